"""The pipeline's steps as plain functions: each Prefect task in tasks/ wraps exactly one of these.

Every step takes and returns small serialisable objects (configs, URIs, records) so a step can run in
another process or be retried alone. `run_pipeline` chains them without Prefect (benchmarks, debugging).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_grpo import runs
from verl_grpo.config import RunConfig, load_config
from verl_grpo.contracts import Cluster, DatasetVersion, EvalReport, ModelVersion, TrainResult
from verl_grpo.errors import InfraError, Preempted, error_class
from verl_grpo.paths import ensure_local_dirs, ensure_state_dir
from verl_grpo.layout import eval_report, train_result
from verl_grpo.store import Store

log = logging.getLogger(__name__)

LineSink = Callable[[str], None]


@dataclass(frozen=True)
class TrainProgress:
    """One training step as the trainer's log reports it (for progress bars and reward charts)."""

    step: int
    total_steps: int
    reward: float | None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def percent(self) -> float:
        return 100.0 * min(self.step, self.total_steps) / max(self.total_steps, 1)


ProgressSink = Callable[[TrainProgress], None]

# The TRL worker prints `step k/N reward=0.25 loss=0.01 ...` (trainers.trl_callbacks.progress_line);
# verl's console logger prints `step:k - critic/score/mean:0.25 - ...`.
_TRL_STEP = re.compile(r"^step (?P<step>\d+)/(?P<total>\d+)(?P<rest>(?: \S+=\S+)*)\s*$")
_VERL_STEP = re.compile(r"^step:(?P<step>\d+) - (?P<rest>.*)$")
_VERL_REWARD_KEYS = ("critic/score/mean", "critic/rewards/mean")


def parse_progress(line: str, total_steps: int) -> TrainProgress | None:
    """The TrainProgress a trainer log line reports, or None for any other line."""
    if match := _TRL_STEP.match(line.strip()):
        metrics = _numbers(pair.split("=", 1) for pair in match["rest"].split())
        return TrainProgress(int(match["step"]), int(match["total"]), metrics.get("reward"), metrics)
    if match := _VERL_STEP.match(line.strip()):
        metrics = _numbers(pair.split(":", 1) for pair in match["rest"].split(" - ") if ":" in pair)
        reward = next((metrics[k] for k in _VERL_REWARD_KEYS if k in metrics), None)
        return TrainProgress(int(match["step"]), total_steps, reward, metrics)
    return None


def _numbers(pairs) -> dict[str, float]:
    out = {}
    for key, value in pairs:
        try:
            out[key.strip()] = float(value)
        except ValueError:
            continue
    return out


@dataclass(frozen=True)
class ResolvedRun:
    cfg: RunConfig
    run_id: str
    resumed: bool


def resolve(config_files: Sequence[str], overrides: Sequence[str] = (), run_id: str | None = None,
            resume: bool = True) -> ResolvedRun:
    """Load and validate the config, pick the run id, and store the run's resolved config."""
    cfg = load_config(config_files, overrides)
    prepare_local_state(cfg)
    store = Store.from_config(cfg.storage)
    run_id, resumed = runs.begin_run(store, cfg, run_id, resume=resume)
    return ResolvedRun(cfg=cfg, run_id=run_id, resumed=resumed)


def prepare_local_state(cfg: RunConfig) -> None:
    """The state dir, and the local directories the config names (a `file://` store, a SQLite MLflow DB),
    created before any library touches them; a path that cannot be made fails here in one line."""
    ensure_state_dir()
    ensure_local_dirs({"storage.uri": cfg.storage.uri, "tracking.mlflow_uri": cfg.tracking.mlflow_uri})


def prepare(cfg: RunConfig) -> DatasetVersion:
    """Prepare (or find cached) verl-format parquet for cfg.dataset, prompts measured by the model's tokenizer."""
    from transformers import AutoTokenizer

    from verl_grpo.data import prepare_dataset
    from verl_grpo.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(cfg.model.name)))
    return prepare_dataset(cfg, Store.from_config(cfg.storage), tokenizer=tokenizer)


def provision(cfg: RunConfig, run_id: str) -> Cluster:
    from verl_grpo.providers import get_provider

    return get_provider(cfg.infra.provider).up(cfg, run_id)


def train(cfg: RunConfig, dataset: DatasetVersion, cluster: Cluster, run_id: str,
          on_line: LineSink | None = None, on_progress: ProgressSink | None = None) -> TrainResult:
    """Plan the backend's command, run it on the cluster, stream its log; resumes from the latest checkpoint.

    on_line gets every log line; on_progress gets a TrainProgress for every step line the trainer logs.

    Raises Preempted when the job's process or machines were taken away (a retry resumes), TrainingError
    when the training code failed.
    """
    from verl_grpo.providers import get_provider
    from verl_grpo.trainers import get_trainer

    store = Store.from_config(cfg.storage)
    runs.mark_training_started(store, run_id)
    spec = get_trainer(cfg.trainer.backend).plan(cfg, dataset, store, run_id, cluster)
    provider = get_provider(cfg.infra.provider)
    job = provider.submit(cluster, spec)
    sink = on_line or log.info
    try:
        for line in provider.logs(job, follow=True):
            sink(line)
            if on_progress is not None and (progress := parse_progress(line, spec.total_steps)) is not None:
                on_progress(progress)
    except BaseException:
        provider.cancel(job)
        raise
    state = provider.status(job)
    if state.phase == "SUCCEEDED":
        return TrainResult.model_validate_json(store.read_text(train_result(run_id)))
    if state.preempted:
        raise Preempted(f"run {run_id}: {state.failure_reason}; a retry resumes from the last committed checkpoint")
    raise error_class(state.error_type)(f"run {run_id}: training failed ({state.phase}): {state.failure_reason}")


def evaluate(cfg: RunConfig, model_uri: str, dataset: DatasetVersion, run_id: str,
             progress: Callable[[int, int], None] | None = None, on_line: LineSink | None = None) -> EvalReport:
    """Held-out evaluation of the trained model; the report is stored beside the run.

    On the skypilot provider it runs on GPUs with vLLM as a SkyPilot task (its log lines go to on_line) and the
    report is read back from the store; elsewhere transformers generate on this machine's CPU (progress).
    Scoring and aggregation are the same code on both paths.
    """
    store = Store.from_config(cfg.storage)
    if cfg.infra.provider == "skypilot":
        from verl_grpo.providers import get_provider

        provider = get_provider(cfg.infra.provider)
        job = provider.submit_eval(cfg, run_id, model_uri, dataset)
        try:
            for line in provider.logs(job, follow=True):
                (on_line or log.info)(line)
        except BaseException:
            provider.cancel(job)
            raise
        state = provider.status(job)  # raises the typed error of a failed job
        if state.phase != "SUCCEEDED":
            raise InfraError(f"run {run_id}: eval job {job.name} ended {state.phase} ({state.failure_reason}); "
                             "retry the evaluate step")
        return EvalReport.model_validate_json(store.read_text(eval_report(run_id, cfg.eval.split)))
    from verl_grpo.evaluate import evaluate_model

    report = evaluate_model(cfg, model_uri, dataset, store, run_id=run_id, progress=progress, **eval_options(cfg))
    store.write_text(report.model_dump_json(indent=1), eval_report(run_id, report.split))
    return report


def evaluate_base(cfg: RunConfig, dataset: DatasetVersion,
                  progress: Callable[[int, int], None] | None = None) -> EvalReport:
    """The base model's eval on the same split and settings, cached across runs (nightly retrains reuse it)."""
    from verl_grpo.evaluate import evaluate_cached
    from verl_grpo.models import resolve_model

    store = Store.from_config(cfg.storage)
    return evaluate_cached(cfg, str(resolve_model(cfg.model.name)), dataset, store, progress=progress,
                           **eval_options(cfg))


def eval_options(cfg: RunConfig) -> dict:
    return {"samples": cfg.eval.samples, "temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p,
            "threads": cfg.eval.threads}


def register(cfg: RunConfig, run_id: str, dataset: DatasetVersion, result: TrainResult, report: EvalReport,
             base_report: EvalReport | None, tags: dict[str, str] | None = None) -> ModelVersion:
    from verl_grpo.registry import champion_needs_reeval, register_run

    store = Store.from_config(cfg.storage)
    champion_report = evaluate_champion(cfg, dataset) if champion_needs_reeval(cfg, report) else None
    version = register_run(cfg, run_id=run_id, dataset=dataset, train=result, report=report,
                           base_report=base_report, store=store, tags=tags or {},
                           promotion_p_value=cfg.tracking.promotion_p_value, champion_report=champion_report)
    runs.mark_run(store, run_id, "completed", model_version=version.version, model_name=version.name)
    return version


def evaluate_champion(cfg: RunConfig, dataset: DatasetVersion) -> EvalReport:
    """The current champion re-evaluated with tonight's settings (cached), so a settings change never blocks promotion."""
    import tempfile

    from verl_grpo.evaluate import evaluate_cached
    from verl_grpo.registry import download_version

    with tempfile.TemporaryDirectory(prefix="champion-") as dst:
        model_dir = download_version(cfg.tracking.mlflow_uri, cfg.registered_model_name, "champion", Path(dst))
        # Cached by the model files' content hash, so a later night with the same champion skips generation.
        return evaluate_cached(cfg, str(model_dir), dataset, Store.from_config(cfg.storage), **eval_options(cfg))


def teardown(cfg: RunConfig, cluster: Cluster) -> None:
    from verl_grpo.providers import get_provider

    get_provider(cfg.infra.provider).down(cluster)


def mark_failed(cfg: RunConfig, run_id: str, error: BaseException) -> None:
    runs.mark_run(Store.from_config(cfg.storage), run_id, "failed", error=f"{type(error).__name__}: {error}")


@dataclass(frozen=True)
class PipelineOutcome:
    run_id: str
    dataset: DatasetVersion
    train: TrainResult
    report: EvalReport
    base_report: EvalReport
    version: ModelVersion
    seconds: float

    def summary(self) -> dict:
        return {
            "run_id": self.run_id,
            "dataset_hash": self.dataset.hash,
            "steps": self.train.final_step,
            "accuracy": self.report.metrics.get("accuracy"),
            "base_accuracy": self.base_report.metrics.get("accuracy"),
            "model": f"{self.version.name} v{self.version.version}",
            "aliases": self.version.aliases,
            "decision": self.version.decision,
            "checkpoint": self.train.checkpoint.uri if self.train.checkpoint else None,
            "seconds": round(self.seconds, 1),
        }


def run_pipeline(config_files: Sequence[str], overrides: Sequence[str] = (), run_id: str | None = None,
                 on_line: LineSink | None = None) -> PipelineOutcome:
    """The whole pipeline in plain Python (the Prefect flow is the same chain with tasks around each step)."""
    start = time.monotonic()
    run = resolve(config_files, overrides, run_id)
    cfg = run.cfg
    dataset = prepare(cfg)
    cluster = provision(cfg, run.run_id)
    try:
        result = train(cfg, dataset, cluster, run.run_id, on_line=on_line)
        base = evaluate_base(cfg, dataset)
        report = evaluate(cfg, result.model_uri, dataset, run.run_id)
        version = register(cfg, run.run_id, dataset, result, report, base)
    except BaseException as e:
        mark_failed(cfg, run.run_id, e)
        raise
    finally:
        teardown(cfg, cluster)
    return PipelineOutcome(run.run_id, dataset, result, report, base, version, time.monotonic() - start)


def describe(outcome: PipelineOutcome) -> str:
    return json.dumps(outcome.summary(), indent=1)
