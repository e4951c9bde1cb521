"""The `verl` trainer backend: RunConfig → `python -m verl.trainer.main_ppo` Hydra overrides, checked offline.

`verl_overrides` is a pure mapping. `validate_verl_overrides` composes those overrides against the
installed verl's own Hydra config (`verl/trainer/config/ppo_trainer.yaml`) and runs verl's own
`validate_config`, which needs no GPU; a misspelled key fails with Hydra's message. verl is imported
lazily so that reading this module stays cheap.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.layout import dataset_dir
from verl_grpo.store import Store, local_path
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.verl import progress
from verl_grpo.trainers.verl.callback import CALLBACK_CLASS
from verl_grpo.trainers.verl.settings import checkpoint_env

MAIN_MODULE = "verl.trainer.main_ppo"
REWARD_MODULE = "pkg://verl_grpo.rewards"
"""verl loads `pkg://` paths with importlib, so the reward works wherever verl_grpo is installed on the cluster."""
REWARD_FUNCTION = "compute_score"
REMOTE_REWARD_MODULE = "pkg://verl_grpo.services.reward_client"
"""Scores through the job group's reward-server (same compute_score signature, awaited by verl's reward loop)."""
SEARCH_TOOL_CONFIG = "infra/verl/search_tool.yaml"
"""Search-R1 style `search` tool backed by the retrieval-server; relative to the task's workdir (the repo)."""
SECRET_ENV_VARS = ("WANDB_API_KEY", "HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                   "VERL_GRPO_SERVICES_TOKEN")
"""Secrets a verl run may need; they reach the cluster as SkyPilot secrets, never as overrides or envs."""

_CLUSTER_MODEL_IDS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct",
}


@dataclass(frozen=True)
class VerlPaths:
    """Where the training process finds its inputs and writes checkpoints, as seen on the cluster."""

    checkpoint_dir: str
    """verl trainer.default_local_dir (global_step_N directories)."""
    reward_path: str = REWARD_MODULE
    """verl reward.custom_reward_function.path (`pkg://module` or a file path)."""
    reward_name: str = REWARD_FUNCTION


@dataclass
class VerlValidation:
    """What the offline check of a set of overrides established."""

    overrides: list[str]
    checks: list[str] = field(default_factory=list)
    """One human-readable line per passed check."""


def cluster_model_path(name: str) -> str:
    """`model.name` as verl on a GPU cluster loads it: an HF id or a path that exists there."""
    if name == "tiny":
        raise ConfigError(
            "model.name 'tiny' is built locally for tests and cannot be trained by verl on a cluster; "
            "set model.name to `smollm2-135m` or an HF id such as Qwen/Qwen2.5-0.5B-Instruct"
        )
    return _CLUSTER_MODEL_IDS.get(name.lower(), name)


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


def trackers(env: Mapping[str, str] | None = None) -> list[str]:
    """verl trainer.logger: console, MLflow and verl's JSONL `file` logger (→ metrics.jsonl) always; W&B only when
    WANDB_API_KEY is in the environment."""
    env = os.environ if env is None else env
    return ["console", "mlflow", "file"] + (["wandb"] if env.get("WANDB_API_KEY") else [])


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
    model = cluster_model_path(cfg.model.name)
    n_gpus = gpus_per_node(cfg)
    mini = v.ppo_mini_batch_size or a.train_batch_size
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
        f"data.max_response_length={a.max_response_length}",
        f"data.train_batch_size={a.train_batch_size}",
        f"data.seed={a.seed}",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.lora_rank={v.lora_rank}",
        f"actor_rollout_ref.model.lora_alpha={v.lora_alpha}",
        f"{actor}.optim.lr={a.lr}",
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
        f"{rollout}.tensor_model_parallel_size={v.rollout_tp}",
        f"{rollout}.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        f"reward.custom_reward_function.path={paths.reward_path}",
        f"reward.custom_reward_function.name={paths.reward_name}",
        f"trainer.project_name={cfg.experiment_name}",
        f"trainer.experiment_name={run_id}",
        f"trainer.logger=[{','.join(trackers(env))}]",
        f"trainer.nnodes={cfg.infra.nodes}",
        f"trainer.n_gpus_per_node={n_gpus}",
        f"trainer.total_training_steps={a.total_steps}",
        f"trainer.save_freq={a.save_freq}",
        f"trainer.test_freq={v.test_freq}",
        f"trainer.max_actor_ckpt_to_keep={cfg.storage.keep_last}",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={paths.checkpoint_dir}",
        f"trainer.checkpoint_callback_class={CALLBACK_CLASS}",
    ]
    out += _strategy_overrides(cfg)
    if "retrieval" in cfg.services.enabled:
        out += [f"{rollout}.multi_turn.enable=True", f"{rollout}.multi_turn.tool_config_path={SEARCH_TOOL_CONFIG}"]
    if v.adv_estimator == "gae":
        out += [
            "critic.enable=True",
            f"critic.model.path={model}",
            f"critic.optim.lr={v.critic_lr}",
            f"critic.ppo_micro_batch_size_per_gpu={v.micro_batch_size_per_gpu}",
        ]
    return out + list(v.extra_overrides)


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


def verl_config_dir() -> Path:
    """The installed verl's Hydra config directory (the one main_ppo itself uses)."""
    import verl

    return Path(verl.__file__).resolve().parent / "trainer" / "config"


def compose_verl_config(overrides: Sequence[str]) -> Any:
    """verl's own `ppo_trainer` config with these overrides, composed by Hydra; ConfigError on a bad key/value."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
                return compose("ppo_trainer", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"verl's Hydra config rejected the overrides: {e}\n"
                          "Fix the key in verl.extra_overrides (or the config field that produced it).") from e


def validate_verl_overrides(overrides: Sequence[str], check_reward: bool = True) -> VerlValidation:
    """Compose the overrides and run verl's GPU-free checks; ConfigError with verl's message on any failure."""
    result = VerlValidation(overrides=list(overrides))
    config = compose_verl_config(overrides)
    result.checks.append("verl Hydra compose of ppo_trainer with all overrides")

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
    if config.actor_rollout_ref.model.get("lora_rank", 0) > 0 and rollout == "vllm" and not importlib.util.find_spec("vllm"):
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


def run_paths(cfg: RunConfig, checkpoint_dir: str) -> VerlPaths:
    """Checkpoint dir and reward function: the reward-server's client when the job group runs one."""
    if "reward" in cfg.services.enabled:
        return VerlPaths(checkpoint_dir=checkpoint_dir, reward_path=REMOTE_REWARD_MODULE)
    return VerlPaths(checkpoint_dir=checkpoint_dir)


class VerlTrainer:
    """Trainer backend `verl`: plans a main_ppo run on the cluster a provider brought up."""

    name = "verl"

    def __init__(self, check_reward: bool = True):
        self.check_reward = check_reward
        self.last_validation: VerlValidation | None = None
        """What the latest plan() established offline (shown by the dry run)."""

    def check(self, cfg: RunConfig) -> str:
        """Compose the overrides against verl's own config and run its validation, with placeholder data paths."""
        files = {split: f"/tmp/verl-grpo/data/{split}.parquet" for split in ("train", "val")}
        overrides = verl_overrides(cfg, files, run_paths(cfg, "/tmp/verl-grpo/checkpoints/check"), "check")
        validation = validate_verl_overrides(overrides, check_reward=self.check_reward)
        return f"verl main_ppo: {len(overrides)} overrides; " + "; ".join(validation.checks)

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Render and validate the main_ppo command; writes nothing (verl reads the overrides, not a spec file)."""
        data_files, env = data_files_on_cluster(dataset, store, cluster)
        paths = run_paths(cfg, f"{cluster.workdir}/checkpoints/{run_id}")
        overrides = verl_overrides(cfg, data_files, paths, run_id)
        self.last_validation = validate_verl_overrides(overrides, check_reward=self.check_reward)
        env["MLFLOW_TRACKING_URI"] = mlflow_uri_on_cluster(cfg, cluster)
        env.update(checkpoint_env(cfg.storage.uri, cfg.storage.endpoint_url, run_id, paths.checkpoint_dir,
                                  cfg.storage.keep_last))
        return TrainSpec(
            backend=self.name,
            run_id=run_id,
            command=["python", "-m", MAIN_MODULE, *overrides],
            env=env,
            overrides=overrides,
            total_steps=cfg.algorithm.total_steps,
        )

    def parse_progress(self, line: str, total_steps: int) -> TrainProgress | None:
        """verl's console `step:k - critic/score/mean:… - …` lines (see verl.progress)."""
        return progress.parse_progress(line, total_steps)


DATASET_URI_ENV = "VERL_GRPO_DATASET_URI"
DATASET_MOUNT_ENV = "VERL_GRPO_DATASET_MOUNT"


def data_files_on_cluster(dataset: DatasetVersion, store: Store, cluster: Cluster) -> tuple[dict[str, str], dict[str, str]]:
    """Parquet paths the trainer reads, and the env telling a remote provider what to mount where.

    On the local provider with a local store the store paths are used as they are; anywhere else the
    dataset directory is mounted at `{workdir}/datasets/{name}/{hash}` (the provider reads the two env vars).
    """
    if cluster.provider == "local" and store.is_local:
        return {split: str(local_path(uri)) for split, uri in dataset.splits.items()}, {}
    mount = f"{cluster.workdir}/{dataset_dir(dataset.name, dataset.hash)}"
    files = {split: f"{mount}/{uri.rstrip('/').rsplit('/', 1)[-1]}" for split, uri in dataset.splits.items()}
    return files, {DATASET_URI_ENV: dataset.uri, DATASET_MOUNT_ENV: mount}


def restore_command(spec_env: Mapping[str, str]) -> list[str]:
    """The pre-main_ppo entry: restore the latest committed checkpoint (and fetch the dataset if not mounted)."""
    cmd = ["python", "-m", "verl_grpo.trainers.verl.restore"]
    if spec_env.get(DATASET_URI_ENV) and spec_env.get(DATASET_MOUNT_ENV):
        cmd += ["--dataset-uri", spec_env[DATASET_URI_ENV], "--dataset-dir", spec_env[DATASET_MOUNT_ENV]]
    return cmd


def finalize_command(cfg: RunConfig) -> list[str]:
    """The post-main_ppo entry: merge the final actor with verl.model_merger, publish model, metrics, TrainResult."""
    return ["python", "-m", "verl_grpo.trainers.verl.finalize", "--backend", cfg.verl.strategy,
            "--train-batch-size", str(cfg.algorithm.train_batch_size)]


def mlflow_uri_on_cluster(cfg: RunConfig, cluster: Cluster) -> str:
    """A tracking server URI is used as is; a local SQLite default becomes a SQLite file in the cluster workdir."""
    uri = cfg.tracking.mlflow_uri
    if cluster.provider == "local" or uri.startswith(("http://", "https://", "databricks")):
        return uri
    return f"sqlite:///{cluster.workdir}/mlflow.db"
