"""`-c <dataset> -c local` (what `make run` uses) resolves to the CPU run it resolved to before the dataset configs
gained their GPU defaults (Qwen models, H100 shapes, spot, verl batch sizes): the values below (every training and
eval setting: dataset, model, algorithm, trainer, warm_start, infra, eval, verl) were resolved on main before that
change. A dataset config that sets something local.yaml does not undo fails here."""

from __future__ import annotations

import pytest

from verl_grpo.config import load_config

CPU_RUN = {
    "dataset.source": "auto", "dataset.mirror_dir": None, "dataset.hub_id": None, "dataset.val_size": 200,
    "dataset.seed": 0, "dataset.system_prompt": None, "dataset.user_template": "{question}",
    "model.name": "smollm2-135m", "model.dtype": "float32",
    "algorithm.rollouts": 4, "algorithm.clip_low": 0.2, "algorithm.clip_high": 0.28,
    "algorithm.loss_agg_mode": "token-mean", "algorithm.kl_coef": 0.0, "algorithm.lr": 1e-05,
    "algorithm.temperature": 1.0, "algorithm.top_p": 1.0, "algorithm.top_k": -1,
    "algorithm.max_response_length": 128, "algorithm.train_batch_size": 2, "algorithm.total_steps": 16,
    "algorithm.save_freq": 2, "algorithm.seed": 42,
    "trainer.backend": "trl", "trainer.micro_batch_size": None, "trainer.threads": None, "trainer.logging_steps": 1,
    "trainer.no_signal_steps": 3, "trainer.stop_on_no_signal": False,
    "warm_start.enabled": True, "warm_start.steps": 40, "warm_start.batch_size": 4, "warm_start.lr": 5e-05,
    "warm_start.max_response_tokens": 96,
    "infra.provider": "local", "infra.accelerators": None, "infra.nodes": 1, "infra.spot": False,
    "eval.split": "test", "eval.limit": 50, "eval.batch_size": 10, "eval.max_new_tokens": 128, "eval.seed": 0,
    "eval.samples": 0, "eval.temperature": None, "eval.top_p": None, "eval.threads": None, "eval.shards": 1,
    "verl.adv_estimator": "grpo", "verl.rollout_engine": "vllm", "verl.gpu_memory_utilization": 0.6,
    "verl.rollout_tp": 1, "verl.n_gpus_per_node": None, "verl.strategy": "fsdp2", "verl.megatron_tp": 1,
    "verl.megatron_pp": 1, "verl.lora_rank": 0, "verl.lora_alpha": 16, "verl.ppo_mini_batch_size": None,
    "verl.micro_batch_size_per_gpu": 4, "verl.critic_lr": 1e-05, "verl.test_freq": 5, "verl.extra_overrides": [],
    # the search tool's CPU settings (used only with retrieval on: squad, or USE_RETRIEVAL=true)
    "services.enabled": [], "services.retrieval.index": "squad-dev-bm25", "services.retrieval.index_kind": "bm25",
    "services.retrieval.default_top_k": 1, "services.retrieval.max_tool_turns": 1,
    "services.retrieval.max_result_chars": 1200,
}
LOCAL_RG_PROMPT = ("First reason inside <think> </think>, then give only the final answer inside <answer> </answer>. "
                   "Example:\nUser: State the final answer to the following arithmetic problem: 4 + 7 - 2 =\n"
                   "Assistant: <think>4 + 7 = 11, 11 - 2 = 9</think>\n<answer>9</answer>")
PER_DATASET = {
    "gsm8k": {"dataset.name": "gsm8k", "algorithm.max_prompt_length": 512},
    "math": {"dataset.name": "math", "algorithm.max_prompt_length": 1024},
    "mbpp": {"dataset.name": "mbpp", "algorithm.max_prompt_length": 768},
    # local.yaml's by_dataset.squad: its tool-calling examples are ~4x longer, so fewer and smaller steps
    "squad": {"dataset.name": "squad", "algorithm.max_prompt_length": 512, "services.enabled": ["retrieval"],
              "warm_start.steps": 14, "warm_start.batch_size": 2, "warm_start.lr": 1e-4,
              "algorithm.train_batch_size": 1, "algorithm.total_steps": 2, "algorithm.save_freq": 1,
              "algorithm.lr": 5e-06, "services.retrieval.max_result_chars": 700, "eval.limit": 20,
              "eval.batch_size": 20},
    # local.yaml's by_dataset.reasoning_gym (`make run`): GRPO alone on 3-term one-digit chain sums, a one-shot prompt,
    # 10 steps of 8x4 at 40 tokens, 200 held-out problems (bench/results/rg_candidates.md)
    "reasoning_gym": {"dataset.name": "reasoning_gym", "algorithm.max_prompt_length": 256,
                      "dataset.system_prompt": LOCAL_RG_PROMPT,
                      "dataset.reasoning_gym.tasks": [{"name": "chain_sum", "weight": 1.0, "config": {
                          "min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}}],
                      "warm_start.enabled": False, "algorithm.train_batch_size": 8, "algorithm.total_steps": 10,
                      "algorithm.save_freq": 5, "algorithm.max_response_length": 40, "algorithm.lr": 3e-5,
                      "algorithm.temperature": 0.7, "algorithm.top_k": 50, "eval.limit": 200, "eval.batch_size": 25,
                      "eval.max_new_tokens": 40},
}


@pytest.mark.parametrize("dataset", sorted(PER_DATASET))
def test_the_cpu_profile_resolves_to_the_same_run_as_before(dataset):
    flat = load_config([dataset, "local"], env={}).flat()
    expected = {**CPU_RUN, **PER_DATASET[dataset]}
    resolved = {key: flat.get(key, "<missing>") for key in expected}
    assert resolved == expected


@pytest.mark.parametrize("dataset", sorted(PER_DATASET))
def test_the_cluster_configs_name_a_gpu_shape_and_a_qwen_model(dataset):
    cfg = load_config([dataset], env={})
    assert cfg.model.name.startswith("Qwen/Qwen2.5-") and cfg.model.name.endswith("-Instruct")
    assert cfg.infra.accelerators and cfg.infra.accelerators.startswith("H100:")
    assert cfg.infra.spot and cfg.infra.nodes == 1
