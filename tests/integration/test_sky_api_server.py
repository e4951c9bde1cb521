"""SkyPilot's real local API server: before any launch the managed-job queue is empty (no controller yet), and our
job group is refused for lack of cloud access, not validation.

Runs in a subprocess whose HOME holds the catalog copy (SkyPilot fixes its paths at import) and whose API server
listens on 127.0.0.1 on a free port, so it never meets another SkyPilot server on this machine; the server is
stopped (by that port) in a `finally` of the subprocess. The port is one whose request-queue manager port (which
SkyPilot derives from it, in the ephemeral range) is free too. The server's log is part of a failure's message; a
server that lost either port to another process before binding it is started once more on others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ports import free_sky_api_port
from sky_home import sky_home

SCRIPT = r'''
import json, sys, time
import sky
from verl_grpo.config import load_config
from verl_grpo.contracts import TrainSpec
from verl_grpo.providers.skypilot import boundary, templates
from verl_grpo.trainers.verl.overrides import VerlPaths, verl_overrides

cfg = load_config([], ["trainer.backend=verl", "infra.provider=skypilot", "infra.accelerators=H100:8",
                       "infra.nodes=2", "infra.spot=true", "skypilot.shape=job_group", "storage.uri=s3://b/store",
                       "services.enabled=[reward]"])
files = {"train": "/tmp/verl-grpo/d/train.parquet", "val": "/tmp/verl-grpo/d/val.parquet"}
ov = verl_overrides(cfg, files, VerlPaths("/tmp/verl-grpo/checkpoints/slow"), "slow", env={})
spec = TrainSpec(backend="verl", run_id="slow", command=["python", "-m", "verl.trainer.main_ppo", *ov],
                 overrides=ov, total_steps=1)
rendered = templates.render(cfg, spec, {}, workdir=sys.argv[1])
out = {}
start = time.perf_counter()
sky.api_start(host="127.0.0.1", port=int(sys.argv[2]))
out["server_start_s"] = time.perf_counter() - start
try:
    out["queue_before_any_launch"] = [r.__dict__ for r in boundary.queue()]  # the provider's first call
    start = time.perf_counter()
    try:
        boundary.launch_managed(rendered.yaml, templates.job_name("slow"), templates.launch_secrets(cfg, {}),
                                job_group=True)
        out["error"] = None
    except BaseException as e:
        out["error"] = type(e).__name__
        out["message"] = str(e)[:2000]
        out["no_cloud_access"] = boundary.is_no_cloud_access(e)
    out["launch_s"] = time.perf_counter() - start
finally:
    sky.api_stop()
print("RESULT" + json.dumps(out))
'''



def _run_with_a_server(tmp_path: Path, workdir: Path) -> tuple[subprocess.CompletedProcess, Path]:
    home = sky_home(tmp_path / "home")
    env = {**os.environ, "HOME": str(home), "VERL_GRPO_HOME": str(home / "state"),
           "SKYPILOT_API_SERVER_LOCAL_PORT": str(free_sky_api_port())}
    for var in ("SKY_RUNTIME_DIR", "SKYPILOT_API_SERVER_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(workdir), env["SKYPILOT_API_SERVER_LOCAL_PORT"]],
                          env=env, capture_output=True, text=True, timeout=420, cwd=Path(__file__).resolve().parents[2])
    return proc, home / ".sky" / "api_server" / "server.log"


@pytest.mark.slow
def test_job_group_reaches_the_api_server_and_fails_only_for_no_cloud(tmp_path):
    workdir = tmp_path / "workdir"  # a small workdir: the server would upload the whole checkout otherwise
    workdir.mkdir()
    (workdir / "README").write_text("slow test workdir\n")
    proc, server_log = _run_with_a_server(tmp_path / "first", workdir)
    log = server_log.read_text(errors="replace") if server_log.exists() else "(no server log)"
    if proc.returncode and "address already in use" in log.lower():  # another process took the port first
        proc, server_log = _run_with_a_server(tmp_path / "second", workdir)
        log = server_log.read_text(errors="replace") if server_log.exists() else "(no server log)"
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, (f"API-server subprocess failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n"
                  f"server.log:\n{log[-4000:]}")
    result = json.loads(line[len("RESULT"):])
    print(f"API server start {result['server_start_s']:.1f}s, launch refused after {result['launch_s']:.1f}s")
    assert result["error"] == "NoCloudAccessError", result
    assert result["no_cloud_access"] is True
    assert result["queue_before_any_launch"] == []  # no jobs controller yet: no jobs, not ClusterDoesNotExist
    assert "collects usage data" not in log  # the provider's boundary turns SkyPilot's usage collection off
