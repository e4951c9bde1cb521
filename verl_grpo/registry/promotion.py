"""Champion/challenger: the champion alias moves only for a significantly better model on the same problems."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from verl_grpo.errors import DataError
from verl_grpo.stats import PairedComparison, compare_paired

FIRST = "first-model"
PROMOTED = "promoted"
NOT_BETTER = "kept-not-better"
NOT_SIGNIFICANT = "kept-not-significant"
INCOMPARABLE = "kept-incomparable"
OTHER_LINE = "kept-other-line"
"""The champion is of another base model or dataset (registry.lines): registered, never compared."""


@dataclass(frozen=True)
class Decision:
    code: str
    """One of first-model, promoted, kept-not-better, kept-not-significant, kept-incomparable, kept-other-line."""
    reason: str
    comparison: PairedComparison | None = None

    @property
    def promoted(self) -> bool:
        return self.code in (FIRST, PROMOTED)

    def metrics(self) -> dict[str, float]:
        """The comparison's numbers (`promotion.mcnemar_p`, ...) for the challenger's run; none without one."""
        return self.comparison.as_metrics() if self.comparison is not None else {}


def decide(
    challenger: pd.DataFrame, champion: pd.DataFrame, *, p_threshold: float, challenger_label: str,
    champion_label: str, seed: int = 0,
) -> Decision:
    """Compare per-problem correctness (columns `id`, `correct`) of two eval tables of the same settings."""
    if not 0 < p_threshold <= 1:
        raise ValueError(f"promotion p-value threshold must be in (0, 1], got {p_threshold}")
    for label, table in ((challenger_label, challenger), (champion_label, champion)):
        missing = {"id", "correct"} - set(table.columns)
        if missing:
            raise DataError(f"eval table of {label} lacks column(s) {sorted(missing)}; re-run its evaluation")
    joined = challenger[["id", "correct"]].merge(champion[["id", "correct"]], on="id", suffixes=("_a", "_b"))
    if len(joined) != len(challenger) or len(joined) != len(champion):
        return Decision(INCOMPARABLE, f"kept champion {champion_label}: its eval problems differ from "
                        f"{challenger_label}'s ({len(joined)} shared of {len(challenger)}/{len(champion)})")
    cmp = compare_paired(joined["correct_a"].astype(float), joined["correct_b"].astype(float), seed=seed)
    summary = (f"accuracy {cmp.mean_a:.3f} vs {cmp.mean_b:.3f} on {cmp.n} problems, "
               f"{cmp.a_only} vs {cmp.b_only} discordant, McNemar p={cmp.mcnemar_p:.3g}")
    if cmp.a_only <= cmp.b_only:
        return Decision(NOT_BETTER, f"kept champion {champion_label}: {challenger_label} is not better ({summary})",
                        cmp)
    if cmp.mcnemar_p >= p_threshold:
        return Decision(NOT_SIGNIFICANT, f"kept champion {champion_label}: {challenger_label} is better but not "
                        f"significantly ({summary} >= {p_threshold})", cmp)
    return Decision(PROMOTED, f"promoted {challenger_label} over {champion_label} ({summary} < {p_threshold})", cmp)
