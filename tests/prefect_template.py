"""A Prefect database that already has its schema, to seed the fresh Prefect homes of tests that are not about a
first start.

A Prefect server on an empty home spends about 11 of its 16 CPU-seconds of start-up on this 2-core machine
creating the schema (Prefect's alembic migrations) and registering the block types; with a migrated database it is
ready after 5. The suite starts some twenty such servers (deployments, resumes, rehearsals), so the schema is made
once per test session, by starting Prefect's own server on an empty home, and copied into each test's home.
A first start on an empty home is still tested: a new user's first `make run` (tests/e2e/conftest.py::first_cli_run),
`make serve`'s in tests/e2e/test_prefect_server.py, and tests/e2e/test_fresh_state.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

FILES = ("prefect.db", "memo_store.toml")
"""What a home holds after a server's first start: the database and the memo that the block types are registered."""
SESSION_DIR_ENV = "VERL_GRPO_TEST_HOME"
_START_AND_STOP = ("from prefect.server.api.server import SubprocessASGIServer\n"
                   "server = SubprocessASGIServer()\nserver.start(timeout=300)\nserver.stop()\n")


def template_home() -> Path:
    """The seed home, made on first use by a Prefect server's first start in the session's temporary directory
    (tests/conftest.py: SESSION_DIR_ENV), never in the checkout; xdist workers that need it meanwhile wait for the
    one that makes it."""
    root = Path(os.environ[SESSION_DIR_ENV])
    home = root / "prefect-template"
    with open(root / "prefect-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((home / name).is_file() for name in FILES):
            with tempfile.TemporaryDirectory(dir=root) as building:
                env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
                env |= {"PREFECT_HOME": building, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
                subprocess.run([sys.executable, "-c", _START_AND_STOP], env=env, check=True, capture_output=True,
                               timeout=600)
                with contextlib.closing(sqlite3.connect(Path(building) / "prefect.db")) as db:
                    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the .db file: copies take only it
                home.mkdir(exist_ok=True)
                for name in FILES:
                    shutil.copyfile(Path(building) / name, home / name)
    return home


def seed_prefect_home(home: Path) -> Path:
    """`home` holding a copy of the migrated database (unless it already has one); returns `home`."""
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "prefect.db").exists():
        template = template_home()
        for name in FILES:
            shutil.copyfile(template / name, home / name)
    return home


EVENTS_DRAIN_S = 60
"""How long the harness's teardown waits for the events its flows emitted. Prefect waits without a bound, and an
events websocket that stopped answering under a loaded machine costs about a minute per queued event (ten
reconnection attempts each): a test that passed would then hang its module's teardown past the suite's timeout.
Events left over belong to the harness's server, which stops right after."""


@contextlib.contextmanager
def seeded_test_harness(server_startup_timeout: int = 120) -> Iterator[None]:
    """Prefect's own `prefect_test_harness`, its temporary database a copy of the migrated one, its teardown's wait
    for emitted events bounded (`EVENTS_DRAIN_S`)."""
    from prefect.events.worker import EventsWorker
    from prefect.testing import utilities

    def seeded_temp_dir() -> str:
        path = Path(tempfile.mkdtemp(prefix="prefect-harness-"))
        shutil.copyfile(template_home() / "prefect.db", path / "prefect-test.db")  # the harness's file name
        return str(path)

    drain_all = EventsWorker.drain_all

    def bounded_drain_all(timeout: float | None = None, at_exit: bool = True):
        return drain_all(timeout=EVENTS_DRAIN_S if timeout is None else timeout, at_exit=at_exit)

    with mock.patch.object(utilities, "mkdtemp", seeded_temp_dir), \
            mock.patch.object(EventsWorker, "drain_all", staticmethod(bounded_drain_all)), \
            utilities.prefect_test_harness(server_startup_timeout=server_startup_timeout):
        yield
