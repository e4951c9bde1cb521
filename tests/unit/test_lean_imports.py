"""A training worker imports neither PEFT, W&B, MLflow nor scikit-learn, though transformers and TRL import each of
them when installed, and a module that does need one fails with an ImportError naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from verl_grpo.trainers.lean_imports import UNUSED_IN_WORKERS

REPO = Path(__file__).resolve().parents[2]
UNUSED = (*UNUSED_IN_WORKERS, "mlflow")


@pytest.mark.parametrize("worker", ["verl_grpo.trainers.trl.worker", "verl_grpo.trainers.loop.worker"])
def test_a_worker_with_its_trainers_loaded_imported_none_of_the_unused_integrations(worker):
    script = (
        f"import sys, {worker}\n"
        "from trl import GRPOTrainer, SFTTrainer\n"
        "import verl_grpo.trainers.trl.training, verl_grpo.trainers.loop.training\n"
        "from transformers.utils import is_peft_available\n"
        "from transformers.integrations import is_mlflow_available, is_wandb_available\n"
        "assert not (is_peft_available() or is_mlflow_available() or is_wandb_available())\n"
        f"print(sorted(m for m in {UNUSED!r} if sys.modules.get(m) is not None))\n"
        "try:\n    import peft\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported, blocked = done.stdout.splitlines()[-2:]
    assert imported == "[]"
    assert "peft" in blocked


def test_the_rest_of_the_project_still_sees_them():
    from transformers.utils import is_peft_available

    assert is_peft_available()  # installed with verl; only the workers hide it
