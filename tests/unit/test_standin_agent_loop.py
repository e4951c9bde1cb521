"""The LLM server the rehearsal's stand-in gives verl's agent loop: vLLM's token budget and stop tokens, on HF generate.

verl's ToolAgentLoop asks `server_manager.generate(...)` for one turn at a time, adding the tool parser's stop tokens;
vLLM's server (verl/workers/rollout/vllm_rollout/vllm_async_server.py) caps the turn at what is left of
prompt_length + response_length and the model length, and returns the stop token it stopped at (and nothing after).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl_grpo_rehearsal.standin_agent_loop import CpuServerClient


def _config(max_model_len=None):
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 10, "response_length": 20, "max_model_len": max_model_len, "full_determinism": False}}})


@pytest.fixture(scope="module")
def client(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return CpuServerClient(_config(), model, AutoTokenizer.from_pretrained(tiny_model_dir))


def test_the_turn_budget_is_vllms(client):
    assert client.max_tokens(5, {}) == 20  # the response length
    assert client.max_tokens(15, {}) == 15  # what is left of prompt + response length
    assert client.max_tokens(15, {"max_tokens": 50}) == 15  # never past the model length
    assert client.max_tokens(29, {"max_tokens": 0}) == 1  # at least one token, as vLLM requires
    with pytest.raises(ValueError, match="leaves no room to generate"):
        client.max_tokens(30, {})
    assert CpuServerClient(_config(max_model_len=12), client.model, client.tokenizer).max_tokens(5, {}) == 7


def test_a_turn_ends_with_the_stop_token_it_stopped_at(client):
    prompt = client.tokenizer("The capital of Poland is", add_special_tokens=False)["input_ids"]
    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 6}
    free = asyncio.run(client.generate("r1", prompt_ids=prompt, sampling_params=greedy)).token_ids
    assert len(free) == 6
    stop = free[2]
    cut = asyncio.run(client.generate("r2", prompt_ids=prompt,
                                      sampling_params={**greedy, "stop_token_ids": [stop]})).token_ids
    assert cut == free[: free.index(stop) + 1]
