"""The optional mirrors (verl_grpo.mirrors) of a registered run: sent at registration, and again on request
(`verl-grpo mirror --run-id ID`) from what the store and MLflow keep of the run."""

from __future__ import annotations

from collections.abc import Sequence

import yaml
from mlflow.tracking import MlflowClient

from verl_grpo import mirrors
from verl_grpo.config import RunConfig
from verl_grpo.contracts import MirrorResult, TrainResult
from verl_grpo.errors import ConfigError, RunNotFound
from verl_grpo.registry import tracking
from verl_grpo.store import Store
from verl_grpo.store_layout import run_config, run_metrics, train_result

MIRROR_TAG = "mirror.{name}"
"""MLflow run tag: `ok` or `failed: <reason>`, the latest send to that mirror."""
SUMMARY_PREFIXES = ("eval.", "base.", "delta.")


def mirror_registered(client: MlflowClient, mlflow_run_id: str, run: mirrors.RunMetrics,
                      to: Sequence[mirrors.Mirror] | None = None, warn: bool = True) -> list[MirrorResult]:
    """Send the run to its mirrors and note each outcome on its MLflow run (`<name>_url`, `mirror.<name>`); a
    failure is logged as one warning line (`warn`) and returned, never raised."""
    results = mirrors.send_all(run, to, warn=warn)
    for result in results:
        client.set_tag(mlflow_run_id, MIRROR_TAG.format(name=result.name),
                       "ok" if result.ok else f"failed: {result.reason}"[:500])
        if result.ok and result.where:
            client.set_tag(mlflow_run_id, f"{result.name}_url", result.where)
    return results


def mirror_run(cfg: RunConfig, run_id: str, only: Sequence[str] = ()) -> list[MirrorResult]:
    """Send a registered run again: its stored config and metrics.jsonl, and the eval summary on its MLflow run.

    ConfigError when no mirror is configured or one's settings are wrong; RunNotFound when MLflow has no
    registered run of that id. A failed send comes back as a result (the caller decides how to report it).
    """
    to = mirrors.enabled_mirrors(only=only)
    if not to:
        raise ConfigError("no mirror is configured: set WANDB_API_KEY (or WANDB_MODE=offline) to mirror to W&B")
    store = Store.from_config(cfg.storage)
    with tracking.infra_errors(cfg.tracking.mlflow_uri):
        client = tracking.client_for(cfg.tracking.mlflow_uri)
        mlflow_run = _registered_run(client, cfg, run_id)
        run_cfg = _stored_config(store, run_id) or cfg
        lines = tracking.read_lines(store, _metrics_uri(store, run_id)) or []
        summary = {k: v for k, v in tracking.single_values(mlflow_run.data.metrics).items()
                   if k.startswith(SUMMARY_PREFIXES)}
        return mirror_registered(client, mlflow_run.info.run_id, mirrors.RunMetrics(run_cfg, run_id, lines, summary),
                                 to, warn=False)


def _registered_run(client: MlflowClient, cfg: RunConfig, run_id: str):
    experiment = client.get_experiment_by_name(cfg.experiment_name)
    found = [] if experiment is None else client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{tracking.RUN_ID_TAG}` = '{run_id.replace(chr(39), '')}'",
        max_results=1)
    if not found:
        raise RunNotFound(f"run {run_id} is not registered in MLflow ({cfg.tracking.mlflow_uri}, experiment "
                          f"{cfg.experiment_name}); check --run-id and -c/-o, or register it first "
                          f"(`verl-grpo register --run-id {run_id}`)")
    return found[0]


def _stored_config(store: Store, run_id: str) -> RunConfig | None:
    rel = run_config(run_id)
    return RunConfig.model_validate(yaml.safe_load(store.read_text(rel))) if store.exists(rel) else None


def _metrics_uri(store: Store, run_id: str) -> str:
    rel = train_result(run_id)
    if store.exists(rel):
        return TrainResult.model_validate_json(store.read_text(rel)).metrics_uri
    return store.url(run_metrics(run_id))
