"""Shared fixtures: an isolated state dir, the tiny model, a moto S3 server on loopback."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from ports import free_port

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ["sigterm_guard", "parallel_units"]

# The suite runs several xdist workers, each with its own trainers, servers and rehearsal nodes, on 2 cores: one torch
# thread per process (inherited by every subprocess; torch's default when a run's config names no thread count).
# Two threads each waiting on the other's core run several times slower than one (bench/trl_step_bench.py's notes).
# Tests of thread settings set them explicitly.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# SkyPilot fixes its state and catalog paths from HOME when first imported, so the whole session gets a
# temporary HOME before anything imports `sky`: tests never touch the developer's ~/.sky.
if "VERL_GRPO_TEST_HOME" not in os.environ:
    os.environ["VERL_GRPO_TEST_HOME"] = tempfile.mkdtemp(prefix="verl-grpo-test-home-")
    os.environ["HOME"] = os.environ["VERL_GRPO_TEST_HOME"]
    atexit.register(shutil.rmtree, os.environ["VERL_GRPO_TEST_HOME"], True)


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    """Every test gets its own VERL_GRPO_HOME and no cloud credentials from the developer's shell."""
    home = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("VERL_GRPO_HOME", str(home))
    for var in ("MODEL_NAME", "TOTAL_STEPS", "TRAIN_BATCH_SIZE", "ROLLOUTS", "CLIP_LOW", "CLIP_HIGH", "LR",
                "TEMPERATURE", "TOP_P", "TOP_K"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VERL_GRPO_MODEL_CACHE", str(_shared_model_cache()))
    yield home


def _shared_model_cache() -> Path:
    """Built/converted models are reused across tests (and runs): building is deterministic."""
    path = Path(os.environ.get("VERL_GRPO_TEST_MODEL_CACHE", REPO / ".state" / "test-models"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def pytest_sessionstart(session):
    """With xdist, the tiny model is built here, once, before the workers start: no worker writes into the
    checkout while another runs the test that checks nothing else does (tests/e2e/test_clean_checkout.py)."""
    if session.config.getoption("dist", "no") == "loadgroup" and not hasattr(session.config, "workerinput"):
        from verl_grpo.models import build_tiny_model

        build_tiny_model(_shared_model_cache() / "tiny")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from verl_grpo.models import build_tiny_model

    return build_tiny_model(_shared_model_cache() / "tiny")


@pytest.fixture(scope="session")
def data_mirror() -> Path:
    from verl_grpo.local_paths import data_mirror_dir

    path = data_mirror_dir()
    if not (path / "gsm8k" / "train.jsonl").is_file():
        pytest.fail(f"data mirror {path} is missing; set VERL_GRPO_DATA_MIRROR to a copy of shared/data")
    return path



@pytest.fixture(scope="session")
def s3_server():
    """A real S3 endpoint: moto in server mode on 127.0.0.1. Yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on the moto server, with dummy credentials in the environment. Yields (uri, endpoint)."""
    import uuid

    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"test-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1").create_bucket(Bucket=name)
    yield f"s3://{name}/store", s3_server
