"""The settings a run implies from its other settings, filled in by one step after validation (`resolve_defaults`).

The schema's validators only check; what a placement or a trainer backend needs and the user left out is added
here, in one place, so that the resolved config written per run (`runs/{id}/config.yaml`) records it and every
reader sees the same services without deriving them again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verl_grpo.config.placement import placement

if TYPE_CHECKING:
    from verl_grpo.config.schema import RunConfig

JOB_GROUP_SERVICES: tuple[str, ...] = ("reward",)
"""A SkyPilot job group is training plus services: with none named it runs the reward-server, which verl's reward
function then calls (the job group's reason to exist)."""
FULLY_ASYNC_SERVICES: tuple[str, ...] = ("data", "reward", "replay")
"""The rollout group trains with verl's fully-async trainer beside the data-server (the dataset version it trains on),
the reward-server (its reward function) and the replay buffer, when no service is named."""
LOOP_SERVICES: tuple[str, ...] = ("data", "reward", "replay")
"""trainer.backend=loop reads prompts from the data-server, rewards from the reward-server and replayed groups from
the replay buffer: each is added when missing, whatever else is named."""


def resolve_defaults(cfg: RunConfig) -> RunConfig:
    """`cfg` with the services its placement and backend imply in services.enabled (a copy; `cfg` is unchanged).

    Idempotent, so a config read back from a run's resolved config.yaml resolves to itself.
    """
    enabled = list(cfg.services.enabled)
    where = placement(cfg)
    if not enabled and where.shape == "job_group":
        enabled = list(JOB_GROUP_SERVICES)
    if not enabled and where.fully_async:
        enabled = list(FULLY_ASYNC_SERVICES)
    if cfg.trainer.backend == "loop":
        enabled += [name for name in LOOP_SERVICES if name not in enabled]
    services = cfg.services.model_copy(update={"enabled": enabled})
    return cfg.model_copy(update={"services": services})
