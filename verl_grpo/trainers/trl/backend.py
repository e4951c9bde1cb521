"""TRL backend: RunConfig → `trl.GRPOConfig` (pure mapping) and the worker command (`plan`).

Training itself runs in a separate process (`python -m verl_grpo.trainers.trl.worker SPEC`), so a
provider can run, watch, kill and restart it like any other job.

Batch semantics (TRL 1.16, `GRPOConfig.__post_init__` and `GRPOTrainer._prepare_inputs`): the
per-device batch counts *completions*, not prompts. One optimizer step here consumes exactly
`train_batch_size` prompts × `rollouts` completions, generated once per step:

    completions_per_step  = train_batch_size * rollouts
    per_device_batch      = trainer.micro_batch_size or completions_per_step
    gradient_accum_steps  = completions_per_step / per_device_batch
    steps_per_generation  = gradient_accum_steps   → generation_batch_size = completions_per_step
    num_iterations        = 1                      (on-policy: each generation is used for one update)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.config.search import rollout_tokens
from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.worker import progress
from verl_grpo.trainers.worker.batch_layout import batch_layout
from verl_grpo.trainers.worker.spec import worker_train_spec

# verl `loss_agg_mode` → TRL `loss_type`, by how each normalises the summed per-token losses:
#   token-mean              ÷ active tokens of the whole step (all micro-batches) → "dapo"
#                           ("bnpo" divides per micro-batch, which differs once gradients accumulate)
#   seq-mean-token-mean     per-sequence token mean, then mean over sequences       → "grpo"
#   seq-mean-token-sum-norm per-sequence token sum ÷ max response length, then mean → "dr_grpo"
#   seq-mean-token-sum      per-sequence token sum, then mean: TRL only has it as "luspo", which also forces
#                           sequence-level importance ratios (GSPO), a different algorithm → not offered.
LOSS_TYPES: dict[str, str] = {
    "token-mean": "dapo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum-norm": "dr_grpo",
}


def loss_type(loss_agg_mode: str) -> str:
    try:
        return LOSS_TYPES[loss_agg_mode]
    except KeyError:
        raise ConfigError(
            f"algorithm.loss_agg_mode {loss_agg_mode!r} has no TRL equivalent (TRL's only per-sequence token-sum "
            "loss, luspo, also changes the importance ratio); use one of "
            f"{', '.join(LOSS_TYPES)} with trainer.backend=trl, or trainer.backend=verl"
        ) from None


def trl_top_k(top_k: int) -> int:
    """verl disables top-k with -1 (or 0); TRL with 0."""
    return max(0, top_k)


def grpo_args(
    cfg: RunConfig, output_dir: str | Path, reward_weights: list[float] | None = None, use_cpu: bool | None = None,
    total_steps: int | None = None,
):
    """The `trl.GRPOConfig` of a run; raises ConfigError naming the config field when TRL rejects a value.

    total_steps: the run's planned steps (`AlgorithmConfig.planned_steps`); None means algorithm.total_steps."""
    from trl import GRPOConfig

    from verl_grpo.trainers.precision import resolve_precision

    alg, tr = cfg.algorithm, cfg.trainer
    layout = batch_layout(cfg)
    if use_cpu is None:
        import torch

        use_cpu = not torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        "output_dir": str(output_dir),
        # GRPO algorithm
        "num_generations": alg.rollouts,
        "epsilon": alg.clip_low,
        "epsilon_high": alg.clip_high,
        "beta": alg.kl_coef,
        "loss_type": loss_type(alg.loss_agg_mode),
        "num_iterations": 1,
        "scale_rewards": "group",
        "reward_weights": reward_weights,
        # sampling
        "temperature": alg.temperature,
        "top_p": alg.top_p,
        "top_k": trl_top_k(alg.top_k),
        "max_completion_length": rollout_tokens(cfg),  # with the search tool, its results get room of their own
        # batch layout (see module docstring)
        "per_device_train_batch_size": layout.per_device_batch,
        "gradient_accumulation_steps": layout.grad_accum_steps,
        "steps_per_generation": layout.grad_accum_steps,
        # optimisation: a constant LR after an optional linear warm-up, as verl's actor does
        "learning_rate": alg.lr,
        "lr_scheduler_type": "constant_with_warmup" if alg.warmup_steps else "constant",
        "warmup_steps": alg.warmup_steps,
        "max_steps": total_steps or alg.total_steps,
        "seed": alg.seed,
        "data_seed": alg.seed,
        "shuffle_dataset": True,
        # checkpoints: full state (optimizer, scheduler, RNG) so a resume is exact; the store keeps the history
        "save_strategy": "steps",
        "save_steps": alg.save_freq,
        "save_only_model": False,
        "save_total_limit": 1,
        # logging: we record metrics ourselves (metrics.jsonl, then MLflow)
        "logging_strategy": "steps",
        "logging_steps": tr.logging_steps,
        "report_to": [],
        "disable_tqdm": True,
        "log_completions": False,
        # devices and precision
        "use_cpu": use_cpu,
        "bf16": resolve_precision(tr.precision, use_cpu) == "bf16",
        "fp16": False,
        "gradient_checkpointing": False,
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
    }
    if "retrieval" in cfg.services.enabled:  # the search tool: TRL runs the multi-turn rollouts
        kwargs["max_tool_calling_iterations"] = cfg.services.retrieval.max_tool_turns
    try:
        return GRPOConfig(**kwargs)
    except ValueError as e:
        raise ConfigError(f"TRL rejected the training settings derived from algorithm.* / trainer.*: {e}") from e


class TrlTrainer:
    """Trainer backend `trl`: TRL's GRPOTrainer in a worker process (CPU, or one GPU)."""

    name = "trl"

    def check(self, cfg: RunConfig) -> str:
        """Validate the TRL mapping offline (ConfigError naming the field); a one-line description of it."""
        import trl

        if cfg.trainer.backend != self.name:
            raise ConfigError(f"trainer.backend is {cfg.trainer.backend!r}; the trl backend cannot check it")
        args = grpo_args(cfg, "unused-output-dir", use_cpu=True)
        layout = batch_layout(cfg)
        return (
            f"TRL {trl.__version__} GRPOTrainer: {layout.prompts_per_step} prompts x {cfg.algorithm.rollouts} rollouts "
            f"per step ({layout.grad_accum_steps} pass(es) of {layout.per_device_batch}), loss_type {args.loss_type}, "
            f"{cfg.algorithm.total_steps} steps, checkpoint every {cfg.algorithm.save_freq}"
        )

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Validate the mapping offline, write `<workdir>/train_spec.json`, return the worker command."""
        self.check(cfg)  # raises ConfigError before anything is spent
        return worker_train_spec(self.name, "verl_grpo.trainers.trl.worker", cfg, dataset, store, run_id, cluster)

    def parse_progress(self, line: str, total_steps: int) -> TrainProgress | None:
        """The worker's `step k/N reward=… loss=…` lines (see trainers.worker.progress)."""
        return progress.parse_progress(line, total_steps)
