"""Every command of docs/gpu-skypilot.md ("Train on GPUs with SkyPilot", the GPU page the README links), run as
written where this machine can, and in the closest honest form where a cloud would be needed (each form is named in
`FORMS` and in the failure message):

- `sky check`: SkyPilot's own, offline, with a temporary HOME and its local API server on a free port; it must
  exit 0 without a traceback (it enables no cloud here).
- `verl-grpo launch ... --rehearse`: as written (the one rehearsal launch; TOTAL_STEPS=3 keeps it short).
- `verl-grpo launch ... --dry-run`: as written, with fake AWS credentials in the environment.
- `verl-grpo launch ...` without --dry-run (the real launch, the resume): with `--dry-run` appended. The store
  `s3://my-bucket` is a moto S3 server (AWS_ENDPOINT_URL), so the resume's `--run-id` check reads a real store: it
  lacks the run and must fail naming it; the same command with `--fresh` passes.
- `sky jobs queue` / `logs -n verl-grpo-<id>` / `cancel -n verl-grpo-<id>`: as their `verl-grpo jobs` equivalents on
  the rehearsal's state (which the section runs as well, as written).
- `sky jobs launch task.yaml --env K=V ...`: the training YAML the dry run printed, loaded by SkyPilot with the same
  env overrides the CLI passes; each knob must land in the task's envs.

A command of the page that breaks (a renamed flag, a removed command) fails here: nothing is skipped, and a command of
no known form fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ports import free_sky_api_port
from prefect_template import seed_prefect_home
from sky_home import sky_home

from verl_grpo_rehearsal import launch_env

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "gpu-skypilot.md"
SECTION = "# Train on GPUs with SkyPilot"
CLI = [sys.executable, "-m", "verl_grpo_cli"]
FORMS = {
    "sky check": "SkyPilot's own sky check, offline (temporary HOME, local API server on a free port)",
    "rehearse": "as written, on the local rehearsal (TOTAL_STEPS=3)",
    "dry run": "as written, fake AWS credentials, s3://my-bucket on moto",
    "launch": "the real launch needs a cloud: run with --dry-run appended",
    "resume": "needs a cloud: --dry-run appended; the moto store lacks the run (RunNotFound), with --fresh it passes",
    "verl-grpo jobs": "as written, on the rehearsal's state (VERL_GRPO_REHEARSAL_DIR)",
    "sky jobs": "as its `verl-grpo jobs` equivalent on the rehearsal's state",
    "sky jobs launch": "the dry run's training YAML loaded by SkyPilot with the --env overrides",
}


def section_commands(page: str) -> list[str]:
    """Each command line of the page's ```bash blocks, its trailing `# comment` removed (the page is the section: from
    its `# Train on GPUs with SkyPilot` title to the next title of that level, if any)."""
    start = page.index(SECTION + "\n")
    end = page.find("\n# ", start + len(SECTION))
    text = page[start:end if end > 0 else None]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def form_of(command: str) -> str:
    words = shlex.split(command)
    if words[:2] == ["sky", "check"]:
        return "sky check"
    if words[:3] == ["sky", "jobs", "launch"]:
        return "sky jobs launch"
    if words[:2] == ["sky", "jobs"]:
        return "sky jobs"
    if words[:2] == ["verl-grpo", "jobs"]:
        return "verl-grpo jobs"
    launch = next((i for i, w in enumerate(words) if w == "verl-grpo"), None)
    if launch is not None and words[launch + 1:launch + 2] == ["launch"]:
        if "--rehearse" in words:
            return "rehearse"
        if "--dry-run" in words:
            return "dry run"
        return "resume" if "--run-id" in words else "launch"
    raise AssertionError(f"GPU page command of no known form (add its honest form to this test): {command}")



class Shell:
    """Runs the page's command lines with bash, `verl-grpo` being this checkout's CLI."""

    def __init__(self, tmp_path: Path, env: dict[str, str]):
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        shim = self.bin / "verl-grpo"
        shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m cli \"$@\"\n")
        shim.chmod(0o755)
        sky = Path(sys.executable).parent / "sky"
        (self.bin / "sky").symlink_to(sky)
        self.env = {**env, "PATH": f"{self.bin}{os.pathsep}{env['PATH']}",
                    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])}
        self.cwd = tmp_path / "work"
        self.cwd.mkdir()

    def run(self, command: str, form: str, timeout: float = 300, **extra: str) -> tuple[int, str]:
        env = {**self.env, **extra}
        proc = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr

    def start(self, command: str, log: Path, **extra: str) -> subprocess.Popen:
        """Start a command in the background, its output into `log` (a pipe would fill up and block it)."""
        with log.open("w") as f:
            return subprocess.Popen(["bash", "-c", command], cwd=self.cwd, env={**self.env, **extra}, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def ok(self, command: str, form: str, **extra: str) -> str:
        return self.checked(command, form, *self.run(command, form, **extra))

    @staticmethod
    def checked(command: str, form: str, rc: int, out: str) -> str:
        assert rc == 0, f"GPU page command failed ({form}: {FORMS[form]}): {command}\n{out[-4000:]}"
        # An uncaught traceback starts a line (`sky check` quotes some clouds' check tracebacks as their "Reason").
        assert not re.search(r"^Traceback", out, flags=re.MULTILINE), f"traceback from ({form}): {command}\n{out[-4000:]}"
        return out


def sky_check(shell: Shell, command: str, form: str) -> str:
    """`command` with SkyPilot's local API server on ports taken now (the rehearsal beside it opens many), then the
    server stopped; once more on others when another process took one before the server bound it (its log says so)."""
    server_log = Path(shell.env["HOME"]) / ".sky" / "api_server" / "server.log"
    for attempt in (1, 2):
        port = {"SKYPILOT_API_SERVER_LOCAL_PORT": str(free_sky_api_port())}
        try:
            rc, out = shell.run(command, form, **port)
        finally:
            shell.run("sky api stop", form, timeout=120, **port)
        lost_a_port = rc != 0 and server_log.exists() and "address already in use" in server_log.read_text().lower()
        if attempt == 2 or not lost_a_port:
            break
    return shell.checked(command, form, rc, out)


@pytest.fixture
def shell(tmp_path, s3_server, tiny_model_dir):
    import boto3

    home = sky_home(tmp_path / "home")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WANDB_", "VERL_GRPO_REHEARSAL"))}
    env.pop("PREFECT_API_URL", None)
    env.pop("SKY_RUNTIME_DIR", None)
    env |= {"HOME": str(home), "VERL_GRPO_HOME": str(tmp_path / "state"),
            "PREFECT_HOME": str(seed_prefect_home(tmp_path / "prefect")), "SKYPILOT_API_SERVER_LOCAL_PORT": str(free_sky_api_port())}
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="my-bucket")
    yield Shell(tmp_path, env)


def test_every_command_of_the_gpu_section_runs(shell, s3_server):
    commands = section_commands(PAGE.read_text())
    forms = [form_of(c) for c in commands]
    assert set(forms) == set(FORMS), f"the page lost commands of forms {set(FORMS) - set(forms)}"
    cloud = {"AWS_ACCESS_KEY_ID": "AKIAREADMETEST000000", "AWS_SECRET_ACCESS_KEY": "readme-test-secret",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_server}

    # The rehearsal runs in the background (it mostly waits on its nodes) while the offline commands run; the
    # follow/cancel commands run after it, on its state and run id.
    rehearse = next(c for c, f in zip(commands, forms) if f == "rehearse")
    log = shell.cwd.parent / "rehearse.log"
    rehearsal = shell.start(rehearse, log, TOTAL_STEPS="3")
    dry_yaml = None
    try:
        for command, form in zip(commands, forms):
            if form == "sky check":
                assert "Enabled infra" in sky_check(shell, command, form)  # its summary: it checked every cloud
            elif form == "dry run":
                out = shell.ok(command, form, **cloud)
                assert "nothing was launched" in out
                dry_yaml = dry_yaml or out
            elif form == "launch":
                out = shell.ok(f"{command} --dry-run", form, **cloud)
                assert "nothing was launched" in out
            elif form == "resume":
                missing = {**cloud, "RUN_ID": "gsm8k-readme-0101"}
                rc, out = shell.run(f"{command} --dry-run", form, **missing)
                assert rc == 2 and "error (RunNotFound)" in out and "gsm8k-readme-0101" in out, \
                    f"{command} ({FORMS[form]})\n{out[-3000:]}"
                assert "nothing was launched" in shell.ok(f"{command} --fresh --dry-run", form, **missing)
            elif form == "sky jobs launch":
                check_env_launch(shell, command, dry_yaml)
        rehearsal.wait(timeout=600)
    finally:
        if rehearsal.poll() is None:  # the CLI stops its rehearsal's jobs on SIGTERM; SIGKILL what is left
            os.killpg(rehearsal.pid, signal.SIGTERM)
            try:
                rehearsal.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(rehearsal.pid, signal.SIGKILL)
                rehearsal.wait()
    out = log.read_text(errors="replace")
    assert rehearsal.returncode == 0 and not re.search(r"^Traceback", out, flags=re.MULTILINE), f"{rehearse} ({FORMS['rehearse']}):\n{out[-4000:]}"
    assert "preempted at step 2" in out and "ended SUCCEEDED" in out, out[-4000:]
    run_id = re.search(r"^  run id +(\S+)", out, flags=re.MULTILINE)[1]
    on_rehearsal = {**launch_env(str(Path(re.search(r"state in (\S+)\):", out)[1]) / "sky")), "RUN_ID": run_id}
    for command, form in zip(commands, forms):
        if form == "verl-grpo jobs":
            check_jobs_output(command, shell.ok(command, form, **on_rehearsal), run_id)
        elif form == "sky jobs":
            equivalent = sky_jobs_equivalent(command)
            check_jobs_output(equivalent, shell.ok(equivalent, form, **on_rehearsal), run_id)


def check_jobs_output(command: str, out: str, run_id: str) -> None:
    words = shlex.split(command)
    if words[2] == "queue":
        assert re.search(rf"verl-grpo-{re.escape(run_id)}\s+SUCCEEDED\s+1\s", out), out
        assert re.search(rf"verl-grpo-{re.escape(run_id)}-eval\s+SUCCEEDED", out), out
    elif words[2] == "logs" and "--eval" in words:
        assert out.strip() and "restored checkpoint" not in out, out[-2000:]
    elif words[2] == "logs":
        assert f"restored checkpoint step 2 of run {run_id}" in out, out[-2000:]
    elif words[2] == "cancel":
        assert "nothing to cancel" in out, out  # both jobs ended; a live one is cancelled in the test below
    else:
        raise AssertionError(f"unknown verl-grpo jobs command: {command}")


def sky_jobs_equivalent(command: str) -> str:
    """`sky jobs queue|logs|cancel [-n verl-grpo-<run id>]` → the `verl-grpo jobs` command of the same meaning."""
    words = shlex.split(command)
    verb = words[2]
    if verb == "queue":
        return "verl-grpo jobs queue"
    name = words[words.index("-n") + 1]
    assert name == "verl-grpo-$RUN_ID", f"{command}: the page names jobs as the provider does"
    if verb == "logs":
        return "verl-grpo jobs logs --run-id $RUN_ID --no-follow"
    if verb == "cancel":
        return "verl-grpo jobs cancel --run-id $RUN_ID"
    raise AssertionError(f"no verl-grpo equivalent for {command}")


def check_env_launch(shell: Shell, command: str, dry_run_output: str | None) -> None:
    assert dry_run_output, "the section shows no dry run before `sky jobs launch task.yaml`"
    words = shlex.split(command)
    task = words[3]
    rendered = re.search(r"^# verl-grpo-dry-run\n(.*?)^# eval\n", dry_run_output, flags=re.DOTALL | re.MULTILINE)
    assert rendered, "the dry run printed no `# verl-grpo-dry-run` YAML"
    (shell.cwd / task).write_text(rendered[1])
    env = [words[i + 1] for i, w in enumerate(words) if w == "--env"]
    assert env, command
    script = (
        "import sys, yaml, sky\n"
        "overrides = [tuple(kv.split('=', 1)) for kv in sys.argv[2:]]\n"
        "task = sky.Task.from_yaml_config(yaml.safe_load(open(sys.argv[1])), env_overrides=overrides)\n"
        "assert all(task.envs[k] == v for k, v in overrides), (task.envs, overrides)\n"
        "print('ENVS OK', sorted(k for k, _ in overrides))\n")
    rc, out = shell.run(shlex.join([sys.executable, "-c", script, task, *env]), "sky jobs launch")
    assert rc == 0 and "ENVS OK" in out, f"{command} ({FORMS['sky jobs launch']}):\n{out[-3000:]}"


def test_jobs_cancel_cancels_the_live_job_of_a_run(tmp_path, monkeypatch):
    """`verl-grpo jobs cancel --run-id` on a live job (the section's own run has ended by then): the rehearsal's
    controller ends it CANCELLED, and `jobs queue` lists it so."""
    from verl_grpo_rehearsal import launch_env, sky_boundary

    for var, value in launch_env(str(tmp_path / "sky")).items():
        monkeypatch.setenv(var, value)
    job_id = sky_boundary.launch_managed('{"name": "t", "run": "sleep 300"}', "verl-grpo-readme-live", {}, False)
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cli = [*CLI, "jobs"]
        subprocess.run([*cli, "queue"], cwd=REPO, env=env, check=True, timeout=120)
        out = subprocess.run([*cli, "cancel", "--run-id", "readme-live"], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and f"cancelled verl-grpo-readme-live (id {job_id}" in out.stdout, out
        statuses = []
        for _ in range(600):
            statuses = [r.status for r in sky_boundary.queue() if r.job_id == job_id]
            if statuses == ["CANCELLED"]:
                break
            time.sleep(0.1)
        assert statuses == ["CANCELLED"]
        queue = subprocess.run([*cli, "queue"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert re.search(r"verl-grpo-readme-live\s+CANCELLED", queue.stdout), queue.stdout
        unknown = subprocess.run([*cli, "cancel", "--run-id", "no-such-run"], cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=120)
        assert unknown.returncode == 2 and "no job named verl-grpo-no-such-run" in unknown.stderr, unknown
    finally:
        sky_boundary.stop_all()
