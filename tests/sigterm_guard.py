"""A SIGTERM to the test run stops it, whatever a test did to the process's signal handlers.

`ray.init` in a test installs Ray's driver handler (`ray/_private/worker.py`, `sys.exit(signum)`) in the pytest process
and leaves it there: a later SIGTERM (CI's `timeout`) then raises `SystemExit: 15` inside whichever test is running,
pytest records one failure and goes on. This plugin keeps Ray from installing it here and restores the handler the
run started with after every test, so SIGTERM keeps its default meaning: the run ends."""

from __future__ import annotations

import signal

import pytest

_ORIGINAL = signal.getsignal(signal.SIGTERM)


def pytest_sessionstart(session):
    try:
        import ray._private.utils as ray_utils
    except ImportError:
        return
    ray_utils.set_sigterm_handler = lambda handler: None  # ray.init's only way of setting it


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    if signal.getsignal(signal.SIGTERM) is not _ORIGINAL:
        signal.signal(signal.SIGTERM, _ORIGINAL)
