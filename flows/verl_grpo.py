"""The `verl-grpo` flow: resolve → prepare → provision → train → evaluate → register, teardown always.

The chain itself is verl_grpo.chain.run_chain, the same one `verl-grpo train` and `plain_steps.run_pipeline` run;
here each step is a Prefect task (flows/steps.py) and the outcome is published on the flow run.
"""

from __future__ import annotations

from prefect import flow, get_client, tags
from prefect.runtime import flow_run
from prefect.states import Completed

from verl_grpo.chain import ResolvedRun, run_chain
from verl_grpo.config import config_files
from verl_grpo.summary import state_message
from verl_grpo_flows.hooks import record_crash
from verl_grpo_flows.steps import PrefectSteps
from verl_grpo_tasks.reporting import publish_summary, run_tags
from verl_grpo_tasks.resolve import resolve_config

NIGHTLY_TAG = "nightly"  # only runs the scheduler created; a run started by hand is not a nightly retrain


@flow(name="verl-grpo", log_prints=True, on_crashed=[record_crash])
def verl_grpo(config: list[str] | None = None, overrides: list[str] | None = None, run_id: str | None = None,
              fresh: bool = False) -> dict:
    """GRPO post-training of one model on one dataset: prepare → provision → train → evaluate → register.

    Args:
        config: Config files or shipped profiles (gsm8k, math, mbpp, local), merged in order; default gsm8k.
        overrides: Dotted `key=value` settings applied last, e.g. `algorithm.total_steps=20` or
            `model.name=tiny` (a one-minute run).
        run_id: Resume this run from its last checkpoint; the run must exist in the store (a run id the store
            does not know fails before any training). Empty: an unfinished run with the same config resumes,
            else a new run starts.
        fresh: Start a new run (named run_id when given, which must then be new) instead of resuming one.
    """
    run = resolve_config(config_files(config), overrides or [], run_id, fresh)
    label_flow_run(run)
    with tags(*run_tags(run.cfg)):
        summary = publish_summary(run_chain(run, PrefectSteps()))
    # Completed with the run's warnings and decision as its message (calling the flow still returns the summary).
    return Completed(message=state_message(summary), data=summary)


def label_flow_run(run: ResolvedRun) -> None:
    """Name the flow run after the run id, tag it (dataset, model, provider, backend; `nightly` when a schedule
    created it) and record run_id (and fresh=false: the run exists now) among its parameters, so the UI can filter
    by tag and a re-run of the same parameters (UI, automation) resumes this run."""
    if flow_run.id is None:
        return
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id)
        parameters = {**current.parameters, "run_id": run.run_id, "fresh": False}
        nightly = [NIGHTLY_TAG] if current.auto_scheduled else []
        client.update_flow_run(flow_run.id, name=run.run_id, parameters=parameters,
                               tags=sorted({*current.tags, *run_tags(run.cfg), *nightly}))


if __name__ == "__main__":
    verl_grpo()
