"""Base → (warm start →) trained, per eval metric, each step with a paired p-value: every model answered the same
problems, so each metric is compared problem by problem (McNemar for right/wrong, Wilcoxon signed-rank for scores).

A run with a warm start (an SFT phase before GRPO) has three evals; the step warm start → trained is what GRPO itself
added, the number `grpo_line` states."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import wilcoxon

from verl_grpo.contracts import EvalReport
from verl_grpo.formats import question_of
from verl_grpo.stats import mcnemar_exact
from verl_grpo.store import Store, strip_scheme

# Eval metric → the per-problem column of the eval table it averages, and whether that column is 0/1.
_PER_PROBLEM = {"accuracy": ("correct", True), "mean_score": ("score", False), "tool_use_rate": ("searched", True)}
GRPO_HEADLINES = ("mean_score", "accuracy")
"""The metric `grpo_line` reports, the first an eval has: the weighted total reward (what GRPO optimizes), else
accuracy."""


@dataclass(frozen=True)
class MetricChange:
    metric: str
    base: float | None
    trained: float | None
    p_value: float | None
    """Two-sided paired p-value of trained vs base on the shared problems; None where no per-problem column."""
    test: str = ""
    warm_start: float | None = None
    """The warm-start model's value, for a run that had a warm start (None otherwise)."""
    warm_start_p_value: float | None = None
    """Paired p-value of warm start vs base (what the SFT phase did)."""
    grpo_p_value: float | None = None
    """Paired p-value of trained vs warm start (what GRPO itself did)."""

    @property
    def delta(self) -> float | None:
        return _minus(self.trained, self.base)

    @property
    def warm_start_delta(self) -> float | None:
        return _minus(self.warm_start, self.base)

    @property
    def grpo_delta(self) -> float | None:
        """Trained minus warm start: GRPO's own share of the change (None without a warm start)."""
        return _minus(self.trained, self.warm_start)


class EvalTables:
    """The per-problem tables of one store's eval reports, each read once: a registration compares, logs and decides
    on the same tables. Callers read them and do not change them."""

    def __init__(self, store: Store):
        self.store = store
        self._read: dict[str, pd.DataFrame] = {}

    def of(self, report: EvalReport) -> pd.DataFrame:
        if report.table_uri not in self._read:
            self._read[report.table_uri] = read_table(self.store, report.table_uri)
        return self._read[report.table_uri]


def compare_to_base(report: EvalReport, base: EvalReport, eval_tables: EvalTables,
                    warm_start: EvalReport | None = None) -> list[MetricChange]:
    """One MetricChange per eval metric of any report (`n` left out), in name order; with `warm_start`, each also
    compares the warm start to the base model and the trained model to the warm start."""
    tables = {"t": eval_tables.of(report), "b": eval_tables.of(base)}
    if warm_start is not None:
        tables["w"] = eval_tables.of(warm_start)
    names = set(report.metrics) | set(base.metrics) | set(warm_start.metrics if warm_start else ())
    changes = []
    for name in sorted(names - {"n"}):
        column, binary = _PER_PROBLEM.get(name, (name, False) if name.startswith("reward/") else (None, False))
        pair = lambda later, earlier: _paired(tables[later], tables[earlier], column, binary)  # noqa: E731
        p_value, test = pair("t", "b")
        warm = {}
        if warm_start is not None:
            warm = {"warm_start": warm_start.metrics.get(name), "warm_start_p_value": pair("w", "b")[0],
                    "grpo_p_value": pair("t", "w")[0]}
        changes.append(MetricChange(name, base.metrics.get(name), report.metrics.get(name), p_value, test, **warm))
    return changes


def grpo_line(changes: list[MetricChange]) -> str:
    """`GRPO added +0.0750 mean_score over the warm start (0.3200 -> 0.3950, Wilcoxon p=0.41)`; "" without a
    warm start."""
    by_metric = {c.metric: c for c in changes if c.grpo_delta is not None}
    change = next((by_metric[m] for m in GRPO_HEADLINES if m in by_metric), None)
    if change is None:
        return ""
    p = "no paired test" if change.grpo_p_value is None else f"{change.test} p={change.grpo_p_value:.3g}"
    return (f"GRPO added {change.grpo_delta:+.4f} {change.metric} over the warm start "
            f"({change.warm_start:.4f} -> {change.trained:.4f}, {p})")


def tools_line(without_tools: list[MetricChange], trained: EvalReport) -> str:
    """`search tool: used in 35% of the trained model's answers; accuracy 0.4000 with it, 0.1000 without (McNemar
    p=0.031)`: what the tool carries, from `compare_to_base(trained, trained_without_tools, ...)`; "" without."""
    change = next((c for c in without_tools if c.metric == "accuracy"), None)
    if change is None or change.trained is None or change.base is None:
        return ""
    p = "no paired test" if change.p_value is None else f"{change.test} p={change.p_value:.3g}"
    used = trained.metrics.get("tool_use_rate")
    share = f"used in {used:.0%} of the trained model's answers; " if used is not None else ""
    return f"search tool: {share}accuracy {change.trained:.4f} with it, {change.base:.4f} without ({p})"


def _paired(later: pd.DataFrame, earlier: pd.DataFrame, column: str | None, binary: bool) -> tuple[float | None, str]:
    """(two-sided paired p-value of `later` vs `earlier` on their shared problems, the test's name)."""
    joined = later.merge(earlier, on="id", suffixes=("_l", "_e"))
    if not column or f"{column}_l" not in joined or f"{column}_e" not in joined or not len(joined):
        return None, ""
    after, before = joined[f"{column}_l"].astype(float), joined[f"{column}_e"].astype(float)
    return (_mcnemar(after, before), "McNemar") if binary else (_wilcoxon(after, before), "Wilcoxon")


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _mcnemar(trained: pd.Series, before: pd.Series) -> float:
    t, b = trained.to_numpy() > 0.5, before.to_numpy() > 0.5
    return mcnemar_exact(int(np.sum(t & ~b)), int(np.sum(~t & b)))


def _wilcoxon(trained: pd.Series, before: pd.Series) -> float:
    diff = (trained - before).dropna().to_numpy()
    if not np.any(diff):  # identical on every problem: no evidence of a change
        return 1.0
    return float(wilcoxon(diff, zero_method="zsplit").pvalue)


def read_table(store: Store, uri: str) -> pd.DataFrame:
    """An eval report's per-problem table (one row per problem, keyed by `id`)."""
    with store.fs.open(strip_scheme(uri), "rb") as f:
        return pd.read_parquet(f)


def side_by_side(trained: pd.DataFrame, base: pd.DataFrame, warm_start: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per problem: the question (the user's turn of the prompt: the system prompt and chat template, alike
    in every row, would fill the cell and push the responses off to the right; the whole prompt stays in the eval's
    parquet table), the ground truth, then each model's response and verdict (base, warm start, trained), scores
    rounded to 3 decimals, `flip`: "fixed" (base wrong, trained right), "broke" (the other way) or "", and the
    problem's id last; flipped problems first."""
    out = trained[["id", *(c for c in ("prompt", "ground_truth") if c in trained)]].copy()
    if "prompt" in out:
        out.insert(0, "question", out.pop("prompt").map(question_of))
    for label, table in (("base", base), ("warm_start", warm_start), ("trained", trained)):
        if table is None:
            continue
        cols = [c for c in ("response", "correct", "score") if c in table]
        out = out.merge(table[["id", *cols]].rename(columns={c: f"{label}_{c}" for c in cols}), on="id", how="left")
    before, after = out["base_correct"].fillna(False).astype(bool), out["trained_correct"].fillna(False).astype(bool)
    out["flip"] = [("fixed" if a and not b else "broke" if b and not a else "") for b, a in zip(before, after)]
    out = out[[c for c in out.columns if c != "id"] + ["id"]]
    scores = [c for c in out.columns if c.endswith("_score")]
    out[scores] = out[scores].astype(float).round(3)
    order = out["flip"].map({"fixed": 0, "broke": 1, "": 2})
    return out.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def eval_table(report: EvalReport, base: EvalReport, warm_start: EvalReport | None = None) -> list[dict]:
    """One row per metric: base model, (warm-start model,) trained model and the difference to base (and, with a
    warm start, GRPO's own difference: trained minus warm start)."""
    rows = []
    for name in sorted(set(report.metrics) | set(base.metrics) | set(warm_start.metrics if warm_start else ())):
        trained, before = report.metrics.get(name), base.metrics.get(name)
        row = {"metric": name, "base": before}
        if warm_start is not None:
            warm = warm_start.metrics.get(name)
            row |= {"warm_start": warm, "trained": trained, "delta": _delta(trained, before),
                    "delta_grpo": _delta(trained, warm)}
        else:
            row |= {"trained": trained, "delta": _delta(trained, before)}
        rows.append(row)
    return rows


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else round(after - before, 6)
