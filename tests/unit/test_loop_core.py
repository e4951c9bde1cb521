"""The loop backend's pure core: GRPO advantages, the clipped importance-ratio loss, the fresh/replay split,
staleness, use counts and the resumable loop state."""

from __future__ import annotations

import math

import pytest
import torch

from verl_grpo.trainers.loop.batch import (
    Group,
    LoopState,
    Rollout,
    choose_replays,
    is_stale,
    prompt_ids,
    replay_count,
)
from verl_grpo.trainers.loop.objective import Surrogate, aggregate, clipped_surrogate, group_advantages, token_logprobs


def test_group_advantages_normalise_within_each_group():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]))
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()
    assert torch.allclose(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-6))
    assert torch.equal(adv[1], torch.zeros(4))  # a tied group carries no signal


def test_on_policy_loss_is_minus_mean_advantage_and_its_gradient_follows_it():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, stats = clipped_surrogate(logp, logp.detach(), adv, mask, Surrogate(0.2, 0.28))
    assert loss.item() == pytest.approx(-(1 + 1 - 1) / 3)
    assert stats.ratio_mean == pytest.approx(1.0) and stats.clip_fraction == 0.0
    loss.backward()
    assert logp.grad[0, 0] < 0 < logp.grad[1, 0]  # raise the good response, lower the bad one
    assert logp.grad[1, 1] == 0  # masked token


@pytest.mark.parametrize("delta, adv, clipped", [(0.5, 1.0, True), (-0.5, 1.0, False), (-0.5, -1.0, True),
                                                 (0.1, 1.0, False)])
def test_importance_ratio_is_clipped_asymmetrically(delta, adv, clipped):
    behaviour = torch.tensor([[-1.0]])
    new = (behaviour + delta).requires_grad_(True)
    loss, stats = clipped_surrogate(new, behaviour, torch.tensor([adv]), torch.ones(1, 1), Surrogate(0.2, 0.28))
    ratio = math.exp(delta)
    bounded = min(max(ratio, 0.8), 1.28)
    assert loss.item() == pytest.approx(max(-adv * ratio, -adv * bounded))
    assert stats.clip_fraction == (1.0 if clipped else 0.0)
    loss.backward()
    assert (new.grad.abs().item() == 0) == clipped  # a clipped token passes no gradient


def test_loss_aggregation_modes_follow_verl():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_length=8).item() == pytest.approx((6 / 8 + 4 / 8) / 2)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate(loss, mask, "sum")


def test_token_logprobs_use_the_temperature():
    logits = torch.tensor([[[2.0, 0.0]]])
    got = token_logprobs(logits, torch.tensor([[0]]), temperature=2.0)
    assert got.item() == pytest.approx(math.log(math.e / (math.e + 1)))


@pytest.mark.parametrize("size, share, want", [(4, 0.0, 0), (4, 0.5, 2), (2, 0.5, 1), (2, 0.9, 1), (8, 0.25, 2)])
def test_replay_count_keeps_a_fresh_group(size, share, want):
    assert replay_count(size, share) == want


def test_staleness_bound():
    assert not is_stale(3, 4, 1) and is_stale(2, 4, 1) and not is_stale(4, 4, 0)


def test_prompt_ids_cross_an_epoch():
    # 2 rows left in epoch 0 (positions 8 and 9 of 10), then 2 rows of epoch 1
    got = prompt_ids((0, 8), (1, 2), [0, 0, 1, 1])
    assert got == [("0:8", (0, 9)), ("0:9", (1, 0)), ("1:0", (1, 1)), ("1:1", (1, 2))]


def _group(pid: str, version: int, replay_id: int | None = None) -> Group:
    g = Group(pid, [1, 2], [Rollout([3], [-0.1], 1.0), Rollout([4], [-0.2], 0.0)], version)
    return g.as_replay(replay_id) if replay_id is not None else g


def test_choose_replays_drops_stale_and_used_up_groups_and_retires_them():
    candidates = [_group("0:1", 1, 10), _group("0:2", 4, 11), _group("0:2", 4, 11), _group("0:3", 4, 12),
                  _group("0:4", 3, 13), _group("0:5", 4, 14), _group("0:6", 0, 15)]
    choice = choose_replays(candidates, want=2, uses={"0:3": 2, "0:4": 1, "0:6": 2}, current_version=4,
                            max_staleness=1, max_uses=2, exclude={"0:5"})
    assert [g.prompt_id for g in choice.chosen] == ["0:2", "0:4"]
    # used up (0:3, and 0:6 which is also stale) is not a staleness drop
    assert choice.retire == [10, 12, 15] and choice.dropped_stale == 1 and choice.max_staleness == 1


@pytest.mark.parametrize("seed", range(12))
def test_a_step_replays_what_the_buffer_holds_whatever_one_draw_picks(seed):
    """After a resume the buffer also holds a killed attempt's groups (prompts this attempt has not trained yet) and
    used-up ones: the step draws again, excluding what it drew, until it has its replays or nothing is left."""
    from types import SimpleNamespace

    from verl_grpo.services.replay_buffer import ReplayBuffer
    from verl_grpo.trainers.loop.training import SAMPLE_OVERDRAW, Loop

    class Replay:  # the replay-buffer service's /sample over its own buffer
        def post(self, path, body):
            assert path == "/sample" and body["unique"]
            entries, _ = buffer.sample(body["size"], None, True, body["min_policy_version"],
                                       frozenset(body["exclude_ids"]))
            return {"items": [{"id": e.id, "data": e.data} for e in entries]}

    buffer = ReplayBuffer(capacity=100, alpha=1.0, seed=seed)
    killed = [_group(f"0:{i}", 3) for i in range(4, 4 + 2 * SAMPLE_OVERDRAW)]  # the killed attempt's fresh groups
    used_up, usable = _group("0:1", 1), _group("0:2", 2)
    groups = [used_up, *killed[:3], usable, *killed[3:]]
    buffer.add([g.mean_reward for g in groups], [g.payload() for g in groups], [g.policy_version for g in groups])
    loop = SimpleNamespace(want_replay=1, pending_retire=set(), max_uses=2,
                           cfg=SimpleNamespace(async_training=SimpleNamespace(max_staleness=3)),
                           state=SimpleNamespace(uses={"0:1": 2, "0:2": 1, "0:3": 1}))
    chosen, retire, dropped = Loop._replays(loop, SimpleNamespace(replay=Replay()), current=3)
    assert [g.prompt_id for g in chosen] == ["0:2"] and dropped == 0
    assert set(retire) <= {0}  # the used-up group, retired when drawn


def test_loop_state_counts_uses_moves_the_cursor_and_round_trips():
    state = LoopState()
    fresh = [Group("0:0", [1], [], 0, cursor_after=(0, 1)), Group("0:1", [1], [], 0, cursor_after=(0, 2))]
    state.record(fresh, current_version=1)
    state.record([fresh[0].as_replay(7)], current_version=2)
    assert state.uses == {"0:0": 2, "0:1": 1} and state.cursor == (0, 2)
    assert state.replay_share == pytest.approx(1 / 3) and state.max_staleness_seen == 2
    assert LoopState.from_json(state.to_json()) == state


def test_group_payload_round_trips_as_a_replay():
    g = _group("1:4", 3)
    back = Group.from_payload(g.payload(), replay_id=5)
    assert back == g.as_replay(5) and back.source == "replay"


def test_sequences_align_behaviour_logprobs_with_the_predicting_positions():
    from verl_grpo.trainers.loop.update import build_sequences

    g = Group("0:0", [5, 6], [Rollout([7, 8], [-0.1, -0.2], 1.0), Rollout([9], [-0.3], 0.0)], 0)
    s = build_sequences([g])
    assert s.input_ids.tolist() == [[5, 6, 7, 8], [5, 6, 9, 0]]
    assert s.response_mask.tolist() == [[0, 1, 1], [0, 1, 0]]
    assert s.targets[0, 1:].tolist() == [7, 8] and s.behaviour[0, 1:].tolist() == pytest.approx([-0.1, -0.2])
    assert s.advantages[0] > 0 > s.advantages[1] and s.first_predicting == 1


def test_update_on_policy_matches_whole_batch_loss_in_micro_batches():
    from verl_grpo.trainers.loop.update import PolicyUpdate

    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(16, 8)
            self.out = torch.nn.Linear(8, 16)

        def forward(self, input_ids, attention_mask, logits_to_keep=0):
            return type("O", (), {"logits": self.out(self.emb(input_ids))[:, -logits_to_keep:]})()

    groups = [Group(f"0:{i}", [1, 2], [Rollout([3 + i, 4], [-2.0, -2.5], float(i % 2 == j)) for j in range(2)], 0)
              for i in range(2)]
    losses = []
    for micro in (None, 1):
        torch.manual_seed(0)
        model = Tiny()
        upd = PolicyUpdate(model, torch.optim.AdamW(model.parameters(), lr=0.0), temperature=1.0,
                           surrogate=Surrogate(0.2, 0.28, "token-mean", 4), micro_batch_size=micro)
        losses.append(upd.step(groups).loss)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_warmup_lr_is_linear_then_constant():
    from verl_grpo.trainers.loop.training import warmup_lr

    assert [warmup_lr(1.0, 4, s) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    assert warmup_lr(1e-6, 0, 1) == 1e-6
