"""MBPP builder: standard splits by task_id, test validation, entry point and ground-truth JSON."""

import ast
import json

import pytest

from verl_grpo.data.mbpp import TEST_INSTRUCTION, entry_point, split_of, to_problem
from verl_grpo.data.schema import RawRecord, Reason, RowRejected


def row(task_id=601, **over):
    data = {
        "task_id": task_id,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\r\n  return tuple(set(a) & set(b))",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    }
    data.update(over)
    return RawRecord(split="all", position=0, uid="all/0", raw=json.dumps(data), data=data)


@pytest.mark.parametrize(
    ("task_id", "split"),
    [(1, "prompt"), (10, "prompt"), (11, "test"), (510, "test"), (511, "val"), (600, "val"), (601, "train"),
     (974, "train"), (0, None), (975, None), (-3, None)],
)
def test_split_of_task_id(task_id, split):
    assert split_of(task_id) == split


def test_split_sizes_match_upstream():
    sizes = {}
    for tid in range(1, 975):
        sizes[split_of(tid)] = sizes.get(split_of(tid), 0) + 1
    assert sizes == {"prompt": 10, "test": 500, "val": 90, "train": 374}


def test_problem_prompt_shows_first_test_and_ground_truth_is_json():
    p = to_problem(row(task_id=520))
    assert p.split == "val" and p.uid == "task/520"
    first_test = "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"
    assert p.question.endswith(f"{TEST_INSTRUCTION}\n{first_test}")
    truth = json.loads(p.ground_truth)
    assert truth == {"test_list": row().data["test_list"], "test_setup_code": "", "challenge_test_list": []}
    assert p.extra["entry_point"] == "similar_elements" and p.extra["task_id"] == 520


def test_entry_point_prefers_function_defined_by_reference_code():
    test = ast.parse("assert math.isclose(wrap(area(2)), 3.0)").body[0]
    assert entry_point(test, "def area(x):\n  return x") == "area"
    assert entry_point(test, "") == "wrap"  # no reference code: the first non-builtin call
    assert entry_point(ast.parse("assert sorted([1]) == [1]").body[0], "") is None


def test_null_challenge_and_setup_are_normalised():
    p = to_problem(row(challenge_test_list=None, test_setup_code=None))
    assert json.loads(p.ground_truth)["challenge_test_list"] == []
    assert json.loads(p.ground_truth)["test_setup_code"] == ""


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"test_list": []}, Reason.MISSING_TESTS),
        ({"test_list": None}, Reason.MISSING_TESTS),
        ({"test_list": ["  "]}, Reason.MISSING_TESTS),
        ({"test_list": ["assert f(1 == 2"]}, Reason.INVALID_TESTS),
        ({"test_list": ["print(f(1))"]}, Reason.INVALID_TESTS),
        ({"test_list": ["assert f(1) == 1; assert f(2) == 2"]}, Reason.INVALID_TESTS),
        ({"test_list": "assert f(1) == 1"}, Reason.INVALID_TESTS),
        ({"test_list": ["assert True"]}, Reason.INVALID_TESTS),
        ({"challenge_test_list": ["assert f("]}, Reason.INVALID_TESTS),
        ({"test_setup_code": "import ("}, Reason.INVALID_TESTS),
        ({"text": ""}, Reason.MISSING_QUESTION),
        ({"task_id": 0}, Reason.INVALID_TASK_ID),
        ({"task_id": "601"}, Reason.INVALID_TASK_ID),
        ({"task_id": None}, Reason.INVALID_TASK_ID),
    ],
)
def test_invalid_rows(over, reason):
    with pytest.raises(RowRejected) as exc:
        to_problem(row(**over))
    assert exc.value.reason == reason
