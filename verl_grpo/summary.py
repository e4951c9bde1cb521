"""Human-readable run summary (markdown), shared by the CLI and the Prefect artifact."""

from __future__ import annotations

from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, TrainResult


def summary_dict(cfg: RunConfig, run_id: str, dataset: DatasetVersion, result: TrainResult, report: EvalReport,
                 base: EvalReport, version: ModelVersion) -> dict:
    acc, base_acc = report.metrics.get("accuracy"), base.metrics.get("accuracy")
    return {
        "run_id": run_id,
        "config_digest": cfg.digest(),
        "dataset": f"{dataset.name}@{dataset.hash}",
        "model": cfg.model.name,
        "steps": result.final_step,
        "eval_split": f"{report.split} (n={report.n})",
        "accuracy": acc,
        "base_accuracy": base_acc,
        "delta": None if acc is None or base_acc is None else acc - base_acc,
        "registered": f"{version.name} v{version.version}",
        "aliases": ", ".join(version.aliases),
        "decision": version.decision,
        "checkpoint": result.checkpoint.uri if result.checkpoint else "",
        "model_uri": result.model_uri,
        "mlflow_run_id": version.mlflow_run_id,
    }


def summary_markdown(summary: dict) -> str:
    rows = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in summary.items())
    return f"# verl-grpo run `{summary['run_id']}`\n\n| | |\n|---|---|\n{rows}\n"


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:+.4f}" if v < 0 else f"{v:.4f}"
    return "" if v is None else str(v)
