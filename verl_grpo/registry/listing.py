"""Registered versions as rows for `verl-grpo models list|compare`: lineage from the version's tags, every number
from its linked run (versions carry no metrics of their own)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from verl_grpo.config import RunConfig
from verl_grpo.models import model_short_name
from verl_grpo.registry.lines import BASE_MODEL_TAG, COMPARABILITY_TAG
from verl_grpo.registry.register import DECISION_TAG, FINAL_STEP_METRIC, SETTINGS_TAG
from verl_grpo.registry.tracking import RUN_ID_TAG, client_for, infra_errors, single_values

EVAL_PREFIX = "eval."


def list_models(cfg_or_uri: RunConfig | str, name: str | None = None) -> list[dict[str, Any]]:
    """Versions of a registered model, newest first: version, aliases, base model, accuracy, delta vs base, steps,
    ..., and `eval`: every eval metric of the version's run (`eval.<m>` → `<m>`).

    `cfg_or_uri` is a RunConfig (its tracking URI and registered model name) or a tracking URI (then `name`
    is required).
    """
    if isinstance(cfg_or_uri, RunConfig):
        uri, name = cfg_or_uri.tracking.mlflow_uri, name or cfg_or_uri.registered_model_name
    else:
        uri = cfg_or_uri
        if not name:
            raise ValueError("list_models needs the registered model name when given a tracking URI")
    with infra_errors(uri):
        return _rows(client_for(uri), name)


def _rows(client: MlflowClient, name: str) -> list[dict[str, Any]]:
    escaped = name.replace("'", "\\'")
    # Search results do not carry aliases on every backend; the registered model has them all.
    try:
        model = client.get_registered_model(name)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return []
        raise
    aliases: dict[str, list[str]] = {}
    for alias, version in model.aliases.items():
        aliases.setdefault(str(version), []).append(alias)
    rows = []
    for v in client.search_model_versions(f"name='{escaped}'"):
        tags, metrics = v.tags, _run_metrics(client, v.run_id)
        steps = metrics.get(FINAL_STEP_METRIC)
        rows.append({
            "version": int(v.version),
            "aliases": sorted(aliases.get(str(v.version), [])),
            "accuracy": metrics.get("eval.accuracy"),
            "base_accuracy": metrics.get("base.accuracy"),
            "delta_accuracy": metrics.get("delta.accuracy"),
            "steps": None if steps is None else int(steps),
            "base_model": model_short_name(tags[BASE_MODEL_TAG]) if tags.get(BASE_MODEL_TAG) else "",
            "comparability": tags.get(COMPARABILITY_TAG, ""),
            "dataset_hash": tags.get("dataset.hash", ""),
            "run_id": tags.get(RUN_ID_TAG, ""),
            "decision": tags.get(DECISION_TAG, ""),
            "p_value": metrics.get("promotion.mcnemar_p"),
            "settings_key": tags.get(SETTINGS_TAG, ""),
            "created": datetime.fromtimestamp(v.creation_timestamp / 1000, UTC).isoformat(timespec="seconds"),
            "mlflow_run_id": v.run_id,
            "eval": {k.removeprefix(EVAL_PREFIX): val for k, val in sorted(metrics.items())
                     if k.startswith(EVAL_PREFIX)},
        })
    return sorted(rows, key=lambda r: r["version"], reverse=True)


def _run_metrics(client: MlflowClient, mlflow_run_id: str | None) -> dict[str, float]:
    """The numbers of a version live on its run (latest value of each metric); none when the run is gone."""
    if not mlflow_run_id:
        return {}
    try:
        return single_values(client.get_run(mlflow_run_id).data.metrics)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return {}
        raise
