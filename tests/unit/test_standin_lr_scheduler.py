"""The CPU stand-in builds verl's LR schedules, and names the field when asked for one verl does not build."""

from types import SimpleNamespace

import pytest
import torch

from verl_grpo.errors import ConfigError
from verl_grpo_rehearsal.standin_actor import StandinActor


def _actor(kind: str) -> SimpleNamespace:
    optim = SimpleNamespace(lr_scheduler_type=kind, total_training_steps=10, lr_warmup_steps=2,
                            lr_warmup_steps_ratio=0.0, min_lr_ratio=0.0, num_cycles=0.5, zero_indexed_step=True)
    return SimpleNamespace(optim_cfg=optim, optimizer=torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0))


@pytest.mark.parametrize("kind", ["constant", "cosine"])
def test_verl_schedules_warm_up(kind):
    scheduler = StandinActor._build_lr_scheduler(_actor(kind))
    assert scheduler.get_last_lr()[0] == 0.0  # step 0 of a 2-step warm-up


def test_an_unknown_schedule_names_the_field_in_one_line():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.optim\.lr_scheduler_type='wsd'.*constant or "
                                          r"cosine"):
        StandinActor._build_lr_scheduler(_actor("wsd"))
