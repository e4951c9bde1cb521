"""The rendered tasks of a run scored by its own function and of a reasoning-gym run: every task that scores fetches
the user's file (or installs reasoning-gym) before it starts, the trainer's preflight looks for what the function
imports, and the dry run's reward check reads those tasks back: their package sets, a package the nodes lack, a
module beside the file, a function that fails or returns no number on the sample row."""

from __future__ import annotations

import shlex

import pytest
import yaml
from run_configs import VERL_H100_1, build_config

from verl_grpo.config import load_config
from verl_grpo.contracts import TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.providers.skypilot import reward_check, templates
from verl_grpo.trainers.verl.backend import DATASET_MOUNT_ENV, DATASET_URI_ENV
from verl_grpo.trainers.verl.node_reward import (
    REWARD_DIR_ENV,
    REWARD_URI_ENV,
    NodeReward,
    SampleRow,
    UserRewardPlan,
    reference_response,
)
from verl_grpo.trainers.verl.overrides import run_paths, verl_overrides
from verl_grpo.trainers.verl.settings import checkpoint_env

MOUNT = "/tmp/verl-grpo/datasets/sums/abc"
NODE_DIR = "/tmp/verl-grpo/rewards/0123456789abcdef"
URI = "s3://bucket/store/rewards/0123456789abcdef"
REWARD = "import math\nimport yaml\n\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    import json\n    try:\n        import nothing_here\n    except ImportError:\n        pass\n" \
         "    return {'score': 1.0, 'exact': 1.0}\n"


def cfg_of(reward, *extra: str):
    return build_config(*VERL_H100_1, "storage.uri=s3://bucket/store", f"reward.path={reward}", *extra)


def plan_of(cfg, sample: SampleRow | None = None) -> UserRewardPlan:
    path = f"{NODE_DIR}/{cfg.reward.path.rsplit('/', 1)[-1]}"
    node = NodeReward(cfg.reward.path, path, cfg.reward.name, cfg.reward.timeout_s, URI, NODE_DIR)
    return UserRewardPlan(node, ("exact",), 2, sample)


def rendered(cfg) -> dict[str, dict]:
    """The training tasks (by name) and the eval task, as the provider renders them for this plan."""
    plan = plan_of(cfg)
    overrides = verl_overrides(cfg, {"train": f"{MOUNT}/train.parquet", "val": f"{MOUNT}/val.parquet"},
                               run_paths(cfg, "/tmp/verl-grpo/checkpoints/r", plan), "r")
    env = {DATASET_URI_ENV: "s3://bucket/store/datasets/sums/abc", DATASET_MOUNT_ENV: MOUNT, **plan.node.env(),
           **checkpoint_env("s3://bucket/store", None, "r", "/tmp/verl-grpo/checkpoints/r", 2)}
    spec = TrainSpec(backend="verl", run_id="r", command=["python", "-m", "verl.trainer.main_ppo", *overrides],
                     overrides=overrides, total_steps=4, env=env)
    tasks = {t["name"]: t for t in yaml.safe_load_all(templates.render(cfg, spec, {}).yaml) if t.get("run")}
    tasks["eval"] = yaml.safe_load(templates.render_eval(cfg, "r", "s3://bucket/store/spec.json", {},
                                                         reward=plan.node).yaml)
    return tasks


@pytest.fixture
def reward(tmp_path):
    path = tmp_path / "score.py"
    path.write_text(REWARD)
    return path


def test_the_trainer_nodes_and_the_eval_fetch_the_file_before_they_score(reward):
    tasks = rendered(cfg_of(reward))
    fetch = f"python -m verl_grpo.trainers.verl.reward_fetch {URI} {NODE_DIR}"
    trainer, evaluation = tasks["verl-grpo-r"], tasks["eval"]
    run = trainer["run"]
    assert fetch in run and run.index(fetch) < run.index("verl_grpo.trainers.verl.restore")
    assert run.index(fetch) < run.index('if [ "$SKYPILOT_NODE_RANK" = "0" ]')  # every node, not the head only
    assert evaluation["run"].index(fetch) < evaluation["run"].index("vllm_runner")
    assert REWARD_URI_ENV not in trainer["envs"] and REWARD_DIR_ENV not in trainer["envs"]
    assert str(reward) not in run and str(reward) not in evaluation["run"]
    preflight = shlex.split(trainer["setup"].strip().splitlines()[-1])
    assert "yaml" in preflight and "nothing_here" not in preflight and "math" not in preflight


def test_a_job_groups_reward_server_fetches_and_serves_it_and_the_trainer_does_not(reward):
    tasks = rendered(cfg_of(reward, "skypilot.shape=job_group", "services.enabled=[reward]"))
    server, trainer = tasks["reward-server"], tasks["verl-trainer"]
    fetch = f"python -m verl_grpo.trainers.verl.reward_fetch {URI} {NODE_DIR}"
    assert server["run"].index(fetch) < server["run"].index("reward_server serve")
    assert f"--reward-path {NODE_DIR}/score.py" in server["run"]
    assert fetch not in trainer["run"] and "compute_score_remote" in trainer["run"]
    assert "yaml" not in shlex.split(trainer["setup"].strip().splitlines()[-1])


def test_the_eval_installs_node_packages_only_for_a_users_function():
    plain = load_config([], ["skypilot.node_packages=[extra-pkg]"])
    assert "extra-pkg" not in templates.eval_packages(plain)
    assert "extra-pkg" in templates.eval_packages(cfg_of("/x/score.py", "skypilot.node_packages=[extra-pkg]"))


def test_reasoning_gym_is_installed_wherever_its_rows_are_scored(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text("reasoning-gym==0.1.25\n    # via verl-grpo\n")
    assert templates.locked_version("reasoning-gym", lock) == "0.1.25"
    cfg = load_config([], ["dataset.name=reasoning_gym"])
    pin = f"reasoning-gym=={templates.locked_version('reasoning-gym')}"
    assert pin in templates.cluster_packages(cfg, "vllm") and pin in templates.eval_packages(cfg)
    assert templates.task_packages(load_config([], [])) == () and "reasoning_gym" in templates.scorer_imports(cfg)


def test_the_reward_check_reads_each_scoring_tasks_package_set(reward):
    tasks = rendered(cfg_of(reward))
    yamls = {name: yaml.safe_dump(task) for name, task in tasks.items()}
    found = {t.label: t for t in reward_check.scoring_tasks(yamls)}
    assert [t.role for t in found.values()] == ["verl's reward loop", "the vLLM eval"]
    assert "verl" in found["verl-grpo-r"].provided and "vllm" in found["verl-grpo-r-eval"].provided
    assert "yaml" in found["verl-grpo-r-eval"].provided  # pyyaml is in CLUSTER_RUNTIME
    lines = reward_check.check_user_reward(yamls, plan_of(cfg_of(reward), None))
    assert "ships through the store" in lines[0] and f"to {NODE_DIR}/score.py" in lines[0]
    assert "imports yaml, nothing_here (in a function or guarded), json (stdlib), math (stdlib)" in lines[1]
    assert "not on every scoring node: nothing_here" in lines[1]


def test_a_package_the_nodes_lack_or_a_module_beside_the_file_fails_in_one_line(tmp_path):
    task = reward_check.ScoringTask("t", "the vLLM eval", frozenset({"numpy"}))
    missing = tmp_path / "missing.py"
    missing.write_text("import yaml\n")
    with pytest.raises(ConfigError) as e:
        reward_check.static_imports_line(missing, [task])
    assert "imports yaml, which the setup of t does not install" in str(e.value)
    assert "skypilot.node_packages" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "helpers.py").write_text("X = 1\n")
    beside = tmp_path / "beside.py"
    beside.write_text("import helpers\n")
    with pytest.raises(ConfigError, match="imports helpers from beside it, which does not travel"):
        reward_check.static_imports_line(beside, [task])


def probe_plan(tmp_path, body: str) -> UserRewardPlan:
    path = tmp_path / "probe_me.py"
    path.write_text(f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n{body}")
    node = NodeReward(str(path), str(path), "compute_score", 10.0)
    sample = SampleRow("sums", "5", {"index": 0}, reference_response("5"))
    return UserRewardPlan(node, ("exact",), 2, sample)


def test_the_probe_scores_the_sample_row_in_the_nodes_package_set(tmp_path):
    nodes = [reward_check.ScoringTask("trainer", "verl's reward loop", frozenset({"numpy"}))]
    ok = probe_plan(tmp_path, "    import numpy, json\n    return {'score': numpy.float64(1), 'exact': 1}\n")
    line = reward_check.probe_line(ok, nodes)
    assert "scored a sample row there: data_source 'sums'" in line and "<answer>5</answer>" in line
    assert "{'score': 1.0, 'acc': 1.0, 'failed': 0.0, 'exact': 1.0}" in line
    lacking = probe_plan(tmp_path, "    import yaml\n    return 1.0\n")
    with pytest.raises(ConfigError) as e:
        reward_check.probe_line(lacking, nodes)
    assert "imports yaml, which the nodes of trainer do not install" in str(e.value) and "\n" not in str(e.value)
    guarded = probe_plan(tmp_path, "    try:\n        import yaml\n    except ImportError:\n        pass\n"
                                   "    return 0.5\n")
    assert "'score': 0.5" in reward_check.probe_line(guarded, nodes)  # an optional import the node lacks is fine
    (tmp_path / "local_helpers.py").write_text("X = 1\n")
    with pytest.raises(ConfigError, match="imports local_helpers from beside it, which does not travel"):
        reward_check.probe_line(probe_plan(tmp_path, "    import local_helpers\n    return 1.0\n"), nodes)
    probed = reward_check.probe(probe_plan(tmp_path, "    import importlib.util\n"
                                                     "    return float(importlib.util.find_spec('yaml') is None)\n"),
                                {"numpy"})
    assert probed == {"result": 1.0}  # as on a node without it: find_spec says None, it does not raise
    with pytest.raises(ConfigError, match=r"failed on a sample row .* ZeroDivisionError"):
        reward_check.probe_line(probe_plan(tmp_path, "    return 1 / 0\n"), nodes)
    with pytest.raises(ConfigError, match="returned a dict without 'score'"):
        reward_check.probe_line(probe_plan(tmp_path, "    return {'exact': 1}\n"), nodes)
    unloaded = UserRewardPlan(ok.node, (), 2, None, error="no sample row (dataset.train_files: ...)", loaded=False)
    assert reward_check.probe_line(unloaded, nodes).startswith("reward: not imported in the nodes' package set")
