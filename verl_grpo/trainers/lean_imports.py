"""A CPU training worker starts without the library integrations it never uses.

transformers and TRL import PEFT, W&B, MLflow and scikit-learn at import time whenever they are installed
(`trl/extras/profiling.py`: `if is_wandb_available(): import wandb`, the same for mlflow; TRL's GRPO trainer: peft;
transformers' `generation/candidate_generator.py`: sklearn.metrics). verl's dependencies install all four, and
importing them costs CPU seconds at every worker start, a large share of the worker's imports. A worker
uses none of them: TRL reports to nothing (`report_to=[]`), LoRA exists on the verl path only, and metrics reach
MLflow and W&B from the flow, which reads the worker's metrics.jsonl.

Call `skip_unused_integrations()` before transformers or TRL is imported. An entry of None in `sys.modules` is
Python's own way to mark a module unavailable: `importlib.util.find_spec` answers None (so the availability
checks answer False) and an import raises ImportError naming it.
"""

from __future__ import annotations

import os
import sys

UNUSED_IN_WORKERS = ("peft", "wandb", "sklearn")


def skip_unused_integrations() -> None:
    os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")  # transformers' own switch for its MLflow check
    for name in UNUSED_IN_WORKERS:
        sys.modules.setdefault(name, None)
