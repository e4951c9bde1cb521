"""A SIGTERM to a test run stops it, also after a test initialized Ray in the pytest process (whose driver handler
would otherwise turn the signal into `SystemExit: 15` inside the running test, and pytest would go on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CHILD_TESTS = '''
import time
from pathlib import Path

import ray


def test_initializes_ray():  # and leaves it up, as a module-scoped fixture does
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)


def test_waits_for_the_signal():
    Path(__file__).with_name("waiting").write_text("")
    time.sleep(120)


def test_after_the_signal():
    Path(__file__).with_name("went-on").write_text("")
'''


def test_sigterm_ends_the_run_after_a_test_ran_ray_init(tmp_path):
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "sigterm_guard", "-p", "no:cacheprovider",
                             "-o", "addopts=", "test_child.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while not (tmp_path / "waiting").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == -signal.SIGTERM, out
    assert not (tmp_path / "went-on").exists(), out
