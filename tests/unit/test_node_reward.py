"""The user's reward function on GPU nodes (reward.path): the file shipped through the store and fetched by the nodes,
verl told where it is (reward_kwargs), every row's keys fixed by one sample row, the first step's rows per reward
worker, a module the nodes cannot import refused in one line, and user_entry's fixed-key results."""

from __future__ import annotations

import hashlib
import json

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from run_configs import VERL_H100_1, build_config

from verl_grpo.contracts import Cluster
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.store import Store
from verl_grpo.trainers.verl import reward_fetch, user_entry as verl_user_entry
from verl_grpo.trainers.verl.node_reward import (
    REWARD_DIR_ENV,
    REWARD_URI_ENV,
    USER_ENTRY,
    NodeReward,
    UserRewardPlan,
    components_of,
    fetch_command,
    first_rows,
    module_on_nodes,
    node_config,
    node_path,
    node_reward,
    plan_user_reward,
    reference_response,
    sample_row,
)
from verl_grpo.trainers.verl.overrides import VerlPaths, hydra_value, run_paths, verl_overrides

REWARD = '''import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "raise" in solution_str:
        raise ValueError("no verdict")
    block = re.search(r"<answer>(.*?)</answer>", solution_str, re.S)
    exact = float(bool(block) and block.group(1).strip() == ground_truth)
    out = {"score": exact, "exact": exact, "pred": block.group(1) if block else None}
    if exact:
        out["bonus"] = 0.5  # a key only some rows have: verl's reward loop needs one key set
    return out
'''
FILES = {"train": "/n/train.parquet", "val": "/n/val.parquet"}


@pytest.fixture
def task(tmp_path):
    rows, reward = tmp_path / "rows", tmp_path / "reward"
    rows.mkdir()
    reward.mkdir()
    (rows / "train.jsonl").write_text('{"question": "", "answer": "1"}\n{"question": "2+3?", "answer": "5"}\n')
    (rows / "test.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n')
    (reward / "score.py").write_text(REWARD)
    return tmp_path


def config(task, *extra: str):
    return build_config("dataset.name=custom", "dataset.task=sums", f"dataset.train_files=[{task}/rows/train.jsonl]",
                        f"dataset.test_files=[{task}/rows/test.jsonl]", f"reward.path={task}/reward/score.py",
                        *VERL_H100_1, f"storage.uri=file://{task}/store", *extra)


def test_a_py_file_ships_content_addressed_through_the_store_to_the_nodes_workdir(task):
    cfg = config(task)
    store = Store.from_config(cfg.storage)
    digest = hashlib.sha256((task / "reward/score.py").read_bytes()).hexdigest()[:16]
    dry = node_reward(cfg, store, "/tmp/verl-grpo", upload=False)
    assert dry.path == f"/tmp/verl-grpo/rewards/{digest}/score.py" and dry.uri == store.url(f"rewards/{digest}")
    assert not store.exists("rewards")  # the dry run names where it would go, uploading nothing
    node = node_reward(cfg, store, "/tmp/verl-grpo")
    assert store.read_text("rewards", digest, "score.py") == REWARD and node == dry
    assert node.env() == {REWARD_URI_ENV: node.uri, REWARD_DIR_ENV: node.node_dir}
    assert fetch_command(node.env())[-2:] == [node.uri, node.node_dir]
    assert node_path(cfg, node.env()) == node.path and node_config(cfg, node).reward.path == node.path
    here = node_reward(cfg, store, "/x", on_this_machine=True)
    assert here.path == cfg.reward.path and here.env() == {} and fetch_command(here.env()) is None


def test_a_missing_file_is_refused_in_one_line(task):
    (task / "reward/score.py").unlink()
    with pytest.raises(ConfigError, match=r"reward.path .*score.py is not a file on this machine"):
        node_reward(config(task), Store(f"file://{task}/store"), "/tmp/verl-grpo")


def test_a_module_is_imported_where_the_nodes_have_it_and_refused_in_one_line_elsewhere(task):
    assert "synced workdir" in module_on_nodes(config(task, "reward.path=verl_grpo.rewards.scoring"))
    assert "standard library" in module_on_nodes(config(task, "reward.path=json.decoder"))
    with pytest.raises(ConfigError) as e:
        module_on_nodes(config(task, "reward.path=yaml.loader"))
    assert "skypilot.node_packages" in str(e.value) and "\n" not in str(e.value)
    assert "node_packages" in module_on_nodes(config(task, "reward.path=yaml.loader",
                                                     "skypilot.node_packages=[pyyaml]"))
    node = node_reward(config(task, "reward.path=verl_grpo.rewards.scoring"), Store(f"file://{task}/s"), "/w")
    assert node.path == "verl_grpo.rewards.scoring" and node.uri is None and node.env() == {}


def test_the_sample_row_fixes_the_component_keys_and_a_bad_row_is_skipped(task):
    cfg = config(task)
    sample = sample_row(cfg)  # nothing prepared: the source's first usable train row
    assert (sample.data_source, sample.ground_truth) == ("sums", "5")
    assert sample.response.endswith("<answer>5</answer>") and json.loads(sample.extra_info["row"])["answer"] == "5"
    cluster = Cluster(provider="skypilot", name="c", workdir="/tmp/verl-grpo")
    plan = plan_user_reward(cfg, None, Store.from_config(cfg.storage), cluster, upload=False)
    assert plan.components == ("exact", "bonus") and plan.error is None and plan.loaded
    assert plan.reward_kwargs() == {"user_path": plan.node.path, "user_name": "compute_score", "timeout_s": 10.0,
                                    "components": ["exact", "bonus"], "first_rows": 4}


def test_reference_responses_state_the_answer_the_task_checks():
    entry = json.dumps({"answer": "42", "metadata": {"source_dataset": "chain_sum"}})
    assert reference_response(entry).endswith("<answer>42</answer>")  # reasoning-gym's entry
    assert reference_response(json.dumps({"target": ["Paris", "paris"]})).endswith("<answer>Paris</answer>")
    assert reference_response("7").endswith("<answer>7</answer>") and reference_response(3).endswith(">3</answer>")
    assert components_of({"score": 1.0, "acc": 1.0, "failed": 0.0, "pred": "7", "a": 1.0, "b": True}) == ("a",)


@pytest.mark.parametrize("extra, rows", [([], 8), (["algorithm.train_batch_size=32"], 32),
                                         (["verl.extra_overrides=[reward.num_workers=2]"], 16)])
def test_the_first_steps_rows_per_reward_worker_and_at_least_one_group(task, extra, rows):
    assert first_rows(config(task, "algorithm.train_batch_size=4", "algorithm.rollouts=8", *extra)) == rows


def test_verl_is_told_where_the_function_is_on_the_nodes(task):
    cfg = config(task)
    node = NodeReward(cfg.reward.path, "/tmp/verl-grpo/rewards/abc/score.py", "compute_score", 10.0)
    plan = UserRewardPlan(node, ("exact", "it's"), 3)
    paths = run_paths(cfg, "/ck", plan)
    assert (paths.reward_path, paths.reward_name) == (USER_ENTRY, "compute_score")
    overrides = verl_overrides(cfg, FILES, paths, "r")
    kwargs = {o.partition("=")[0]: o for o in overrides if "reward_kwargs" in o}
    parser = OverridesParser.create()
    parsed = {p.key_or_group.rsplit(".", 1)[-1]: p.value() for p in parser.parse_overrides(list(kwargs.values()))}
    assert parsed == {"user_path": node.path, "user_name": "compute_score", "timeout_s": 10.0,
                      "components": ["exact", "it's"], "first_rows": 3}
    remote = run_paths(config(task, "services.enabled=[reward]"), "/ck", plan)
    assert remote.reward_name == "compute_score_remote"
    assert not [o for o in verl_overrides(cfg, FILES, VerlPaths("/ck"), "r") if "reward_kwargs" in o]
    assert hydra_value(["a b", "c'd"]) == "['a b','c\\'d']"
    with pytest.raises(ConfigError):
        hydra_value(None)


def test_every_row_returns_the_same_keys_and_a_failed_call_scores_zero(task):
    kwargs = {"user_path": str(task / "reward/score.py"), "components": ["exact", "bonus"], "first_rows": 1,
              "reward_router_address": "ignored"}
    right = verl_user_entry.compute_score("sums", "<answer>5</answer>", "5", {"index": 0}, **kwargs)
    wrong = verl_user_entry.compute_score("sums", "<answer>4</answer>", "5", None, **kwargs)
    failed = verl_user_entry.compute_score("sums", "raise", "5", None, **kwargs)
    assert right == {"score": 1.0, "acc": 1.0, "failed": 0.0, "exact": 1.0, "bonus": 0.5}
    assert wrong == {"score": 0.0, "acc": 0.0, "failed": 0.0, "exact": 0.0, "bonus": 0.0}
    assert failed == {"score": 0.0, "acc": 0.0, "failed": 1.0, "exact": 0.0, "bonus": 0.0}
    assert verl_user_entry.fixed_keys({"score": float("nan"), "x": "7", "failed": 1}, ["x", "y"]) == \
        {"score": 0.0, "acc": 0.0, "failed": 1.0, "x": 7.0, "y": 0.0}


def test_a_function_that_fails_on_every_first_row_stops_the_run(task):
    kwargs = {"user_path": str(task / "reward/score.py"), "components": ["exact"], "first_rows": 2,
              "timeout_s": 9.0}
    verl_user_entry.compute_score("sums", "raise", "5", **kwargs)
    with pytest.raises(ConfigError, match=r"failed on every row of the first step \(2 rows; first: ValueError"):
        verl_user_entry.compute_score("sums", "raise", "5", **kwargs)


def test_a_node_fetches_the_shipped_file_checks_it_and_keeps_a_whole_copy(task):
    cfg = config(task)
    store = Store.from_config(cfg.storage)
    node = node_reward(cfg, store, str(task / "node"))
    (file,) = reward_fetch.fetch(node.uri, task / "node-dir")
    assert file.read_text() == REWARD
    file.write_text("tampered")
    assert reward_fetch.fetch(node.uri, task / "node-dir")[0].read_text() == REWARD  # a torn copy is fetched again
    store.write_text("altered", "rewards", node.uri.rsplit("/", 1)[-1], "score.py")
    assert reward_fetch.fetch(node.uri, task / "node-dir")[0].read_text() == REWARD  # the whole copy is kept
    with pytest.raises(DataError, match="does not match its digest"):
        reward_fetch.fetch(node.uri, task / "other-dir")
    with pytest.raises(DataError, match="is not in the store"):
        reward_fetch.fetch(store.url("rewards", "0" * 16), task / "none")
    assert reward_fetch.main([store.url("rewards", "0" * 16), str(task / "none")]) == 2
