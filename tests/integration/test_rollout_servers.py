"""The CPU rollout fleet for real: two rollout servers and the router as subprocesses on 127.0.0.1, driven over
HTTP by the clients the trainer uses; behaviour log-probs checked against a teacher-forced forward pass."""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl_grpo.errors import ConfigError, DataError
from verl_grpo.services.rollout_client import RolloutClient, RouterClient
from verl_grpo.services.rollout_fleet import start_rollout_fleet

PROMPTS = ["Question: Natalia sold 48 clips. How many?", "Answer:", "Tom has 3 apples and buys 5 more."]
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_model_dir):
    with start_rollout_fleet(tiny_model_dir, 2, tmp_path_factory.mktemp("fleet"), startup_timeout_s=180) as started:
        yield started


@pytest.fixture(scope="module")
def token(fleet):
    return Path(fleet.token_file).read_text().strip()


@pytest.fixture(scope="module")
def router(fleet, token):
    with RouterClient(fleet.router_url, token=token) as client:
        yield client


@pytest.fixture(scope="module")
def perturbed_model_dir(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("perturbed") / "model"
    shutil.copytree(tiny_model_dir, out)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    model.save_pretrained(str(out))
    return out


def teacher_forced(model_dir: Path, prompt_ids: list[int], token_ids: list[int], temperature: float) -> torch.Tensor:
    model = _load(str(model_dir))
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0, len(prompt_ids) - 1:-1]
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(token_ids)[:, None])[:, 0]


def eventually(check, timeout_s: float = 10.0) -> bool:
    """The router sees versions through its periodic health checks (every second)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


_models: dict[str, AutoModelForCausalLM] = {}


def _load(path: str) -> AutoModelForCausalLM:
    if path not in _models:
        _models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _models[path]


def test_generate_through_the_router_spreads_over_both_servers(fleet, router):
    assert router.workers() == fleet.worker_urls
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda i: router.generate(PROMPTS, n=3, max_new_tokens=12,
                                                            temperature=TEMPERATURE), range(8)))
    assert {r.worker for r in responses} == set(fleet.worker_urls)
    for response in responses:
        assert response.policy_version == 0
        assert [o.prompt_index for o in response.outputs] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        for out in response.outputs:
            assert 1 <= len(out.token_ids) <= 12 and len(out.logprobs) == len(out.token_ids)
            assert out.finish_reason == ("length" if len(out.token_ids) == 12 else "stop")
            assert all(lp <= 0 for lp in out.logprobs)
    stats = router.stats()
    assert stats["requests"] == 8 and sum(stats["per_worker"].values()) == 8
    assert all(count > 0 for count in stats["per_worker"].values())


def test_logprobs_equal_a_teacher_forced_recomputation(fleet, router, tiny_model_dir):
    response = router.generate(PROMPTS, n=2, max_new_tokens=16, temperature=TEMPERATURE, top_k=50, top_p=0.9, seed=3)
    for out in response.outputs:
        expected = teacher_forced(tiny_model_dir, out.prompt_token_ids, out.token_ids, TEMPERATURE)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


def test_a_seed_repeats_the_samples_on_any_server(fleet, token):
    requests = dict(prompts=PROMPTS, n=2, max_new_tokens=10, temperature=1.0, seed=11)
    answers = []
    for url in fleet.worker_urls:
        with RolloutClient(url, token=token) as client:
            answers.append([o.token_ids for o in client.generate(**requests).outputs])
            answers.append([o.token_ids for o in client.generate(**{**requests, "seed": 12}).outputs])
    assert answers[0] == answers[2] and answers[1] == answers[3] and answers[0] != answers[1]


def test_the_router_refuses_weights_and_requests_without_the_token(fleet, router):
    with pytest.raises(DataError, match="409.*every worker listed by GET /workers"):
        router.post("/update_weights", {"path": "/nowhere", "policy_version": 1})
    with RouterClient(fleet.router_url, token="wrong") as client, pytest.raises(ConfigError, match="wrong bearer"):
        client.generate(["x"], max_new_tokens=2)


def test_a_request_the_model_cannot_take_is_refused_without_failing_the_worker(fleet, router):
    with pytest.raises(DataError, match="422.*exceed the model's 2048 positions"):
        router.generate(["hello"], max_new_tokens=4000)
    assert router.health()["status"] == "ok"


def test_update_weights_on_every_worker_raises_the_version_and_changes_generations(fleet, router, token,
                                                                                   perturbed_model_dir):
    request = dict(prompts=PROMPTS, n=2, max_new_tokens=12, temperature=TEMPERATURE, seed=5)
    clients = [RolloutClient(url, token=token) for url in fleet.worker_urls]
    before = [[o.token_ids for o in c.generate(**request).outputs] for c in clients]
    for client in clients:
        answer = client.update_weights(str(perturbed_model_dir), 1)
        assert answer["policy_version"] == 1 and answer["seconds"] >= 0
        assert client.policy_version() == 1
    after = [c.generate(**request) for c in clients]
    for old, new in zip(before, after):
        assert new.policy_version == 1 and [o.token_ids for o in new.outputs] != old
        out = new.outputs[0]
        expected = teacher_forced(perturbed_model_dir, out.prompt_token_ids, out.token_ids, TEMPERATURE)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)
    assert eventually(lambda: {w["policy_version"] for w in router.health()["workers"]} == {1})

    with pytest.raises(DataError, match="409.*policy_version 0 is lower than the served 1"):
        clients[0].update_weights(str(perturbed_model_dir), 0)
    with pytest.raises(DataError, match="400.*/no/such/dir"):
        clients[0].update_weights("/no/such/dir", 2)
    assert clients[0].policy_version() == 1
    for client in clients:
        client.close()


def test_every_response_is_stamped_with_the_weights_that_generated_it(fleet, token, tiny_model_dir,
                                                                       perturbed_model_dir):
    """Generations racing weight updates: each response's log-probs are those of the version it names."""
    models = {1: perturbed_model_dir, 2: tiny_model_dir, 3: perturbed_model_dir}
    url = fleet.worker_urls[0]
    with RolloutClient(url, token=token) as client, ThreadPoolExecutor(4) as pool:
        gens = [pool.submit(client.generate, PROMPTS[:2], n=2, max_new_tokens=40, temperature=TEMPERATURE, seed=i)
                for i in range(6)]
        for version in (2, 3):
            client.update_weights(str(models[version]), version)
        responses = [g.result() for g in gens]
    for response in responses:
        out = response.outputs[-1]
        expected = teacher_forced(models[response.policy_version], out.prompt_token_ids, out.token_ids, TEMPERATURE)
        torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


def test_a_killed_worker_is_skipped(tmp_path, tiny_model_dir):
    with start_rollout_fleet(tiny_model_dir, 2, tmp_path, startup_timeout_s=180) as fleet:
        token = Path(fleet.token_file).read_text().strip()
        os.kill(fleet.pids["rollout-0"], signal.SIGKILL)
        with RouterClient(fleet.router_url, token=token) as router:
            workers = {router.generate(["hello"], max_new_tokens=4).worker for _ in range(4)}
            health = router.health()
    assert workers == {fleet.worker_urls[1]}
    assert health["status"] == "degraded"
    assert [w["healthy"] for w in health["workers"]] == [False, True]


def test_a_server_that_cannot_load_its_model_names_its_log(tmp_path):
    (tmp_path / "empty-model").mkdir()
    with pytest.raises(ConfigError, match=r"rollout-0 exited with code 2 during start-up; log .*rollout-0\.log"):
        start_rollout_fleet(tmp_path / "empty-model", 1, tmp_path, startup_timeout_s=60)
