"""`python -m verl_grpo_rehearsal.main_ppo_cpu <main_ppo overrides>`: verl.trainer.main_ppo stood in on a CPU.

A local rehearsal of a SkyPilot launch runs this instead of `python -m verl.trainer.main_ppo` with the very same
Hydra overrides. Everything of verl that runs on a CPU is verl's own (config compose + validate_config, dataset,
sampler, StatefulDataLoader, reward loader, GRPO advantage, policy loss, optimizer/LR schedule, FSDP2 wrapping,
FSDPCheckpointManager, Tracking console/file loggers (and mlflow if named), the checkpoint callback builder,
resume_mode=auto);
the trainer loop mirrors verl 0.9.1's v1 `PPOTrainer.fit` / `_save_checkpoint` / `_load_checkpoint`. Rollouts
use HF `generate` instead of vLLM, one process instead of Ray workers, and there is no validation pass.

Env: VERL_FILE_LOGGER_PATH (verl's file logger), MLFLOW_TRACKING_URI (verl's mlflow logger), and for the
injected failure VERL_GRPO_REHEARSAL_FAIL_AT=N with VERL_GRPO_STORE_URI / VERL_GRPO_STORE_ENDPOINT /
VERL_GRPO_RUN_ID (the once-only marker) or VERL_GRPO_REHEARSAL_DIR. Exit 0 on success, 1 on any error.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from typing import Any

WANDB_INVALID_CHARS = "/\\#?%:"


class RehearsalError(Exception):
    """A problem the real run would hit too (printed without a traceback)."""


def wandb_project_error(project: str) -> str | None:
    """What `wandb.init(project=...)` would reject the project name with, else None (wandb's own validator)."""
    try:
        from wandb.errors import UsageError
        from wandb.sdk.wandb_settings import Settings
    except ImportError:
        bad = sorted({c for c in WANDB_INVALID_CHARS if c in project})
        if len(project) > 128:
            return f"Invalid project name {project!r}: exceeded 128 characters"
        if bad:
            return (f"Invalid project name {project!r}: cannot contain characters "
                    f"{','.join(WANDB_INVALID_CHARS)!r}, found {','.join(bad)!r}")
        return None
    try:
        Settings(project=project)
    except UsageError as e:
        return str(e)
    except Exception as e:  # pydantic wraps validator errors in some wandb versions
        if "Invalid project name" in str(e):
            return str(e).strip().splitlines()[-1] if "\n" in str(e) else str(e)
        raise
    return None


def load_config(overrides: list[str]) -> Any:
    """verl's own ppo_trainer config with these overrides, checked as `verl_grpo` checks them before a launch."""
    from omegaconf import OmegaConf

    from verl_grpo.trainers.verl.validation import compose_verl_config, validate_verl_overrides

    validate_verl_overrides(overrides)
    config = compose_verl_config(overrides)
    OmegaConf.resolve(config)
    return config


def rehearsal_line(config: Any, loggers: list[str]) -> str:
    wandb = ", W&B: project name checked with wandb's validator, nothing sent" if "wandb" in loggers else ""
    extra_not_real = ""
    if str(config.algorithm.adv_estimator) != "grpo":
        extra_not_real += f", advantage estimator {config.algorithm.adv_estimator} (GRPO used instead)"
    if config.actor_rollout_ref.actor.get("use_kl_loss", False):
        extra_not_real += ", KL loss to the reference policy (use_kl_loss; not applied)"
    strategy = str(config.actor_rollout_ref.actor.get("strategy", "fsdp2"))
    if strategy != "fsdp2":
        extra_not_real += f", actor strategy {strategy} (FSDP2 checkpoint layout written instead)"
    if config.get("critic", {}).get("enable", False):
        extra_not_real += ", critic (not trained)"
    from verl_grpo_rehearsal import uses_agent_loop

    rollout = config.actor_rollout_ref.rollout
    agent_loop = (f", multi-turn rollouts in verl's AgentLoopWorker + {rollout.agent.default_agent_loop} loop with the "
                  f"tools of {rollout.multi_turn.tool_config_path} called for real" if uses_agent_loop(config) else "")
    return ("rehearsal: verl.trainer.main_ppo stood in by verl_grpo_rehearsal.main_ppo_cpu (CPU): real: verl "
            "Hydra config + validate_config, RLHFDataset + StatefulDataLoader (data.pt), custom reward via verl's "
            f"loader{agent_loop}, GRPO advantage + policy loss of verl.core_algos, AdamW/LR schedule of verl's FSDP "
            "engine, FSDP2 (world size 1, gloo) + FSDPCheckpointManager, checkpoint callback, resume_mode, Tracking "
            f"[{','.join(x for x in loggers if x != 'wandb')}]{wandb}; not real: vLLM rollouts (HF generate "
            f"of {config.actor_rollout_ref.model.path}), Ray worker groups, GPUs, validation (test_freq)"
            f"{extra_not_real}")


def main(argv: list[str] | None = None) -> int:
    return run(list(sys.argv[1:] if argv is None else argv), load_config, rehearsal_line)


def run(overrides: list[str], load: Callable[[list[str]], Any], describe: Callable[[Any, list[str]], str]) -> int:
    """Check and compose the overrides with `load`, print `describe`'s line, train with the stand-in trainer."""
    try:
        import torch

        from verl_grpo_rehearsal import STANDIN_THREADS

        torch.set_num_threads(STANDIN_THREADS)
        config = load(overrides)
        loggers = list(config.trainer.logger) if not isinstance(config.trainer.logger, str) else [
            config.trainer.logger]
        if "wandb" in loggers:
            problem = wandb_project_error(str(config.trainer.project_name))
            if problem:
                raise RehearsalError(f"wandb.errors.UsageError: {problem} (trainer.project_name: verl passes it "
                                     "to wandb.init(project=...), so the real run fails here)")
        print(describe(config, loggers), flush=True)
        from verl_grpo_rehearsal.standin_trainer import StandinTrainer

        trainer = StandinTrainer(config, [x for x in loggers if x != "wandb"])
        succeeded = False
        try:
            trainer.fit()
            succeeded = True
        finally:
            trainer.logger.finish(exit_code=0 if succeeded else 1)
        return 0
    except RehearsalError as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return 1
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    finally:
        _destroy_process_group()


def _destroy_process_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main())
