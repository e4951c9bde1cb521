"""Live training progress in the Prefect UI: a progress artifact (step k of N) and a reward table, both
updated in place while the trainer runs."""

from __future__ import annotations

from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.logging import get_run_logger

from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.signal import ALL_TIED, CLIPPED_RATIO, LOSS, MEAN_LENGTH, TIED_GROUP_SHARE, components

PROGRESS_KEY = "training-progress"
REWARDS_KEY = "training-rewards"
_TABLE_ROWS = 50
"""Reward rows shown (the most recent); the full history is in MLflow and runs/{run_id}/metrics.jsonl."""


def rewards_markdown(run_id: str, history: list[TrainProgress]) -> str:
    """Markdown table of the steps so far, newest last: reward, tied share, each reward component's mean, mean
    length, truncation rate, loss (the signal vocabulary of verl_grpo.trainers.signal; blank where not logged)."""
    shown = history[-_TABLE_ROWS:]
    lines = [f"# Training rewards of `{run_id}`", ""]
    if len(history) > len(shown):
        lines += [f"Last {len(shown)} of {len(history)} steps.", ""]
    names = list(dict.fromkeys(name for p in shown for name in components(p.metrics)))
    header = ["step", "reward", "tied", *names, "mean length", "truncated", "loss"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for p in shown:
        means = components(p.metrics)
        cells = [f"{p.step}/{p.total_steps}", _num(p.reward), _tied(p.metrics), *(_num(means.get(n)) for n in names),
                 _num(p.metrics.get(MEAN_LENGTH)), _num(p.metrics.get(CLIPPED_RATIO)), _num(p.metrics.get(LOSS))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _tied(metrics: dict[str, float]) -> str:
    """The tied share; verl logs none, so there only `all` (every group tied) or blank."""
    if TIED_GROUP_SHARE in metrics:
        return _num(metrics[TIED_GROUP_SHARE])
    return "all" if metrics.get(ALL_TIED) == 1.0 else ""


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


class TrainingProgressArtifacts:
    """Creates both artifacts at step 0 and updates them on every TrainProgress (use as on_progress)."""

    def __init__(self, run_id: str, total_steps: int):
        self.run_id = run_id
        self.history: list[TrainProgress] = []
        self.progress_id: UUID = create_progress_artifact(
            0.0, key=PROGRESS_KEY, description=f"{run_id}: step 0/{total_steps}")
        self.rewards_id: UUID = create_markdown_artifact(
            rewards_markdown(run_id, []), key=REWARDS_KEY, description=f"{run_id}: reward per training step")

    def __call__(self, progress: TrainProgress) -> None:
        # A resumed run replays its log from the start: keep one row per step.
        self.history = [p for p in self.history if p.step < progress.step] + [progress]
        reward = "" if progress.reward is None else f" reward={progress.reward:.4g}"
        try:
            update_progress_artifact(self.progress_id, progress.percent,
                                     description=f"{self.run_id}: step {progress.step}/{progress.total_steps}{reward}")
            with get_client(sync_client=True) as client:
                client.update_artifact(self.rewards_id,
                                       ArtifactUpdate(data=rewards_markdown(self.run_id, self.history)))
        except Exception as e:  # the UI lagging behind must never stop training
            get_run_logger().warning("could not update the training progress artifacts: %s", e)
