"""PNG charts logged with each MLflow run: the reward curve and eval accuracy against the base (and warm-start)
model."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402

from verl_grpo.contracts import EvalReport  # noqa: E402
from verl_grpo.reward_curve import reward_series  # noqa: E402

_COMPARED = ("accuracy", "format_rate", "mean_score")


def reward_curve(metrics_lines: Iterable[str], out: Path) -> Path | None:
    """Total reward per step and each reward component (TRL's or verl's names, see verl_grpo.reward_curve);
    None when there are no training points."""
    series = reward_series(metrics_lines)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in sorted(series, key=lambda k: (k != "reward", k)):
        steps, values = zip(*sorted(series[key]))
        label = "total reward" if key == "reward" else key
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, linewidth=2.5 if key == "reward" else 1,
                label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    ax.set_title("GRPO reward per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def accuracy_vs_base(report: EvalReport, base: EvalReport | None, out: Path,
                     warm_start: EvalReport | None = None) -> Path:
    """Grouped bars of accuracy, format rate and mean score on the same split: base model, warm-start model (a run
    with an SFT phase before GRPO: what it gained is not GRPO's) and trained model."""
    names = [n for n in _COMPARED if n in report.metrics]
    models = [(label, rep) for label, rep in (("base", base), ("warm start", warm_start), ("trained", report))
              if rep is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / len(models)
    xs = range(len(names))
    for i, (label, rep) in enumerate(models):
        offset = (i - (len(models) - 1) / 2) * width
        ax.bar([x + offset for x in xs], [rep.metrics.get(n, 0.0) for n in names], width, label=label)
    ax.set_xticks(list(xs), names)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{report.split} (n={report.n}): " + " vs ".join(label for label, _ in reversed(models)))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=len(models), frameon=False)  # off the bars
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out)


def _save(fig: plt.Figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
