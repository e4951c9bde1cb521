"""The dry run's GPU memory estimate: the OOM a local rehearsal cannot reproduce fails before launch."""

from __future__ import annotations

from functools import partial

import pytest
from run_configs import VERL_ON_SKYPILOT, build_config

from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot.dry_run import check_gpu_memory, model_params

_cfg = partial(build_config, *VERL_ON_SKYPILOT)


def test_model_params_from_the_name():
    assert model_params("HuggingFaceTB/SmolLM2-135M-Instruct") == pytest.approx(1.35e8)
    assert model_params("Qwen/Qwen2.5-0.5B-Instruct") == pytest.approx(5e8)
    assert model_params("meta-llama/Llama-3.1-70B") == pytest.approx(7e10)
    assert model_params("gpt2") is None


def test_small_model_fits():
    assert check_gpu_memory(_cfg("infra.accelerators=H100:8")).startswith("GPU memory fits")


def test_full_fine_tuning_of_a_70b_on_one_node_fails_in_one_line_naming_the_fields():
    cfg = _cfg("infra.accelerators=H100:8", "model.name=meta-llama/Llama-3.1-70B-Instruct")
    with pytest.raises(ConfigError) as e:
        check_gpu_memory(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "infra.nodes" in msg and "verl.gpu_memory_utilization" in msg
    assert "verl.lora_rank" in msg


def test_more_nodes_make_it_fit():
    cfg = _cfg("infra.accelerators=H100:8", "infra.nodes=8", "model.name=meta-llama/Llama-3.1-70B-Instruct",
               "verl.rollout_tp=8")
    assert check_gpu_memory(cfg).startswith("GPU memory fits")


def test_rollout_weights_must_fit_their_share():
    cfg = _cfg("infra.accelerators=H100:8", "infra.nodes=8", "model.name=meta-llama/Llama-3.1-70B-Instruct")
    with pytest.raises(ConfigError, match="verl.rollout_tp"):
        check_gpu_memory(cfg)


def test_unknown_sizes_skip_the_check():
    assert "skipped" in check_gpu_memory(_cfg("infra.accelerators=H100:8", "model.name=gpt2"))
    assert "skipped" in check_gpu_memory(_cfg("infra.accelerators=TPU-X:8"))


def test_model_params_of_a_local_model_are_counted_from_its_weights_not_read_from_its_path(tmp_path):
    """The tiny test model under a temp dir whose random name holds `3b` (as a clean clone's once did): counted from
    the safetensors headers, never 3e9; a path's other components never give a size."""
    import torch
    from safetensors.torch import save_file

    model = tmp_path / "pytest-3b7x" / "tiny"
    model.mkdir(parents=True)
    save_file({"embed.weight": torch.zeros(64, 32), "lm_head.bias": torch.zeros(64)}, str(model / "model.safetensors"))
    assert model_params(str(model)) == 64 * 32 + 64
    assert model_params(str(tmp_path / "runs-7b" / "Qwen2.5-0.5B-Instruct")) == pytest.approx(5e8)
    assert model_params("/data/llama-70b-copies/my-model") is None
