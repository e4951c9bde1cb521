"""MLflow tracking of pipeline runs and the model registry (champion/challenger aliases)."""

from verl_grpo.registry.listing import list_models
from verl_grpo.registry.register import champion_needs_reeval, eval_summary, register_run
from verl_grpo.registry.versions import download_version

__all__ = ["champion_needs_reeval", "download_version", "eval_summary", "list_models",
           "register_run"]
