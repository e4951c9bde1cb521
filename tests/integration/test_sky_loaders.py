"""Rendered YAML through SkyPilot's own loaders, registry and catalog, in a subprocess whose HOME holds the
catalog copy (SkyPilot fixes its catalog directory when `sky` is imported, and must not try to download)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sky_home import sky_home

SCRIPT = r'''
import json, sys
from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot.dry_run import dry_run

base = ["dataset.name=gsm8k", "trainer.backend=verl", "infra.provider=skypilot", "infra.accelerators=H100:8",
        "storage.uri=s3://bucket/prefix"]
env = {"WANDB_API_KEY": "sekretxyz" + "0" * 31, "AWS_ACCESS_KEY_ID": "AKIAFAKE", "AWS_SECRET_ACCESS_KEY": "fake"}
out = {}
for name, extra in {
    "multinode": [], "job_group": ["skypilot.shape=job_group", "infra.nodes=2", "services.enabled=[reward,retrieval]"],
    "rollout_group": ["skypilot.shape=rollout_group", "verl.rollout_engine=sglang"],
    "service_resources": ["skypilot.shape=job_group", "services.enabled=[reward,retrieval]",
                          "services.retrieval.replicas=2", "services.reward.reward_model=/models/rm",
                          "services.reward.accelerators=A10:1"],
    "bad_accelerator": ["infra.accelerators=H10:8"], "bad_strategy": ["skypilot.recovery_strategy=BOGUS"],
    "spot_on_lambda": ["infra.spot=true", "skypilot.cloud=lambda"], "bad_key": ["skypilot.cloud=lambda",
    "verl.extra_overrides=[trainer.savefreq=3]"],
    "h100x3": ["infra.accelerators=H100:3"],
}.items():
    try:
        r = dry_run(load_config([], base + extra), env=env, check_reward=False)
        out[name] = {"ok": True, "checks": r.checks, "costs": [c.__dict__ for c in r.costs], "text": r.render()}
    except ConfigError as e:
        out[name] = {"ok": False, "error": str(e)}
# The shipped shapes as a user launches them: a config file each, the store and nothing else.
store = ["trainer.backend=verl", "infra.provider=skypilot", "storage.uri=s3://bucket/prefix"]  # as `launch` sets
for name, (files, extra) in {
    "gsm8k": (["gsm8k"], []), "math": (["math"], []), "mbpp": (["mbpp"], []), "squad": (["squad"], []),
    "nq_hotpotqa": (["nq_hotpotqa"], ["services.retrieval.url=http://10.0.0.5:8000/retrieve"]),
    "gsm8k_2_nodes": (["gsm8k"], ["infra.nodes=2"]), "gsm8k_job_group": (["gsm8k"], ["skypilot.shape=job_group"]),
    "gsm8k_rollout_group": (["gsm8k"], ["skypilot.shape=rollout_group"]),
    "gsm8k_kubernetes": (["gsm8k"], ["skypilot.cloud=kubernetes"]),
}.items():
    try:
        r = dry_run(load_config(files, store + extra, env={}), env=env, check_reward=False)
        out[name] = {"ok": True, "checks": r.checks, "costs": [c.__dict__ for c in r.costs or []], "text": r.render()}
    except ConfigError as e:
        out[name] = {"ok": False, "error": str(e)}
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    home = sky_home(tmp_path_factory.mktemp("skyhome"))
    env = {**os.environ, "HOME": str(home), "VERL_GRPO_HOME": str(home / "state"), "HF_HUB_OFFLINE": "1"}
    env.pop("SKY_RUNTIME_DIR", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"dry-run subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("shape", ["multinode", "job_group", "rollout_group"])
def test_every_shape_passes_skypilot_loaders_and_catalog(results, shape):
    r = results[shape]
    assert r["ok"], r.get("error")
    assert any("SkyPilot loads the" in c for c in r["checks"])
    assert any("registered in SkyPilot" in c for c in r["checks"])
    assert "sekretxyz" not in r["text"]


def test_cost_is_catalog_price_times_nodes_times_hours(results):
    two_nodes = results["job_group"]["costs"][0]
    assert two_nodes["instance_type"] == "gpu_8x_h100_sxm5" and two_nodes["nodes"] == 2
    # 20 steps x 120 s = 2/3 h of the trainer (Lambda's gpu_8x_h100_sxm5: $31.92/h) and of the two services
    # (reward-server 4+ vCPUs / 8+ GiB: cpu_4x_general, $0.20/h; retrieval-server 16+ vCPUs / 64+ GiB as the seed's:
    # Lambda sells no such CPU box, SkyPilot's default instance type is gpu_1x_a10, $1.29/h), plus the eval task's
    # 20 min on gpu_1x_h100_pcie ($3.29/h).
    hours = 20 * 120 / 3600
    assert two_nodes["on_demand"] == pytest.approx(31.92 * 2 * hours + (0.20 + 1.29) * hours + 3.29 * 20 / 60)
    assert two_nodes["spot"] is None
    assert "reward-server: 1 x cpus 4+, memory 8+" in results["job_group"]["text"]
    assert "retrieval-server: 1 x cpus 16+, memory 64+" in results["job_group"]["text"]


def test_service_resources_pass_skypilots_loaders(results):
    """Two retrieval replicas (num_nodes: 2) and a reward-server with a GPU for its neural reward model load as a
    job group, and the estimate counts them."""
    r = results["service_resources"]
    assert r["ok"], r.get("error")
    assert "SkyPilot loads the job_group YAML (3 tasks)" in r["checks"]
    assert ("services token VERL_GRPO_SERVICES_TOKEN: generated per launch, given to all 3 tasks as a SkyPilot "
            "secret; no secret's value is in the YAML") in r["checks"]
    assert not any("services token" in c for c in results["multinode"]["checks"])
    assert "retrieval-server: 2 x cpus 16+, memory 64+" in r["text"]
    assert "reward-server: 1 x A10:1 (cpus 4+, memory 8+)" in r["text"]
    # trainer 1 x $31.92, reward-server on gpu_1x_a10 ($1.29), 2 retrieval replicas on gpu_1x_a10, eval
    hours = 20 * 120 / 3600
    assert r["costs"][0]["on_demand"] == pytest.approx((31.92 + 3 * 1.29) * hours + 3.29 * 20 / 60)


def test_bad_accelerator_fails_with_catalog_candidates(results):
    assert not results["bad_accelerator"]["ok"]
    assert "'H10:8' is not offered" in results["bad_accelerator"]["error"]
    assert "H100:8" in results["bad_accelerator"]["error"]


def test_bad_recovery_strategy_fails_with_skypilots_message(results):
    assert "is not a valid jobs recovery strategy" in results["bad_strategy"]["error"]


def test_spot_where_no_spot_is_sold_launches_on_demand_with_a_warning(results):
    r = results["spot_on_lambda"]
    assert r["ok"], r.get("error")
    assert "warning: infra.spot=true but no catalog offer of H100:8 on lambda sells spot: launching on-demand" in r["text"]
    assert "use_spot: false" in r["text"] and "use_spot: true" not in r["text"]


def test_misspelled_verl_key_fails_in_dry_run(results):
    assert "Could not override 'trainer.savefreq'" in results["bad_key"]["error"]


SHIPPED = ["gsm8k", "math", "mbpp", "squad", "nq_hotpotqa", "gsm8k_2_nodes", "gsm8k_job_group", "gsm8k_rollout_group",
           "gsm8k_kubernetes"]


@pytest.mark.parametrize("shape", SHIPPED)
def test_each_shipped_shape_dry_runs_naming_spot_driver_restarts_and_the_eval_nodes_transformers(results, shape):
    r = results[shape]
    assert r["ok"], r.get("error")
    checks = r["checks"]
    spot = next(c for c in checks if c.startswith("spot: "))
    kubernetes = shape in ("squad", "gsm8k_job_group", "gsm8k_rollout_group", "gsm8k_kubernetes")  # squad: a job group
    if kubernetes:  # SkyPilot has no spot on an unlabelled Kubernetes cluster: on-demand, with a warning
        assert spot.startswith("spot: off (") and "kubernetes" in spot.lower()
        assert "warning: infra.spot=true but skypilot" in r["text"] and "use_spot: true" not in r["text"]
    else:  # the shipped catalog (Lambda) sells no spot
        assert spot.startswith("spot: off (no catalog offer of")
    trainers = [c for c in checks if c.startswith("driver: ")]
    assert len(trainers) == 2 and all("NVIDIA driver >= 580.65.06 (torch 2.11.0, CUDA 13.0)" in c for c in trainers)
    restarts = [c for c in checks if c.startswith("restarts: ")]
    assert restarts and all("recovers exit code(s) [75]" in c and "0 time(s)" in c for c in restarts)
    assert any(c.startswith("transformers: 5.9.0 on every GPU task (") and "-eval" in c for c in checks)
    assert "MLFLOW_TRACKING_URI:" not in r["text"] and "pip install --quiet --upgrade uv" not in r["text"]
    if shape in ("gsm8k_2_nodes", "gsm8k_rollout_group"):
        assert any(c.startswith("network: ") for c in checks)
    if shape in ("squad", "gsm8k_job_group", "gsm8k_rollout_group"):
        assert any(c.startswith("services: task ") for c in checks)


def test_an_accelerator_count_no_catalog_offers_fails_in_one_line(results):
    """Three H100s per node: no instance of the local catalogs (Lambda sells 1, 2, 4 and 8) carries them. (`-c math`'s
    H100:2 passes: Lambda's gpu_2x_h100_sxm5.)"""
    error = results["h100x3"]["error"]
    assert not results["h100x3"]["ok"]
    lines = [ln for ln in error.splitlines() if "H100:3" in ln]
    assert len(lines) == 1 and "infra.accelerators 'H100:3' is not offered" in lines[0] and "lambda" in lines[0]
    assert "gpu_2x_h100_sxm5" in str(results["math"]["costs"])
