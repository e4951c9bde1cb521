"""`verl-grpo launch -c gsm8k --dry-run` as a new user runs it, from a directory outside the checkout: it fails on
every check a real launch would fail, one line each, and passes once the store is a bucket with credentials."""

from __future__ import annotations

import os
import subprocess
import sys

from click.testing import CliRunner

from verl_grpo_cli.main import main

FAKE_KEY_ID, FAKE_SECRET = "AKIAFAKEFAKEFAKEFAKE", "fake/secret+value/for/the/dry/run/only00"


def _launch(tmp_path, *args: str, config: str = "gsm8k", **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WANDB_"))}
    clean["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), clean.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "verl_grpo_cli", "launch", "-c", config, *args, "--dry-run"],
                          cwd=tmp_path, env={**clean, **env}, capture_output=True, text=True, timeout=300)


def test_the_shipped_config_without_a_bucket_fails_naming_storage_uri(tmp_path):
    done = _launch(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    problems = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert problems[0].startswith("  - storage.uri 'file://") and "s3://bucket/prefix" in problems[0]
    assert problems[1].startswith("  - AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY not set")
    assert len(problems) == 2, done.stderr
    assert done.stdout == ""  # no YAML, no cost table: nothing is shown as if it could launch


def test_with_a_bucket_and_credentials_it_passes_rendering_the_qwen_model_on_the_configs_gpu(tmp_path):
    done = _launch(tmp_path, "-o", "storage.uri=s3://bucket/prefix",
                   AWS_ACCESS_KEY_ID=FAKE_KEY_ID, AWS_SECRET_ACCESS_KEY=FAKE_SECRET)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert 'MODEL_NAME: "Qwen/Qwen2.5-1.5B-Instruct"' in out and 'actor_rollout_ref.model.path="$MODEL_NAME"' in out
    assert 'accelerators: "H100:1"' in out and "trainer.n_gpus_per_node=1" in out
    assert "GPU memory fits" in out and "per H100" in out
    assert "AWS credentials for the store are in the environment" in out
    assert "nothing was launched" in out
    assert FAKE_SECRET not in out + done.stderr and FAKE_KEY_ID not in out + done.stderr
    # the shipped catalog (Lambda) sells no spot: the task goes on-demand and says so
    assert "use_spot: false" in out and "warning: infra.spot=true but no catalog offer of H100:1" in out


def test_every_failing_check_is_reported_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_API_KEY", "short")
    result = CliRunner(mix_stderr=False).invoke(main, [
        "launch", "-c", "gsm8k", "-o", "model.name=qwen 1.5b", "-o", "infra.accelerators=H10:1",
        "-o", f"dataset.mirror_dir={tmp_path}", "-o", "dataset.source=mirror",
        "-o", "storage.uri=s3://bucket/prefix", "-o", "storage.endpoint_url=http://127.0.0.1:9", "--dry-run"])
    assert result.exit_code == 2, result.output
    problems = [line.removeprefix("  - ") for line in result.stderr.splitlines() if line.startswith("  - ")]
    keys = ["storage.endpoint_url http://127.0.0.1:9 is not reachable", "AWS_ACCESS_KEY_ID not set",
            "WANDB_API_KEY is not a W&B API key", "model.name 'qwen 1.5b'", "dataset.mirror_dir",
            "infra.accelerators 'H10:1' is not offered"]
    assert len(problems) == len(keys) and all(key in line for key, line in zip(keys, problems)), problems
    assert FAKE_SECRET not in result.stderr and "'short'" not in result.stderr


def test_rollout_group_renders_and_validates_verls_fully_async_entry_offline(tmp_path):
    done = _launch(tmp_path, "-o", "skypilot.shape=rollout_group", "-o", "storage.uri=s3://bucket/prefix",
                   AWS_ACCESS_KEY_ID=FAKE_KEY_ID, AWS_SECRET_ACCESS_KEY=FAKE_SECRET)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "python -m verl_grpo.trainers.verl.fully_async_entry " in out and "verl.trainer.main_ppo" not in out
    assert "verl Hydra compose of fully_async_ppo_trainer with all overrides" in out
    assert "verl fully-async asserts" in out and "pkg://verl_grpo.services.reward_client:compute_score loads" in out
    assert "SkyPilot loads the rollout_group YAML (4 tasks)" in out
    assert "rollout.nnodes=1 rollout.n_gpus_per_node=1" in out and "num_nodes: 2" in out  # 1 trainer + 1 rollout
    for task in ("data-server", "reward-server", "replay-buffer"):
        assert f"name: {task}\n" in out
    assert "router" not in out and "VERL_GRPO_ROLLOUT_URL" not in out and "vllm serve" not in out
    assert "training state on the trainer GPUs" in out  # rollout replicas are not colocated with training
    assert "verl-trainer: 2 x H100:1" in out


def test_use_retrieval_dry_run_checks_verls_tool_loop_and_loads_the_search_tool(tmp_path):
    """The seeds' USE_RETRIEVAL on the job group: the rendered overrides select verl's tool_agent loop, and the dry
    run says it composed them and loaded the tool through verl's registry."""
    done = _launch(tmp_path, "-o", "storage.uri=s3://bucket/prefix", "-o", "skypilot.shape=job_group",
                   USE_RETRIEVAL="true", AWS_ACCESS_KEY_ID=FAKE_KEY_ID, AWS_SECRET_ACCESS_KEY=FAKE_SECRET)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent" in out
    assert "agent loop 'tool_agent' is registered in verl and is the rollout's default" in out
    assert "tool config infra/verl/search_tool.yaml loads with verl's tool registry: search" in out


def test_nq_hotpotqa_against_the_users_search_r1_retriever_renders_one_task_offline(tmp_path):
    """docs/search-r1.md's launch: no retrieval-server task, the trainer's env names the retriever, verl's tool config
    asks it in Search-R1's API; no hub is reached (the data step only says where preparation will read)."""
    done = _launch(tmp_path, "-o", "storage.uri=s3://my-bucket/verl-grpo",
                   "-o", "services.retrieval.url=http://10.0.0.5:8000/retrieve", config="nq_hotpotqa",
                   HF_HUB_OFFLINE="1", AWS_ACCESS_KEY_ID=FAKE_KEY_ID, AWS_SECRET_ACCESS_KEY=FAKE_SECRET)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert 'VERL_GRPO_RETRIEVAL_SERVER_URL: "http://10.0.0.5:8000/retrieve"' in out and 'USE_RETRIEVAL: "true"' in out
    assert "tool config infra/verl/search_r1_retriever_tool.yaml loads with verl's tool registry: search" in out
    assert "SkyPilot loads the multinode YAML" in out and "retrieval-server" not in out
    assert "data.train_files=/tmp/verl-grpo/datasets/nq_hotpotqa/" in out and "GPU memory fits" in out
    assert any(line.startswith("  - data: ") and "nq_hotpotqa" in line for line in out.splitlines())
