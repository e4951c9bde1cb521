"""reward-server app in-process (FastAPI TestClient): auth, scores equal in-process scoring, limits, errors,
and the neural reward model path with a tiny random-init sequence-classification model."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from verl_grpo.rewards import compute_score
from verl_grpo.services.reward_server import ModelScorer, RuleScorer, build_app

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD = "<think>6*7</think><answer>42</answer>"


@pytest.fixture(scope="module")
def client():
    with TestClient(build_app(RuleScorer(), TOKEN, max_body_bytes=64_000, max_items=50)) as c:
        yield c


def test_scores_equal_in_process_scoring(client):
    items = [
        {"data_source": "gsm8k", "solution_str": GOOD, "ground_truth": "42"},
        {"data_source": "openai/gsm8k", "solution_str": "the answer is 41", "ground_truth": "42"},
        {"data_source": "math", "solution_str": "<think>x</think><answer>\\frac{1}{2}</answer>", "ground_truth": "0.5"},
        {"data_source": "mbpp", "solution_str": "<think>t</think><answer>```python\ndef f(x):\n    return "
                                                "x\n```</answer>",
         "ground_truth": '{"test_list": ["assert f(1) == 1"], "test_setup_code": "", "challenge_test_list": []}'},
    ]
    r = client.post("/batch_reward", json={"items": items}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scorer"] == "rule"
    expected = [compute_score(i["data_source"], i["solution_str"], i["ground_truth"]) for i in items]
    assert [r["components"] for r in body["rewards"]] == expected
    assert [r["reward"] for r in body["rewards"]] == [e["score"] for e in expected]
    assert [r["correct"] for r in body["rewards"]] == [True, False, True, True]
    assert [r["extracted_answer"] for r in body["rewards"]][:3] == ["42", expected[1]["pred"] or None, "\\frac{1}{2}"]
    assert body["rewards"][3]["components"]["test_pass_rate"] == 1.0
    assert body["mean_reward"] == pytest.approx(sum(e["score"] for e in expected) / 4)
    assert body["accuracy"] == 0.75
    assert set(body) == {"rewards", "mean_reward", "accuracy", "scorer", "seconds"}


def test_the_seeds_reward_function_reads_the_answer(client):
    """SkyPilot's verl_reward_function reads `[r["reward"] for r in data["rewards"]]`."""
    items = [{"data_source": "gsm8k", "solution_str": s, "ground_truth": "42"} for s in (GOOD, "no")]
    data = client.post("/batch_reward", json={"items": items}, headers=AUTH).json()
    assert [r["reward"] for r in data["rewards"]] == [1.0, compute_score("gsm8k", "no", "42")["score"]]


def test_missing_and_wrong_token_are_401(client):
    body = {"items": [{"data_source": "gsm8k", "solution_str": GOOD, "ground_truth": "42"}]}
    r = client.post("/batch_reward", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    r = client.post("/batch_reward", json=body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and TOKEN not in r.text
    assert client.get("/health").json()["info"] == {"scorer": "rule"}


def test_errors_are_structured_4xx(client):
    r = client.post("/batch_reward", json={"items": [{"data_source": "imdb", "solution_str": "x", "ground_truth": 1}]},
                    headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_data_source"
    assert "items[0].data_source" in r.json()["error"]["message"]
    r = client.post("/batch_reward", content=b'{"items": [', headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = client.post("/batch_reward", json={"items": []}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["details"][0]["loc"] == "body.items"
    r = client.post("/batch_reward", json={"items": [{"data_source": "gsm8k", "solution_str": "x"}] * 51}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"]["code"] == "too_many_items"
    r = client.post("/batch_reward", content=b"x" * 70_000, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    r = client.post("/batch_reward", json={"items": [{"data_source": "mbpp", "solution_str": "x", "ground_truth": "zz"}]},
                    headers=AUTH)
    assert r.status_code == 422 and "mbpp ground_truth" in r.json()["error"]["message"]


def test_openapi_documents_the_models(client):
    spec = client.get("/openapi.json").json()
    assert "/batch_reward" in spec["paths"]
    assert {"RewardItem", "BatchRewardRequest", "BatchRewardResponse", "RewardResult",
            "ErrorResponse"} <= set(spec["components"]["schemas"])


@pytest.fixture(scope="module")
def tiny_reward_model(tmp_path_factory, tiny_model_dir):
    """A random-init sequence-classification model (1 label) with the tiny model's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("rm")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_neural_reward_model_behind_the_same_api(tiny_reward_model):
    scorer = ModelScorer(str(tiny_reward_model), batch_size=2)
    with TestClient(build_app(scorer, TOKEN, 64_000)) as c:
        items = [{"data_source": "gsm8k", "solution_str": s, "ground_truth": "42",
                  "extra_info": {"prompt": "What is 6*7?"}} for s in (GOOD, "no idea", "42 42 42")]
        r = c.post("/batch_reward", json={"items": items}, headers=AUTH)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["scorer"] == "model" and len(body["rewards"]) == 3 and body["accuracy"] is None
        assert all(r["correct"] is None and r["reward"] == r["components"]["score"] for r in body["rewards"])
        scores = [r["reward"] for r in body["rewards"]]
        assert all(isinstance(s, float) for s in scores) and len(set(scores)) == 3
        again = c.post("/batch_reward", json={"items": items[:1]}, headers=AUTH).json()["rewards"][0]["reward"]
        assert again == pytest.approx(scores[0], abs=1e-5)  # padding in a batch does not change a score
        info = c.get("/health").json()["info"]
        assert info["num_labels"] == 1 and info["device"] == "cpu"
