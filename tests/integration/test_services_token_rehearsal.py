"""The services' token on the SkyPilot path, through the rehearsal's jobs controller: generated per launch by the
provider's `launch_secrets`, declared by name only in the job group's YAML, handed to every task as a secret, and
used by the real reward-server (which requires it) and the trainer's client (which sends it). It never lands in the
YAML, the job's logs or any file the job leaves behind."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from ports import free_port

from verl_grpo.config import load_config
from verl_grpo.providers.skypilot import templates
from verl_grpo.providers.skypilot.provider import rendered_secret_names
from verl_grpo.services import SERVICES
from verl_grpo_rehearsal import launch_env, sky_boundary as sky

REPO = Path(__file__).resolve().parents[2]
GROUP = "tokgrp"

TRAINER = textwrap.dedent("""\
    import os, time, httpx
    from verl_grpo.services.client import ServiceClient, service_url
    url = service_url("reward")
    for _ in range(600):
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    else:
        raise SystemExit("reward-server never answered /health")
    item = {"data_source": "gsm8k", "solution_str": "<think>6*7</think><answer>42</answer>", "ground_truth": "42"}
    print("WITHOUT_TOKEN", httpx.post(url + "/batch_reward", json={"items": [item]}).status_code, flush=True)
    with ServiceClient(url, retries=0) as client:  # the token from $VERL_GRPO_SERVICES_TOKEN, as on a cluster
        answer = client.post("/batch_reward", {"items": [item]})
    print("WITH_TOKEN", answer["rewards"][0]["reward"], answer["accuracy"], flush=True)
    """)


@pytest.fixture
def rehearsal(tmp_path, monkeypatch):
    state = tmp_path / "rehearsal"
    for var, value in launch_env(str(state)).items():
        monkeypatch.setenv(var, value)
    yield state
    sky.stop_all()
    for job in state.glob("jobs/*"):
        left = subprocess.run(["pgrep", "-af", str(job)], capture_output=True, text=True)
        assert left.returncode == 1, f"processes of {job} left behind:\n{left.stdout}"



def _job_group(cfg, token_env: str, port: int) -> str:
    """A job group shaped as the rendered one: the rendered setups (the reward-server's service packages, the
    trainer's cluster packages), the reward-server's own `serve` command bound to the node's IP and the trainer
    reaching it at `reward-server-0.<group>`, the token declared by name under `secrets:`."""
    spec = SERVICES["reward"]
    secrets = {token_env: None}
    def venv(packages: list[str]) -> dict:  # these tasks ask no GPU: no driver check, as a CPU node's setup
        setup = "\n".join(["set -euo pipefail", *templates.venv_setup(packages, gpu=False)])
        return {"envs": {templates.VENV_ENV: templates.REMOTE_VENV}, "setup": setup}
    activate = f'. "${templates.VENV_ENV}/bin/activate"\n'

    header = {"name": GROUP, "execution": "parallel", "inter_connection": True, "primary_tasks": ["trainer"],
              "termination_delay": "1s"}
    server = {"name": spec.task, "workdir": str(REPO), "secrets": secrets,
              **venv(templates.service_packages("reward", cfg)),
              "run": f"{activate}{templates.NODE_IP_LINE}\n"
                     f"python -m {spec.module} serve --host \"$NODE_IP\" --port {port} "
                     f"--token-env {token_env} --exit-with-parent"}
    trainer = {"name": "trainer", "workdir": str(REPO), "secrets": secrets,
               **venv(templates.cluster_packages(cfg, "vllm")),
               "run": f'{activate}export {spec.url_env}="http://{spec.task}-0.${{SKYPILOT_JOBGROUP_NAME}}:{port}"\n'
                      f"cat > /tmp/reach.py <<'EOF'\n{TRAINER}EOF\npython /tmp/reach.py"}
    return "\n---\n".join(json.dumps(doc) for doc in (header, server, trainer))


def test_the_generated_token_reaches_the_services_and_the_trainer_as_a_secret_only(rehearsal):
    cfg = load_config([], ["trainer.backend=verl", "infra.provider=skypilot", "infra.accelerators=H100:8",
                           "skypilot.shape=job_group", "services.enabled=[reward]"])
    token_env = cfg.services.token_env
    yaml = _job_group(cfg, token_env, free_port())
    values = templates.launch_secrets(cfg, {})  # what the provider passes at launch: a fresh token per launch
    secrets = {k: values[k] for k in rendered_secret_names(yaml)}
    token = secrets[token_env]
    assert len(token) >= 40 and token not in yaml

    job_id = sky.launch_managed(yaml, GROUP, secrets, job_group=True)
    deadline = time.monotonic() + 600  # a bound for a hang, beside other xdist workers
    while (status := next(r.status for r in sky.queue() if r.job_id == job_id)) not in sky.MANAGED_TERMINAL:
        assert time.monotonic() < deadline, f"job still {status}"
        time.sleep(0.2)
    summary = sky.summary(job_id)
    lines = list(sky.tail_logs(job_id, follow=False))
    assert status == "SUCCEEDED", (summary["failure_reason"], lines[-30:])
    assert "WITHOUT_TOKEN 401" in lines  # the reward-server requires the token...
    assert "WITH_TOKEN 1.0 1.0" in lines  # ...and the trainer's client sends the one the secret carried
    leftovers = [p for p in rehearsal.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leftovers == [], "the token must not remain in any file of the job (YAML, logs, state)"
