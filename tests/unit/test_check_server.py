"""The server-log reading behind `make serve`'s check: one line per ERROR record, naming the exception."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "infra" / "prefect"))
from check_server import is_transient, log_errors, without_transient_errors  # noqa: E402

# As Prefect 3.8.8's server logged it every minute with SQLAlchemy 2.1.9 pinned (shortened).
SCHEDULER_FAILURE = """\
20:31:05.118 | INFO    | prefect.server.services.scheduler - Scheduled 0 runs.
20:32:05.402 | ERROR   | prefect.server.services.scheduler - Unexpected error in: InvalidRequestError("Can't evaluate bulk DML statement")
Traceback (most recent call last):
  File ".../prefect/server/models/deployments.py", line 1010, in _insert_scheduled_flow_runs
    await session.execute(
sqlalchemy.exc.InvalidRequestError: Can't evaluate bulk DML statement; please supply a bulk_dml decorated function
20:32:06.001 | INFO    | prefect.server.services.late_runs - Finished monitoring for late runs.
"""


def test_an_error_record_becomes_one_line_naming_the_service_and_the_exception():
    assert log_errors(SCHEDULER_FAILURE) == [
        "prefect.server.services.scheduler: sqlalchemy.exc.InvalidRequestError: Can't evaluate bulk DML "
        "statement; please supply a bulk_dml decorated function"]


def test_a_clean_log_has_no_errors():
    assert log_errors("\n".join(line for line in SCHEDULER_FAILURE.splitlines() if "INFO" in line)) == []


def test_an_error_without_a_trace_keeps_its_message():
    assert log_errors("12:00:00.000 | ERROR   | uvicorn.error - Application startup failed. Exiting.\n") == [
        "uvicorn.error: Application startup failed. Exiting."]


def test_sqlite_lock_contention_is_transient_a_scheduler_failure_is_not():
    locked = log_errors("12:00:00.000 | ERROR   | prefect.server.services.task_run_recorder - Error flushing 1 "
                        "events (1 to retry, 0 dropped)\nTraceback (most recent call last):\nsqlalchemy.exc."
                        "OperationalError: (sqlite3.OperationalError) database is locked\n")
    assert [is_transient(e) for e in locked] == [True]
    assert [is_transient(e) for e in log_errors(SCHEDULER_FAILURE)] == [False]


def test_only_error_records_caused_by_sqlites_lock_are_left_out_of_the_log():
    log = ("13:01:20.001 | INFO    | prefect.server - started\n"
           "13:01:22.658 | ERROR   | prefect.server.events.triggers - Error running periodic evaluation\n"
           "Traceback (most recent call last):\n"
           "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) database is locked\n"
           "13:01:23.100 | ERROR   | prefect.server.services.scheduler - Unexpected error\n"
           "Traceback (most recent call last):\n"
           "KeyError: 'x'\n"
           "13:01:24.000 | INFO    | prefect.server - done\n")
    kept = without_transient_errors(log).splitlines()
    assert kept == [log.splitlines()[0], *log.splitlines()[4:]]
