"""SkyPilot YAML rendering: golden files for the three shapes; secrets by name only."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from rendered_tasks import CKPT_MOUNT, MOUNT, render, shape_config

from verl_grpo import node_imports
from verl_grpo.contracts import TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.node_imports import check_node_imports
from verl_grpo.providers.skypilot import templates
from verl_grpo.trainers.verl.overrides import VerlPaths, cluster_nodes, verl_overrides
from verl_grpo.trainers.verl.settings import checkpoint_env

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
_cfg, _render = shape_config, render


@pytest.mark.parametrize("shape", ["multinode", "job_group", "rollout_group"])
def test_matches_golden(shape):
    text = _render(shape, {"WANDB_API_KEY": "sekret-123"}).yaml
    golden = GOLDEN / f"skypilot-{shape}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"rendered YAML differs from {golden}; rerun with UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("shape", ["multinode", "job_group", "rollout_group"])
def test_secrets_by_name_only_and_trainer_is_primary(shape):
    rendered = _render(shape, {"WANDB_API_KEY": "sekret-123", "HF_TOKEN": "hf_abc"})
    assert "sekret-123" not in rendered.yaml and "hf_abc" not in rendered.yaml
    docs = list(yaml.safe_load_all(rendered.yaml))
    tasks = docs[1:] if rendered.is_job_group else docs
    token = {"VERL_GRPO_SERVICES_TOKEN": None} if rendered.is_job_group else {}
    for task in tasks:
        assert task["secrets"] == {"WANDB_API_KEY": None, "HF_TOKEN": None, **token}
        assert not set(task["envs"]) & {"WANDB_API_KEY", "HF_TOKEN"}
    trainer = tasks[-1]
    assert trainer["resources"]["job_recovery"] == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0,
                                                    "recover_on_exit_codes": [75]}
    assert trainer["resources"]["use_spot"] is True and trainer["num_nodes"] == cluster_nodes(_cfg(shape))
    # The data is fetched by restore with the task's secrets: SkyPilot would sync a data mount with credentials
    # it uploads only from ~/.aws/credentials, none when they come from the environment.
    assert "file_mounts" not in trainer  # no bucket mount: every node syncs its checkpoints with the task's secrets
    assert trainer["envs"]["VERL_GRPO_CHECKPOINT_MOUNT"] == CKPT_MOUNT
    assert "python -m verl_grpo.trainers.verl.checkpoint_sync" in trainer["run"]
    assert f"--dataset-uri s3://bucket/store/datasets/gsm8k/abc123 --dataset-dir {MOUNT}" in trainer["run"]
    for service in tasks[:-1]:  # only the trainer's nodes write checkpoints
        assert "file_mounts" not in service
    if rendered.is_job_group:
        assert docs[0]["execution"] == "parallel" and docs[0]["primary_tasks"] == ["verl-trainer"]


def test_job_group_services_and_discovery():
    docs = list(yaml.safe_load_all(_render("job_group", {}).yaml))
    names = [d["name"] for d in docs[1:]]
    assert names == ["data-server", "reward-server", "retrieval-server", "verl-trainer"]
    assert "python -m verl_grpo.services.reward_server serve" in docs[2]["run"]
    assert 'http://reward-server-0.${SKYPILOT_JOBGROUP_NAME}:8001' in docs[-1]["run"]
    assert docs[-1]["secrets"] == {"VERL_GRPO_SERVICES_TOKEN": None}


def test_trainer_restores_before_and_finalizes_after_main_ppo():
    trainer = list(yaml.safe_load_all(_render("job_group", {}).yaml))[-1]
    run = trainer["run"]
    restore = run.index("python -m verl_grpo.trainers.verl.restore --dataset-uri "
                        "s3://bucket/store/datasets/gsm8k/abc123")
    train = run.index("python -m verl.trainer.main_ppo")
    finalize = run.index("python -m verl_grpo.trainers.verl.finalize --backend fsdp2 --train-batch-size "
                         "\"$TRAIN_BATCH_SIZE\"")
    assert restore < run.index('if [ "$SKYPILOT_NODE_RANK" = "0" ]') < train < finalize
    assert trainer["envs"]["VERL_GRPO_STORE_URI"] == "s3://bucket/store"
    assert trainer["envs"]["VERL_GRPO_CHECKPOINT_DIR"] == "/tmp/verl-grpo/checkpoints/run-1"
    assert "trainer.default_local_dir=/tmp/verl-grpo/checkpoints/run-1" in run
    assert trainer["resources"]["ports"] == [8265]


def test_job_name_is_sanitised():
    assert templates.job_name("gsm8k smollm2/2024") == "verl-grpo-gsm8k-smollm2-2024"



# --- what the rendered YAML must get right on a real cluster --------------------------------------------------------

def _docs(shape: str, env: dict[str, str] | None = None, *extra: str) -> list[dict]:
    rendered = _render(shape, env or {}, *extra)
    docs = list(yaml.safe_load_all(rendered.yaml))
    return docs[1:] if rendered.is_job_group else docs


@pytest.mark.parametrize("shape", ["job_group", "rollout_group"])
def test_service_shapes_declare_the_services_token_and_the_provider_can_supply_it(shape):
    tasks = _docs(shape)
    assert all(t["secrets"] == {"VERL_GRPO_SERVICES_TOKEN": None} for t in tasks)
    cfg = _cfg(shape)
    fresh = templates.services_token_secret(cfg, {})
    assert set(fresh) == {"VERL_GRPO_SERVICES_TOKEN"} and len(fresh["VERL_GRPO_SERVICES_TOKEN"]) >= 40
    assert fresh != templates.services_token_secret(cfg, {})
    assert templates.services_token_secret(cfg, {"VERL_GRPO_SERVICES_TOKEN": "mine"}) == {"VERL_GRPO_SERVICES_TOKEN": "mine"}
    secrets = templates.launch_secrets(cfg, {"WANDB_API_KEY": "w"})
    assert secrets.keys() == {"WANDB_API_KEY", "VERL_GRPO_SERVICES_TOKEN"}
    assert "mine" not in _render(shape, {"VERL_GRPO_SERVICES_TOKEN": "mine"}).yaml


def test_multinode_needs_no_services_token():
    assert templates.services_token_secret(_cfg("multinode"), {}) == {}
    assert "secrets" not in _docs("multinode")[0]


@pytest.mark.parametrize("shape", ["job_group", "rollout_group"])
def test_servers_bind_the_node_ip_not_every_interface(shape):
    for task in _docs(shape):
        run = task["run"]
        assert "0.0.0.0" not in run
        if task["name"] != "verl-trainer":
            assert templates.NODE_IP_LINE in run and '--host "$NODE_IP"' in run
    trainer = _docs(shape)[-1]["run"]
    assert '--dashboard-host="$NODE_IP"' in trainer
    assert trainer.count('--node-ip-address="$NODE_IP"') == 2  # head and workers


def test_job_group_runs_only_enabled_services_with_their_settings():
    tasks = _docs("job_group", {}, "services.enabled=[reward]", "services.reward.max_items=77",
                  "services.reward.reward_model=/m/rm")
    assert [t["name"] for t in tasks] == ["reward-server", "verl-trainer"]
    run = tasks[0]["run"]
    assert "--max-items 77" in run and "--reward-model /m/rm" in run
    assert "--token-env VERL_GRPO_SERVICES_TOKEN" in run
    assert "RETRIEVAL_SERVER" not in tasks[-1]["run"] and "DATA_SERVER" not in tasks[-1]["run"]
    assert "multi_turn" not in tasks[-1]["run"] and tasks[-1]["envs"]["USE_RETRIEVAL"] == "false"


def test_job_group_services_get_their_resources_from_config():
    tasks = {t["name"]: t for t in _docs("job_group", {}, "services.data.cpus=2", "services.data.memory=4+",
                                         "services.retrieval.replicas=2", "services.retrieval.cpus=8+")}
    assert tasks["data-server"]["resources"]["cpus"] == "2" and tasks["data-server"]["resources"]["memory"] == "4+"
    assert tasks["reward-server"]["resources"]["memory"] == "8+"
    assert "accelerators" not in tasks["reward-server"]["resources"]  # rule-based scorers: no GPU
    retrieval = tasks["retrieval-server"]
    assert retrieval["num_nodes"] == 2 and retrieval["resources"]["cpus"] == "8+"
    assert retrieval["resources"]["memory"] == "64+"
    assert "num_nodes" not in tasks["data-server"] and "num_nodes" not in tasks["reward-server"]
    # every replica serves on its own node; the trainer gets every replica's URL, comma-separated
    assert '--host "$NODE_IP" --port 8002' in retrieval["run"]
    assert ('export VERL_GRPO_RETRIEVAL_SERVER_URL="http://retrieval-server-0.${SKYPILOT_JOBGROUP_NAME}:8002,'
            'http://retrieval-server-1.${SKYPILOT_JOBGROUP_NAME}:8002"') in tasks["verl-trainer"]["run"]


def test_a_neural_reward_model_gets_the_reward_server_a_gpu():
    reward = _docs("job_group", {}, "services.enabled=[reward]", "services.reward.reward_model=/m/rm")[0]
    assert reward["resources"]["accelerators"] == "L4:1" and "--reward-model /m/rm" in reward["run"]
    reward = _docs("job_group", {}, "services.enabled=[reward]", "services.reward.reward_model=/m/rm",
                   "services.reward.accelerators=A10G:1")[0]
    assert reward["resources"]["accelerators"] == "A10G:1"


def test_another_token_env_is_named_to_the_clients_and_servers():
    tasks = _docs("job_group", {"MY_SVC_TOKEN": "tok-xyz"}, "services.enabled=[reward]",
                  "services.token_env=MY_SVC_TOKEN")
    assert all(t["secrets"] == {"MY_SVC_TOKEN": None} for t in tasks)
    assert "--token-env MY_SVC_TOKEN" in tasks[0]["run"]
    assert tasks[-1]["envs"]["VERL_GRPO_SERVICES_TOKEN_ENV"] == "MY_SVC_TOKEN"
    assert "VERL_GRPO_SERVICES_TOKEN_ENV" not in _docs("job_group", {})[-1]["envs"]  # the default name needs none


def test_job_group_without_services_runs_the_reward_server_and_the_config_says_so():
    cfg = _cfg("job_group", "services.enabled=[]")
    assert cfg.services.enabled == ["reward"]  # recorded in the run's resolved config
    assert [t["name"] for t in _docs("job_group", None, "services.enabled=[]")] == ["reward-server", "verl-trainer"]


def test_job_group_services_of_a_config_naming_none_is_a_one_line_config_error():
    cfg = _cfg("job_group").model_copy(deep=True)
    object.__setattr__(cfg.services, "enabled", [])  # as a config built around the validator would be
    with pytest.raises(ConfigError, match=r"services\.enabled.*empty.*services\.enabled=\[") as e:
        templates.job_group_services(cfg)
    assert "\n" not in str(e.value)


def test_retrieval_server_reads_its_corpus_from_the_store():
    run = next(t for t in _docs("job_group") if t["name"] == "retrieval-server")["run"]
    assert "shared/data" not in run and "--store-uri s3://bucket/store" in run and "--index squad-dev" in run
    assert "--corpus s3://bucket/store/services/retrieval-server/corpus/squad-dev.json" in run


def test_head_waits_for_nodes_against_its_own_ray_and_gives_up():
    run = _docs("multinode")[0]["run"]
    assert 'ray list nodes --address="$HEAD_IP:6379"' in run
    assert f"WAIT_UNTIL=$((SECONDS + {templates.NODE_WAIT_S}))" in run
    assert "nodes joined the Ray cluster" in run and "exit 1" in run


@pytest.mark.parametrize(("nodes", "expect_polls"), [(1, 0), (2, 1)])
def test_the_rendered_wait_polls_ray_only_for_worker_nodes(tmp_path, nodes, expect_polls):
    """The head's wait loop as rendered, run by bash against a `ray` that logs its calls and reports every node
    alive: a one-node cluster is whole once `ray start --head` returned, so it never asks."""
    run = _docs("multinode")[0]["run"]
    wait = run[run.index("WAIT_UNTIL="):run.index("export RAY_ADDRESS=")]
    fake_ray = tmp_path / "ray"
    fake_ray.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path}/calls\n"
                        f"python3 -c 'print([{{}}] * {nodes})' | tr \"'\" '\"'\n")
    fake_ray.chmod(0o755)
    script = f"set -euo pipefail\nHEAD_IP=10.0.0.1\nNUM_NODES={nodes}\n{wait}echo waited\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert done.returncode == 0 and done.stdout.strip() == "waited", done.stderr
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    assert len(calls) == expect_polls and all(c.startswith("list nodes --address=10.0.0.1:6379") for c in calls)


@pytest.mark.parametrize("shape", ["multinode", "job_group", "rollout_group"])
def test_every_task_installs_into_and_runs_in_a_venv_of_the_required_python(shape):
    assert templates.python_version() == "3.11"
    for task in _docs(shape):
        assert task["envs"]["VERL_GRPO_VENV"] == "/tmp/verl-grpo/venv"
        setup = task["setup"]
        assert 'uv venv --allow-existing --seed --python 3.11 "$VERL_GRPO_VENV"' in setup
        assert "--system" not in setup
        assert setup.index('. "$VERL_GRPO_VENV/bin/activate"') < setup.index("uv pip install")
        assert task["run"].splitlines()[1] == '. "$VERL_GRPO_VENV/bin/activate"'


def test_python_version_follows_requires_python(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nrequires-python = ">=3.12,<3.14"\n')
    assert templates.python_version(tmp_path / "pyproject.toml") == "3.12"


def _launch_with_env(shape: str, changes: dict[str, str], *extra: str) -> subprocess.CompletedProcess:
    """Run the trainer's knob lines and main_ppo command from the rendered YAML as `sky jobs launch --env` would:
    the task's envs overlaid by `changes`; `python` prints the arguments it would get."""
    trainer = list(yaml.safe_load_all(_render(shape, {}, *extra).yaml))[-1]
    lines = trainer["run"].splitlines()
    start = next(i for i, line in enumerate(lines) if "knob() {" in line) - 1
    end = next(i for i, line in enumerate(lines)
               if "python -m verl.trainer.main_ppo" in line or "python -m verl_grpo.trainers.verl.fully_async_entry" in line)
    script = "\n".join(["set -euo pipefail", "python() { printf '%s\\n' \"$@\"; }", *lines[start:end + 1]])
    env = {"PATH": os.environ["PATH"], **{k: str(v) for k, v in trainer["envs"].items()}, **changes}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)


def _main_ppo_args(shape: str, changes: dict[str, str], *extra: str) -> dict[str, str]:
    result = _launch_with_env(shape, changes, *extra)
    assert result.returncode == 0, result.stderr
    args = result.stdout.splitlines()
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    return dict(arg.partition("=")[::2] for arg in args[2:])


@pytest.mark.parametrize("shape", ["multinode", "job_group"])
def test_the_rendered_envs_reproduce_the_run_exactly(shape):
    cfg = _cfg(shape)
    files = {"train": f"{MOUNT}/train.parquet", "val": f"{MOUNT}/val.parquet"}
    expected = verl_overrides(cfg, files, VerlPaths("/tmp/verl-grpo/checkpoints/run-1"), "run-1", env={})
    assert _main_ppo_args(shape, {}) == dict(o.partition("=")[::2] for o in expected)


def test_env_knobs_at_launch_change_main_ppo_as_in_the_seeds():
    args = _main_ppo_args("multinode", {"MODEL_NAME": "Qwen/Qwen2.5-1.5B-Instruct", "TOTAL_STEPS": "50",
                                        "TEMPERATURE": "0.9", "TOP_K": "20", "ACTOR_LR": "3e-6", "ROLLOUTS": "16",
                                        "WARMUP_STEPS": "20", "TOTAL_EPOCHS": "3", "CLIP_HIGH": "0.3"})
    assert args["actor_rollout_ref.model.path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert args["trainer.total_training_steps"] == "50" and args["trainer.total_epochs"] == "3"
    assert args["actor_rollout_ref.rollout.temperature"] == "0.9" and args["actor_rollout_ref.rollout.top_k"] == "20"
    assert args["actor_rollout_ref.actor.optim.lr"] == "3e-6" and args["actor_rollout_ref.rollout.n"] == "16"
    assert args["actor_rollout_ref.actor.optim.lr_warmup_steps"] == "20"
    assert args["actor_rollout_ref.actor.clip_ratio_high"] == "0.3"
    assert _main_ppo_args("multinode", {"MODEL": "Qwen/Qwen2.5-3B-Instruct"})["actor_rollout_ref.model.path"] == \
        "Qwen/Qwen2.5-3B-Instruct"


def test_grad_accum_at_launch_sets_the_train_and_mini_batch():
    args = _main_ppo_args("multinode", {"BATCH_SIZE": "2", "GRAD_ACCUM": "16"})
    # four updates per step (verl.ppo_mini_batches): the mini batch follows the train batch the knobs set
    assert args["data.train_batch_size"] == "32" and args["actor_rollout_ref.actor.ppo_mini_batch_size"] == "8"
    assert args["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "2"
    assert args["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == "2"


def test_a_train_batch_below_the_mini_batch_count_at_launch_trains_in_mini_batches_of_one():
    args = _main_ppo_args("multinode", {"TRAIN_BATCH_SIZE": "2"})
    assert args["data.train_batch_size"] == "2" and args["actor_rollout_ref.actor.ppo_mini_batch_size"] == "1"


def test_a_fully_async_train_batch_of_whole_mini_batches_at_launch_sets_its_step():
    result = _launch_with_env("rollout_group", {"TRAIN_BATCH_SIZE": "32"})
    assert result.returncode == 0, result.stderr
    args = dict(arg.partition("=")[::2] for arg in result.stdout.splitlines()[2:])
    mini, batches = int(args["actor_rollout_ref.actor.ppo_mini_batch_size"]), int(args["async_training.require_batches"])
    assert mini * batches == 32, "a step trains on exactly TRAIN_BATCH_SIZE prompts"


def test_use_retrieval_at_launch_turns_the_search_tool_off():
    on = _main_ppo_args("job_group", {})
    assert on["actor_rollout_ref.rollout.multi_turn.enable"] == "True"
    assert "actor_rollout_ref.rollout.multi_turn.enable" not in _main_ppo_args("job_group", {"USE_RETRIEVAL": "false"})


@pytest.mark.parametrize("shape, changes, says", [
    ("multinode", {"MODEL": "a/b", "MODEL_NAME": "c/d"}, "env vars MODEL_NAME=c/d and MODEL=a/b disagree"),
    ("multinode", {"LR": "1e-5", "ACTOR_LR": "2e-5"}, "env vars LR=1e-5 and ACTOR_LR=2e-5 disagree"),
    ("multinode", {"BATCH_SIZE": "2", "GRAD_ACCUM": "4", "TRAIN_BATCH_SIZE": "16"},
     "BATCH_SIZE × GRAD_ACCUM (8) and TRAIN_BATCH_SIZE=16 disagree"),
    ("multinode", {"DATASET": "math"}, "DATASET=math: this task trains the prepared gsm8k data"),
    ("multinode", {"USE_RETRIEVAL": "true"}, "this task runs no retrieval-server"),
    ("job_group", {"USE_RETRIEVAL": "perhaps"}, "USE_RETRIEVAL=perhaps is not true/false"),
    ("rollout_group", {"TRAIN_BATCH_SIZE": "10"}, "TRAIN_BATCH_SIZE=10 is not a multiple of 4"),
])
def test_conflicting_env_knobs_at_launch_fail_before_main_ppo(shape, changes, says):
    result = _launch_with_env(shape, changes)
    assert result.returncode != 0 and says in result.stderr and "main_ppo" not in result.stdout


def test_the_knob_envs_are_on_the_trainer_only_and_never_secrets():
    docs = list(yaml.safe_load_all(_render("job_group", {"WANDB_API_KEY": "sekret-123"}).yaml))
    assert all("TOTAL_STEPS" not in d["envs"] for d in docs[1:-1]) and docs[-1]["envs"]["TOTAL_STEPS"] == "20"
    assert "TOTAL_EPOCHS" not in docs[-1]["envs"]  # rendered only when the run sets it
    epochs = list(yaml.safe_load_all(_render("multinode", {}, "algorithm.total_epochs=2").yaml))[-1]
    assert epochs["envs"]["TOTAL_EPOCHS"] == "2"


def test_multinode_checkpoints_need_a_bucket_and_a_managed_job():
    with pytest.raises(ConfigError, match=r"storage.uri .* is no bucket; set storage.uri=s3://"):
        templates.checkpoint_sync_lines(_cfg("multinode", "storage.uri=file:///tmp/store"),
                                   TrainSpec(backend="verl", run_id="r", command=[], overrides=[], total_steps=1,
                                             env=checkpoint_env("file:///tmp/store", None, "r", "/tmp/c", 2,
                                                                "file:///tmp/store/runs/r/checkpoints")))
    with pytest.raises(ConfigError, match="a multi-node run is a managed job"):
        _render("multinode", {}, "skypilot.cluster=mine")
    single = _render("multinode", {}, "infra.nodes=1")
    assert "checkpoint_sync" not in single.yaml


def test_rollout_group_with_replay_passes_the_settings_to_the_entry_beside_the_buffers_url():
    rendered = _render("rollout_group", {}, "async_training.replay_share=0.25", "async_training.max_replays=2")
    trainer = list(yaml.safe_load_all(rendered.yaml))[-1]
    entry = next(line for line in trainer["run"].splitlines() if "fully_async_entry" in line)
    for setting in ("+async_training.replay_share=0.25", "+async_training.max_replays=2",
                    "+async_training.max_staleness=1"):
        assert f" {setting} " in entry
    assert 'export VERL_GRPO_REPLAY_BUFFER_URL="http://replay-buffer-0.' in trainer["run"]


@pytest.mark.parametrize("shape", ["multinode", "job_group", "rollout_group"])
def test_every_task_installs_what_its_nodes_import(shape):
    lines = check_node_imports({shape: _render(shape, {}).yaml})
    assert lines and all("it brings all" in line for line in lines)
    trainer = next(line for line in lines if "verl-grpo-run-1'" in line or "verl-trainer'" in line)
    assert "setup installs verl[vllm]==0.9.1 transformers==5.9.0 " in trainer
    services = [line for line in lines if line is not trainer]
    assert len(services) == {"multinode": 0, "job_group": 3, "rollout_group": 3}[shape]
    assert not any("verl[" in line or "vllm" in line or "torch" in line for line in services), "services: no CUDA stack"
    assert "tenacity" in trainer  # verl_grpo.retry / checkpoints import it at module level, restore runs first


def test_a_runtime_package_setup_forgets_is_named_with_the_module_that_imports_it(monkeypatch):
    """The first-launch defect: setup installed no tenacity, which every node's first command imports."""
    monkeypatch.setattr(templates, "CLUSTER_RUNTIME", tuple(p for p in templates.CLUSTER_RUNTIME
                                                           if not p.startswith("tenacity")))
    with pytest.raises(ConfigError) as e:
        check_node_imports({"multinode": _render("multinode", {}).yaml})
    text = str(e.value)
    assert "\n" not in text
    assert "task 'verl-grpo-run-1' imports tenacity (verl_grpo." in text and "CLUSTER_RUNTIME" in text


def test_verls_mlflow_logger_needs_mlflow_on_the_node():
    """The other first-launch import: `trainer.logger=[console,mlflow,file]` makes verl's Tracking import mlflow."""
    text = _render("multinode", {}).yaml.replace("'trainer.logger=[console,file]'",
                                                 "'trainer.logger=[console,mlflow,file]'")
    assert "mlflow,file" in text
    with pytest.raises(ConfigError, match=r"imports mlflow \(verl's mlflow logger\)"):
        check_node_imports({"multinode": text})


def test_imports_a_module_runs_when_imported_count_and_guarded_or_lazy_ones_do_not(tmp_path):
    source = ("import a_top\nfrom .sibling import x\ntry:\n    import optional_one\nexcept ImportError:\n"
              "    optional_one = None\nif TYPE_CHECKING:\n    import typing_only\n"
              "def f():\n    import lazy_one\nclass C:\n    import class_level\n")
    names = set(node_imports._import_names(ast.parse(source), "verl_grpo.pkg"))
    assert {"a_top", "verl_grpo.pkg.sibling", "verl_grpo.pkg.sibling.x", "class_level"} <= names
    assert not names & {"optional_one", "typing_only", "lazy_one"}


def test_the_rendered_setup_ends_with_the_preflight_of_its_run():
    docs = list(yaml.safe_load_all(_render("job_group", {}).yaml))
    trainer = next(d for d in docs if d.get("name") == "verl-trainer")
    last = trainer["setup"].strip().splitlines()[-1]
    assert last.split()[:3] == ["python", "-m", "verl_grpo.trainers.verl.preflight"]
    assert {"verl", "tenacity", "math_verify", "fsspec"} <= set(last.split()[3:])  # restore imports tenacity first
    services = [d for d in docs if d.get("name", "").endswith("-server")]
    assert services and not any("preflight" in d["setup"] for d in services)


@pytest.mark.parametrize("shape", ["job_group", "rollout_group"])
def test_a_group_asks_skypilot_for_in_group_networking(shape):
    """`inter_connection: true`: SkyPilot's optimizer then places the group on Kubernetes or refuses it before
    provisioning, instead of launching services the trainer cannot resolve."""
    from verl_grpo.providers.skypilot.boundary import load_job_group

    assert load_job_group(_render(shape, {}).yaml).inter_connection is True
