"""Flow-run state hooks. Prefect never retries a Crashed flow run (the process died or lost its heartbeat):
the hook records the crash on the run, and the `rerun-crashed` automation (infra/prefect/automations/)
starts the deployment again with the same parameters, run_id included, which resumes from the last checkpoint."""

from __future__ import annotations

import logging

from prefect.client.schemas.objects import FlowRun
from prefect.states import State

from verl_grpo import runs
from verl_grpo.config import config_files, load_config
from verl_grpo.store import Store

log = logging.getLogger("verl_grpo.flows")


def crashed_run_id(parameters: dict) -> tuple[str | None, Store]:
    """The verl-grpo run a flow run was working on: its run_id parameter (the flow sets it once resolved),
    else the unfinished run with the same config (what a re-run would resume)."""
    cfg = load_config(config_files(parameters.get("config")), parameters.get("overrides") or [])
    store = Store.from_config(cfg.storage)
    return parameters.get("run_id") or runs.find_resumable(store, cfg), store


def record_crash(flow, flow_run: FlowRun, state: State) -> None:
    """on_crashed hook: mark the run failed with the crash reason; the run stays resumable."""
    run_id, store = crashed_run_id(dict(flow_run.parameters or {}))
    if run_id is None:
        log.warning("flow run %s crashed before it picked a run id: %s", flow_run.name, state.message)
        return
    record = runs.read_run(store, run_id) or {"run_id": run_id}
    runs.mark_run(store, run_id, "failed", record, error=f"flow run {flow_run.name} crashed: {state.message}",
                  crashed_flow_run_id=str(flow_run.id), crashes=int(record.get("crashes", 0)) + 1)
    log.warning("run %s: flow run %s crashed (%s); re-run it with run_id=%s to resume from the last checkpoint",
                run_id, flow_run.name, state.message, run_id)
