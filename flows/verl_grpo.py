"""The `verl-grpo` flow: prepare → provision → train → evaluate → register, teardown always."""

from __future__ import annotations

from prefect import flow, get_client, tags
from prefect.runtime import flow_run

from flows.hooks import record_crash
from flows.task_runners import task_runner
from tasks.evaluate import submit_eval
from tasks.prepare import prepare_data
from tasks.provision import provision, teardown
from tasks.register import register
from tasks.reporting import publish_summary, run_tags
from tasks.resolve import resolve_config
from tasks.train import train
from verl_grpo.config import RunConfig, load_config
from verl_grpo.runs import run_name


NIGHTLY_TAG = "nightly"  # only runs the scheduler created; a run started by hand is not a nightly retrain


def _flow_run_name() -> str:
    params = flow_run.parameters
    return run_name(load_config(params.get("config") or ["gsm8k"], params.get("overrides") or []))


@flow(name="verl-grpo", flow_run_name=_flow_run_name, log_prints=True, on_crashed=[record_crash])
def verl_grpo(config: list[str] | None = None, overrides: list[str] | None = None, run_id: str | None = None) -> dict:
    """GRPO post-training of one model on one dataset: prepare → provision → train → evaluate → register.

    Args:
        config: Config files or shipped profiles (gsm8k, math, mbpp, local), merged in order; default gsm8k.
        overrides: Dotted `key=value` settings applied last, e.g. `algorithm.total_steps=20` or
            `model.name=tiny` (a one-minute run).
        run_id: Resume this run from its last checkpoint. Empty: an unfinished run with the same config
            resumes, else a new run starts.
    """
    run = resolve_config(config or ["gsm8k"], overrides or [], run_id)
    cfg = run.cfg
    label_flow_run(cfg, run.run_id)
    with tags(*run_tags(cfg)):
        dataset = prepare_data(cfg)
        cluster = provision(cfg, run.run_id)
        try:
            result = train(cfg, dataset, cluster, run.run_id)
            with task_runner(cfg.orchestration) as runner:  # threads, or Ray workers (local or a cluster)
                base_eval = submit_eval(runner, cfg, dataset)  # cached across runs
                trained_eval = submit_eval(runner, cfg, dataset, result.model_uri, run.run_id)
                base_report, report = base_eval.result(), trained_eval.result()
            version = register(cfg, run.run_id, dataset, result, report, base_report, tracking_tags(run.run_id))
        finally:
            teardown(cfg, cluster)
        return publish_summary(cfg, run.run_id, dataset, result, report, base_report, version)


def label_flow_run(cfg: RunConfig, run_id: str) -> None:
    """Tag the flow run (dataset, model, provider, backend; `nightly` when a schedule created it) and record
    its run_id among its parameters, so the UI can filter by tag and a re-run of the same parameters (UI,
    automation) resumes this run."""
    if flow_run.id is None:
        return
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id)
        parameters = {**current.parameters, "run_id": run_id}
        nightly = [NIGHTLY_TAG] if current.auto_scheduled else []
        client.update_flow_run(flow_run.id, tags=sorted({*current.tags, *run_tags(cfg), *nightly}),
                               parameters=parameters)


def tracking_tags(run_id: str) -> dict[str, str]:
    """Prefect provenance for the MLflow run (the git source is recorded by the registry itself)."""
    return {
        "prefect.flow_run_id": str(flow_run.id or ""),
        "prefect.flow_run_url": str(flow_run.ui_url or ""),
        "prefect.flow_run_name": str(flow_run.name or ""),
    }


if __name__ == "__main__":
    verl_grpo()
