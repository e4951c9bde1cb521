"""The pipeline's steps as plain functions: each Prefect task in tasks/ wraps exactly one of these.

Every step takes the run as resolved once (`chain.ResolvedRun`) and small serialisable records, so a step can run
in another process or be retried alone. The order of the steps is `chain.run_chain`'s; `PlainSteps` runs them
as these functions, `run_pipeline` is the whole chain without Prefect (benchmarks, debugging).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from verl_grpo import extras, runs
from verl_grpo.chain import Evals, Outcome, ResolvedRun, run_chain
from verl_grpo.config import RunConfig, load_config
from verl_grpo.contracts import Cluster, DatasetVersion, EvalReport, ModelVersion, RunCost, TrainResult
from verl_grpo.data.task_check import check_task
from verl_grpo.errors import Preempted, error_class
from verl_grpo.eval_plan import BASE, TRAINED, TRAINED_WITHOUT_TOOLS, WARM_START, eval_plan
from verl_grpo.local_paths import ensure_local_dirs, ensure_state_dir
from verl_grpo.providers.base import LineSink
from verl_grpo.store import Store
from verl_grpo.store_layout import train_result
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.signal import NoSignalWatch

log = logging.getLogger(__name__)



ProgressSink = Callable[[TrainProgress], None]


def resolve(config_files: Sequence[str], overrides: Sequence[str] = (), run_id: str | None = None,
            fresh: bool = False) -> ResolvedRun:
    """Load and validate the config, check the optional mirrors' settings (mirrors.preflight), pick the run id
    (runs.begin_run: a given run id must exist unless fresh), and store the run's resolved config: once per run."""
    from verl_grpo import mirrors

    cfg = load_config(config_files, overrides)
    mirrors.preflight()  # a bad WANDB_API_KEY fails here, not in the register step after the training was paid for
    prepare_local_state(cfg, data=True)
    store = Store.from_config(cfg.storage)
    run_id, resumed = runs.begin_run(store, cfg, run_id, fresh=fresh)
    return ResolvedRun(cfg=cfg, run_id=run_id, resumed=resumed)


def prepare_local_state(cfg: RunConfig, data: bool = False) -> None:
    """The extras the config needs (`extras.check_config`), the state dir, and the local directories the config
    names (a `file://` store, a SQLite MLflow DB), created before any library touches them; a missing extra or a
    path that cannot be made fails here in one line. With `data` (a run about to start), so does a data mirror that
    lacks the dataset (`check_mirror`)."""
    extras.check_config(cfg)
    ensure_state_dir()
    ensure_local_dirs({"storage.uri": cfg.storage.uri, "tracking.mlflow_uri": cfg.tracking.mlflow_uri})
    if data:
        check_task(cfg)


def prepare(cfg: RunConfig) -> DatasetVersion:
    """Prepare (or find cached) verl-format parquet for cfg.dataset, prompts measured by the model's tokenizer."""
    from verl_grpo.data import prepare_dataset
    from verl_grpo.models import load_tokenizer

    return prepare_dataset(cfg, Store.from_config(cfg.storage), tokenizer=load_tokenizer(cfg.model.name))


def provision(run: ResolvedRun) -> Cluster:
    from verl_grpo.providers import get_provider

    return get_provider(run.cfg.infra.provider).up(run.cfg, run.run_id)


def train(run: ResolvedRun, dataset: DatasetVersion, cluster: Cluster, on_line: LineSink | None = None,
          on_progress: ProgressSink | None = None) -> TrainResult:
    """Plan the backend's command, run it on the cluster, stream its log; resumes from the latest checkpoint.

    on_line gets every log line; on_progress gets a TrainProgress for every step line the trainer logs. For a backend
    whose processes do not watch the learning signal themselves (`signal_watched_in_log`: verl), its step lines
    feed a NoSignalWatch here: its warning goes to on_line, and with trainer.stop_on_no_signal the job is cancelled.

    Raises Preempted when the job's process or machines were taken away (a retry resumes), TrainingError
    when the training code failed or the run stopped for want of a learning signal.
    """
    from verl_grpo.providers import follow_job, get_provider
    from verl_grpo.trainers import get_trainer

    cfg, run_id, store = run.cfg, run.run_id, run.store
    runs.mark_training_started(store, run_id)
    trainer = get_trainer(cfg.trainer.backend)
    spec = trainer.plan(cfg, dataset, store, run_id, cluster)
    provider = get_provider(cfg.infra.provider)
    sink = on_line or log.info
    watch = NoSignalWatch.from_config(cfg) if getattr(trainer, "signal_watched_in_log", False) else None

    def each_line(line: str) -> None:
        sink(line)
        if on_progress is None and watch is None:
            return
        if (progress := trainer.parse_progress(line, spec.total_steps)) is None:
            return
        if on_progress is not None:
            on_progress(progress)
        # A TrainingError from the watch (stop_on_no_signal) makes follow_job cancel the job, then propagates.
        if watch is not None and (warning := watch.observe({"step": progress.step, **progress.metrics})):
            sink(warning)

    state = follow_job(provider, provider.submit(cluster, spec), each_line)
    if state.phase == "SUCCEEDED":
        return TrainResult.model_validate_json(store.read_text(train_result(run_id)))
    if state.preempted:
        raise Preempted(f"run {run_id}: {state.failure_reason}; a retry resumes from the last committed checkpoint")
    raise error_class(state.error_type)(f"run {run_id}: training failed ({state.phase}): {state.failure_reason}")


def register(run: ResolvedRun, dataset: DatasetVersion, result: TrainResult, evals: Evals,
             tags: dict[str, str] | None = None) -> ModelVersion:
    """MLflow run + registered model version (idempotent); the champion is re-evaluated first when tonight's eval
    settings differ from its own."""
    from verl_grpo.held_out import evaluate_champion
    from verl_grpo.registry import champion_needs_reeval, register_run

    cfg = run.cfg
    champion_report = evaluate_champion(cfg, dataset) if champion_needs_reeval(cfg, evals.trained) else None
    version = register_run(Outcome(run, dataset, result, evals), tags=tags or {}, champion_report=champion_report,
                           cloud_cost=cloud_cost(run))
    runs.mark_run(run.store, run.run_id, "completed", model_version=version.version, model_name=version.name)
    return version


def cloud_cost(run: ResolvedRun) -> RunCost | None:
    """The run's actual cloud cost from its jobs' timelines, for a provider that bills (SkyPilot); else None.
    Informational: a failure to measure it is logged and does not stop the model's registration."""
    from verl_grpo.providers import get_provider

    try:
        return get_provider(run.cfg.infra.provider).run_cost(run.cfg, run.run_id)
    except Exception as e:
        log.warning("run %s: cloud cost not measured (%s: %s)", run.run_id, type(e).__name__, e)
        return None


def teardown(run: ResolvedRun, cluster: Cluster) -> None:
    """The cluster down, and the services this process started for its evaluations (evaluate.eval_tools)."""
    from verl_grpo.evaluate.eval_tools import stop_eval_services
    from verl_grpo.providers import get_provider

    try:
        get_provider(run.cfg.infra.provider).down(cluster)
    finally:
        stop_eval_services()


@dataclass
class PlainSteps:
    """The chain's steps as the functions above, one after another in this process (evals not sharded)."""

    on_line: LineSink | None = None

    def prepare(self, run: ResolvedRun) -> DatasetVersion:
        return prepare(run.cfg)

    def provision(self, run: ResolvedRun) -> Cluster:
        return provision(run)

    def train(self, run: ResolvedRun, dataset: DatasetVersion, cluster: Cluster) -> TrainResult:
        return train(run, dataset, cluster, on_line=self.on_line)

    def evaluate(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult) -> Evals:
        """The evals of the run's eval plan (eval_plan.eval_plan), one after another in the plan's order."""
        from verl_grpo.held_out import (
            evaluate_base,
            evaluate_cached_model,
            evaluate_trained,
            evaluate_trained_without_tools,
            warm_start_model,
            without_tools_after_trained,
        )

        cfg = run.cfg
        warm_uri = warm_start_model(cfg, run.run_id)
        run_eval: dict[str, Callable[[], EvalReport | None]] = {
            BASE: lambda: evaluate_base(cfg, dataset),
            WARM_START: lambda: evaluate_cached_model(cfg, dataset, warm_uri),
            TRAINED: lambda: evaluate_trained(cfg, dataset, run.run_id, result.model_uri, on_line=self.on_line),
            TRAINED_WITHOUT_TOOLS: lambda: evaluate_trained_without_tools(cfg, dataset, run.run_id, result.model_uri),
        }
        plan = eval_plan(cfg, warm_start=bool(warm_uri), without_tools_after_trained=without_tools_after_trained(cfg))
        return Evals(**{step.name: run_eval[step.name]() for step in plan})

    def register(self, run: ResolvedRun, dataset: DatasetVersion, result: TrainResult, evals: Evals) -> ModelVersion:
        return register(run, dataset, result, evals)

    def teardown(self, run: ResolvedRun, cluster: Cluster) -> None:
        teardown(run, cluster)


def run_pipeline(config_files: Sequence[str], overrides: Sequence[str] = (), run_id: str | None = None,
                 on_line: LineSink | None = None) -> Outcome:
    """The whole pipeline in plain Python: the Prefect flow's chain with plain functions for tasks."""
    return run_chain(resolve(config_files, overrides, run_id), PlainSteps(on_line))
