"""The launch's cost: the dry run's estimate from SkyPilot's catalog (shipped Lambda copy + a small RunPod
catalog that sells spot) and the actual cost from a job's timeline through the rehearsal boundary.

SkyPilot fixes its catalog directory when `sky` is imported, so everything runs in one subprocess whose HOME
holds the catalogs (as tests/integration/test_sky_loaders.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sky_home import sky_home

from verl_grpo_rehearsal import launch_env

# A cloud that sells spot, in SkyPilot's RunPod catalog format: H100:8 cheaper on demand in US, on spot in CA.
RUNPOD_CSV = """\
InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Region,SpotPrice,Price,AvailabilityZone,GpuInfo
8x_H100_SECURE,H100,8.0,128.0,1000.0,US,16.0,24.0,US-TX-3,
8x_H100_SECURE,H100,8.0,128.0,1000.0,CA,12.0,26.0,CA-MTL-1,
1x_H100_SECURE,H100,1.0,16.0,125.0,US,2.0,3.0,US-TX-3,
1x_H100_SECURE,H100,1.0,16.0,125.0,CA,1.5,3.25,CA-MTL-1,
cpu3c-4-8,,,4.0,8.0,US,0.06,0.12,US-TX-3,
cpu3c-4-8,,,4.0,8.0,CA,0.07,0.14,CA-MTL-1,
"""

SCRIPT = r'''
import json, os, time
from pathlib import Path
from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot import boundary
from verl_grpo.providers.skypilot.cost import estimate_cost
from verl_grpo.providers.skypilot.provider import SkyPilotProvider
from verl_grpo.providers.skypilot.templates import eval_job_name, job_name
from verl_grpo_rehearsal import sky_boundary

base = ["dataset.name=gsm8k", "trainer.backend=verl", "infra.provider=skypilot", "infra.accelerators=H100:8",
        "algorithm.total_steps=30", "algorithm.save_freq=10", "skypilot.step_seconds=120"]
out = {}
for name, extra in {
    "on_demand": [], "spot": ["infra.spot=true"],
    "lambda": ["skypilot.cloud=lambda"], "region": ["skypilot.cloud=runpod", "skypilot.region=CA"],
    "job_group": ["skypilot.cloud=runpod", "skypilot.region=US", "skypilot.shape=job_group", "infra.nodes=2",
                  "services.enabled=[reward,retrieval]", "infra.spot=true", "services.retrieval.replicas=2",
                  "services.retrieval.cpus=4", "services.retrieval.memory=8"],
    "neural_reward": ["skypilot.cloud=runpod", "skypilot.region=US", "skypilot.shape=job_group",
                      "services.enabled=[reward]", "services.reward.reward_model=/models/rm",
                      "services.reward.accelerators=H100:1"],
    "no_l4": ["skypilot.cloud=runpod", "skypilot.shape=job_group", "services.enabled=[reward]",
              "services.reward.reward_model=/models/rm"],
    "big_retrieval": ["skypilot.cloud=runpod", "skypilot.region=US", "skypilot.shape=job_group",
                      "services.enabled=[retrieval]"],
    "rollout_group": ["skypilot.cloud=runpod", "skypilot.region=US", "skypilot.shape=rollout_group",
                      "skypilot.rollout_nodes=2", "infra.spot=true",
                      "services.data.memory=8", "services.replay.memory=8"],
    "spot_on_lambda": ["skypilot.cloud=lambda", "infra.spot=true"],
}.items():
    try:
        e = estimate_cost(load_config([], base + extra), boundary)
        out[name] = {"ok": True, "rows": [r.__dict__ for r in e.rows], "left_off": e.left_off,
                     "tasks": [t.__dict__ for t in e.tasks], "overhead_hours": e.overhead_hours,
                     "text": "\n".join(e.render_lines())}
    except ConfigError as err:
        out[name] = {"ok": False, "error": str(err)}

# A finished run in the rehearsal's job queue: training (one recovery) and eval, written as its controller does.
root = Path(os.environ["VERL_GRPO_REHEARSAL_DIR"])
run_id, t0 = "cost-run", 1_700_000_000.0
for job_id, name, start, end, runs in ((1, job_name(run_id), t0, t0 + 7200, [(600, 3000), (3600, 7000)]),
                                       (2, eval_job_name(run_id), t0 + 7300, t0 + 9100, [(300, 1800)])):
    path = root / "jobs" / str(job_id)
    path.mkdir(parents=True)
    (path / "job.json").write_text(json.dumps({"job_id": job_id, "name": name, "submitted_at": start - 5,
                                               "kind": "managed", "job_group": False}))
    (path / "state.json").write_text(json.dumps({"status": "SUCCEEDED", "recovery_count": len(runs) - 1,
                                                 "ended_at": end}))
    events = [{"ts": start, "event": "controller_started"}]
    for a, b in runs:
        events += [{"ts": start + a, "event": "run_started", "task": "t"},
                   {"ts": start + b, "event": "recovering" if b != runs[-1][1] else "task_ended", "task": "t"}]
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
(root / "jobs" / "3").mkdir()  # another run's job: not counted
(root / "jobs" / "3" / "job.json").write_text(json.dumps({"job_id": 3, "name": job_name("other"), "kind": "managed"}))
(root / "jobs" / "3" / "state.json").write_text(json.dumps({"status": "SUCCEEDED", "ended_at": t0 + 1}))
records = [r.__dict__ for r in sky_boundary.queue()]
cost_cfg = load_config([], base + ["skypilot.cloud=runpod", "skypilot.region=US", "infra.nodes=2", "infra.spot=true"])
cost = SkyPilotProvider(boundary=sky_boundary, env={}).run_cost(cost_cfg, run_id)
fallback_cfg = load_config([], base + ["skypilot.cloud=lambda", "infra.nodes=2", "infra.spot=true"])
out["fallback"] = SkyPilotProvider(boundary=sky_boundary, env={}).run_cost(fallback_cfg, run_id).model_dump()
cluster_cfg = load_config([], base + ["skypilot.cluster=mine"])
out["records"] = records
out["actual"] = cost.model_dump()
out["actual_line"] = cost.line()
out["cluster"] = SkyPilotProvider(boundary=sky_boundary, env={}).run_cost(cluster_cfg, run_id)
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    home = sky_home(tmp_path_factory.mktemp("skyhome"), {"runpod": RUNPOD_CSV})
    env = {**os.environ, "HOME": str(home), "VERL_GRPO_HOME": str(home / "state"),
           **launch_env(str(home / "rehearsal"))}
    env.pop("SKY_RUNTIME_DIR", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"cost subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line[len("RESULT"):])


HOURS = 30 * 120 / 3600  # total_steps x step_seconds
EVAL_HOURS = 20 / 60  # skypilot.eval_minutes default
# 1 h x 0.1 preemptions/h x (10 steps x 120 s / 2 + 10 min) = 0.1 x (600 s + 600 s) = 1/30 h
OVERHEAD_HOURS = HOURS * 0.1 * (10 * 120 / 2 + 10 * 60) / 3600


def test_on_demand_first_without_spot(results):
    r = results["on_demand"]
    assert [(row["cloud"], row["region"]) for row in r["rows"][:2]] == [("runpod", "US"), ("runpod", "CA")]
    assert [row["on_demand"] for row in r["rows"]] == sorted(row["on_demand"] for row in r["rows"])
    # Trainer and eval in the same region: 1 h x $24 + 1/3 h x $3.
    assert r["rows"][0]["on_demand"] == pytest.approx(HOURS * 24 + EVAL_HOURS * 3)
    assert r["rows"][2]["cloud"] == "lambda" and r["rows"][2]["spot"] is None


def test_spot_first_when_infra_spot(results):
    rows = results["spot"]["rows"]
    assert [(row["cloud"], row["region"]) for row in rows[:2]] == [("runpod", "CA"), ("runpod", "US")]
    assert rows[0]["spot"] < rows[1]["spot"] and rows[0]["on_demand"] > rows[1]["on_demand"]
    assert all(row["spot"] is None for row in rows[2:])  # Lambda sells no spot: after every spot offer
    assert "cheapest spot first" in results["spot"]["text"]


def test_preemption_overhead_from_the_save_interval(results):
    ca = results["spot"]["rows"][0]
    assert results["spot"]["overhead_hours"] == pytest.approx(OVERHEAD_HOURS)
    assert ca["spot_overhead"] == pytest.approx(OVERHEAD_HOURS * 12)  # the training task's spot $/h in CA
    assert ca["spot"] == pytest.approx(HOURS * 12 + EVAL_HOURS * 1.5 + OVERHEAD_HOURS * 12)
    assert "algorithm.save_freq" in results["spot"]["text"] and "skypilot.recovery_minutes" in results["spot"]["text"]


def test_every_region_of_the_catalog_and_the_left_off_count(results):
    r = results["lambda"]  # Lambda lists each instance type in 17 regions at one price
    assert len(r["rows"]) == 5 and r["left_off"] == 12
    assert len({row["region"] for row in r["rows"]}) == 5
    assert "12 more offer(s) left off" in r["text"]
    assert results["on_demand"]["left_off"] == 2 + 17 - 5


def test_region_filter(results):
    r = results["region"]
    assert [(row["cloud"], row["region"]) for row in r["rows"]] == [("runpod", "CA")] and r["left_off"] == 0
    assert r["rows"][0]["on_demand"] == pytest.approx(HOURS * 26 + EVAL_HOURS * 3.25)


def test_job_group_services_are_priced_from_cpu_rows(results):
    r = results["job_group"]
    names = [t["name"] for t in r["tasks"]]
    assert names == ["verl-trainer", "reward-server", "retrieval-server", "eval"]
    assert [(t["nodes"], t["cpus"], t["memory"]) for t in r["tasks"][1:3]] == [(1, "4+", "8+"), (2, "4", "8")]
    assert "retrieval-server: 2 x cpus 4, memory 8 x 1.00 h" in r["text"]
    row = r["rows"][0]
    # reward-server 1 node, retrieval-server 2 replicas, each on the 4 vCPU / 8 GiB row
    assert row["on_demand"] == pytest.approx(2 * HOURS * 24 + 3 * HOURS * 0.12 + EVAL_HOURS * 3)
    training_rate = 2 * 16 + 3 * 0.06  # trainer nodes and services wait through a recovery, billed
    assert row["spot"] == pytest.approx(HOURS * training_rate + EVAL_HOURS * 2 + OVERHEAD_HOURS * training_rate)


def test_a_neural_reward_model_puts_the_reward_server_on_its_gpu(results):
    r = results["neural_reward"]
    reward = next(t for t in r["tasks"] if t["name"] == "reward-server")
    assert reward["accelerators"] == "H100:1" and reward["cpus"] == "4+" and reward["memory"] == "8+"
    assert r["rows"][0]["on_demand"] == pytest.approx(HOURS * 24 + HOURS * 3 + EVAL_HOURS * 3)


def test_a_reward_gpu_the_catalog_lacks_names_the_fields(results):
    r = results["no_l4"]  # the default L4:1 is not sold in the test RunPod catalog
    assert not r["ok"] and "reward-server task's L4:1 (cpus 4+, memory 8+) is not offered" in r["error"]
    assert "services.reward.cpus / services.reward.memory / services.reward.accelerators" in r["error"]


def test_the_seeds_retrieval_node_is_priced_by_its_cpus_and_memory(results):
    """The retrieval-server's default node (16+ vCPUs, 64+ GiB, as the seed's) is not the 4 vCPU / 8 GiB row: the
    catalog's smallest instance type with both is the 16 vCPU / 125 GiB one ($3/h in US)."""
    r = results["big_retrieval"]
    assert "retrieval-server: 1 x cpus 16+, memory 64+ x 1.00 h" in r["text"]
    assert r["rows"][0]["on_demand"] == pytest.approx(HOURS * 24 + HOURS * 3 + EVAL_HOURS * 3)


def test_rollout_group_prices_trainer_and_rollout_nodes_as_one_cluster_and_its_services(results):
    r = results["rollout_group"]
    assert [t["name"] for t in r["tasks"]] == ["verl-trainer", "data-server", "reward-server", "replay-buffer", "eval"]
    assert r["tasks"][0]["nodes"] == 3 and r["rows"][0]["nodes"] == 3  # 1 trainer node + 2 rollout nodes
    rate = 3 * 16 + 3 * 0.06  # the Ray cluster's 3 GPU nodes and the 3 services (on the 4 vCPU / 8 GiB row), all on spot
    assert r["rows"][0]["spot"] == pytest.approx(HOURS * rate + EVAL_HOURS * 2 + OVERHEAD_HOURS * rate)


def test_spot_where_no_spot_is_sold_fails(results):
    assert not results["spot_on_lambda"]["ok"] and "sells spot" in results["spot_on_lambda"]["error"]


def test_rehearsal_queue_reports_the_job_timeline(results):
    by_id = {r["job_id"]: r for r in results["records"]}
    train = by_id[1]
    assert train["end_at"] - train["start_at"] == pytest.approx(7200)
    assert train["job_duration"] == pytest.approx(2400 + 3400)  # two attempts; provisioning and recovery excluded
    assert train["recovery_count"] == 1 and train["submitted_at"] is not None


def test_actual_cost_from_the_timeline_at_the_launched_price(results):
    cost = results["actual"]
    # Training: 2 nodes x 2 h at the US spot $16; eval: 1 node x 0.5 h at the US spot $2 of H100:1.
    assert cost["node_hours"] == pytest.approx(2 * 2 + 0.5)
    assert cost["cost_usd"] == pytest.approx(2 * 2 * 16 + 0.5 * 2)
    assert cost["jobs"] == 2 and cost["recoveries"] == 1 and cost["pricing"] == "spot"
    assert cost["run_hours"] == pytest.approx((2400 + 3400 + 1500) / 3600)
    assert "node-hours" in results["actual_line"] and "$65.00" in results["actual_line"]


def test_spot_asked_where_none_is_sold_is_priced_on_demand_and_says_so(results):
    cost = results["fallback"]  # infra.spot=true on Lambda, which sells no spot: the launch went on demand
    assert cost["pricing"] == "on-demand" and cost["priced_at"].startswith("on-demand lambda")
    assert cost["cost_usd"] is not None and cost["cost_usd"] != pytest.approx(results["actual"]["cost_usd"])
    [warning] = cost["warnings"]
    assert "infra.spot=true but no catalog offer of H100:8 on lambda sells spot: launching on-demand" in warning
    assert results["actual"]["warnings"] == []


def test_no_actual_cost_on_an_existing_cluster(results):
    assert results["cluster"] is None
