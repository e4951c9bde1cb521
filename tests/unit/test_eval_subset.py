import pandas as pd
import pytest

from verl_grpo.errors import DataError
from verl_grpo.evaluate.problems import select_subset, subset_digest, to_problems


def test_subset_is_seeded_sorted_and_sized():
    chosen = select_subset(1000, 50, seed=0)
    assert chosen == select_subset(1000, 50, seed=0)
    assert chosen == sorted(chosen) and len(set(chosen)) == 50 and all(0 <= i < 1000 for i in chosen)
    assert chosen != select_subset(1000, 50, seed=1)


def test_no_limit_or_a_large_limit_takes_every_row():
    assert select_subset(5, None, seed=0) == [0, 1, 2, 3, 4]
    assert select_subset(5, 9, seed=0) == [0, 1, 2, 3, 4]
    assert select_subset(0, 3, seed=0) == []


def frame():
    return pd.DataFrame([
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"q{i}"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": str(i)},
         "extra_info": {"split": "test", "index": i, "uid": f"test/{i}"}}
        for i in range(4)
    ])


def test_rows_are_flattened_with_stable_ids():
    problems = to_problems(frame(), [1, 3])
    assert [(p.id, p.index, p.ground_truth, p.messages[0]["content"]) for p in problems] == [
        ("test/1", 1, "1", "q1"), ("test/3", 3, "3", "q3")]
    assert subset_digest(problems) == subset_digest(to_problems(frame(), [1, 3]))
    assert subset_digest(problems) != subset_digest(to_problems(frame(), [1, 2]))


def test_missing_columns_name_the_fix():
    with pytest.raises(DataError, match="reward_model.*re-run data preparation"):
        to_problems(frame().drop(columns=["reward_model"]), [0])
