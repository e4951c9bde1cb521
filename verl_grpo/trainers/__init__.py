"""Training backends, by `trainer.backend` name. A new backend is one subpackage plus one line here."""

from __future__ import annotations

from verl_grpo.plugins import load_named
from verl_grpo.trainers.protocol import Trainer

TRAINERS: dict[str, str] = {
    "trl": "verl_grpo.trainers.trl.backend:TrlTrainer",
    "verl": "verl_grpo.trainers.verl.backend:VerlTrainer",
    "loop": "verl_grpo.trainers.loop.backend:LoopTrainer",
}


def get_trainer(backend: str) -> Trainer:
    """The Trainer registered as `backend`, or ConfigError naming `trainer.backend`."""
    return load_named("trainer.backend", TRAINERS, backend)()
