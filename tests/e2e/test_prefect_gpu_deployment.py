"""The nightly GPU deployment, run as a user runs it: `make serve` with VERL_GRPO_GPU_STORE naming a bucket, then
`prefect deployment run verl-grpo/gsm8k-gpu --watch` against the local rehearsal of the cloud (the worker's
environment points SkyPilot at the rehearsal and carries the bucket's credentials, as a real worker's would).

The deployment's own parameters (the gsm8k cluster config, SkyPilot, verl, the bucket) are what the run uses; the test
only appends the tiny model and a few steps. The flow run must reach Completed, having trained through the SkyPilot
provider on the rehearsal into the bucket, and registered a model; nothing of the rehearsal may be left running."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import mlflow
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import StateType
from prefect.settings import PREFECT_API_URL
from prefect_serving import served_prefect

from verl_grpo.config import load_config
from verl_grpo.registry.tracking import RUN_ID_TAG
from verl_grpo_rehearsal import sky_boundary
from verl_grpo_rehearsal.session import BUCKET, rehearsal_session
from verl_grpo_tasks.train import CLOUD_TRAIN_CONCURRENCY_TAG, TRAIN_CONCURRENCY_TAG

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

RUN_TIMEOUT_S = 900  # a bound for a hang: beside two other xdist workers the run took 302 s once
# Independent of the cluster config's model, GPU shape and spot setting: the tiny model, one node, two steps.
TINY_GPU_RUN = ["model.name=tiny", "infra.accelerators=H100:1", "infra.nodes=1", "infra.spot=false",
                "algorithm.total_steps=2", "algorithm.save_freq=2", "algorithm.train_batch_size=2",
                "algorithm.rollouts=2", "algorithm.max_response_length=16", "eval.limit=4", "eval.batch_size=4",
                "eval.max_new_tokens=16"]


def test_prefect_deployment_run_gsm8k_gpu_trains_on_the_rehearsal_and_registers_a_model(
        tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("gpu-deployment")
    store = f"s3://{BUCKET}/nightly"
    far = datetime.now(timezone.utc) + timedelta(hours=12)  # schedules active, none due during the test
    # The cluster config's own store is on this machine: the session serves the bucket on a loopback S3 endpoint.
    with rehearsal_session(load_config(["gsm8k"]), root=home / "rehearsal") as session:
        endpoint = _override(session.overrides, "storage.endpoint_url")
        mlflow_uri = _override(session.overrides, "tracking.mlflow_uri")
        started = time.monotonic()
        with served_prefect(home, tiny_model_dir.parent, VERL_GRPO_NIGHTLY_CRON=f"{far.minute} {far.hour} * * *",
                            VERL_GRPO_GPU_STORE=store, VERL_GRPO_GPU_STORE_ENDPOINT=endpoint):
            served_at = time.monotonic()
            with get_client(sync_client=True) as client:
                deployment = client.read_deployment_by_name("verl-grpo/gsm8k-gpu")
            assert deployment.parameters == {"config": ["gsm8k"], "overrides": [
                "infra.provider=skypilot", "trainer.backend=verl", "warm_start.enabled=false", f"storage.uri={store}",
                f"storage.endpoint_url={endpoint}"]}
            assert [s.active for s in deployment.schedules] == [True]  # a bucket is given

            overrides = [*deployment.parameters["overrides"], *TINY_GPU_RUN, f"tracking.mlflow_uri={mlflow_uri}"]
            ran = subprocess.run(
                [str(Path(sys.executable).parent / "prefect"), "deployment", "run", "verl-grpo/gsm8k-gpu",
                 "--params", json.dumps({"overrides": overrides}), "--watch", "--watch-timeout", str(RUN_TIMEOUT_S)],
                env={"PATH": "/usr/bin:/bin", "HOME": str(home), "PREFECT_HOME": str(home / "prefect"),
                     "PREFECT_API_URL": PREFECT_API_URL.value()},
                capture_output=True, text=True, timeout=RUN_TIMEOUT_S + 60)
            ran_at = time.monotonic()
            flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", ran.stdout)[1]
            with get_client(sync_client=True) as client:
                flow_run = client.read_flow_run(flow_run_id)
                task_runs = client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
            worker_log = (home / "prefect" / "worker.log").read_text(errors="replace")
            assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:] + worker_log[-5000:]
            assert flow_run.state.type == StateType.COMPLETED

        run_id = flow_run.parameters["run_id"]
        assert {"verl-grpo", "gsm8k", "gpu", "tiny", "skypilot", "verl"} <= set(flow_run.tags)
        # held by the cloud trainings' concurrency limit, not by the one of this machine's CPU trainings
        [train_task] = [t for t in task_runs if t.name.startswith("train")]
        assert CLOUD_TRAIN_CONCURRENCY_TAG in train_task.tags and TRAIN_CONCURRENCY_TAG not in train_task.tags
        # Trained (and evaluated) by jobs on the rehearsal of SkyPilot, which the SkyPilot provider launched.
        jobs = [sky_boundary.summary(record.job_id) for record in sky_boundary.queue()]
        assert jobs and all(job["status"] == "SUCCEEDED" for job in jobs), jobs
        train = [job for job in jobs if not job["name"].endswith("-eval")]
        assert len(train) == 1 and run_id in train[0]["name"], jobs
        log = (Path(train[0]["job_dir"]) / "run.log").read_text()
        assert "training done: step 2, model at " in log

        # The run lives in the deployment's bucket, and its model is registered in MLflow.
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"nightly/runs/{run_id}/")["Contents"]]
        assert f"nightly/runs/{run_id}/run.json" in keys
        assert any(key.startswith(f"nightly/runs/{run_id}/model/") for key in keys)
        versions = mlflow.MlflowClient(tracking_uri=mlflow_uri).search_model_versions("")
        assert [v.tags.get(RUN_ID_TAG) for v in versions] == [run_id], versions
    print(f"\nmake serve {served_at - started:.0f} s; prefect deployment run --watch {ran_at - served_at:.0f} s")
    left = subprocess.run(["pgrep", "-af", str(home / "rehearsal")], capture_output=True, text=True).stdout.strip()
    assert not left, f"rehearsal processes left:\n{left}"


def _override(overrides: list[str], key: str) -> str:
    return next(o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}="))
