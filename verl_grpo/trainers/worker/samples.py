"""What the model wrote while training: a few rollouts of every `trainer.log_samples_every`-th step, in the run's
`samples.jsonl` (one `{"step": N, "samples": [...]}` line per sampled step, kept like metrics.jsonl), and the flat
rows of the MLflow table (the Prefect page of the last sampled step: verl_grpo/samples_markdown.py)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from verl_grpo.store import Store
from verl_grpo.store_layout import run_samples
from verl_grpo.trainers.worker.metrics import step_records

RESPONSE_CHARS = 2000
"""A sample's prompt and response are cut to this many characters (a runaway response would swamp the table)."""


@dataclass(frozen=True)
class Sample:
    """One rollout as a reader wants it: what was asked, what the model answered and how that was scored."""

    prompt: str
    response: str
    reward: float
    """The weighted total the policy was trained on."""
    advantage: float
    truncated: bool | None
    """The response hit the length limit before it ended (None where the backend does not say: verl's dumps)."""
    components: dict[str, float] = field(default_factory=dict)
    """Each reward function's own (unweighted) score, where the backend has them."""
    policy_version: int | None = None
    """The loop backend's policy version that generated it (None: on-policy trainers)."""
    source: str | None = None
    """`fresh` or `replay` for the loop backend."""

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out["prompt"], out["response"] = _cut(self.prompt), _cut(self.response)
        return {k: v for k, v in out.items() if v is not None}


def sampled_step(step: int, every: int) -> bool:
    """Whether `step` keeps samples under trainer.log_samples_every (0 keeps none)."""
    return every > 0 and step % every == 0


NOT_COMPONENTS = ("score", "acc")
"""Keys of a verl-style score dict that are not reward parts: the total, and `acc` (verl's copy of correctness)."""


def score_components(score: dict[str, Any], skip: Iterable[str] = ()) -> dict[str, float]:
    """The numeric reward parts of a score dict (the reward-server's, or a line of verl's rollout dump)."""
    left_out = {*NOT_COMPONENTS, *skip}
    return {k: float(v) for k, v in score.items()
            if k not in left_out and isinstance(v, (int, float)) and not isinstance(v, bool)}


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """GRPO's advantages of one prompt's rollouts as verl computes them: (r - mean) / (unbiased std + 1e-6), 0 for
    a group of one. Plain Python for the verl path, whose settings the launch CLI imports without torch; the loop,
    which trains on `loop.objective.group_advantages`, shows that one's values (a unit test holds the two equal)."""
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]


def first_groups(groups: Iterable[Sequence[Sample]], k: int) -> list[Sample]:
    """Whole groups, in order, until k samples (the last group cut to fit): a group's responses side by side."""
    out: list[Sample] = []
    for group in groups:
        out.extend(group[: k - len(out)])
        if len(out) >= k:
            break
    return out


def sample_rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """samples.jsonl records → one flat row per sample (step first, each reward component as `reward/<name>`)."""
    rows = []
    for record in records:
        for sample in record.get("samples", []):
            row = {"step": record["step"], **{k: v for k, v in sample.items() if k != "components"}}
            row.update({f"reward/{name}": value for name, value in (sample.get("components") or {}).items()})
            rows.append(row)
    return rows


def stored_samples(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run's samples.jsonl records from the store, in step order ([] when the run kept none)."""
    rel = run_samples(run_id)
    return step_records(store.read_text(rel)) if store.exists(rel) else []


def _cut(text: str) -> str:
    if len(text) <= RESPONSE_CHARS:
        return text
    return text[:RESPONSE_CHARS] + f" … [{len(text) - RESPONSE_CHARS} more chars]"
