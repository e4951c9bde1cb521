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


VERSION_COLUMNS = ("version", "aliases", "accuracy", "delta_accuracy", "steps", "dataset_hash", "decision", "created")


def versions_table(rows: list[dict]) -> str:
    """Registered versions as an aligned text table (the same rows feed the Prefect table artifact)."""
    cells = [[_cell(row.get(col)) for col in VERSION_COLUMNS] for row in rows]
    headers = ["version", "aliases", "accuracy", "delta vs base", "steps", "dataset", "decision", "created"]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(c) for c in cells)])


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ",".join(value) or "-"
    if isinstance(value, float):
        return f"{value:+.4f}" if value < 0 else f"{value:.4f}"
    return "-" if value in (None, "") else str(value)[:48]
