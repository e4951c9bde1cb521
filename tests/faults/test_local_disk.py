"""A full disk or a directory the worker may not write: one clear line naming the path and the fix.

Disk full: the work dir is a 2 MiB tmpfs (needs root to mount). Permission denied: the worker runs
without CAP_DAC_OVERRIDE (setpriv), so root obeys a read-only directory like any other user.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from faultlib import Worker, plan_run

from verl_grpo.store import Store

NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB filesystem: room for the spec and logs, not for one tiny-model checkpoint (~3.5 MB)."""
    mount = tmp_path / "work"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _without_dac_override() -> list[str]:
    if os.geteuid() != 0:
        return []  # not root: permission bits already apply
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to drop root's permission override")
    return NO_DAC


def _assert_one_clear_error(worker: Worker, *needles: str) -> str:
    output = worker.output()
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error: ConfigError: ")]
    assert len(errors) == 1, output[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def test_disk_full_work_dir(tiny_disk, tmp_path, tiny_model_dir, data_mirror):
    store = Store(f"file://{tmp_path / 'store'}")
    spec = plan_run(tiny_disk, tiny_model_dir, data_mirror, store)
    worker = Worker(spec, tmp_path / "home")
    assert worker.finish() == 2, worker.output()[-4000:]
    line = _assert_one_clear_error(worker, str(tiny_disk), "free space")
    print(line)


def test_read_only_work_dir(tmp_path, tiny_model_dir, data_mirror):
    prefix = _without_dac_override()
    store = Store(f"file://{tmp_path / 'store'}")
    spec = plan_run(tmp_path / "work", tiny_model_dir, data_mirror, store)
    (tmp_path / "work").chmod(0o555)
    try:
        worker = Worker(spec, tmp_path / "home", prefix=prefix)
        assert worker.finish() == 2, worker.output()[-4000:]
    finally:
        (tmp_path / "work").chmod(0o755)
    line = _assert_one_clear_error(worker, f"work dir {tmp_path / 'work'}", "permission denied", "chmod")
    print(line)


def test_read_only_store_dir(tmp_path, tiny_model_dir, data_mirror):
    prefix = _without_dac_override()
    store = Store(f"file://{tmp_path / 'store'}")
    spec = plan_run(tmp_path / "work", tiny_model_dir, data_mirror, store, "algorithm.total_steps=2")
    runs = tmp_path / "store" / "runs"
    runs.mkdir()
    runs.chmod(0o555)
    try:
        worker = Worker(spec, tmp_path / "home", prefix=prefix)
        assert worker.finish() == 2, worker.output()[-4000:]
    finally:
        runs.chmod(0o755)
    line = _assert_one_clear_error(worker, str(runs), "permission denied", store.uri)
    assert "retry" not in worker.output().lower().replace("retry budget", ""), "permission errors are not retried"
    print(line)
