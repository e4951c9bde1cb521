"""Paired significance tests on per-problem correctness of two models evaluated on the same problems.

Both models answer the same problems, so the comparison is paired: only the problems where they
disagree (discordant pairs) carry information about which one is better.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binomtest


@dataclass(frozen=True)
class PairedComparison:
    """Outcome of comparing a challenger (a) against an incumbent (b) on the same n problems."""

    n: int
    a_only: int
    """Problems only the challenger solved (discordant, in its favour)."""
    b_only: int
    """Problems only the incumbent solved."""
    both: int
    neither: int
    mean_a: float
    mean_b: float
    mcnemar_p: float
    """Exact two-sided McNemar p-value (binomial test on the discordant pairs)."""
    bootstrap_p: float
    """Paired-bootstrap one-sided p-value of `mean_a <= mean_b`."""
    ci_low: float
    ci_high: float
    """Percentile-bootstrap 95% interval of `mean_a - mean_b`."""

    @property
    def delta(self) -> float:
        return self.mean_a - self.mean_b

    def as_metrics(self, prefix: str = "promotion.") -> dict[str, float]:
        """Flat numeric view for MLflow metrics (single values: `promotion.mcnemar_p`, ...)."""
        fields = {
            "n": self.n, "challenger_only": self.a_only, "champion_only": self.b_only, "both": self.both,
            "neither": self.neither, "delta": self.delta, "mcnemar_p": self.mcnemar_p,
            "bootstrap_p": self.bootstrap_p, "ci95_low": self.ci_low, "ci95_high": self.ci_high,
        }
        return {f"{prefix}{k}": float(v) for k, v in fields.items()}


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value: under H0 each discordant pair favours either model with p=1/2."""
    if a_only < 0 or b_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got {a_only} and {b_only}")
    n = a_only + b_only
    if n == 0:
        return 1.0
    return float(binomtest(a_only, n, 0.5, alternative="two-sided").pvalue)


def paired_bootstrap(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """Resample problems with replacement; return (one-sided p of mean(a) <= mean(b), ci_low, ci_high)."""
    diff = _as_pair(a, b)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, diff.size, size=(resamples, diff.size))
    means = diff[idx].mean(axis=1)
    # The +1s keep the estimate away from an impossible p = 0 with a finite number of resamples.
    p = (np.count_nonzero(means <= 0) + 1) / (resamples + 1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(p), float(low), float(high)


def compare_paired(
    a: Sequence[bool | float], b: Sequence[bool | float], *, resamples: int = 10_000, seed: int = 0
) -> PairedComparison:
    """McNemar + paired bootstrap of binary correctness vectors aligned on the same problems."""
    diff = _as_pair(a, b)  # validates shapes
    av, bv = np.asarray(a, dtype=float) > 0.5, np.asarray(b, dtype=float) > 0.5
    a_only, b_only = int(np.sum(av & ~bv)), int(np.sum(~av & bv))
    boot_p, low, high = paired_bootstrap(av.astype(float), bv.astype(float), resamples=resamples, seed=seed)
    return PairedComparison(
        n=int(diff.size), a_only=a_only, b_only=b_only, both=int(np.sum(av & bv)), neither=int(np.sum(~av & ~bv)),
        mean_a=float(av.mean()), mean_b=float(bv.mean()), mcnemar_p=mcnemar_exact(a_only, b_only),
        bootstrap_p=boot_p, ci_low=low, ci_high=high,
    )


def _as_pair(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    av, bv = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if av.ndim != 1 or av.shape != bv.shape:
        raise ValueError(f"paired samples must be 1-D and of equal length, got shapes {av.shape} and {bv.shape}")
    if av.size == 0:
        raise ValueError("paired samples are empty: there are no shared problems to compare")
    return av - bv
