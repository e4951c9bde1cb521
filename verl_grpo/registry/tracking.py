"""One MLflow run per pipeline run: found again by tag, so a retried step logs into the same run.

Everything goes through an explicit MlflowClient (no global fluent state), so concurrent callers with
different tracking URIs do not interfere.
"""

from __future__ import annotations

import json
import logging
import re
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag, SourceType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME, MLFLOW_SOURCE_TYPE
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

from verl_grpo.contracts import DatasetVersion
from verl_grpo.errors import InfraError
from verl_grpo.provenance import git_sha
from verl_grpo.registry.relocate import artifacts_root, relocate_artifacts
from verl_grpo.registry.secrets import assert_no_secrets
from verl_grpo.store import Store, strip_scheme

log = logging.getLogger(__name__)

RUN_ID_TAG = "verl_grpo.run_id"
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"
"""What MLflow 3's UI reads to open an experiment as model training (runs, metrics) rather than GenAI (traces)."""
TRAINING_VIEW = "workflowType=machine_learning"
"""The UI route's query that opens an experiment's training view (MLflow 3 would open its GenAI view otherwise)."""
SOURCE_NAME = "verl-grpo"
TRAINING_CONTEXT = "training"
TRAIN_METRICS_TAG = "verl_grpo.train_metrics_logged"
_INVALID_NAME_CHARS = re.compile(r"[^\w./\- ]")
_UNSAFE_DIR_CHARS = re.compile(r"[^\w.-]+")
_TRUNCATED = "…[truncated; see config.yaml artifact]"


# MLflow reports unreachable servers, 5xx answers and a locked SQLite file with these codes.
_TRANSIENT_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "RESOURCE_EXHAUSTED"}


@contextmanager
def infra_errors(tracking_uri: str) -> Iterator[None]:
    """Turn transient MLflow/network failures into InfraError (retryable); other MLflow errors pass through."""
    try:
        yield
    except MlflowException as e:
        if e.error_code in _TRANSIENT_CODES:
            raise InfraError(f"MLflow at {tracking_uri} failed ({e.error_code}: {str(e)[:300]}); check that the "
                             "tracking server is up (tracking.mlflow_uri), a retry continues where this stopped") from e
        raise
    except OSError as e:
        raise InfraError(f"MLflow at {tracking_uri}: {type(e).__name__}: {e}; a retry continues where this "
                         "stopped") from e


_RELOCATION_CHECKED: set[str] = set()


def client_for(tracking_uri: str) -> MlflowClient:
    """A client whose tracking and registry both live at `tracking_uri` (SQLite file or http server); a SQLite store
    that moved with its state dir has its artifact paths rewritten first (registry.relocate)."""
    if tracking_uri not in _RELOCATION_CHECKED:  # once per process: a store does not move under a running process
        relocate_artifacts(tracking_uri)
        _RELOCATION_CHECKED.add(tracking_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


def metric_name(name: str) -> str:
    """A name MLflow accepts: `pass@4` → `pass_at_4`; other characters outside [\\w./- ] become `_`."""
    return _INVALID_NAME_CHARS.sub("_", name.replace("@", "_at_"))


def value_name(*parts: str) -> str:
    """The MLflow name of a single value (an eval result, a p-value, a cost): its parts joined by dots, no slash.

    MLflow's run page groups its charts into sections by what precedes a name's last `/`, lists those sections
    alphabetically, and puts the names without a slash last, in its "Model metrics" section; a metric logged once
    is drawn as one bar. So the training curves (`train/...`) lead the page, the single values follow them, and the
    runs table offers each value as a column. `value_name("eval", "reward/correctness")` → `eval.reward.correctness`.
    """
    return ".".join(part.replace("/", ".") for part in parts)


_SLASHED_VALUES = re.compile(r"^(eval|base|delta|delta_grpo|warm_start|pvalue|promotion|cloud)/|^train/final_step$")


def single_values(metrics: Mapping[str, float]) -> dict[str, float]:
    """A run's metrics with the single values of runs registered before they were named by `value_name`
    (`eval/accuracy`, `promotion/mcnemar_p`, ...) under their current names, so old and new versions compare."""
    out = dict(metrics)
    for key, value in metrics.items():
        if _SLASHED_VALUES.match(key):
            out.setdefault(key.replace("/", "."), value)
    return out


def artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Artifact root of a new experiment: beside a SQLite DB (never MLflow's cwd-relative ./mlruns); None lets a
    server choose its own (proxied) root."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri.removeprefix("sqlite:///")).expanduser()
    return f"{artifacts_root(db)}/{_UNSAFE_DIR_CHARS.sub('-', experiment)}"


def experiment_id(client: MlflowClient, name: str, location: str | None = None) -> str:
    """Id of the model-training experiment `name`, created (at `location`) when missing; a concurrent creator is
    fine. An existing experiment is marked model-training too, so the UI opens it on its runs, not on traces."""
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS" and e.get_http_status_code() != 409:
                raise
        found = client.get_experiment_by_name(name)
        assert found is not None, f"experiment {name} reported as existing but cannot be read"
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    if found.tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    return found.experiment_id


def find_or_create_run(client: MlflowClient, exp_id: str, run_id: str, tags: Mapping[str, str],
                       started_at: float | None = None) -> str:
    """MLflow run id of pipeline run `run_id` (tagged `verl_grpo.run_id`), created (starting at Unix time
    `started_at`, default now) when missing."""
    runs = client.search_runs([exp_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{_quote(run_id)}'",
                              max_results=2, order_by=["attributes.start_time ASC"])
    if runs:
        return runs[0].info.run_id
    start_ms = None if started_at is None else int(started_at * 1000)
    return client.create_run(exp_id, start_time=start_ms, run_name=run_id,
                             tags={**tags, RUN_ID_TAG: run_id}).info.run_id


def source_tags() -> dict[str, str]:
    """MLflow's tags of where the code came from (the runs table's Source and Version columns)."""
    sha = git_sha()
    return {MLFLOW_SOURCE_NAME: SOURCE_NAME, MLFLOW_SOURCE_TYPE: SourceType.to_string(SourceType.LOCAL),
            **({MLFLOW_GIT_COMMIT: sha} if sha else {})}


def log_dataset_input(client: MlflowClient, mlflow_run_id: str, dataset: DatasetVersion) -> None:
    """The dataset version as the run's training input (the runs table's Dataset column); logged once."""
    with warnings.catch_warnings():  # MLflow registers two sources for file:// URIs and warns that it picks one
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted")
        source = resolve_dataset_source(dataset.splits.get("train", dataset.uri))
    meta = MetaDataset(source, name=dataset.name, digest=dataset.hash)._to_mlflow_entity()
    entity = Dataset(name=meta.name, digest=meta.digest, source_type=meta.source_type, source=meta.source,
                     profile=json.dumps({"rows": dataset.counts, "rejected": dataset.rejected}))
    context = InputTag(MLFLOW_DATASET_CONTEXT, TRAINING_CONTEXT)
    client.log_inputs(mlflow_run_id, datasets=[DatasetInput(entity, tags=[context])])


def log_params(client: MlflowClient, mlflow_run_id: str, params: Mapping[str, Any]) -> None:
    """Log params not yet on the run (a retry neither fails nor duplicates); values capped at MLflow's limit."""
    assert_no_secrets(params, "MLflow params")
    existing = client.get_run(mlflow_run_id).data.params
    todo = []
    for key, value in params.items():
        text = "None" if value is None else str(value)
        if len(text) > MAX_PARAM_VAL_LENGTH:
            text = text[: MAX_PARAM_VAL_LENGTH - len(_TRUNCATED)] + _TRUNCATED
        if key not in existing:
            todo.append(Param(key, text))
        elif existing[key] != text:  # MLflow params are immutable; the run keeps its first value
            log.warning("MLflow run %s already has param %s=%r; not changing it to %r", mlflow_run_id, key,
                        existing[key], text)
    for chunk in _chunks(todo, MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(mlflow_run_id, params=chunk)


def set_tags(client: MlflowClient, mlflow_run_id: str, tags: Mapping[str, Any]) -> None:
    assert_no_secrets(tags, "MLflow tags")
    items = [RunTag(k, str(v)) for k, v in tags.items()]
    for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
        client.log_batch(mlflow_run_id, tags=chunk)


def log_metrics(client: MlflowClient, mlflow_run_id: str, metrics: Mapping[str, float], step: int = 0,
                model_id: str | None = None) -> None:
    """Summary metrics (eval/…, base/…, delta/…) at one step, also of the logged model `model_id` when given (its
    row in the experiment's Models tab); re-logging the same values is harmless."""
    now = int(time.time() * 1000)
    items = [Metric(metric_name(k), float(v), now, step, model_id=model_id) for k, v in metrics.items()]
    for chunk in _chunks(items, MAX_METRICS_PER_BATCH):
        client.log_batch(mlflow_run_id, metrics=chunk)


def log_training_metrics(client: MlflowClient, mlflow_run_id: str, store: Store, metrics_uri: str) -> int:
    """Per-step training metrics from the run's JSONL, once per MLflow run; returns the number of points."""
    run = client.get_run(mlflow_run_id)
    if TRAIN_METRICS_TAG in run.data.tags:
        return int(run.data.tags[TRAIN_METRICS_TAG])
    lines = read_lines(store, metrics_uri)
    if lines is None:  # not written (yet): a later retry logs them
        return 0
    points = list(training_points(lines))
    for chunk in _chunks(points, MAX_METRICS_PER_BATCH):
        client.log_batch(mlflow_run_id, metrics=chunk)
    client.set_tag(mlflow_run_id, TRAIN_METRICS_TAG, str(len(points)))
    return len(points)


def training_points(lines: Iterable[str]) -> Iterator[Metric]:
    """`{"step": 3, "loss": 0.1, "reward/mean": 0.5, ...}` lines → one `train/<field>` Metric per numeric field."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise InfraError(f"training metrics line {n} is not JSON ({line[:80]!r}); the metrics file is "
                             "damaged, re-run training's last step or delete the line") from None
        step = int(record.get("step", n))
        stamp = record.get("timestamp", record.get("time"))
        millis = int(float(stamp) * 1000) if isinstance(stamp, (int, float)) else int(time.time() * 1000)
        for key, value in record.items():
            if key in {"step", "timestamp", "time"} or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                yield Metric(metric_name(f"train/{key}"), float(value), millis, step)


def read_lines(store: Store, uri: str) -> list[str] | None:
    try:
        with store.fs.open(strip_scheme(uri), "r") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return None


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _quote(value: str) -> str:
    return value.replace("'", "\\'")

