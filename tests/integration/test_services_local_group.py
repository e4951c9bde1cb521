"""The local job group for real: reward + retrieval (+ replay) as subprocesses on 127.0.0.1, found through the
env vars the SkyPilot job group exports, used by the verl reward function (loaded by verl's loader), the TRL
reward functions and the search tool, then stopped."""

from __future__ import annotations

import asyncio
import json
import os
import stat

import pytest

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError
from verl_grpo.rewards import compute_score
from verl_grpo.services.client import ServiceClient
from verl_grpo.services.local_group import services_env, start_local_services, stop_local_services

GOOD = "<think>6*7</think><answer>42</answer>"


def small_corpus(mirror, path, paragraphs=20):
    data = json.loads((mirror / "squad" / "dev-v1.1.json").read_text())
    article = data["data"][0]
    path.write_text(json.dumps({"version": "1.1", "data": [{**article, "paragraphs": article["paragraphs"][:paragraphs]}]}))
    return path


def group_config(tmp_path, mirror, enabled):
    return RunConfig.model_validate({
        "storage": {"uri": f"file://{tmp_path / 'store'}"},
        "services": {"enabled": enabled, "termination_delay_s": 0.2, "startup_timeout_s": 180,
                     "retrieval": {"index": "slice", "corpus": str(small_corpus(mirror, tmp_path / "squad.json"))}},
    })


@pytest.fixture(scope="module")
def group(tmp_path_factory, data_mirror):
    tmp = tmp_path_factory.mktemp("group")
    cfg = group_config(tmp, data_mirror, ["reward", "retrieval", "replay"])
    workdir = tmp / "work"
    started = start_local_services(cfg, "run-1", workdir)
    yield cfg, workdir, started
    stop_local_services(workdir, delay_s=0)


@pytest.fixture
def group_env(group, monkeypatch):
    _, _, started = group
    for k, v in started.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("VERL_GRPO_SERVICES_TOKEN", raising=False)
    return started.env


def test_env_matches_the_job_group_and_holds_no_secret(group):
    _, workdir, started = group
    assert set(started.env) == {"VERL_GRPO_REWARD_SERVER_URL", "VERL_GRPO_RETRIEVAL_SERVER_URL",
                                "VERL_GRPO_REPLAY_BUFFER_URL", "VERL_GRPO_SERVICES_TOKEN_FILE"}
    assert all(v.startswith("http://127.0.0.1:") for k, v in started.env.items() if k.endswith("_URL"))
    token_file = started.env["VERL_GRPO_SERVICES_TOKEN_FILE"]
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    token = open(token_file).read()
    assert services_env(workdir) == started.env
    for task, log in started.logs.items():
        assert token not in open(log).read()
        assert token not in " ".join(started.commands[task])
    assert set(started.endpoints) == {"reward-server", "retrieval-server", "replay-buffer"}


def test_a_second_start_reuses_the_running_services(group):
    cfg, workdir, started = group
    again = start_local_services(cfg, "run-1", workdir)
    assert again.pids == started.pids and again.endpoints == started.endpoints


def test_verl_reward_function_calls_the_reward_server(group_env):
    from verl.utils.import_utils import load_extern_object

    fn = load_extern_object(module_path="pkg://verl_grpo.services.reward_client", object_name="compute_score")
    assert asyncio.iscoroutinefunction(fn)
    import numpy as np

    extra = {"index": np.int64(3), "num_turns": None, "rollout_reward_scores": {}}
    got = asyncio.run(fn(data_source="gsm8k", solution_str=GOOD, ground_truth="42", extra_info=extra))
    assert got == compute_score("gsm8k", GOOD, "42")


def test_trl_reward_functions_score_through_the_server(group_env):
    from verl_grpo.rewards.trl_adapter import trl_reward_functions
    from verl_grpo.services.reward_client import remote_trl_reward_functions

    remote, weights = remote_trl_reward_functions("gsm8k")
    local, local_weights = trl_reward_functions("gsm8k")
    completions = [[{"role": "assistant", "content": GOOD}], [{"role": "assistant", "content": "41"}]]
    cols = {"reward_model": [{"ground_truth": "42"}, {"ground_truth": "42"}], "data_source": ["gsm8k"] * 2}
    assert weights == local_weights
    for r, l in zip(remote, local):
        assert r.__name__ == l.__name__
        assert r(prompts=["p", "p"], completions=completions, **cols) == l(prompts=["p", "p"], completions=completions, **cols)
    assert remote[0].scores.requests == 1  # one request per batch; the other components reuse it


def test_search_tool_for_trl_and_verl(group_env):
    from verl.tools.tool_registry import initialize_tools_from_config

    from verl_grpo.services.search import search
    from verl_grpo.services.search_tool import tool_config_path

    text = search("Which NFL team represented the AFC at Super Bowl 50?", top_k=2)
    assert text.startswith("Doc 1(Title: Super Bowl 50)") and "Doc 2(" in text and "Doc 3(" not in text
    (tool,) = initialize_tools_from_config(str(tool_config_path()))
    response, reward, metrics = asyncio.run(tool.execute("i-1", {"query": "Where was Super Bowl 50 played?"}))
    assert metrics == {"num_results": 3} and response.text.count("Doc ") == 3
    bad, _, metrics = asyncio.run(tool.execute("i-2", {"query": ""}))
    assert metrics == {"error": "bad_query"}


def test_replay_buffer_through_the_client(group_env):
    from verl_grpo.services.client import service_url

    with ServiceClient(service_url("replay")) as c:
        assert c.post("/add", {"items": [{"data": {"r": "x"}, "reward": 1.0}]})["size"] == 1
        assert c.post("/sample", {"size": 3})["items"][0]["data"] == {"r": "x"}


def test_wrong_token_is_a_config_error(group):
    _, _, started = group
    with ServiceClient(started.endpoints["reward-server"], token="wrong", retries=0) as c:
        with pytest.raises(ConfigError, match="wrong bearer token"):
            c.post("/batch_reward", {"items": [{"data_source": "gsm8k", "solution_str": "1", "ground_truth": "1"}]})


def test_stop_ends_the_processes_and_a_failing_service_fails_start(tmp_path, data_mirror):
    cfg = group_config(tmp_path, data_mirror, ["reward"])
    started = start_local_services(cfg, "run-2", tmp_path / "work")
    pid = started.pids["reward-server"]
    stop_local_services(tmp_path / "work")
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "Z"
    assert services_env(tmp_path / "work") == {}
    broken = cfg.model_copy(update={"services": cfg.services.model_copy(update={"enabled": ["data"]})})
    with pytest.raises(ConfigError, match="no prepared version of dataset 'gsm8k'"):
        start_local_services(broken, "run-3", tmp_path / "work3")
    assert services_env(tmp_path / "work3") == {}
    assert start_local_services(RunConfig(), "run-4", tmp_path / "work4") is None
