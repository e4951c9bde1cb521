"""Pure parts of the services: epoch order and cursors, replay priorities and eviction, config, commands, tokens."""

from __future__ import annotations

import numpy as np
import pytest

from verl_grpo.config import RunConfig, load_config
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.providers.skypilot import templates
from verl_grpo.services import SERVICES
from verl_grpo.services.data_server import Cursor, epoch_order, take
from verl_grpo.services.http import load_token
from verl_grpo.services.local_group import service_command
from verl_grpo.services.replay_buffer import ReplayBuffer, priorities
from verl_grpo.services.reward_client import jsonable
from verl_grpo.services.search import format_passages
from verl_grpo.services.serving import resolve_token


def test_epoch_order_is_a_seeded_permutation():
    a, b = epoch_order(10, seed=0, epoch=0), epoch_order(10, seed=0, epoch=0)
    assert sorted(a.tolist()) == list(range(10))
    assert a.tolist() == b.tolist()
    assert a.tolist() != epoch_order(10, seed=0, epoch=1).tolist()
    assert a.tolist() != epoch_order(10, seed=1, epoch=0).tolist()


def test_take_crosses_epochs_and_visits_every_row_once_per_epoch():
    picked, cursor = take(5, seed=3, cursor=Cursor(), size=7)
    assert cursor == Cursor(epoch=1, position=2)
    assert [e for e, _ in picked] == [0] * 5 + [1] * 2
    assert sorted(i for e, i in picked if e == 0) == list(range(5))
    rest, cursor = take(5, seed=3, cursor=cursor, size=3)
    assert cursor == Cursor(epoch=2, position=0)
    assert sorted([i for e, i in picked if e == 1] + [i for _, i in rest]) == list(range(5))


def test_take_resumes_exactly_where_it_stopped():
    whole, _ = take(9, seed=1, cursor=Cursor(), size=20)
    first, cursor = take(9, seed=1, cursor=Cursor(), size=8)
    second, _ = take(9, seed=1, cursor=cursor, size=12)
    assert first + second == whole


def test_take_on_an_empty_split_names_the_fix():
    with pytest.raises(DataError, match="no rows"):
        take(0, seed=0, cursor=Cursor(), size=1)


def test_priorities_follow_reward_and_alpha():
    rewards = np.array([0.0, 0.5, 1.0])
    p = priorities(rewards, alpha=1.0)
    assert p.sum() == pytest.approx(1.0)
    assert p[0] < p[1] < p[2]
    assert priorities(rewards, alpha=0.0) == pytest.approx(np.full(3, 1 / 3))
    assert priorities(rewards, alpha=2.0)[2] > p[2]
    assert priorities(np.array([-3.0, -1.0]), alpha=1.0)[1] > 0.99  # negative rewards are shifted, not clipped


def test_replay_buffer_evicts_oldest_beyond_capacity():
    buf = ReplayBuffer(capacity=3, alpha=1.0, seed=0)
    ids = buf.add([0.1, 0.2, 0.3, 0.4, 0.5], [{"i": i} for i in range(5)])
    assert ids == [0, 1, 2, 3, 4]
    assert list(buf.items) == [2, 3, 4]
    assert (buf.added_total, buf.evicted_total) == (5, 2)


def test_replay_sampling_prefers_high_reward():
    buf = ReplayBuffer(capacity=10, alpha=1.0, seed=0)
    buf.add([0.0, 1.0], ["low", "high"])
    entries, probs = buf.sample(2000)
    high = sum(e.data == "high" for e in entries)
    assert high > 1900
    uniform, _ = buf.sample(2000, alpha=0.0)
    assert 800 < sum(e.data == "high" for e in uniform) < 1200


def test_replay_state_round_trips():
    buf = ReplayBuffer(capacity=4, alpha=0.5, seed=0)
    buf.add([1.0, 2.0, 3.0], ["a", "b", "c"])
    other = ReplayBuffer(capacity=4, alpha=0.5)
    other.load_state(buf.state())
    assert [(e.id, e.reward, e.data) for e in other.items.values()] == [(0, 1.0, "a"), (1, 2.0, "b"), (2, 3.0, "c")]
    assert other.next_id == 3


def test_services_config_accepts_a_bare_list_and_rejects_unknown_names(tmp_path):
    f = tmp_path / "svc.yaml"
    f.write_text("services: [reward, retrieval, reward]\n")
    assert load_config([f]).services.enabled == ["reward", "retrieval"]
    assert load_config(overrides=["services.enabled=[replay]"]).services.enabled == ["replay"]
    with pytest.raises(ConfigError, match="services.enabled"):
        load_config(overrides=["services.enabled=[rewards]"])
    with pytest.raises(ConfigError, match="did you mean 'services.termination_delay_s'"):
        load_config(overrides=["services.termination_delay=5"])


def test_the_skypilot_job_group_runs_the_services_table():
    assert [s.task for s in templates.JOB_GROUP_SERVICES] == ["data-server", "reward-server", "retrieval-server"]
    assert all(SERVICES[s.name] is s for s in templates.JOB_GROUP_SERVICES)
    assert SERVICES["reward"].url_env == "VERL_GRPO_REWARD_SERVER_URL"
    assert SERVICES["replay"].url_env == "VERL_GRPO_REPLAY_BUFFER_URL"


def test_service_commands_carry_settings_but_no_secret():
    cfg = RunConfig.model_validate({"services": {"enabled": ["data", "reward", "retrieval", "replay"],
                                                 "replay": {"capacity": 7}, "retrieval": {"index_kind": "flat"}}})
    cmds = {name: service_command(name, cfg, 9000, "run-1") for name in SERVICES}
    for name, cmd in cmds.items():
        assert cmd[1:4] == ["-m", SERVICES[name].module, "serve"]
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
        assert "--exit-with-parent" in cmd
        assert not any("token" in c.lower() and c != "--token-env" and c != cfg.services.token_env for c in cmd)
    assert cmds["replay"][cmds["replay"].index("--capacity") + 1] == "7"
    assert cmds["retrieval"][cmds["retrieval"].index("--kind") + 1] == "flat"
    assert cmds["data"][cmds["data"].index("--dataset") + 1] == "gsm8k"
    assert "--dataset-uri" in service_command("data", cfg, 9000, "run-1", dataset_uri="file:///s/datasets/gsm8k/ab")


def test_token_precedence_env_then_file(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_GRPO_SERVICES_TOKEN", raising=False)
    monkeypatch.delenv("VERL_GRPO_SERVICES_TOKEN_FILE", raising=False)
    assert load_token() is None
    monkeypatch.setenv("VERL_GRPO_SERVICES_TOKEN", "from-env")
    assert load_token() == "from-env"
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    monkeypatch.setenv("VERL_GRPO_SERVICES_TOKEN_FILE", str(f))
    assert load_token() == "from-file"
    f.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_token()


def test_clients_read_the_token_from_the_variable_services_token_env_names(tmp_path, monkeypatch):
    from verl_grpo.services.client import ServiceClient

    for var in ("VERL_GRPO_SERVICES_TOKEN", "VERL_GRPO_SERVICES_TOKEN_FILE", "VERL_GRPO_SERVICES_TOKEN_ENV"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MY_SVC_TOKEN", "mine")
    with ServiceClient("http://127.0.0.1:9") as client:
        assert client.token is None
    monkeypatch.setenv("VERL_GRPO_SERVICES_TOKEN_ENV", "MY_SVC_TOKEN")  # what the job group / local group export
    with ServiceClient("http://127.0.0.1:9") as client:
        assert client.token == "mine"
    monkeypatch.delenv("MY_SVC_TOKEN")
    f = tmp_path / "tok"
    f.write_text("from-file\n")
    monkeypatch.setenv("MY_SVC_TOKEN_FILE", str(f))  # the local group's per-run token file
    with ServiceClient("http://127.0.0.1:9") as client:
        assert client.token == "from-file"


def test_serving_without_a_token_needs_no_auth_on_loopback(monkeypatch):
    monkeypatch.delenv("VERL_GRPO_SERVICES_TOKEN", raising=False)
    monkeypatch.delenv("VERL_GRPO_SERVICES_TOKEN_FILE", raising=False)
    with pytest.raises(ConfigError, match="VERL_GRPO_SERVICES_TOKEN"):
        resolve_token("127.0.0.1", "VERL_GRPO_SERVICES_TOKEN", None, no_auth=False)
    assert resolve_token("127.0.0.1", "VERL_GRPO_SERVICES_TOKEN", None, no_auth=True) is None
    with pytest.raises(ConfigError, match="loopback"):
        resolve_token("0.0.0.0", "VERL_GRPO_SERVICES_TOKEN", None, no_auth=True)


def test_jsonable_turns_numpy_into_json():
    out = jsonable({"a": np.int64(3), "b": np.array([1.5, 2.0]), "c": (np.float32(0.5), None), 4: {"d": np.bool_(True)}})
    assert out == {"a": 3, "b": [1.5, 2.0], "c": [0.5, None], "4": {"d": True}}


def test_format_passages_is_search_r1_style():
    text = format_passages([{"title": "Paris", "text": "Capital of France."}, {"title": "Rome", "text": "Italy."}])
    assert text == "Doc 1(Title: Paris) Capital of France.\nDoc 2(Title: Rome) Italy."
