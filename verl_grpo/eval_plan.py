"""Which held-out evals a run gets, in which order, and which waits for which: one plan, carried out by the Prefect
flow's steps (flows/steps.py, concurrently on the run's task runner) and by the plain chain (plain_steps.PlainSteps,
one after another), so that the two never disagree on what a run is measured against.

Data and a pure function only: the callers look up what the plan depends on (the run's warm-start model, where its
provider evaluates) and run each planned eval with their own means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_grpo.config.search import uses_search

if TYPE_CHECKING:
    from verl_grpo.config.schema import RunConfig

BASE = "base"
WARM_START = "warm_start"
TRAINED = "trained"
TRAINED_WITHOUT_TOOLS = "trained_without_tools"


@dataclass(frozen=True)
class PlannedEval:
    name: str
    """The chain.Evals field its report fills (BASE, WARM_START, TRAINED, TRAINED_WITHOUT_TOOLS)."""
    waits_for: tuple[str, ...] = ()
    """The evals that must have finished before it starts: a concurrent caller's dependencies (the plan's order
    already keeps them for a sequential one)."""


def eval_plan(cfg: RunConfig, *, warm_start: bool, without_tools_after_trained: bool) -> tuple[PlannedEval, ...]:
    """A run's evals in the order they start: the base model (cached across runs), the warm start when the run
    committed one, the trained model, and for a run with the search tool the trained model without it, which waits
    for the trained model's eval where that eval's job writes both reports (`without_tools_after_trained`)."""
    plan = [PlannedEval(BASE)]
    if warm_start:
        plan.append(PlannedEval(WARM_START))
    plan.append(PlannedEval(TRAINED))
    if uses_search(cfg):
        plan.append(PlannedEval(TRAINED_WITHOUT_TOOLS, (TRAINED,) if without_tools_after_trained else ()))
    return tuple(plan)
