"""Where a run's work happens, as its provider answers it: for the code outside providers/ that differs by it (the
services a SkyPilot shape runs by default, the loop's need of this machine, a Prefect concurrency tag, the cost
line), so that nothing there branches on a provider's name.

A table in the config package, not a method of the provider classes: the config resolves its defaults with it and
every layer above reads it downward, while importing the SkyPilot provider would cost the config half a second and
point the core at a layer above it. A new provider (`PROVIDERS`) adds its line here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_grpo.errors import ConfigError

if TYPE_CHECKING:
    from verl_grpo.config.schema import RunConfig

LOCAL_SHAPE = "local"


@dataclass(frozen=True)
class Placement:
    on_this_machine: bool
    """Training, evals and services run on this machine's cores; else on nodes the provider rents."""
    shape: str
    """`local`, or the SkyPilot launch shape (skypilot.shape: multinode, job_group, rollout_group)."""
    existing_cluster: str | None = None
    """An already-running cluster the run executes on (billed whatever runs on it); None: the run gets its own."""

    @property
    def fully_async(self) -> bool:
        """The run trains on verl's fully-async trainer beside its rollout servers (the rollout group)."""
        return self.shape == "rollout_group"


PLACEMENTS: dict[str, Callable[[RunConfig], Placement]] = {
    "local": lambda cfg: Placement(on_this_machine=True, shape=LOCAL_SHAPE),
    "skypilot": lambda cfg: Placement(on_this_machine=False, shape=cfg.skypilot.shape,
                                      existing_cluster=cfg.skypilot.cluster or None),
}


def placement(cfg: RunConfig) -> Placement:
    """The placement of `cfg`'s run, or ConfigError naming infra.provider."""
    of = PLACEMENTS.get(cfg.infra.provider)
    if of is None:
        raise ConfigError(f"infra.provider {cfg.infra.provider!r} has no placement; use one of: "
                          f"{', '.join(sorted(PLACEMENTS))}")
    return of(cfg)
