"""Record a finished pipeline run in MLflow and register its model (idempotent: retries add nothing twice)."""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from mlflow.entities.model_registry import ModelVersion as MlflowModelVersion
from mlflow.tracking import MlflowClient

from verl_grpo import runs
from verl_grpo.chain import Outcome
from verl_grpo.comparison import EvalTables, MetricChange, compare_to_base, eval_table, grpo_line, side_by_side
from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, RunCost, TrainResult
from verl_grpo.evaluate.models import resolve_model_dir
from verl_grpo.mirrors import RunMetrics
from verl_grpo.registry import plots, tracking
from verl_grpo.registry.eval_records import log_eval_records
from verl_grpo.registry.leaderboard import (
    COMPARED_TO_TAG,
    DECISION_TAG,
    MODEL_VERSION_TAG,
    compare_route,
    ensure_leaderboard_view,
)
from verl_grpo.registry.lines import (
    BASE_MODEL_TAG,
    COMPARABILITY_TAG,
    DATASET_NAME_TAG,
    other_line_reason,
    run_line,
    version_line,
)
from verl_grpo.registry.mirroring import mirror_registered
from verl_grpo.registry.promotion import FIRST, INCOMPARABLE, OTHER_LINE, PROMOTED, Decision, decide
from verl_grpo.registry.secrets import assert_no_secrets
from verl_grpo.registry.versions import (
    MODEL_URI_TAG,
    ensure_registered_model,
    find_or_create_version,
    log_hf_model,
    version_by_alias,
)
from verl_grpo.reward_curve import curve_markdown, reward_curve
from verl_grpo.store import Store, strip_scheme
from verl_grpo.store_layout import DATASET_MANIFEST, DATASET_REJECTED, run_config, run_reward_curve
from verl_grpo.trainers.signal import run_findings
from verl_grpo.trainers.worker.samples import sample_rows, stored_samples

log = logging.getLogger(__name__)

CHAMPION, CHALLENGER = "champion", "challenger"
RUN_NOTE_TAG = "mlflow.note.content"
"""MLflow's run description (the run page's Description; the runs table's tooltip)."""
EVAL_ARTIFACT_DIR = "eval"
TRAIN_SAMPLES_ARTIFACT = "train/samples.json"
"""The run's training samples (samples.jsonl, every sampled step) as a table MLflow's UI renders."""
EVAL_SUMMARY_ARTIFACT = "eval/summary.json"
"""Each eval metric of base, (warm start,) trained and their differences: the Prefect `eval-results` table."""
SETTINGS_TAG, SPLIT_TAG = "eval.settings_key", "eval.split"
FINAL_STEP_METRIC = tracking.value_name("train", "final_step")
VERSION_TAGS = (tracking.RUN_ID_TAG, MODEL_URI_TAG, "dataset.hash", BASE_MODEL_TAG, "config.digest",
                COMPARABILITY_TAG, SETTINGS_TAG)
"""Run tags a registered version repeats (plus `promotion.decision`): its lineage, its line (which champion it may
displace, see registry.lines) and its eval settings key (which evals compare as they are). The numbers stay on
the linked run, where MLflow's Compare and `verl-grpo models compare` read them."""
REGISTERED_MODEL_ABOUT = ("GRPO post-trained models of verl-grpo. Each version is the model of one pipeline run; "
                          "`champion` moves to a version of the same base model and dataset (tag `comparability`) "
                          "only when it is significantly better (McNemar) on the same problems.")


def register_run(outcome: Outcome, *, tags: Mapping[str, str], champion_report: EvalReport | None = None,
                 cloud_cost: RunCost | None = None) -> ModelVersion:
    """Log the run of a chain outcome through evaluation (params, training curves, eval metrics, artifacts, model)
    and register its model version.

    The new version gets alias `challenger` unless the champion is of another line (base model, dataset: see
    registry.lines; then it is registered and nothing else); `champion` moves to it when there is none yet, or
    when it beats the champion of its line on the same problems and settings with McNemar p <
    `tracking.promotion_p_value`. `champion_report` is the champion re-evaluated with this run's settings, for when
    the champion's own eval used other settings.
    `cloud_cost` (the run's actual cloud cost, SkyPilot provider) goes on the run as `cloud.*` metrics and
    `cloud.*` params. The run's warm-start report (when it had one) goes beside base and trained (`warm_start.*`,
    paired p-values under `pvalue.*`), and the decision says what GRPO added over it.
    """
    assert_no_secrets(tags, "register_run tags")
    if outcome.evals is None:
        raise ValueError(f"run {outcome.run.run_id}: register_run needs the run's evals")
    with tracking.infra_errors(outcome.run.cfg.tracking.mlflow_uri):
        return _register(outcome, tags, champion_report, cloud_cost)


def _register(outcome: Outcome, tags: Mapping[str, str], champion_report: EvalReport | None,
              cloud_cost: RunCost | None) -> ModelVersion:
    started = time.monotonic()
    store = outcome.run.store
    cfg, run_id, dataset, train = outcome.run.cfg, outcome.run.run_id, outcome.dataset, outcome.train
    report, base_report, warm_start_report = outcome.evals.trained, outcome.evals.base, outcome.evals.warm_start
    client = tracking.client_for(cfg.tracking.mlflow_uri)
    exp_id = tracking.experiment_id(client, cfg.experiment_name,
                                    tracking.artifact_location(cfg.tracking.mlflow_uri, cfg.experiment_name))
    ensure_leaderboard_view(client, exp_id)
    run_tags = _run_tags(cfg, run_id, dataset, train, report, tags)
    # The MLflow run spans the training: it starts when training did and ends with this registration.
    mlflow_run_id = tracking.find_or_create_run(client, exp_id, run_id, run_tags,
                                                started_at=runs.training_started_at(store, run_id))
    tracking.set_tags(client, mlflow_run_id, run_tags)
    tracking.log_params(client, mlflow_run_id, cfg.params())
    tracking.log_dataset_input(client, mlflow_run_id, dataset)
    tracking.log_training_metrics(client, mlflow_run_id, store, train.metrics_uri)
    name = cfg.registered_model_name
    model = log_hf_model(client, exp_id, mlflow_run_id, resolve_model_dir(train.model_uri, store), f"{name} ({run_id})",
                         step=train.final_step)
    tables = EvalTables(store)
    changes = compare_to_base(report, base_report, tables, warm_start_report)
    summary = eval_summary(report, base_report, warm_start_report)
    metrics = {**summary, **p_value_metrics(changes), FINAL_STEP_METRIC: train.final_step}
    if (plain := outcome.evals.trained_without_tools) is not None:
        metrics.update(without_tools_metrics(plain, compare_to_base(report, plain, tables)))
    tracking.log_metrics(client, mlflow_run_id, metrics, step=train.final_step, model_id=model.model_id)
    _log_artifacts(client, mlflow_run_id, outcome, store, tables)
    # The held-out rows as evaluation traces: MLflow's run page lists them and compares two runs row by row.
    log_eval_records(client, exp_id, mlflow_run_id, tables.of(report), report.split,
                     tables.of(base_report) if base_report is not None else None)
    if cloud_cost is not None:
        tracking.log_metrics(client, mlflow_run_id, cloud_cost_metrics(cloud_cost), step=train.final_step)
        tracking.log_params(client, mlflow_run_id, {"cloud.pricing": cloud_cost.pricing,
                                                    "cloud.priced_at": cloud_cost.priced_at})

    ensure_registered_model(client, name, REGISTERED_MODEL_ABOUT)
    version_tags = {key: run_tags[key] for key in VERSION_TAGS}
    version, created = find_or_create_version(client, name, mlflow_run_id, model, train.model_uri, version_tags)
    metric_lines = tracking.read_lines(store, train.metrics_uri) or []
    health = run_findings((json.loads(line) for line in metric_lines if line.strip()), cfg.trainer.no_signal_steps,
                          cfg.algorithm.max_response_length)
    for finding in health:
        log.warning("run %s: %s", run_id, finding)
    decision = _recorded_decision(client, name, version, report)
    if decision is None:
        champion = version_by_alias(client, name, CHAMPION)
        decision = _decide(client, name, version, report, tables, champion_report, cfg.tracking.promotion_p_value)
        if champion is not None and decision.comparison is not None:  # the run it was compared with
            tracking.set_tags(client, mlflow_run_id, {COMPARED_TO_TAG: champion.run_id})
        if attribution := grpo_line(changes):
            decision = dataclasses.replace(decision, reason=f"{decision.reason}; {attribution}")
        _record_decision(client, name, version, report, decision, health)
    if decision.code != OTHER_LINE:  # `challenger`: the latest contender for this line's champion, never the champion
        if CHAMPION in client.get_model_version(name, version.version).aliases:
            client.delete_registered_model_alias(name, CHALLENGER)  # none is left: the latest one was promoted
        else:
            client.set_registered_model_alias(name, CHALLENGER, version.version)
    # The runs table and the run page show the outcome where comparisons happen: the description, a decision column.
    compared = client.get_run(mlflow_run_id).data.tags.get(COMPARED_TO_TAG)
    compare = (f"\n\n[Compare with the champion's run](#{compare_route(exp_id, mlflow_run_id, compared)})"
               if compared else "")
    tracking.set_tags(client, mlflow_run_id, {
        RUN_NOTE_TAG: f"**{name} v{version.version}**: {decision.reason}\n\n{_headline(report)}"
                      + compare + _warning_paragraphs(health),
        MODEL_VERSION_TAG: f"{name} v{version.version}",
        DECISION_TAG: decision.code})  # the version's tag, on its run too: a column the runs table can show
    client.set_terminated(mlflow_run_id, "FINISHED")
    # Last, once the version is registered: a mirror is best effort and its failure is a result, not an error.
    mirrored = mirror_registered(client, mlflow_run_id,
                                 RunMetrics(cfg, run_id, metric_lines, summary))
    aliases = client.get_model_version(name, version.version).aliases
    log.info("registered %s v%s (%s) in %.1fs: %s", name, version.version, "new" if created else "existing",
             time.monotonic() - started, decision.reason)
    return ModelVersion(name=name, version=str(version.version), aliases=sorted(aliases), mlflow_run_id=mlflow_run_id,
                        decision=decision.reason, mirrors=mirrored, cloud_cost=cloud_cost, health=health)


def cloud_cost_metrics(cost: RunCost) -> dict[str, float]:
    """`cloud.node_hours`, `cloud.run_hours`, `cloud.recoveries`, `cloud.jobs` and `cloud.cost_usd` (when priced)."""
    metrics = {"node_hours": cost.node_hours, "run_hours": cost.run_hours, "recoveries": float(cost.recoveries),
               "jobs": float(cost.jobs)} | ({"cost_usd": cost.cost_usd} if cost.cost_usd is not None else {})
    return {tracking.value_name("cloud", k): v for k, v in metrics.items()}


def champion_needs_reeval(cfg: RunConfig, report: EvalReport) -> bool:
    """True when a champion of this run's line exists but was evaluated with other settings than `report`; a
    champion of another line is never re-evaluated (it is not compared at all)."""
    client = tracking.client_for(cfg.tracking.mlflow_uri)
    champion = version_by_alias(client, cfg.registered_model_name, CHAMPION)
    if champion is None or version_line(client, champion) != run_line(cfg):
        return False
    return champion.tags.get(SETTINGS_TAG) != report.settings_key


def eval_summary(report: EvalReport, base_report: EvalReport | None,
                 warm_start_report: EvalReport | None = None) -> dict[str, float]:
    """`eval.<m>`, with a base report `base.<m>` and `delta.<m>` (eval minus base) for shared metrics, and with a
    warm-start report `warm_start.<m>` and `delta_grpo.<m>` (eval minus warm start: what GRPO added); single values,
    named by `tracking.value_name`."""
    name = tracking.value_name
    out = {name("eval", k): v for k, v in report.metrics.items()}
    for prefix, delta, earlier in (("base", "delta", base_report), ("warm_start", "delta_grpo", warm_start_report)):
        if earlier is not None:
            out.update({name(prefix, k): v for k, v in earlier.metrics.items()})
            out.update({name(delta, k): v - earlier.metrics[k] for k, v in report.metrics.items()
                        if k in earlier.metrics and k != "n"})
    return out


def without_tools_metrics(plain: EvalReport, changes: list[MetricChange]) -> dict[str, float]:
    """`without_tools.<m>` (the trained model with no tool offered) and `pvalue.with_vs_without_tools.<m>`."""
    out = {tracking.value_name("without_tools", k): v for k, v in plain.metrics.items()}
    out.update({tracking.value_name("pvalue", "with_vs_without_tools", c.metric): c.p_value for c in changes
                if c.p_value is not None})
    return out


def p_value_metrics(changes: list[MetricChange]) -> dict[str, float]:
    """The paired tests' p-values: `pvalue.trained_vs_base.<m>`, and for a run with a warm start
    `pvalue.warm_start_vs_base.<m>` and `pvalue.trained_vs_warm_start.<m>` (GRPO's own effect)."""
    out = {}
    for c in changes:
        for name, p in (("trained_vs_base", c.p_value), ("warm_start_vs_base", c.warm_start_p_value),
                        ("trained_vs_warm_start", c.grpo_p_value)):
            if p is not None:
                out[tracking.value_name("pvalue", name, c.metric)] = p
    return out


def _run_tags(cfg: RunConfig, run_id: str, dataset: DatasetVersion, train: TrainResult, report: EvalReport,
              extra: Mapping[str, str]) -> dict[str, str]:
    tags = {
        tracking.RUN_ID_TAG: run_id,
        DATASET_NAME_TAG: cfg.task,
        "dataset.hash": dataset.hash,
        "trainer.backend": cfg.trainer.backend,
        "infra.provider": cfg.infra.provider,
        BASE_MODEL_TAG: cfg.model.name,
        COMPARABILITY_TAG: run_line(cfg).key,
        "checkpoint_uri": train.checkpoint.uri if train.checkpoint else train.model_uri,
        MODEL_URI_TAG: train.model_uri,
        "config.digest": cfg.digest(),
        SETTINGS_TAG: report.settings_key,
        SPLIT_TAG: report.split,
        **tracking.source_tags(),
    }
    return {**{str(k): str(v) for k, v in extra.items()}, **tags}


REJECTED_ARTIFACT = "data/rejected.json"


def _log_artifacts(client: MlflowClient, mlflow_run_id: str, outcome: Outcome, store: Store,
                   tables: EvalTables) -> None:
    """config.yaml, the data manifest, the eval tables + reports (file names: `<split>` for the trained model's,
    `base-<split>`, `warm_start-<split>`), the two PNG charts and the reward curve as a markdown table (re-logging
    overwrites). The reward curve PNG is also kept in the store beside the run."""
    cfg, run_id, dataset, metrics_uri = outcome.run.cfg, outcome.run.run_id, outcome.dataset, outcome.train.metrics_uri
    report, base_report, warm = outcome.evals.trained, outcome.evals.base, outcome.evals.warm_start
    reports = {"": report, "base-": base_report, "warm_start-": warm}
    with tempfile.TemporaryDirectory(prefix="verl-grpo-artifacts-") as tmp:
        root = Path(tmp)
        lines = tracking.read_lines(store, metrics_uri) or []
        if png := plots.reward_curve(lines, root / "plots" / "reward_curve.png"):
            store.put_file(png, run_reward_curve(run_id))
        if curve := reward_curve(lines):
            (root / "reward_curve.md").write_text(curve_markdown(curve) + "\n")
        plots.accuracy_vs_base(report, base_report, root / "plots" / "accuracy_vs_base.png", warm)
        config_rel = run_config(run_id)
        (root / "config.yaml").write_text(store.read_text(config_rel) if store.exists(config_rel) else cfg.to_yaml())
        manifest = f"{strip_scheme(dataset.uri).rstrip('/')}/{DATASET_MANIFEST}"
        if store.fs.exists(manifest):
            (root / "data").mkdir()
            store.fs.get_file(manifest, str(root / "data" / DATASET_MANIFEST))
        evals = root / EVAL_ARTIFACT_DIR
        evals.mkdir()
        for prefix, rep in reports.items():
            if rep is None:
                continue
            store.fs.get_file(strip_scheme(rep.table_uri), str(evals / f"{prefix}{rep.split}.parquet"))
            (evals / f"{prefix}{rep.split}.json").write_text(rep.model_dump_json(indent=2))
        client.log_artifacts(mlflow_run_id, str(root))
    if base_report is not None:  # the run's single values as one table, beside their one-dot charts
        client.log_table(mlflow_run_id, pd.DataFrame(eval_table(report, base_report, warm)), EVAL_SUMMARY_ARTIFACT)
    if base_report is not None:  # a table MLflow's UI renders (parquet it cannot preview): problems that flipped first
        table = side_by_side(tables.of(report), tables.of(base_report), tables.of(warm) if warm is not None else None)
        client.log_table(mlflow_run_id, table, f"{EVAL_ARTIFACT_DIR}/{report.split}-side_by_side.json")
    if samples := sample_rows(stored_samples(store, run_id)):  # what the model wrote while it trained
        client.log_table(mlflow_run_id, pd.DataFrame(samples), TRAIN_SAMPLES_ARTIFACT)
    if dataset.rejected:  # the quarantined rows, each with its reason, as a table MLflow's UI shows
        with store.fs.open(f"{strip_scheme(dataset.uri).rstrip('/')}/{DATASET_REJECTED}", "rb") as f:
            client.log_table(mlflow_run_id, pd.read_parquet(f), REJECTED_ARTIFACT)


def _recorded_decision(client: MlflowClient, name: str, version: MlflowModelVersion,
                       report: EvalReport) -> Decision | None:
    """The decision a registration of this version recorded before (None for a new version): a retry does not
    decide again, it only redoes the champion move that a crash may have cut off."""
    recorded = version.tags.get(DECISION_TAG)
    if not recorded:
        return None
    champion = version_by_alias(client, name, CHAMPION)
    # The crash may have come before the move; a newer champion has since replaced this one.
    if recorded in (FIRST, PROMOTED) and (champion is None or int(champion.version) < int(version.version)):
        _crown(client, name, version, report)
    return Decision(recorded, (version.description or recorded).split("\n\n", 1)[0])  # the reason paragraph


def _decide(client: MlflowClient, name: str, version: MlflowModelVersion, report: EvalReport, tables: EvalTables,
            champion_report: EvalReport | None, p_threshold: float) -> Decision:
    """First model, other line, incomparable settings, or McNemar against the champion of this version's line."""
    champion = version_by_alias(client, name, CHAMPION)
    label = f"v{version.version}"
    if champion is None or champion.version == version.version:
        return Decision(FIRST, f"{label} is the first model: it becomes the champion ({_headline(report)})")
    if (champion_line := version_line(client, champion)) != (line := version_line(client, version)):
        return Decision(OTHER_LINE, other_line_reason(f"v{champion.version}", champion_line, label, line))
    champ_label = f"v{champion.version}"
    champ_table = _champion_table(client, champion, report, tables, champion_report)
    if champ_table is None:
        return Decision(INCOMPARABLE, f"kept champion {champ_label}: it was evaluated with other settings "
                        f"({champion.tags.get(SETTINGS_TAG)} vs {report.settings_key}); pass the champion "
                        "re-evaluated with these settings as champion_report to compare")
    return decide(tables.of(report), champ_table, p_threshold=p_threshold, challenger_label=label,
                  champion_label=champ_label)


def _record_decision(client: MlflowClient, name: str, version: MlflowModelVersion, report: EvalReport,
                     decision: Decision, health: Sequence[str]) -> None:
    """The decision's numbers as metrics of the version's run; its reason, with a warning paragraph per training
    finding, as the version's description; its code as the `promotion.decision` tag; `champion` moved on a win."""
    tracking.log_metrics(client, version.run_id, decision.metrics())
    # The decision tag last: a retry that finds it has the description too and only redoes the alias move.
    client.update_model_version(name, version.version, description=decision.reason + _warning_paragraphs(health))
    client.set_model_version_tag(name, version.version, DECISION_TAG, decision.code)
    if decision.promoted:
        _crown(client, name, version, report)


def _warning_paragraphs(health: Sequence[str]) -> str:
    """Markdown paragraphs, one per training finding, for a description that opens with its own paragraph."""
    return "".join(f"\n\n**Warning:** {finding}" for finding in health)


def _crown(client: MlflowClient, name: str, version: MlflowModelVersion, report: EvalReport) -> None:
    """Point `champion` at `version` and name it, with its headline metric, in the registered model's description."""
    client.set_registered_model_alias(name, CHAMPION, version.version)
    champion = f"Champion: v{version.version} ({_headline(report)}, run {version.tags.get(tracking.RUN_ID_TAG)})."
    line = version_line(client, version)
    if line is not None:
        champion += f" Line: {line.label}; only versions of that base model and dataset compete with it."
    client.update_registered_model(name, description=f"{champion}\n\n{REGISTERED_MODEL_ABOUT}")


def _headline(report: EvalReport) -> str:
    return f"accuracy {report.metrics.get('accuracy', float('nan')):.3f} on {report.split}, n={report.n}"


def _champion_table(client: MlflowClient, champion: MlflowModelVersion, report: EvalReport, tables: EvalTables,
                    champion_report: EvalReport | None) -> pd.DataFrame | None:
    """The champion's per-problem results under the challenger's settings, or None when there are none."""
    if champion_report is not None and champion_report.settings_key == report.settings_key:
        return tables.of(champion_report)
    if champion.tags.get(SETTINGS_TAG) != report.settings_key:  # the key covers the split
        return None
    with tempfile.TemporaryDirectory(prefix="verl-grpo-champion-") as tmp:
        path = client.download_artifacts(champion.run_id, f"{EVAL_ARTIFACT_DIR}/{report.split}.parquet", tmp)
        return pd.read_parquet(path)
