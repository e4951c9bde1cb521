"""The rehearsal engine end to end: sky_boundary submits hand-written task YAMLs to real controllers that run
real nodes (namespaces, setup, run, file_mounts from moto S3), inject preemptions, restart on errors, run job
groups and cancel; after every test no process of any job remains."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from ports import free_port

from verl_grpo_rehearsal import ENV_DRIVER, ENV_FAIL_AT, ENV_MAIN_PPO, ENV_PREEMPT_AT, launch_env, sky_boundary as sky

REPO = Path(__file__).resolve().parents[2]

FAKE_TRAINER = textwrap.dedent("""\
    import sys, time
    for step in range(1, int(sys.argv[1]) + 1):
        print(f"step:{step} - x:{step}", flush=True)
        time.sleep(0.3)
    """)
TERMINAL = sky.MANAGED_TERMINAL | sky.CLUSTER_TERMINAL


@pytest.fixture
def rehearsal(tmp_path, monkeypatch):
    """An empty rehearsal state dir; at teardown every job is stopped and no process of any job is left."""
    state = tmp_path / "rehearsal"
    for var, value in launch_env(str(state)).items():
        monkeypatch.setenv(var, value)
    for var in (ENV_PREEMPT_AT, ENV_FAIL_AT, ENV_MAIN_PPO, ENV_DRIVER):
        monkeypatch.delenv(var, raising=False)
    yield state
    sky.stop_all()
    for job in [*state.glob("jobs/*"), *state.glob("clusters/*/jobs/*")]:
        if not (job / "state.json").exists():
            continue
        assert not sky._controller_alive(job), f"controller of {job} still runs"
        left = subprocess.run(["pgrep", "-af", str(job)], capture_output=True, text=True)
        assert left.returncode == 1, f"processes of {job} left behind:\n{left.stdout}"
        assert not (job / "secrets.json").exists(), "secrets must be deleted when the job ends"


@pytest.fixture
def workdir(tmp_path) -> Path:
    """A git checkout: tracked files, one untracked-not-ignored file (synced) and one ignored file (not synced)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text(FAKE_TRAINER)
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "ignored.txt").write_text("must not be synced")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    (repo / "untracked.txt").write_text("synced")
    return repo


def task_yaml(**fields) -> str:
    return json.dumps(fields)  # JSON is YAML


def wait(job_id: int, cluster: str | None = None, timeout: float = 60) -> tuple[str, list[str]]:
    """Poll until the job ends; returns (final status, every distinct status seen in order)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = sky.cluster_queue(cluster) if cluster else sky.queue()
        status = next(r.status for r in records if r.job_id == job_id)
        if not seen or seen[-1] != status:
            seen.append(status)
        if status in TERMINAL:
            return status, seen
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not end in {timeout}s; statuses {seen}")


def events(job_id: int, name: str, cluster: str | None = None) -> list[dict]:
    return [e for e in sky.summary(job_id, cluster)["events"] if e["event"] == name]



def test_success_with_envs_secrets_file_mounts_and_workdir_sync(rehearsal, workdir, s3_bucket, tmp_path):
    import boto3

    uri, endpoint = s3_bucket
    bucket, key = uri[len("s3://"):].split("/", 1)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").put_object(
        Bucket=bucket, Key=f"{key}/data/obj.txt", Body=b"from the store")
    local = tmp_path / "local.txt"
    local.write_text("from a local file")
    yaml = task_yaml(
        name="train", num_nodes=2, workdir=str(workdir),
        resources={"accelerators": "H100:8"},
        envs={"FOO": "bar", "AWS_ENDPOINT_URL": endpoint, "HOST_CHECKOUT": str(REPO)},
        secrets={"MY_TOKEN": None, "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
        file_mounts={"/tmp/verl-grpo/local.txt": str(local), "/tmp/verl-grpo/obj.txt": f"{uri}/data/obj.txt"},
        setup="echo setup on $SKYPILOT_NODE_RANK",
        run=textwrap.dedent("""\
            set -e
            echo "FOO=$FOO TOKEN=$MY_TOKEN GPUS=$SKYPILOT_NUM_GPUS_PER_NODE NODES=$SKYPILOT_NUM_NODES ON=$VERL_GRPO_REHEARSAL"
            BARE=$(python -c 'import yaml' 2>/dev/null && echo ours || echo bare)
            echo "IPS=$(echo "$SKYPILOT_NODE_IPS" | wc -l) PYTHONPATH=${PYTHONPATH:-unset} PYTHON=$BARE"
            echo "LOCAL=$(cat /tmp/verl-grpo/local.txt) S3=$(cat /tmp/verl-grpo/obj.txt)"
            test ! -e ignored.txt && test -e untracked.txt && echo "SYNC=ok"
            test ! -e "$HOST_CHECKOUT/pyproject.toml" && test ! -e "$HOST_CHECKOUT/tests" && echo "HOST=hidden"
            if [ "$SKYPILOT_NODE_RANK" = 0 ]; then python train.py 2; fi
            """))
    secrets = {"MY_TOKEN": "tok-123", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    job_id = sky.launch_managed(yaml, "train-run", secrets, job_group=False)
    lines = list(sky.tail_logs(job_id, follow=True))

    record = next(r for r in sky.queue() if r.job_id == job_id)
    assert (record.name, record.status, record.recovery_count) == ("train-run", "SUCCEEDED", 0)
    assert "FOO=bar TOKEN=tok-123 GPUS=8 NODES=2 ON=1" in lines  # rank 0: unprefixed
    assert "(train, rank=1) FOO=bar TOKEN=tok-123 GPUS=8 NODES=2 ON=1" in lines
    assert "IPS=2 PYTHONPATH=unset PYTHON=bare" in lines, "a node's python has only what its setup installs"
    assert "LOCAL=from a local file S3=from the store" in lines
    assert lines.count("SYNC=ok") == 1 and "(train, rank=1) SYNC=ok" in lines
    assert "HOST=hidden" in lines and "(train, rank=1) HOST=hidden" in lines, "no host file outside the workdir"
    assert "step:2 - x:2" in lines
    assert not (workdir / "verl-grpo").exists(), "/tmp/... of the YAML lands in the node's own tmp/"
    assert [e["exit_code"] for e in events(job_id, "node_run_exited")] == [0, 0]
    assert events(job_id, "job_ended")[0]["status"] == "SUCCEEDED"


def test_failing_setup_is_restarted_max_restarts_on_errors_times_then_failed_setup(rehearsal, workdir):
    """SkyPilot restarts a failed setup like a failed run (JobStatus.user_code_failure_states()): with
    max_restarts_on_errors 2 it sets up three times, then ends FAILED_SETUP; with 0, after its one attempt."""
    jobs = {}
    for restarts in (2, 0):
        yaml = task_yaml(name="t", workdir=str(workdir), setup="echo installing; exit 3", run="echo never",
                         resources={"job_recovery": {"max_restarts_on_errors": restarts}})
        jobs[restarts] = sky.launch_managed(yaml, f"setup-fails-{restarts}", {}, job_group=False)
    for restarts, job_id in jobs.items():
        status, seen = wait(job_id, timeout=120)
        record = next(r for r in sky.queue() if r.job_id == job_id)
        assert status == "FAILED_SETUP" and "RUNNING" not in seen
        assert [e["exit_code"] for e in events(job_id, "node_setup_exited")] == [3] * (restarts + 1)
        assert len(events(job_id, "task_launched")) == restarts + 1 and not events(job_id, "run_started")
        assert [e["restart"] for e in events(job_id, "restarted_after_error")] == list(range(1, restarts + 1))
        assert record.recovery_count == restarts
        assert "Setup failed with exit code 3" in record.failure_reason
        lines = list(sky.tail_logs(job_id, follow=False))
        assert "never" not in lines
        if restarts:
            assert "rehearsal: task t: Setup failed with exit code 3 on node rank 0; restart 2 of 2 on errors" in lines


def test_an_exit_code_in_recover_on_exit_codes_restarts_without_counting(rehearsal, workdir):
    """recover_on_exit_codes [75] with max_restarts_on_errors 0 (what the trainer YAML renders: 75 is transient): a
    setup, then a run, each exiting 75 once, are restarted and the job succeeds; a run exiting 7 ends FAILED after its
    one attempt. Markers in the rehearsal's state dir (which every node sees, unlike its own fresh disk) tell the
    attempts apart."""
    policy = {"job_recovery": {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0,
                               "recover_on_exit_codes": [75]}}
    once = 'if [ ! -e "{m}" ]; then touch "{m}"; echo "{what} transient"; exit 75; fi; echo "{what} ok"'
    transient = task_yaml(name="t", workdir=str(workdir), resources=policy,
                          setup=once.format(m=rehearsal / "setup-75", what="setup"),
                          run=once.format(m=rehearsal / "run-75", what="run"))
    fatal = task_yaml(name="t", workdir=str(workdir), resources=policy, run="echo crashing; exit 7")
    transient_id = sky.launch_managed(transient, "transient", {}, job_group=False)
    fatal_id = sky.launch_managed(fatal, "fatal", {}, job_group=False)

    status, seen = wait(transient_id, timeout=120)
    record = next(r for r in sky.queue() if r.job_id == transient_id)
    assert (status, record.recovery_count) == ("SUCCEEDED", 2), record.failure_reason
    assert len(events(transient_id, "task_launched")) == 3
    matched = events(transient_id, "recovered_on_exit_code")
    assert [(e["status"], e["exit_codes"], e["recover_on_exit_codes"]) for e in matched] == [
        ("FAILED_SETUP", [75], [75]), ("FAILED", [75], [75])]
    assert not events(transient_id, "restarted_after_error")
    lines = list(sky.tail_logs(transient_id, follow=False))
    assert "rehearsal: task t: Setup failed with exit code 75 on node rank 0; exit code(s) [75] matched " \
           "recover_on_exit_codes [75]" in lines
    assert "rehearsal: task t: Job exited with exit code 75; exit code(s) [75] matched recover_on_exit_codes [75]" \
        in lines
    assert "run ok" in lines

    assert wait(fatal_id)[0] == "FAILED"
    record = next(r for r in sky.queue() if r.job_id == fatal_id)
    assert record.recovery_count == 0 and "exit code 7" in record.failure_reason
    assert len(events(fatal_id, "task_launched")) == 1
    assert not events(fatal_id, "recovered_on_exit_code") and not events(fatal_id, "restarted_after_error")


def test_use_spot_where_the_cloud_has_no_spot_fails_prechecks_before_any_node(rehearsal, workdir):
    """SkyPilot's optimizer drops a candidate whose cloud's feature check refuses SPOT_INSTANCE; with none left the
    launch fails before provisioning (ProvisionPrechecksError: FAILED_PRECHECKS). Kubernetes is judged offline
    (tests' HOME has no kubeconfig or SkyPilot config). In a job group one such task fails the group."""
    spot_k8s = {"infra": "kubernetes", "use_spot": True, "accelerators": "H100:1"}
    single = task_yaml(name="verl-trainer", workdir=str(workdir), resources=spot_k8s, setup="echo setup", run="true")
    header = {"name": "grp", "execution": "parallel", "primary_tasks": ["verl-trainer"]}
    aux = {"name": "web", "resources": {"infra": "kubernetes"}, "run": "sleep 60"}
    trainer = {"name": "verl-trainer", "resources": spot_k8s, "run": "true"}
    group = "\n---\n".join(json.dumps(doc) for doc in (header, aux, trainer))
    jobs = [sky.launch_managed(single, "spot-k8s", {}, job_group=False),
            sky.launch_managed(group, "grp", {}, job_group=True)]
    for job_id in jobs:
        assert wait(job_id, timeout=120)[0] == "FAILED_PRECHECKS"
        reason = sky.summary(job_id)["failure_reason"]
        assert reason.startswith("No launchable resource: task verl-trainer asks use_spot on Kubernetes: Spot "
                                 "instances are not supported in Kubernetes."), reason
        assert "\n" not in reason
        assert not events(job_id, "task_launched") and events(job_id, "no_launchable_resource")
        assert not list((rehearsal / "jobs" / str(job_id)).glob("attempt-*")), "no node may start"


def test_nvidia_smi_reports_the_rehearsed_driver_on_gpu_nodes_only(rehearsal, workdir, monkeypatch):
    """A job group of a GPU task (its nodes answer the driver query, one line per GPU, and pass the trainer setup's
    driver check) and a CPU task (no nvidia-smi, as a CPU node). VERL_GRPO_REHEARSAL_DRIVER, read at launch, changes
    the driver the nodes report: an R550 node fails the driver check, once (a deterministic failure)."""
    from verl_grpo.providers.skypilot.node_stack import driver_check

    query = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
    run = f'echo "DRIVERS=$({query} | tr "\\n" " ")"; echo "FIRST=$({query} | head -n1)"'
    header = {"name": "gpus", "execution": "parallel"}
    gpu = {"name": "gpu", "workdir": str(workdir), "resources": {"accelerators": "H100:2"},
           "setup": "\n".join([*driver_check(), query]), "run": run}
    cpu = {"name": "cpu", "run": "command -v nvidia-smi || echo no-nvidia-smi"}
    group = "\n---\n".join(json.dumps(doc) for doc in (header, gpu, cpu))
    default = sky.launch_managed(group, "gpus", {}, job_group=True)
    monkeypatch.setenv(ENV_DRIVER, "550.54.15")
    older = sky.launch_managed(group, "gpus-older-driver", {}, job_group=True)
    monkeypatch.delenv(ENV_DRIVER)  # read at launch

    assert wait(default, timeout=120)[0] == "SUCCEEDED", sky.summary(default)["failure_reason"]
    lines = list(sky.tail_logs(default, follow=False))
    assert "DRIVERS=580.95.05 580.95.05 " in lines and "FIRST=580.95.05" in lines, lines  # one line per GPU
    assert "rehearsal: nvidia-smi stands in (driver 580.95.05)" in lines
    assert any(line.startswith("driver check: NVIDIA driver 580.95.05 ") for line in lines)
    assert "(cpu, rank=0) no-nvidia-smi" in lines

    assert wait(older, timeout=120)[0] == "FAILED_SETUP"
    assert "driver check: this node's NVIDIA driver is 550.54.15" in sky.summary(older)["failure_reason"]
    assert [e["task"] for e in events(older, "task_launched") if e["task"] == "gpu"] == ["gpu"]


def test_user_failure_is_restarted_max_restarts_on_errors_times_then_failed(rehearsal, workdir):
    yaml = task_yaml(name="t", workdir=str(workdir), run="echo crashing; exit 7",
                     resources={"job_recovery": {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 2}})
    job_id = sky.launch_managed(yaml, "user-fails", {}, job_group=False)
    status, seen = wait(job_id)
    record = next(r for r in sky.queue() if r.job_id == job_id)
    assert status == "FAILED" and "RECOVERING" in seen
    assert "exit code 7" in record.failure_reason and "crashing" in record.failure_reason
    assert [e["restart"] for e in events(job_id, "restarted_after_error")] == [1, 2]
    assert len(events(job_id, "task_launched")) == 3


def test_two_injected_preemptions_recover_and_succeed(rehearsal, workdir, monkeypatch):
    monkeypatch.setenv(ENV_PREEMPT_AT, "2,4")
    yaml = task_yaml(name="trainer", workdir=str(workdir), setup="echo setup", run="python train.py 5",
                     resources={"job_recovery": {"max_restarts_on_errors": 0}})
    job_id = sky.launch_managed(yaml, "preempted", {}, job_group=False)
    monkeypatch.delenv(ENV_PREEMPT_AT)  # read at launch: later changes do not matter
    status, seen = wait(job_id)
    record = next(r for r in sky.queue() if r.job_id == job_id)
    assert (status, record.recovery_count) == ("SUCCEEDED", 2)
    assert seen.count("RECOVERING") == 2, seen
    assert [e["step"] for e in events(job_id, "preempted")] == [2, 4]
    assert [e["exit_code"] for e in events(job_id, "node_setup_exited")] == [0, 0, 0]  # setup on fresh nodes
    assert "step:5 - x:5" in list(sky.tail_logs(job_id, follow=False))


def test_job_group_primary_reaches_auxiliary_by_name_and_auxiliary_stops_after_delay(rehearsal, workdir):
    port = free_port()
    header = {"name": "grp", "execution": "parallel", "inter_connection": True, "primary_tasks": ["trainer"],
              "termination_delay": "2s"}
    aux = {"name": "web", "run": f"python -m http.server --bind 127.0.0.1 {port}"}
    reach = (f"import time, urllib.request\nurl = 'http://web-0.grp:{port}/'\n"
             "for _ in range(100):\n"
             "    try:\n        print('reached', url, urllib.request.urlopen(url).status, flush=True); break\n"
             "    except OSError:\n        time.sleep(0.1)\nelse:\n    raise SystemExit('auxiliary unreachable')\n")
    trainer = {"name": "trainer", "workdir": str(workdir),
               "run": f'test "$SKYPILOT_JOBGROUP_NAME" = grp\ncat > reach.py <<"EOF"\n{reach}EOF\npython reach.py'}
    yaml = "\n---\n".join(json.dumps(doc) for doc in (header, aux, trainer))
    job_id = sky.launch_managed(yaml, "grp", {}, job_group=True)
    status, _ = wait(job_id)
    summary = sky.summary(job_id)
    assert status == "SUCCEEDED", summary["failure_reason"]
    assert summary["tasks"] == {"web": "CANCELLED", "trainer": "SUCCEEDED"}
    lines = list(sky.tail_logs(job_id, follow=False))
    assert f"reached http://web-0.grp:{port}/ 200" in lines
    assert any(line.startswith("(web, rank=0) ") for line in lines)
    trainer_end = next(e["ts"] for e in events(job_id, "task_ended") if e["task"] == "trainer")
    assert events(job_id, "auxiliary_terminating")[0]["delay_s"] == 2
    assert events(job_id, "auxiliary_terminated")[0]["ts"] - trainer_end >= 1.9


def test_a_job_group_off_kubernetes_resolves_no_task_hostnames(rehearsal, workdir):
    """What the first launch on a VM cloud would have met: SkyPilot names a group's tasks only on Kubernetes."""
    header = {"name": "grp", "execution": "parallel", "primary_tasks": ["trainer"], "termination_delay": "1s"}
    aux = {"name": "web", "run": "sleep 60"}
    trainer = {"name": "trainer", "workdir": str(workdir), "run": "getent hosts web-0.grp"}
    yaml = "\n---\n".join(json.dumps(doc) for doc in (header, aux, trainer))
    job_id = sky.launch_managed(yaml, "grp", {}, job_group=True)
    assert wait(job_id)[0] == "FAILED"
    lines = list(sky.tail_logs(job_id, follow=False))
    assert any("gives job-group hostnames only on Kubernetes" in line for line in lines)


def test_cancel_kills_every_node(rehearsal, workdir):
    yaml = task_yaml(name="t", workdir=str(workdir), num_nodes=2, run="sleep 300 & python train.py 1000")
    job_id = sky.launch_managed(yaml, "to-cancel", {}, job_group=False)
    deadline = time.monotonic() + 120  # two nodes' setup on a loaded 2-core box
    while next(r for r in sky.queue() if r.job_id == job_id).status != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sky.cancel(job_id)
    status, _ = wait(job_id)
    assert status == "CANCELLED"
    assert events(job_id, "cancel_requested")


def test_exec_on_cluster_runs_no_setup_and_keeps_the_cluster(rehearsal, workdir, tmp_path):
    assert sky.cluster_status("dev") is None
    sky.create_cluster("dev")
    assert sky.cluster_status("dev") == "UP"
    first = task_yaml(name="round", workdir=str(workdir), setup="exit 1",
                      file_mounts={"/tmp/mounted.txt": str(workdir / "train.py")},
                      run="test ! -e /tmp/mounted.txt && echo no-mount && echo kept > /tmp/left.txt")
    job1 = sky.exec_on_cluster("dev", first, {})
    assert wait(job1, cluster="dev")[0] == "SUCCEEDED"
    job2 = sky.exec_on_cluster("dev", task_yaml(name="round", run="cat /tmp/left.txt"), {})
    status, seen = wait(job2, cluster="dev")
    assert status == "SUCCEEDED" and "STARTING" not in seen
    assert "no-mount" in list(sky.tail_cluster_logs("dev", job1, follow=False))
    assert "kept" in list(sky.tail_cluster_logs("dev", job2, follow=True))
    assert [r.job_id for r in sky.cluster_queue("dev")] == [job2, job1]
    assert sky.cluster_status("dev") == "UP" and sky.queue() == []


def test_pip_uv_and_python_shims(rehearsal, workdir, monkeypatch):
    (workdir / "fake_main_ppo.py").write_text("import sys\nprint('stand-in got', sys.argv[1:])\n")
    monkeypatch.setenv(ENV_MAIN_PPO, "fake_main_ppo")
    ok = task_yaml(name="t", workdir=str(workdir), setup=textwrap.dedent("""\
        set -e
        pip install 'packaging>=20' pyyaml
        uv pip install --system 'vllm==0.24.0' 'verl[vllm]' 'flash-attn'
        uv venv --allow-existing --seed --python 3.11 /tmp/venv
        """), run=textwrap.dedent("""\
        set -e
        . /tmp/venv/bin/activate
        echo "VENV=$VIRTUAL_ENV"
        python -m verl.trainer.main_ppo trainer.total_epochs=1
        """))
    missing = task_yaml(name="t", workdir=str(workdir), run="true",
                        setup="python -m pip install 'packaging>=20' 'surely-not-installed-pkg>=1'")
    (workdir / "pyproject.toml").write_text('[project]\nname = "future"\nversion = "0"\nrequires-python = ">=3.99"\n')
    editable = task_yaml(name="t", workdir=str(workdir), run="true",
                         setup="uv pip install --system --no-deps -e .")
    jobs = [sky.launch_managed(yaml, name, {}, job_group=False)
            for name, yaml in (("ok", ok), ("missing", missing), ("editable", editable))]
    results = {job: wait(job)[0] for job in jobs}
    ok_id, missing_id, editable_id = jobs
    assert results[ok_id] == "SUCCEEDED", sky.summary(ok_id)["failure_reason"]
    lines = list(sky.tail_logs(ok_id, follow=False))
    assert any("vllm==0.24.0: missing, stood in: GPU-only" in line for line in lines)
    assert "VENV=/tmp/venv" in lines
    assert "stand-in got ['trainer.total_epochs=1']" in lines
    assert results[missing_id] == "FAILED_SETUP"
    assert "surely-not-installed-pkg" in sky.summary(missing_id)["failure_reason"]
    assert results[editable_id] == "FAILED_SETUP"
    assert "does not satisfy Python>=3.99" in "\n".join(sky.tail_logs(editable_id, follow=False))


def test_yaml_skypilot_rejects_is_failed_prechecks(rehearsal):
    job_id = sky.launch_managed(task_yaml(name="bad", run="true", no_such_field=1), "bad", {}, job_group=False)
    assert wait(job_id)[0] == "FAILED_PRECHECKS"
    assert "no_such_field" in next(r for r in sky.queue() if r.job_id == job_id).failure_reason


def test_a_job_listed_before_its_controller_pid_is_recorded_keeps_its_secrets(rehearsal, workdir, monkeypatch):
    """A poller (the provider's watch, `verl-grpo jobs`) listing the queue while `_submit` starts the controller read
    the job as dead and deleted the secrets its controller was about to read (an intermittent xdist failure)."""
    listed: list[tuple[int, str]] = []
    record_pid = sky.update_state

    def list_the_queue_first(path, **fields):
        listed.extend((r.job_id, r.status) for r in sky.queue())
        record_pid(path, **fields)

    monkeypatch.setattr(sky, "update_state", list_the_queue_first)
    yaml = task_yaml(name="t", workdir=str(workdir), secrets={"MY_TOKEN": None}, run='test "$MY_TOKEN" = tok-123')
    job_id = sky.launch_managed(yaml, "early-listing", {"MY_TOKEN": "tok-123"}, job_group=False)
    monkeypatch.setattr(sky, "update_state", record_pid)
    assert (job_id, "PENDING") in listed
    assert wait(job_id)[0] == "SUCCEEDED"


def test_dead_controller_is_failed_controller(rehearsal, workdir):
    job_id = sky.launch_managed(task_yaml(name="t", workdir=str(workdir), run="sleep 300"), "orphan", {}, False)
    path = rehearsal / "jobs" / str(job_id)
    deadline = time.monotonic() + 30
    while next(r for r in sky.queue() if r.job_id == job_id).status != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(sky.read_json(path / "state.json")["controller_pid"], 9)
    status, _ = wait(job_id)
    assert status == "FAILED_CONTROLLER"
    deadline = time.monotonic() + 10  # the nodes die with their controller (parent-death signal)
    while subprocess.run(["pgrep", "-f", str(path)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "nodes outlived their controller"
        time.sleep(0.1)


def test_setup_installing_uv_is_stood_in_by_the_uv_shim_even_without_uv_here(monkeypatch):
    """A clean checkout's venv has no uv; the node runs the rehearsal's uv shim, so `pip install uv` passes."""
    from importlib import metadata

    from verl_grpo_rehearsal import shims

    real_version = metadata.version

    def version(name: str) -> str:
        if name == "uv":
            raise metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(shims.metadata, "version", version)
    assert shims._check_requirement("uv") == []
    assert shims._check_requirement("surely-not-installed-pkg") == ["surely-not-installed-pkg is not installed"]


def _first_launch(monkeypatch, defect: str) -> str:
    """Today's rendered single-node training task (this checkout as its workdir, no restarts on errors) with one
    first-launch defect put back: a node package setup forgot, verl's mlflow logger without mlflow, or a data
    mount on a non-AWS cloud with AWS keys only in the environment."""
    from rendered_tasks import render

    from verl_grpo.providers.skypilot import templates

    override = None
    if defect.startswith("tenacity"):
        monkeypatch.setattr(templates, "CLUSTER_RUNTIME",
                            tuple(p for p in templates.CLUSTER_RUNTIME if not p.startswith("tenacity")))
    else:
        override = ("trainer.logger=[console,file]", "trainer.logger=[console,mlflow,file]")
    # Lambda sells no spot: SkyPilot would refuse the task before provisioning (and the rehearsal with it), so the
    # mount's own error is reached only on demand.
    cloud = ("skypilot.cloud=lambda", "infra.spot=false") if defect.startswith("data mount") else ("skypilot.cloud=aws",)
    text = render("multinode", {}, "infra.nodes=1", *cloud, workdir=str(REPO), override=override).yaml
    if defect.startswith("data mount"):
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
        text = text.replace("\nenvs:\n", "\nfile_mounts:\n  /tmp/verl-grpo/datasets/gsm8k/abc123: "
                                         "s3://bucket/store/datasets/gsm8k/abc123\nenvs:\n", 1)
    text = text.replace("max_restarts_on_errors: 3", "max_restarts_on_errors: 0")
    if defect.endswith("without the preflight"):
        text = "\n".join(line for line in text.splitlines() if "verl_grpo.trainers.verl.preflight" not in line)
    return text


@pytest.mark.parametrize(("defect", "status", "node_error"), [
    ("tenacity", "FAILED_SETUP", "preflight: No module named 'tenacity' on this node"),
    ("mlflow logger", "FAILED_SETUP", "preflight: No module named 'mlflow' on this node"),
    ("tenacity without the preflight", "FAILED", "ModuleNotFoundError: No module named 'tenacity'"),
    ("data mount off AWS", "FAILED_CONTROLLER",
     "SkyPilot authenticates it on lambda only with an uploaded ~/.aws/credentials"),
])
def test_each_first_launch_defect_put_back_fails_the_rehearsal_with_its_own_error(
        rehearsal, monkeypatch, defect, status, node_error):
    """First-launch defects the rehearsal used to hide. Its nodes ran in this machine's venv, which has every package:
    now each node's Python holds only what its setup's install lines bring, so the node's own error is in the report.
    Its mounts took the task's secrets: now only the credentials SkyPilot would give a mount on the task's cloud."""
    job_id = sky.launch_managed(_first_launch(monkeypatch, defect), "first-launch", {}, job_group=False)
    assert wait(job_id, timeout=180)[0] == status
    report = sky.summary(job_id)["failure_reason"] + "\n".join(sky.tail_logs(job_id, follow=False))
    assert node_error in report
    if status != "FAILED_CONTROLLER":  # the mount fails before any node starts, as SkyPilot's provisioning would
        assert "linked into /tmp/verl-grpo/venv" in report and "stood in (GPU-only): verl[vllm], vllm" in report
