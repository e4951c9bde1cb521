"""Is the local Prefect server doing its job? Prefect's services (the scheduler above all) report failures
only in the server's log, so a server can look healthy while no nightly run is ever created. This check
fails loudly instead: exit 1, one line per problem, when the log holds ERROR records (SQLite lock contention,
which Prefect retries, only warns) or a deployment whose schedule is active has no Scheduled run within the wait.
Deployments whose schedules are paused are listed (the GPU ones stay paused until VERL_GRPO_GPU_STORE is set).

`make serve` runs it after deploying; by hand, with PREFECT_API_URL set:
    python infra/prefect/check_server.py --log "$PREFECT_HOME/server.log" [--wait 45]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from prefect import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType

_ERROR_RECORD = re.compile(r"\|\s*ERROR\s*\|\s*(?P<logger>\S+)\s+-\s+(?P<message>.*)")
_RECORD = re.compile(r"^\d\d:\d\d:\d\d\.\d+ \| ")
_EXCEPTION_LINE = re.compile(r"^[\w.]+(Error|Exception)\b.*")
# Prefect's services retry a write that met SQLite's lock (PrefectHQ/prefect#10188, #18934): contention on a
# busy machine, reported and not failed on.
_TRANSIENT = "database is locked"


def is_transient(error: str) -> bool:
    """True for an ERROR record Prefect retries by itself (SQLite lock contention)."""
    return _TRANSIENT in error


def without_transient_errors(text: str) -> str:
    """The log less its ERROR records (each up to the next record) that Prefect retries by itself."""
    records: list[list[str]] = [[]]
    for line in text.splitlines():
        if _RECORD.match(line):
            records.append([])
        records[-1].append(line)
    return "\n".join(line for record in records
                     if not (record and _ERROR_RECORD.search(record[0]) and any(map(is_transient, record)))
                     for line in record)


def log_errors(text: str) -> list[str]:
    """One line per ERROR record of a Prefect server log: its logger and the exception that ended its trace."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if match := _ERROR_RECORD.search(line):
            following = lines[i + 1:i + 200]
            end = next((j for j, nxt in enumerate(following) if _ERROR_RECORD.search(nxt)), len(following))
            cause = [nxt for nxt in following[:end] if _EXCEPTION_LINE.match(nxt)]
            found.append(f"{match['logger']}: {(cause[-1] if cause else match['message']).strip()[:300]}")
    return found


def scheduled_runs(client) -> dict[str, int]:
    """Scheduled flow runs of each deployment that has an active schedule, by `flow/deployment` name."""
    counts = {}
    for deployment in client.read_deployments():
        if not any(s.active for s in deployment.schedules):
            continue
        flow = client.read_flow(deployment.flow_id)
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
        )
        counts[f"{flow.name}/{deployment.name}"] = len(runs)
    return counts


def paused_deployments(client) -> list[str]:
    """`flow/deployment` names of the deployments that have schedules, all of them paused."""
    return sorted(f"{client.read_flow(d.flow_id).name}/{d.name}" for d in client.read_deployments()
                  if d.schedules and not any(s.active for s in d.schedules))


def check(log: Path, wait_s: float) -> list[str]:
    """Problems found (empty when the server is fine); waits up to `wait_s` for the scheduler's first pass."""
    deadline = time.monotonic() + wait_s
    with get_client(sync_client=True) as client:
        while True:
            errors = log_errors(log.read_text(errors="replace")) if log.is_file() else []
            counts = scheduled_runs(client)
            unscheduled = sorted(name for name, n in counts.items() if n == 0)
            if any(not is_transient(e) for e in errors) or not unscheduled or time.monotonic() > deadline:
                break
            time.sleep(1)
        paused = paused_deployments(client)
    for error in filter(is_transient, errors):
        print(f"warning: server log {log}: {error} (retried by Prefect)", file=sys.stderr)
    problems = [f"server log {log}: ERROR from {e}" for e in errors if not is_transient(e)]
    problems += [f"deployment {name}: schedule active but no Scheduled run (waited up to {wait_s:.0f} s); see {log}"
                 for name in unscheduled]
    if not problems:
        print("scheduler: " + (", ".join(f"{name} {n} scheduled" for name, n in sorted(counts.items()))
                               or "no active schedules"))
        if paused:
            hint = (" (the GPU ones wait for a bucket: set VERL_GRPO_GPU_STORE=s3://bucket/prefix and re-deploy)"
                    if any(name.endswith("-gpu") for name in paused) else "")
            print(f"paused: {', '.join(paused)}{hint}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True, help="the server's log file")
    parser.add_argument("--wait", type=float, default=45.0, help="seconds to wait for scheduled runs")
    args = parser.parse_args()
    problems = check(args.log, args.wait)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
