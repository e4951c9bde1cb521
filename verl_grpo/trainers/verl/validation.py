"""Offline checks of main_ppo overrides against the installed verl, without a GPU.

`validate_verl_overrides` composes the overrides against verl's own Hydra config
(`verl/trainer/config/ppo_trainer.yaml`) and runs verl's own `validate_config`; a misspelled key fails with
Hydra's message. verl is imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_grpo.errors import ConfigError


@dataclass
class VerlValidation:
    """What the offline check of a set of overrides established."""

    overrides: list[str]
    checks: list[str] = field(default_factory=list)
    """One human-readable line per passed check."""


def verl_config_dir() -> Path:
    """The installed verl's Hydra config directory (the one main_ppo itself uses)."""
    import verl

    return Path(verl.__file__).resolve().parent / "trainer" / "config"


def compose_verl_config(overrides: Sequence[str], config_dir: str | Path | None = None,
                        config_name: str = "ppo_trainer") -> Any:
    """verl's own `config_name` config (main_ppo's `ppo_trainer` by default) with these overrides, composed by Hydra;
    ConfigError on a bad key/value."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(config_dir or verl_config_dir()), version_base=None):
                return compose(config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"verl's Hydra config rejected the overrides: {e}\n"
                          "Fix the key in verl.extra_overrides (or the config field that produced it).") from e


def validate_verl_overrides(overrides: Sequence[str], check_reward: bool = True) -> VerlValidation:
    """Compose the overrides and run verl's GPU-free checks; ConfigError with verl's message on any failure."""
    result = VerlValidation(overrides=list(overrides))
    config = compose_verl_config(overrides)
    result.checks.append("verl Hydra compose of ppo_trainer with all overrides")
    return _validate_composed(config, result, check_reward)


def validate_fully_async(overrides: Sequence[str], config_dir: str, config_name: str,
                         check_reward: bool = True) -> VerlValidation:
    """The fully-async trainer's overrides composed with verl's own `config_name` (in `config_dir`), the settings its
    entry copies (rollout.nnodes/n_gpus_per_node into actor_rollout_ref.rollout), the asserts its rollouter and trainer
    make before placing a GPU, then main_ppo's checks on the batch one trainer step takes (verl's fully-async entry
    runs no validate_config itself: its rollouter takes prompts one at a time, data.train_batch_size=0)."""
    from omegaconf import OmegaConf

    result = VerlValidation(overrides=list(overrides))
    config = compose_verl_config(overrides, config_dir, config_name)
    result.checks.append(f"verl Hydra compose of {config_name} with all overrides")
    OmegaConf.update(config, "actor_rollout_ref.rollout.nnodes", config.rollout.nnodes)
    OmegaConf.update(config, "actor_rollout_ref.rollout.n_gpus_per_node", config.rollout.n_gpus_per_node)
    at, arr = config.async_training, config.actor_rollout_ref
    problems = [why for ok, why in (
        (config.data.train_batch_size == 0, "data.train_batch_size must be 0 (prompts go one at a time)"),
        (config.data.gen_batch_size == 1, "data.gen_batch_size must be 1"),
        (not arr.hybrid_engine, "actor_rollout_ref.hybrid_engine must be False (standalone rollout replicas)"),
        (at.staleness_threshold >= 0, "async_training.staleness_threshold must be >= 0"),
        (at.trigger_parameter_sync_step >= 1, "async_training.trigger_parameter_sync_step must be >= 1"),
        (arr.rollout.calculate_log_probs, "actor_rollout_ref.rollout.calculate_log_probs must be True"),
        (config.rollout.nnodes >= 1 and config.rollout.n_gpus_per_node >= 1, "rollout.nnodes/n_gpus_per_node >= 1"),
        (config.rollout.n_gpus_per_node % arr.rollout.tensor_model_parallel_size == 0,
         "rollout.n_gpus_per_node must be a multiple of actor_rollout_ref.rollout.tensor_model_parallel_size"),
    ) if not ok]
    if problems:
        raise ConfigError("verl's fully-async trainer would reject the run settings: " + "; ".join(problems))
    result.checks.append("verl fully-async asserts (one-prompt generation batches, standalone rollout replicas, "
                         "staleness and sync period, rollout log-probs)")
    step = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    OmegaConf.update(step, "data.train_batch_size", arr.actor.ppo_mini_batch_size * at.require_batches)
    return _validate_composed(step, result, check_reward)


def _validate_composed(config: Any, result: VerlValidation, check_reward: bool) -> VerlValidation:
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    estimator = config.algorithm.adv_estimator
    try:
        get_adv_estimator_fn(estimator)
    except ValueError as e:
        raise ConfigError(f"verl.adv_estimator: {e}; verl {_verl_version()} knows: "
                          f"{', '.join(sorted(ADV_ESTIMATOR_REGISTRY))}") from e
    result.checks.append(f"advantage estimator {estimator!r} is registered in verl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # need_critic warns that non-gae estimators run without a critic
        config, skipped = _offline_view(config, need_critic(config))
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"verl validate_config rejected the run settings: {e}\n"
                          "Adjust algorithm.train_batch_size / verl.ppo_mini_batch_size / "
                          "verl.micro_batch_size_per_gpu / infra.accelerators so they divide evenly.") from e
    except Exception as e:
        # validate_config instantiates verl's config dataclasses, whose __post_init__ raise plain errors.
        raise ConfigError(f"verl validate_config rejected the run settings: {type(e).__name__}: {e}") from e
    result.checks.append("verl validate_config (batch sizes, micro-batches, dataclass configs)")
    result.checks += [f"not checked here: {why}" for why in skipped]
    fqn = config.trainer.get("checkpoint_callback_class")
    if fqn:
        _check_callback(str(fqn))
        result.checks.append(f"checkpoint callback {fqn} loads with verl's loader and has on_save")
    if config.actor_rollout_ref.rollout.multi_turn.get("enable"):
        result.checks += _check_tool_loop(config)
    if check_reward:
        _check_reward(config.reward.custom_reward_function.path, config.reward.custom_reward_function.name)
        result.checks.append(f"reward function {config.reward.custom_reward_function.path}:"
                             f"{config.reward.custom_reward_function.name} loads with verl's loader")
    return result


def _offline_view(config: Any, use_critic: bool) -> tuple[Any, list[str]]:
    """A copy of the config with the parts verl can only check on a GPU node turned off, and why.

    verl's critic check loads the model's config.json and tokenizer (an HF id is only reachable from the
    cluster), and its LoRA check imports vLLM (not installed without a GPU).
    """
    import importlib.util

    from omegaconf import OmegaConf

    view = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    skipped = []
    if use_critic and not Path(str(config.critic.model.path)).expanduser().is_dir():
        OmegaConf.update(view, "critic.enable", False)
        skipped.append(f"critic dataclass (needs config.json of {config.critic.model.path}, fetched on the cluster)")
    rollout = config.actor_rollout_ref.rollout.name
    lora = config.actor_rollout_ref.model.get("lora_rank", 0) > 0
    if lora and rollout == "vllm" and not importlib.util.find_spec("vllm"):
        OmegaConf.update(view, "actor_rollout_ref.model.lora_rank", 0)
        skipped.append("LoRA rank against vLLM's allowed ranks (vllm is not installed on this machine)")
    return view, skipped


def _check_callback(fqn: str) -> None:
    from verl.utils.import_utils import load_class_from_fqn

    try:
        cls = load_class_from_fqn(fqn, "CheckpointCallback")
    except (ValueError, ImportError, AttributeError) as e:
        raise ConfigError(f"trainer.checkpoint_callback_class {fqn!r} cannot be loaded: {e}") from e
    if not callable(getattr(cls, "on_save", None)):
        raise ConfigError(f"trainer.checkpoint_callback_class {fqn!r} has no on_save(trainer, global_step, "
                          "checkpoint_dir, async_save, **kwargs) method")


def _check_tool_loop(config: Any) -> list[str]:
    """multi_turn.enable alone leaves verl on `single_turn_agent`: the model never sees a tool. The composed config
    must select verl's tool loop, name a tool config, and that config's classes must load with verl's registry."""
    import importlib

    from verl.experimental.agent_loop import agent_loop

    importlib.import_module("verl.experimental.agent_loop.tool_agent_loop")  # registers `tool_agent`

    from verl_grpo.local_paths import repo_root
    from verl_grpo.services.search_tool import validate_tool_config

    rollout = config.actor_rollout_ref.rollout
    loop = rollout.agent.default_agent_loop
    if loop not in agent_loop._agent_loop_registry:
        raise ConfigError(f"actor_rollout_ref.rollout.agent.default_agent_loop={loop!r} is no agent loop verl "
                          f"{_verl_version()} registers ({', '.join(sorted(agent_loop._agent_loop_registry))})")
    if loop == "single_turn_agent":
        raise ConfigError("actor_rollout_ref.rollout.multi_turn.enable=True but the agent loop is single_turn_agent, "
                          "which never calls a tool; set actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent")
    path = rollout.multi_turn.get("tool_config_path")
    if not path:
        raise ConfigError("actor_rollout_ref.rollout.multi_turn.enable=True without multi_turn.tool_config_path: the "
                          "tool loop would offer the model no tool")
    local = Path(str(path))
    if not local.is_absolute():
        local = (repo_root() or Path.cwd()) / local  # the task's workdir is the repo
    with contextlib.redirect_stdout(io.StringIO()):  # verl's loader prints every tool schema
        names = validate_tool_config(local)
    if not config.data.get("return_raw_chat"):
        raise ConfigError("the tool loop re-renders the chat with each tool answer: set data.return_raw_chat=True")
    return [f"agent loop {loop!r} is registered in verl and is the rollout's default",
            f"tool config {path} loads with verl's tool registry: {', '.join(names)}"]


def _check_reward(path: str, name: str) -> None:
    from verl.utils.import_utils import load_extern_object

    try:
        fn = load_extern_object(module_path=path, object_name=name)
    except (ImportError, FileNotFoundError, AttributeError, RuntimeError) as e:
        raise ConfigError(f"reward.custom_reward_function {path}:{name} cannot be loaded: {e}") from e
    if not callable(fn):
        raise ConfigError(f"reward.custom_reward_function {path}:{name} is not callable")


def _verl_version() -> str:
    import verl

    return getattr(verl, "__version__", "?")
