"""Optional mirror of the training metrics to Weights & Biases when WANDB_API_KEY is set.

MLflow stays the system of record; W&B gets the same per-step curves and the flattened config. The key is
read by wandb from the environment and never passed, logged or stored by us.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping

from verl_grpo.config import RunConfig

log = logging.getLogger(__name__)


def wandb_enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get("WANDB_API_KEY")) or env.get("WANDB_MODE") == "offline"


def mirror_to_wandb(cfg: RunConfig, run_id: str, metrics_lines: Iterable[str], summary: Mapping[str, float]) -> str | None:
    """Log the run's training curves and eval summary to W&B (project `verl-grpo-<dataset>`, run id = run_id).

    Idempotent: the W&B run id is the pipeline run id, resumed on a retry. Returns the W&B run URL (or the
    offline run dir), None when W&B is not enabled.
    """
    if not wandb_enabled():
        return None
    import wandb

    run = wandb.init(project=cfg.wandb_project, id=run_id, name=run_id, resume="allow",
                     config=cfg.params(), reinit="finish_previous")
    try:
        for line in metrics_lines:
            if line.strip():
                record = json.loads(line)
                step = int(record.pop("step"))
                numbers = {f"train/{k}": v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                run.log(numbers, step=step)
        run.summary.update(dict(summary))
        return run.url or run.dir
    finally:
        run.finish()
