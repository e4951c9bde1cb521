"""The user's own reward function: loaded in worker processes, results normalised, failures scored 0 and counted,
a hang stopped at its time limit, a function that fails on a whole first step stops the run, TRL's calling
convention, and `verl-grpo score` with it."""

from __future__ import annotations

import json
import math
import time

import pytest

from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.rewards import run_scorer
from verl_grpo.rewards.score_file import score_file
from verl_grpo.rewards.trl_adapter import user_reward_functions
from verl_grpo.rewards.user_reward import FAILED_METRIC, FailureGuard, UserReward, normalise, step_metrics

REWARD = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if "raise" in solution_str:
        raise ValueError("cannot parse " + solution_str)
    if "hang" in solution_str:
        time.sleep(60)
    if "nan" in solution_str:
        return float("nan")
    if "text" in solution_str:
        return "1.0"
    if "float" in solution_str:
        return 0.25
    right = solution_str.strip().endswith(str(ground_truth))
    return {"score": 1.0 if right else 0.1, "exact": float(right), "source_seen": data_source == "sums",
            "extra_seen": (extra_info or {}).get("k") == 1}
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD)
    return path


@pytest.mark.parametrize("value, expected", [
    (0.5, {"score": 0.5, "acc": 0.5, "failed": 0.0}),
    (True, {"score": 1.0, "acc": 1.0, "failed": 0.0}),
    ({"score": 1, "acc": 0, "part": 0.5, "note": "x", "pred": 7}, {"score": 1.0, "acc": 0.0, "failed": 0.0,
                                                                   "part": 0.5, "pred": "7"}),
])
def test_a_number_or_a_dict_with_a_score_is_a_result(value, expected):
    assert normalise(value) == (expected, None)


@pytest.mark.parametrize("value, why", [
    (math.nan, "not a finite number"), (math.inf, "not a finite number"), ("1.0", "is a str"),
    (None, "NoneType, not a number"), ({"exact": 1.0}, "dict without 'score'"), ({"score": "high"}, "its 'score'"),
])
def test_anything_else_is_no_score(value, why):
    result, error = normalise(value)
    assert result is None and why in error


def test_fixed_components_give_every_result_the_same_keys():
    assert normalise({"score": 1, "a": 1, "b": 2}, ("a", "c"))[0] == {"score": 1.0, "acc": 1.0, "failed": 0.0,
                                                                       "a": 1.0, "c": 0.0}


def test_calls_run_in_a_worker_and_every_failure_scores_zero_and_is_counted(reward_file, capfd):
    reward = UserReward(str(reward_file), timeout_s=2)
    ok = reward("sums", "so 4", "4", {"k": 1})
    assert ok == {"score": 1.0, "acc": 1.0, "failed": 0.0, "exact": 1.0, "source_seen": 1.0, "extra_seen": 1.0}
    assert reward("sums", "float", "4")["score"] == 0.25
    for response in ("raise", "nan", "text"):
        assert reward("sums", response, "4") == {"score": 0.0, "acc": 0.0, "failed": 1.0}
    assert "ValueError: cannot parse raise (at my_reward.py:" in capfd.readouterr().err  # the first failure, once
    started = time.monotonic()
    assert reward("sums", "hang", "4")["failed"] == 1.0
    assert time.monotonic() - started < 10  # stopped at timeout_s, its worker replaced:
    assert reward("sums", "so 4", "4")["score"] == 1.0
    _, error = reward.score_or_error("sums", "hang", "4")
    assert "timed out after 2s (reward.timeout_s)" in error


@pytest.mark.parametrize("path, name, message", [
    ("missing.py", "compute_score", "FileNotFoundError"),
    ("my_reward.py", "score_it", "it defines no 'score_it' (callables there: compute_score)"),
    ("imports_missing.py", "compute_score", "ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    ("no_such_package_xyz.module", "compute_score", "ModuleNotFoundError"),
])
def test_a_function_that_cannot_be_imported_fails_in_one_line(tmp_path, reward_file, path, name, message):
    (tmp_path / "imports_missing.py").write_text("import no_such_package_xyz\n")
    target = path if "/" not in path and not path.endswith(".py") else str(tmp_path / path)
    with pytest.raises(ConfigError, match="cannot be used") as raised:
        UserReward(target, name).check()
    assert message in str(raised.value) and "reward.path" in str(raised.value) and "\n" not in str(raised.value)


def test_a_module_on_the_path_works_too(tmp_path, monkeypatch):
    (tmp_path / "team_rewards").mkdir()
    (tmp_path / "team_rewards" / "__init__.py").write_text("")
    (tmp_path / "team_rewards" / "sums.py").write_text("def judge(data_source, solution_str, ground_truth, "
                                                       "extra_info=None):\n    return 0.75\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert UserReward("team_rewards.sums", "judge")("x", "y", "z")["score"] == 0.75


def test_a_function_failing_on_every_row_of_the_first_step_stops_the_run(reward_file):
    reward = UserReward(str(reward_file))
    guard = FailureGuard(reward, first_rows=4)
    guard.check([reward("s", "raise", "1")] * 2)  # half a step: not yet
    with pytest.raises(ConfigError, match=r"failed on every row of the first step \(4 rows; first: ValueError"):
        guard.check([reward("s", "raise", "1")] * 2)
    lucky = FailureGuard(reward, first_rows=4)
    lucky.check([reward("s", "raise", "1"), reward("s", "so 1", "1")])
    lucky.check([reward("s", "raise", "1")] * 8)  # one success in the first step: failures later only count


def test_trl_gets_one_score_function_that_logs_components_and_failures(tmp_path, reward_file):
    cfg = load_config([], ["dataset.name=custom", "dataset.task=sums", f"dataset.train_files=[{tmp_path}/a.jsonl]",
                           f"dataset.test_files=[{tmp_path}/b.jsonl]", f"reward.path={reward_file}",
                           "algorithm.train_batch_size=1", "algorithm.rollouts=2"], env={})
    (funcs,), weights = user_reward_functions(cfg)
    assert weights == [1.0] and funcs.__name__ == "score"
    logged = {}
    scores = funcs(prompts=["q", "q"], completions=[[{"role": "assistant", "content": "so 4"}], "raise"],
                   data_source=["sums", "sums"], reward_model=[{"ground_truth": "4"}] * 2, extra_info=[{"k": 1}, {}],
                   log_metric=lambda name, value: logged.__setitem__(name, value))
    assert scores == [1.0, 0.0]
    assert logged[FAILED_METRIC] == 1.0 and logged["rewards/exact/mean"] == 0.5
    assert "rewards/score/mean" not in logged  # TRL logs the function itself
    assert run_scorer(cfg) == UserReward(str(reward_file))


def test_step_metrics_count_failures_only_for_a_users_function():
    rows = [{"score": 1.0, "acc": 1.0, "failed": 0.0, "exact": 1.0}, {"score": 0.0, "acc": 0.0, "failed": 1.0}]
    assert step_metrics(rows) == {"rewards/exact/mean": 0.5, FAILED_METRIC: 1.0}
    assert FAILED_METRIC not in step_metrics([{"score": 1.0, "correctness": 1.0}], count_failures=False)


def test_score_file_with_the_users_function_shows_why_a_line_failed(tmp_path, reward_file):
    f = tmp_path / "responses.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in [
        {"solution_str": "so 4", "ground_truth": "4", "extra_info": {"k": 1}},
        {"solution_str": "raise", "ground_truth": "4"}, {"solution_str": "x"}]))
    out = list(score_file("sums", f, UserReward(str(reward_file))))
    assert out[0]["score"]["exact"] == 1.0 and out[0]["score"]["source_seen"] == 1.0 and "error" not in out[0]
    assert out[1]["score"]["failed"] == 1.0 and "line 2: ValueError: cannot parse raise" in out[1]["error"]
    assert out[2] == {"line": 3, "error": "line 3 lacks ground_truth"}
