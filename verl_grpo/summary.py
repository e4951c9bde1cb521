"""Human-readable run summary (markdown), shared by the CLI and the Prefect artifact."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from verl_grpo.chain import Outcome
from verl_grpo.comparison import MetricChange, grpo_line, tools_line
from verl_grpo.config import RunConfig
from verl_grpo.config.placement import placement
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion
from verl_grpo.mirrors import warning_line
from verl_grpo.reward_curve import curve_markdown, curve_text
from verl_grpo.store_layout import DATASET_REJECTED


def summary_dict(outcome: Outcome, changes: Sequence[MetricChange] = (), curve: dict | None = None,
                 curve_png: str = "", without_tools: Sequence[MetricChange] = ()) -> dict:
    """A registered run's outcome as flat facts, plus `metrics`: base → (warm start →) trained per eval metric with
    the paired p-value of each step, `grpo` (what GRPO added over the warm start, "" without one), `tools` (what the
    search tool carries, from `without_tools`: the trained model compared to itself without the tool; "" without)
    and `reward_curve` (verl_grpo.reward_curve.reward_curve of the run's metrics; None when it logged no reward)."""
    if outcome.evals is None or outcome.version is None:
        raise ValueError(f"run {outcome.run.run_id}: a summary needs the run's evals and registered version")
    cfg, run_id, dataset, result = outcome.run.cfg, outcome.run.run_id, outcome.dataset, outcome.train
    report, base, warm_start, version = (outcome.evals.trained, outcome.evals.base, outcome.evals.warm_start,
                                         outcome.version)
    acc, base_acc = report.metrics.get("accuracy"), base.metrics.get("accuracy")
    return {
        "run_id": run_id,
        "config_digest": cfg.digest(),
        "dataset": f"{dataset.name}@{dataset.hash}",
        "quarantined": quarantine_line(dataset),
        "model": cfg.model.name,
        "steps": result.final_step,
        "eval_split": f"{report.split} (n={report.n})",
        "accuracy": acc,
        "base_accuracy": base_acc,
        "delta": None if acc is None or base_acc is None else acc - base_acc,
        **({"warm_start_accuracy": warm_start.metrics.get("accuracy")} if warm_start is not None else {}),
        "grpo": grpo_line(list(changes)),
        "tools": tools_line(list(without_tools), report),
        "registered": f"{version.name} v{version.version}",
        "aliases": ", ".join(version.aliases),
        "decision": version.decision,
        "checkpoint": result.checkpoint.uri if result.checkpoint else "",
        "model_uri": result.model_uri,
        "mlflow_run_id": version.mlflow_run_id,
        "mirrors": ", ".join(f"{m.name} {m.where if m.ok else 'FAILED'}" for m in version.mirrors),
        "warnings": [*version.health, *(version.cloud_cost.warnings if version.cloud_cost else []),
                     *(warning_line(m, run_id) for m in version.mirrors if not m.ok),
                     *reward_failure_lines(cfg, result.summary, report)],
        "warm_start": warm_start_line(result.summary),
        "async_loop": async_loop_lines(result.summary),
        "reward_curve_png": curve_png,
        "reward_curve": curve,
        "metrics": [{"metric": c.metric, "base": c.base, "trained": c.trained, "delta": c.delta,
                     "p_value": c.p_value, "test": c.test,
                     **({"warm_start": c.warm_start, "warm_start_delta": c.warm_start_delta,
                         "warm_start_p_value": c.warm_start_p_value, "grpo_delta": c.grpo_delta,
                         "grpo_p_value": c.grpo_p_value} if warm_start is not None else {})} for c in changes],
        **cloud_cost_fact(cfg, version),
    }


def cloud_cost_fact(cfg: RunConfig, version: ModelVersion) -> dict[str, str]:
    """{"cloud_cost": the run's actual node-hours and $} on a billing provider (or why not, on an existing cluster);
    {} on the local provider."""
    if version.cloud_cost is not None:
        return {"cloud_cost": version.cloud_cost.line()}
    if cluster := placement(cfg).existing_cluster:
        return {"cloud_cost": f"not measured: the existing cluster {cluster} is billed whatever runs on it"}
    return {}


def quarantine_line(dataset: DatasetVersion) -> str:
    """How many rows preparation quarantined, by reason, and where they are listed ("" for none)."""
    if not dataset.rejected:
        return ""
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(dataset.rejected_by_reason.items(),
                                                                 key=lambda item: -item[1]))
    return f"{dataset.rejected} rows ({reasons or 'see the file'}), each with its reason in " \
           f"{dataset.uri}/{DATASET_REJECTED} and the MLflow run's data/ artifacts"


def reward_failure_lines(cfg: RunConfig, train_summary: dict, report: EvalReport) -> list[str]:
    """What the user's reward function failed on (each such row scored 0): training rows, and the share of the
    trained model's eval rows; nothing when it never failed."""
    if not cfg.reward.path:
        return []
    failed, share = train_summary.get("reward_failed_rows") or 0, report.metrics.get("reward/failed") or 0.0
    if not failed and not share:
        return []
    return [f"reward function {cfg.reward.name} in {cfg.reward.path} failed on {failed:g} training rows and "
            f"{share:.1%} of the eval rows (each scored 0; the first reason is in the training log)"]


def warm_start_line(train_summary: dict) -> str:
    """`40 SFT steps on 160 rewritten solutions, mean loss 1.1 (first steps) -> 0.8 (last steps), 307 s`, or ""."""
    if "warm_start_steps" not in train_summary:
        return ""
    s = train_summary
    return (f"{int(s['warm_start_steps'])} SFT steps on {int(s['warm_start_examples'])} rewritten solutions, "
            f"mean loss {s['warm_start_first_loss']:.4g} (first steps) -> {s['warm_start_final_loss']:.4g} "
            f"(last steps), {s['warm_start_seconds']:.0f} s")


def async_loop_lines(train_summary: dict) -> list[str]:
    """trainer.backend=loop's facts, one line each: the policy versions (trainer and every rollout server), the
    share of trained groups replayed from the buffer, and the largest staleness trained; [] for other backends."""
    if "policy_version" not in train_summary:
        return []
    s = train_summary
    servers = sorted((k for k in s if k.startswith("policy_version/server_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    per_server = ", ".join(f"{k.rsplit('/', 1)[1]} v{int(s[k])}" for k in servers) or "no server answered"
    return [f"policy versions   trainer v{int(s['policy_version'])}; {per_server}",
            f"replay share      {s.get('replay_share', 0.0):.3f} of trained groups",
            f"largest staleness {int(s.get('max_staleness', 0))} policy version(s)"
            f" ({int(s.get('dropped_stale', 0))} stale group(s) dropped)"]


STATE_MESSAGE_CHARS = 1000


def state_message(summary: dict) -> str:
    """The flow run's final state message, which Prefect's UI shows beside the state in the runs list and on the run
    page: each training finding or mirror failure first (`Warning: ...`, so a run that learned nothing does not read
    as a plain success), then the decision."""
    text = " ".join([*(f"Warning: {line}" for line in summary.get("warnings", [])), f"Decision: {summary['decision']}"])
    return text if len(text) <= STATE_MESSAGE_CHARS else text[: STATE_MESSAGE_CHARS - 1] + "…"


def outcome_lines(summary: dict) -> list[str]:
    """What a user reads first, one line each: the decision, the registered version, what GRPO added over the warm
    start (a run with one), each metric's change: `base -> trained (delta, p)`, or with a warm start
    `base -> warm start -> trained (warm start delta, p; GRPO delta, p)`."""
    lines = [f"decision: {summary['decision']}",
             f"registered: {summary['registered']} (aliases: {summary['aliases'] or '-'})"]
    if summary.get("grpo"):
        lines.append(summary["grpo"])
    if summary.get("tools"):
        lines.append(summary["tools"])
    for m in summary.get("metrics", []):
        if "warm_start" in m:
            steps = [(who, step) for who, step in (("warm start", "warm_start"), ("GRPO", "grpo"))
                     if m[f"{step}_delta"] is not None]
            detail = "; ".join(f"{who} {_fmt(m[f'{step}_delta'])}, {_p(m, f'{step}_p_value')}" for who, step in steps)
            lines.append(f"{m['metric']}: {_fmt(m['base']) or '-'} -> {_fmt(m['warm_start']) or '-'} -> "
                         f"{_fmt(m['trained']) or '-'}" + (f" ({detail})" if detail else ""))
            continue
        delta = f" ({_fmt(m['delta'])}, {_p(m)})" if m["delta"] is not None else ""
        lines.append(f"{m['metric']}: {_fmt(m['base']) or '-'} -> {_fmt(m['trained']) or '-'}{delta}")
    return lines


def metrics_heading(summary: dict) -> str:
    """What the metric lines of `outcome_lines` compare."""
    warm = any("warm_start" in m for m in summary.get("metrics", []))
    models = "base -> warm start -> trained" if warm else "base -> trained"
    return f"{models}, per eval metric (paired test on the same problems):"


def curve_lines(summary: dict) -> list[str]:
    """The reward curve as text lines (caption, header, rows) and where its PNG is; one line without a curve."""
    curve, png = summary.get("reward_curve"), summary.get("reward_curve_png")
    lines = [f"warm start: {summary['warm_start']}"] if summary.get("warm_start") else []
    lines += curve_text(curve).splitlines() if curve else ["reward curve: no reward was logged per step"]
    return [*lines, f"reward curve PNG: {png}"] if png else lines


def summary_markdown(summary: dict, mlflow_link: str) -> str:
    """The flow run's summary artifact: outcome, base → (warm start →) trained per metric, the reward curve, the
    run's facts."""
    rows = summary.get("metrics", [])
    if any("warm_start" in m for m in rows):
        header = ("| metric | base | warm start | trained | warm start - base | p-value | trained - warm start (GRPO) "
                  "| p-value |\n|---|---|---|---|---|---|---|---|")
        metrics = "\n".join(
            f"| {m['metric']} | {_fmt(m['base'])} | {_fmt(m['warm_start'])} | {_fmt(m['trained'])} | "
            f"{_fmt(m['warm_start_delta'])} | {_p(m, 'warm_start_p_value')} | "
            f"{_fmt(m['grpo_delta'])} | {_p(m, 'grpo_p_value')} |" for m in rows)
    else:
        header = "| metric | base | trained | delta | p-value |\n|---|---|---|---|---|"
        metrics = "\n".join(f"| {m['metric']} | {_fmt(m['base'])} | {_fmt(m['trained'])} | {_fmt(m['delta'])} | "
                            f"{_p(m)} |"
                            for m in rows)
    grpo = f"**GRPO's own share:** {summary['grpo']}\n\n" if summary.get("grpo") else ""
    grpo += f"**Search tool:** {summary['tools'].removeprefix('search tool: ')}\n\n" if summary.get("tools") else ""
    facts = "\n".join(f"| {k} | {_fmt(v)} |" for k, v in summary.items()
                      if k not in ("metrics", "reward_curve", "warnings", "async_loop", "grpo", "tools"))
    warnings = "".join(f"**Warning:** {line}\n\n" for line in summary.get("warnings", []))
    curve = summary.get("reward_curve")
    learning = curve_markdown(curve) if curve else "No reward was logged per step."
    learning += "".join(f"\n\n{line}" for line in summary.get("async_loop", []))
    png = f"\n\nPNG: `{summary['reward_curve_png']}` (and `plots/reward_curve.png` of the MLflow run)" \
        if summary.get("reward_curve_png") else ""
    return (f"# verl-grpo run `{summary['run_id']}`\n\n"
            f"**Decision:** {summary['decision']}\n\n"
            f"**Registered:** {summary['registered']} (aliases: {summary['aliases'] or '-'})\n\n{warnings}"
            f"**MLflow run:** {mlflow_link}\n\n{grpo}"
            f"{header}\n{metrics}\n\n"
            f"## Learning\n\n{learning}{png}\n\n"
            f"| | |\n|---|---|\n{facts}\n")


def mlflow_ui_command(tracking_uri: str) -> str:
    """The command that serves a local tracking store (this environment's mlflow, which may not be on PATH)."""
    mlflow = Path(sys.executable).parent / "mlflow"
    return f"{mlflow} ui --backend-store-uri {tracking_uri} --host 127.0.0.1 --port 5000"


def _p(metric: dict, key: str = "p_value") -> str:
    """The metric row's paired test and its p-value under `key` (p_value, warm_start_p_value, grpo_p_value)."""
    return "no paired test" if metric[key] is None else f"{metric['test']} p={metric[key]:.3g}"


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:+.4f}" if v < 0 else f"{v:.4f}"
    return "" if v is None else str(v)


VERSION_COLUMNS = ("version", "aliases", "base_model", "accuracy", "delta_accuracy", "steps", "dataset_hash",
                   "decision", "created")


def versions_table(rows: list[dict]) -> str:
    """Registered versions as an aligned text table (the same rows feed the Prefect table artifact)."""
    headers = ["version", "aliases", "base model", "accuracy", "delta vs base", "steps", "dataset", "decision",
               "created"]
    return _aligned(headers, [[_cell(row.get(col)) for col in VERSION_COLUMNS] for row in rows])


def metrics_table(rows: list[dict]) -> str:
    """Every eval metric (rows) of each version (columns), as its run logged it: `verl-grpo models compare`."""
    names = sorted({m for row in rows for m in row.get("eval", {})})
    headers = ["eval metric", *(f"v{row['version']}" for row in rows)]
    return _aligned(headers, [[name, *(_cell(row.get("eval", {}).get(name)) for row in rows)] for name in names])


def _aligned(headers: list[str], cells: list[list[str]]) -> str:
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(c) for c in cells)])


def _cell(value: object) -> str:
    if isinstance(value, list):
        return ",".join(value) or "-"
    if isinstance(value, float):
        return f"{value:+.4f}" if value < 0 else f"{value:.4f}"
    return "-" if value in (None, "") else str(value)[:48]
