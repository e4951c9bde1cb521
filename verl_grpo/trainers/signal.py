"""Learning-signal diagnostics of both backends: one per-step metric vocabulary and the no-signal watch.

GRPO learns from the differences between the rollouts of one prompt: a group whose rewards all tie gets a zero
advantage. A step where every group ties learns nothing from its rewards, and many such steps in a row spend
compute on nothing, mostly for a reason the step's own figures show: responses cut off at the length limit, a
format the model never meets, a task too hard for it. Each backend maps its metric names to the keys below
(`trl.callbacks.signal_figures`, `verl.metrics.common_figures`); the watch reads only these keys.

Pure functions and one small class; nothing heavy is imported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from verl_grpo.errors import TrainingError

if TYPE_CHECKING:
    from verl_grpo.config import RunConfig

TIED_GROUP_SHARE = "signal/tied_group_share"
"""Share of the step's prompt groups whose rollouts' total rewards all tie (zero advantage). TRL logs it
(`frac_reward_zero_std`); verl logs nothing it can be derived from, so verl records lack it."""
ALL_TIED = "signal/all_tied"
"""1.0 when every group of the step tied (or every reward was 0): the step learned nothing from its rewards."""
REWARD = "reward"
"""Mean total reward of the step's rollouts."""
LOSS = "loss"
MEAN_LENGTH = "completions/mean_length"
"""Mean response length in tokens."""
CLIPPED_RATIO = "completions/clipped_ratio"
"""Share of responses cut off at algorithm.max_response_length."""
_COMPONENT = ("rewards/", "/mean")

CORRECTNESS = frozenset({"correctness", "test_pass_rate"})
"""The reward component of each dataset that scores the answer itself; every other component scores its format
(verl_grpo.rewards: gsm8k and math `correctness`, mbpp `test_pass_rate`)."""
TRUNCATED = 0.5
"""A clipped ratio from which truncation is named as a cause: most responses never reach their answer."""


def component_key(name: str) -> str:
    """`rewards/<name>/mean`: the step mean of one reward component (TRL's own name for it)."""
    return f"{_COMPONENT[0]}{name}{_COMPONENT[1]}"


def components(record: Mapping[str, Any]) -> dict[str, float]:
    """{component: step mean} of a record's `rewards/<component>/mean` keys, in record order."""
    prefix, suffix = _COMPONENT
    return {key[len(prefix):-len(suffix)]: float(value) for key, value in record.items()
            if key.startswith(prefix) and key.endswith(suffix) and len(key) > len(prefix) + len(suffix)
            and _number(value)}


def no_signal(record: Mapping[str, Any]) -> bool | None:
    """Whether a step carried no learning signal; None when its record has no tie figure (not a training step)."""
    flag = record.get(ALL_TIED)
    if _number(flag):
        return flag >= 1.0
    share = record.get(TIED_GROUP_SHARE)
    if _number(share):
        return share >= 1.0 - 1e-9
    return None


def all_tied(tied_share: float | None = None, all_equal: bool = False) -> float | None:
    """The ALL_TIED flag from what a backend knows: the tied share, or that every rollout scored the same."""
    if all_equal:
        return 1.0
    if _number(tied_share):
        return 1.0 if tied_share >= 1.0 - 1e-9 else 0.0
    return None


@dataclass
class NoSignalWatch:
    """Warns once when `steps` consecutive training steps carry no learning signal; with `stop`, fails instead.

    Feed it each step's record in the vocabulary above (`observe`). A step with signal ends the streak, so a
    later streak warns again; a record without tie figures (e.g. verl's step-0 validation) neither counts nor
    ends it; a step at or before the last one seen (a replayed log) is ignored.
    """

    steps: int
    stop: bool = False
    max_response_length: int | None = None
    """Named in the truncation cause's fix."""
    _streak: list[Mapping[str, Any]] = field(default_factory=list, init=False, repr=False)
    _streak_steps: int = field(default=0, init=False, repr=False)
    _warned: bool = field(default=False, init=False, repr=False)
    _last_step: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"NoSignalWatch needs steps >= 1, got {self.steps} (trainer.no_signal_steps=0 means "
                             "no watch: use NoSignalWatch.from_config)")

    @classmethod
    def from_config(cls, cfg: RunConfig) -> NoSignalWatch | None:
        """The watch trainer.no_signal_steps / trainer.stop_on_no_signal ask for; None when it is off."""
        if cfg.trainer.no_signal_steps == 0:
            return None
        return cls(cfg.trainer.no_signal_steps, cfg.trainer.stop_on_no_signal, cfg.algorithm.max_response_length)

    def observe(self, record: Mapping[str, Any], span: int = 1) -> str | None:
        """The warning line when this step completes a streak of `steps` no-signal steps, else None.

        A record stands for the steps since the previous record (TRL averages `trainer.logging_steps` steps per
        record); `span` is that count for the first record. Raises TrainingError instead of warning when `stop`
        is set.
        """
        step = record.get("step")
        if _number(step):
            if self._last_step is not None:
                if step <= self._last_step:
                    return None
                span = int(step) - self._last_step
            self._last_step = int(step)
        verdict = no_signal(record)
        if verdict is None:
            return None
        if not verdict:
            self._streak, self._streak_steps, self._warned = [], 0, False
            return None
        if self._warned:
            return None
        self._streak.append(record)
        self._streak_steps += max(1, span)
        if self._streak_steps < self.steps:
            return None
        self._warned = True
        finding = no_signal_finding(self._streak, self._streak_steps, self.max_response_length)
        if self.stop:
            raise TrainingError(f"{finding}. Stopped early (trainer.stop_on_no_signal=true): fix the cause and "
                                "start a new run, or set trainer.stop_on_no_signal=false to train on")
        return f"warning: {finding}"


def run_findings(records: Iterable[Mapping[str, Any]], no_signal_steps: int,
                 max_response_length: int | None = None) -> list[str]:
    """What the watch found over a finished run's per-step metrics (the records its metrics.jsonl holds, from any
    backend), as the trainer warned it: for the run's summary and registry decision. None with no_signal_steps 0."""
    if no_signal_steps == 0:
        return []
    watch = NoSignalWatch(no_signal_steps, max_response_length=max_response_length)
    return [w.removeprefix("warning: ") for record in records if (w := watch.observe(record))]


def no_signal_finding(streak: Sequence[Mapping[str, Any]], steps: int, max_response_length: int | None = None) -> str:
    """One line: how long the run has had no signal, what that means, and the likely causes with their fixes."""
    first, last = streak[0].get("step"), streak[-1].get("step")
    where = f" (steps {first}-{last})" if _number(first) and _number(last) else ""
    causes = likely_causes(streak, max_response_length)
    return (f"no learning signal for {steps} consecutive steps{where}: the rollouts of every prompt scored alike, so "
            f"every advantage is 0 and nothing is learned; likely cause{'s' if len(causes) > 1 else ''}: "
            + "; ".join(causes))


def likely_causes(streak: Sequence[Mapping[str, Any]], max_response_length: int | None = None) -> list[str]:
    """The causes the streak's mean figures point to, most likely first, each with its fix; never empty."""
    clipped = _mean(r.get(CLIPPED_RATIO) for r in streak)
    reward = _mean(r.get(REWARD) for r in streak)
    means: dict[str, list[float]] = {}
    for record in streak:
        for name, value in components(record).items():
            means.setdefault(name, []).append(value)
    comps = {name: sum(v) / len(v) for name, v in means.items()}
    correct = {n: v for n, v in comps.items() if n in CORRECTNESS}
    form = {n: v for n, v in comps.items() if n not in CORRECTNESS}
    causes = []
    if clipped is not None and clipped >= TRUNCATED:
        now = f" (now {max_response_length})" if max_response_length else ""
        causes.append(f"responses truncated ({clipped:.0%} hit the length limit, completions/clipped_ratio): raise "
                      f"algorithm.max_response_length{now}")
    if form and all(v == 0 for v in form.values()):
        causes.append(f"format never met ({', '.join(form)} all 0): the model does not write the layout the reward "
                      "expects; use an instruct model or a dataset.system_prompt that shows the layout")
    elif correct and all(v == 0 for v in correct.values()) and any(v > 0 for v in form.values()):
        met = ", ".join(f"{n} {v:.2g}" for n, v in form.items() if v > 0)
        causes.append(f"task too hard ({', '.join(correct)} 0 while the format is met: {met}): use a stronger "
                      "model.name, more algorithm.rollouts or an easier dataset")
    if causes:
        return causes
    if (reward or 0) > 0 or any(v > 0 for v in comps.values()):
        mean = f" (mean {reward:.3g})" if reward is not None else ""
        return [f"every rollout of a prompt earns the same reward{mean}: raise algorithm.temperature or "
                "algorithm.rollouts for more varied rollouts, or use prompts that are neither always nor never solved"]
    if not comps:
        return ["every reward is 0 and this backend logs no per-component means; look at the rollouts (verl: "
                "verl.extra_overrides=[trainer.rollout_data_dir=DIR])"]
    return ["every reward is 0"]


def _mean(values: Any) -> float | None:
    found = [float(v) for v in values if _number(v)]
    return sum(found) / len(found) if found else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
