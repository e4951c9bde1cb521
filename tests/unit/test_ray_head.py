"""`verl_grpo.trainers.verl.ray_head`: a job stops the Ray head an earlier job left on its node (it would hand that
job's environment to verl's workers), and only that one: never another Ray on the machine (SkyPilot's own)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from verl_grpo.trainers.verl import ray_head

# A stand-in for a Ray process: named by its session dir, it starts a child that renames itself (as Ray's dashboard
# and runtime-env agents do), so only the process tree finds the child.
PARENT = textwrap.dedent("""\
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print("up", flush=True)
    time.sleep(120)
    """)


def _start(*marker: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", PARENT, *marker], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_stops_our_head_with_everything_it_started_and_nothing_else(tmp_path, capsys):
    ours = _start("--session-dir", f"{tmp_path}/ray/session_2026-11-26_12-00-00_1_1")
    client = _start("-m", "ray.util.client.server", "--address=10.0.0.1:6379")  # matched by its args, not renamed
    other_ray = _start("--session-dir", "/tmp/skypilot-ray/session_2026-11-26_12-00-00_1_1")  # e.g. SkyPilot's
    other_port = _start("-m", "ray.util.client.server", "--address=10.0.0.1:6380")
    try:
        ours_child = psutil.Process(ours.pid).children()[0]
        assert ray_head.main(["stop", f"{tmp_path}/ray/", "6379"]) == 0
        assert "stopped the Ray head an earlier job left on this node" in capsys.readouterr().out
        deadline = time.monotonic() + 10
        while ours.poll() is None or client.poll() is None or ours_child.is_running() and \
                ours_child.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "our Ray's processes still run"
            time.sleep(0.1)
        assert other_ray.poll() is None and other_port.poll() is None
        assert ray_head.main(["stop", f"{tmp_path}/ray", "6379"]) == 0 and capsys.readouterr().out == ""
    finally:
        for proc in (ours, client, other_ray, other_port):
            for child in psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []:
                child.kill()
            proc.kill()
            proc.wait()
