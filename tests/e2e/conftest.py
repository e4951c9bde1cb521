from __future__ import annotations

import pytest

# A whole-flow run on the tiny model: small enough for CI, big enough to checkpoint twice.
TINY_RUN = [
    "model.name=tiny",
    "algorithm.total_steps=4",
    "algorithm.save_freq=2",
    "algorithm.train_batch_size=2",
    "algorithm.rollouts=2",
    "algorithm.max_response_length=16",
    "algorithm.lr=1e-4",
    "trainer.threads=1",
    "eval.limit=8",
    "eval.batch_size=8",
    "eval.max_new_tokens=16",
    "warm_start.enabled=false",  # the local profile's SFT phase; tests/integration/test_trl_training.py covers it
]


@pytest.fixture
def tiny_overrides(tmp_path, tiny_model_dir):
    return [
        *TINY_RUN,
        f"model.name={tiny_model_dir}",
        f"storage.uri=file://{tmp_path / 'store'}",
        f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}",
    ]


@pytest.fixture(scope="session")
def tiny_run() -> list[str]:
    """TINY_RUN for a fixture wider than one test (one run whose output several tests check)."""
    return list(TINY_RUN)
