"""RunConfig → the Hydra overrides of `python -m verl.trainer.main_ppo`: a pure mapping, no verl import.

`validation.validate_verl_overrides` checks the result against the installed verl's own config.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.config.placement import placement
from verl_grpo.config.search import rollout_tokens
from verl_grpo.data.schema import TOOL_AGENT
from verl_grpo.errors import ConfigError
from verl_grpo.models import MODEL_ALIASES
from verl_grpo.services import SERVICES
from verl_grpo.trainers.verl.callback import CALLBACK_CLASS
from verl_grpo.trainers.verl.node_reward import LOCAL_FUNCTION, REMOTE_FUNCTION, USER_ENTRY, UserRewardPlan
from verl_grpo.trainers.verl.samples import rollout_dir

REWARD_MODULE = "pkg://verl_grpo.rewards"
"""verl loads `pkg://` paths with importlib, so the reward works wherever verl_grpo is installed on the cluster."""
REWARD_FUNCTION = "compute_score"
REMOTE_REWARD_MODULE = "pkg://verl_grpo.services.reward_client"
"""Scores through the job group's reward-server (same compute_score signature, awaited by verl's reward loop)."""
SEARCH_TOOL_CONFIG = "infra/verl/search_tool.yaml"
"""Search-R1 style `search` tool backed by the retrieval-server; relative to the task's workdir (the repo)."""
SEARCH_R1_RETRIEVER_TOOL_CONFIG = "infra/verl/search_r1_retriever_tool.yaml"
"""The same `search` tool answered by a Search-R1 retriever already serving (services.retrieval.url)."""


@dataclass(frozen=True)
class VerlPaths:
    """Where the training process finds its inputs and writes checkpoints, as seen on the cluster."""

    checkpoint_dir: str
    """verl trainer.default_local_dir (global_step_N directories)."""
    reward_path: str = REWARD_MODULE
    """verl reward.custom_reward_function.path (`pkg://module` or a file path)."""
    reward_name: str = REWARD_FUNCTION
    model_path: str | None = None
    """Where a model shipped through the store is mounted on the cluster (None: model.name is an HF id there)."""
    reward_kwargs: tuple[tuple[str, Any], ...] = ()
    """verl reward.custom_reward_function.reward_kwargs (the user's function on the nodes: node_reward)."""


def ships_with_run(name: str) -> bool:
    """True when model.name exists only on this machine (tiny, a local directory): a cluster gets it through the
    store (`backend.model_on_cluster`); an alias or HF id is loaded from the hub there."""
    key = name.strip().lower()
    return key == "tiny" or (key not in MODEL_ALIASES and Path(name).expanduser().is_dir())


def cluster_model_path(name: str, shipped_to: str | None = None) -> str:
    """`model.name` as verl on a GPU cluster loads it: an HF id, or where a model shipped through the store is
    mounted (`shipped_to`)."""
    if ships_with_run(name):
        if shipped_to is None:
            raise ConfigError(f"model.name {name!r} exists only on this machine; it reaches the cluster through the "
                              "store when the run is planned (VerlTrainer.plan)")
        return shipped_to
    return MODEL_ALIASES.get(name.lower(), name)


def gpus_per_node(cfg: RunConfig) -> int:
    """GPUs of each node: verl.n_gpus_per_node, else the count of infra.accelerators (`H100:8` → 8)."""
    if cfg.verl.n_gpus_per_node is not None:
        return cfg.verl.n_gpus_per_node
    spec = cfg.infra.accelerators
    if not spec:
        raise ConfigError("infra.accelerators is not set; the verl backend needs GPUs, e.g. infra.accelerators=H100:8")
    _, sep, count = spec.partition(":")
    if not sep:
        return 1
    try:
        n = float(count)
    except ValueError:
        raise ConfigError(f"infra.accelerators {spec!r} has a bad count; use NAME:COUNT, e.g. H100:8") from None
    if n < 1 or n != int(n):
        raise ConfigError(f"infra.accelerators {spec!r}: verl needs whole GPUs per node, e.g. H100:8")
    return int(n)


def ppo_mini_batch_size(cfg: RunConfig) -> int:
    """verl.ppo_mini_batch_size, else the train batch over the largest count <= verl.ppo_mini_batches dividing it."""
    if cfg.verl.ppo_mini_batch_size is not None:
        return cfg.verl.ppo_mini_batch_size
    batch = cfg.algorithm.train_batch_size
    return batch // mini_batch_count(batch, cfg.verl.ppo_mini_batches)


def mini_batch_count(batch: int, at_most: int) -> int:
    return max(k for k in range(1, min(at_most, batch) + 1) if batch % k == 0)


def trackers(env: Mapping[str, str] | None = None) -> list[str]:
    """verl trainer.logger: console and verl's JSONL `file` logger (→ the run's metrics.jsonl, which registration
    logs to your MLflow as `train/<metric>` per step); W&B only when WANDB_API_KEY is in the environment.

    Not verl's `mlflow` logger: the nodes have no mlflow (verl[vllm] does not bring it, and its server-side
    dependencies are not needed there), and with the embedded SQLite default its `sqlite:////tmp/mlruns.db` on the
    node would be lost with the node."""
    env = os.environ if env is None else env
    return ["console", "file"] + (["wandb"] if env.get("WANDB_API_KEY") else [])


def verl_overrides(
    cfg: RunConfig,
    data_files: Mapping[str, str],
    paths: VerlPaths,
    run_id: str,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The Hydra overrides of `python -m verl.trainer.main_ppo` for this run; user extra_overrides come last.

    data_files maps `train` and `val` to parquet paths as the training process sees them. `env` is only
    consulted for whether WANDB_API_KEY is present; its value never enters the overrides.
    """
    for split in ("train", "val"):
        if not data_files.get(split):
            raise ConfigError(f"verl needs a {split} parquet file; the prepared dataset has none (splits: "
                              f"{sorted(data_files)}). Re-run data preparation with dataset.val_size > 0")
    a, v = cfg.algorithm, cfg.verl
    model = cluster_model_path(cfg.model.name, paths.model_path)
    n_gpus = gpus_per_node(cfg)
    mini = ppo_mini_batch_size(cfg)
    if mini > a.train_batch_size:
        raise ConfigError(f"verl.ppo_mini_batch_size ({mini}) exceeds algorithm.train_batch_size "
                          f"({a.train_batch_size}); lower it or leave it unset")
    use_kl = a.kl_coef > 0
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"
    out = [
        f"algorithm.adv_estimator={v.adv_estimator}",
        f"data.train_files={data_files['train']}",
        f"data.val_files={data_files['val']}",
        f"data.max_prompt_length={a.max_prompt_length}",
        f"data.max_response_length={rollout_tokens(cfg)}",
        f"data.train_batch_size={a.train_batch_size}",
        f"data.seed={a.seed}",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.lora_rank={v.lora_rank}",
        f"actor_rollout_ref.model.lora_alpha={v.lora_alpha}",
        f"{actor}.optim.lr={a.lr}",
        f"{actor}.optim.lr_warmup_steps={a.warmup_steps}",
        f"{actor}.ppo_mini_batch_size={mini}",
        f"{actor}.ppo_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"{actor}.clip_ratio_low={a.clip_low}",
        f"{actor}.clip_ratio_high={a.clip_high}",
        f"{actor}.loss_agg_mode={a.loss_agg_mode}",
        f"{actor}.use_kl_loss={use_kl}",
        f"{actor}.kl_loss_coef={a.kl_coef}",
        f"{rollout}.name={v.rollout_engine}",
        f"{rollout}.n={a.rollouts}",
        f"{rollout}.temperature={a.temperature}",
        f"{rollout}.top_p={a.top_p}",
        f"{rollout}.top_k={a.top_k}",
        f"{rollout}.gpu_memory_utilization={v.gpu_memory_utilization}",
        # Unset, vLLM's context is the model's max_position_embeddings (32k for Qwen2.5): its CUDA graphs and
        # scheduler are sized for sequences the run never makes. Prompt + response bounds every rollout, the
        # multi-turn tool loop's included (its response budget spans all turns).
        f"{rollout}.max_model_len={a.max_prompt_length + rollout_tokens(cfg)}",
        f"{rollout}.tensor_model_parallel_size={v.rollout_tp}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"reward.custom_reward_function.path={paths.reward_path}",
        f"reward.custom_reward_function.name={paths.reward_name}",
        *reward_kwargs_overrides(paths.reward_kwargs),
        f"trainer.project_name={cfg.wandb_project}",
        f"trainer.experiment_name={run_id}",
        f"trainer.logger=[{','.join(trackers(env))}]",
        f"trainer.nnodes={cfg.infra.nodes}",
        f"trainer.n_gpus_per_node={n_gpus}",
        f"trainer.total_training_steps={a.total_steps}",
        f"trainer.save_freq={a.save_freq}",
        f"trainer.test_freq={v.test_freq}",
        f"trainer.max_actor_ckpt_to_keep={verl_keep(cfg)}",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={paths.checkpoint_dir}",
        f"trainer.checkpoint_callback_class={CALLBACK_CLASS}",
    ]
    if a.total_epochs is not None:
        out.append(f"trainer.total_epochs={a.total_epochs}")
    # verl dumps every rollout of each step: verl.samples keeps a few, reward_metrics reads the step's reward parts.
    if cfg.trainer.log_samples_every or cfg.reward.path:
        out.append(f"trainer.rollout_data_dir={rollout_dir(paths.checkpoint_dir)}")
    out += _strategy_overrides(cfg) + attention_overrides(cfg)
    if "retrieval" in cfg.services.enabled:
        out += tool_overrides(cfg)
    if v.adv_estimator == "gae":
        out += [
            "critic.enable=True",
            f"critic.model.path={model}",
            f"critic.optim.lr={v.critic_lr}",
            f"critic.ppo_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        ]
    return out + list(v.extra_overrides)


def tool_overrides(cfg: RunConfig) -> list[str]:
    """The Search-R1 tool loop: verl's `tool_agent` loop (the default for rows without `agent_name`; prepared rows
    name it too), the `search` tool config (asking the retriever at services.retrieval.url when set, else the run's
    retrieval-server), raw chat prompts for the loop to re-render, and the tool-turn bound."""
    rollout = "actor_rollout_ref.rollout"
    tools = SEARCH_R1_RETRIEVER_TOOL_CONFIG if cfg.services.retrieval.url else SEARCH_TOOL_CONFIG
    return [
        f"{rollout}.multi_turn.enable=True",
        f"{rollout}.multi_turn.tool_config_path={tools}",
        f"{rollout}.multi_turn.max_user_turns={cfg.services.retrieval.max_tool_turns}",
        f"{rollout}.multi_turn.max_tool_response_length={cfg.services.retrieval.max_result_chars}",
        f"{rollout}.multi_turn.tool_response_truncate_side=right",
        f"{rollout}.agent.default_agent_loop={TOOL_AGENT}",
        "data.return_raw_chat=True",
    ]


SEARCH_TOP_K_ENV = "VERL_GRPO_SEARCH_TOP_K"
"""Passages per search that infra/verl/search_r1_retriever_tool.yaml asks a Search-R1 retriever for (whose default
count is its own); the run's retrieval-server applies services.retrieval.default_top_k itself."""


def tool_env(cfg: RunConfig) -> dict[str, str]:
    """The trainer's env for the search tool: the URL of the retriever at services.retrieval.url in the variable the
    tool config reads (as a job group exports its own retrieval-server's) and services.retrieval.default_top_k, as TRL
    and the evaluation ask it; {} without one."""
    r = cfg.services.retrieval
    if not (r.url and "retrieval" in cfg.services.enabled):
        return {}
    return {SERVICES["retrieval"].url_env: r.url, SEARCH_TOP_K_ENV: str(r.default_top_k)}


def attention_overrides(cfg: RunConfig) -> list[str]:
    """verl.attn_implementation for every trained model: verl 0.9.1 reads it from `model.override_config` (default
    flash_attention_2, `verl/workers/config/model.py`). Remove-padding goes with flash-attn only: its packed rows
    rely on flash-attn's varlen kernel, and sdpa would attend across the packed sequences."""
    attn = cfg.verl.attn_implementation
    models = ["actor_rollout_ref.model"] + (["critic.model"] if cfg.verl.adv_estimator == "gae" else [])
    return [line for m in models for line in (f"+{m}.override_config.attn_implementation={attn}",
                                              f"{m}.use_remove_padding={attn == 'flash_attention_2'}")]


def _strategy_overrides(cfg: RunConfig) -> list[str]:
    v = cfg.verl
    if v.strategy == "megatron":
        # verl's ppo_trainer picks actor/ref/critic config groups from `model_engine`.
        return [
            "model_engine=megatron",
            f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={v.megatron_tp}",
            f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={v.megatron_pp}",
        ]
    out = [f"actor_rollout_ref.actor.strategy={v.strategy}"]
    if v.adv_estimator == "gae":
        out.append(f"critic.strategy={v.strategy}")
    return out


def uses_fully_async(cfg: RunConfig) -> bool:
    """Whether the run trains on verl's fully-async trainer (skypilot.shape=rollout_group), not main_ppo."""
    return placement(cfg).fully_async


def cluster_nodes(cfg: RunConfig) -> int:
    """Nodes of the run's Ray cluster: infra.nodes trainer nodes, plus skypilot.rollout_nodes standalone rollout
    nodes on verl's fully-async trainer."""
    return cfg.infra.nodes + (cfg.skypilot.rollout_nodes if uses_fully_async(cfg) else 0)


def verl_keep(cfg: RunConfig) -> int:
    """trainer.max_actor_ckpt_to_keep: storage.keep_last; at least 2 on multi-node runs, so verl keeps the previous
    step dir on each node's disk until the node's checkpoint sync and its background commit are done."""
    return max(cfg.storage.keep_last, 2) if cluster_nodes(cfg) > 1 else cfg.storage.keep_last


def run_paths(cfg: RunConfig, checkpoint_dir: str, user: UserRewardPlan | None = None) -> VerlPaths:
    """Checkpoint dir and reward function: the reward-server's client when the job group runs one; with the user's
    own function (`user`, node_reward), user_entry told where it is on the nodes (remotely: the reward-server
    runs it)."""
    remote = "reward" in cfg.services.enabled
    if user is not None:
        return VerlPaths(checkpoint_dir=checkpoint_dir, reward_path=USER_ENTRY,
                         reward_name=REMOTE_FUNCTION if remote else LOCAL_FUNCTION,
                         reward_kwargs=tuple(user.reward_kwargs().items()))
    if remote:
        return VerlPaths(checkpoint_dir=checkpoint_dir, reward_path=REMOTE_REWARD_MODULE)
    return VerlPaths(checkpoint_dir=checkpoint_dir)


REWARD_KWARGS = "reward.custom_reward_function.reward_kwargs"


def reward_kwargs_overrides(kwargs: tuple[tuple[str, Any], ...]) -> list[str]:
    """`+reward.custom_reward_function.reward_kwargs.<key>=<value>` (verl's reward config has no such key until
    one is added): strings quoted for Hydra, lists of strings as lists."""
    return [f"+{REWARD_KWARGS}.{key}={hydra_value(value)}" for key, value in kwargs]


def hydra_value(value: Any) -> str:
    """A Hydra override value: numbers as they are, a string single-quoted (quotes and the backslashes before them
    escaped, Hydra's rule), a list of them in brackets."""
    if isinstance(value, bool) or value is None:
        raise ConfigError(f"reward_kwargs value {value!r} has no Hydra form here; pass a number, text or list")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", str(value))
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"
