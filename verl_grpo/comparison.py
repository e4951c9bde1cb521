"""Base → trained, per eval metric, with a paired p-value: both models answered the same problems, so each
metric is compared problem by problem (McNemar for right/wrong, Wilcoxon signed-rank for scores)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import wilcoxon

from verl_grpo.contracts import EvalReport
from verl_grpo.stats import mcnemar_exact
from verl_grpo.store import Store, strip_scheme

# Eval metric → the per-problem column of the eval table it averages, and whether that column is 0/1.
_PER_PROBLEM = {"accuracy": ("correct", True), "mean_score": ("score", False)}


@dataclass(frozen=True)
class MetricChange:
    metric: str
    base: float | None
    trained: float | None
    p_value: float | None
    """Two-sided paired p-value of trained vs base on the shared problems; None where no per-problem column."""
    test: str = ""

    @property
    def delta(self) -> float | None:
        return None if self.base is None or self.trained is None else self.trained - self.base


def compare_to_base(report: EvalReport, base: EvalReport, store: Store) -> list[MetricChange]:
    """One MetricChange per eval metric of either report (`n` left out), in name order."""
    trained_table, base_table = read_table(store, report.table_uri), read_table(store, base.table_uri)
    joined = trained_table.merge(base_table, on="id", suffixes=("_t", "_b"))
    changes = []
    for name in sorted((set(report.metrics) | set(base.metrics)) - {"n"}):
        column, binary = _PER_PROBLEM.get(name, (name, False) if name.startswith("reward/") else (None, False))
        p_value, test = None, ""
        if column and f"{column}_t" in joined and f"{column}_b" in joined and len(joined):
            trained, before = joined[f"{column}_t"].astype(float), joined[f"{column}_b"].astype(float)
            p_value, test = (_mcnemar(trained, before), "McNemar") if binary else (_wilcoxon(trained, before),
                                                                                    "Wilcoxon")
        changes.append(MetricChange(name, base.metrics.get(name), report.metrics.get(name), p_value, test))
    return changes


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
