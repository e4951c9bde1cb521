"""Where responses state final answers: regions outside the reasoning, every box, every marker."""

import pytest

from verl_grpo.latex import all_boxed
from verl_grpo.rewards.answers import answer_is_phrases, answer_regions, final_line, hash_answers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"first \boxed{1}, finally \boxed{x^{2}}", ["1", "x^{2}"]),
        (r"\boxed{\boxed{3}} and \fbox{4}", [r"\boxed{3}", "4"]),
        (r"$\boxed 2$ then \boxed", ["2"]),
        (r"\boxed{unbalanced, \boxed{5}", ["5"]),
        (r"\boxed{}", [""]),
        ("no box", []),
    ],
)
def test_all_boxed_reads_every_box_in_order(text, expected):
    assert all_boxed(text) == expected


def test_regions_leave_closed_thinking_out_then_fall_back_to_everything():
    text = "<think>maybe 12</think>\n<answer>18</answer>"
    assert answer_regions(text) == ["\n\n<answer>18</answer>", text]
    assert answer_regions("no thinking") == ["no thinking"]
    assert answer_regions("<think>unclosed 12") == ["<think>unclosed 12"]


def test_markers_and_final_line():
    text = "#### 12\nThe answer is 18.\nAnswer: 7\nthe answer isn't 3\n\n  last 5  \n"
    assert hash_answers(text) == ["12"]
    assert answer_is_phrases(text) == ["18.", "7"]
    assert final_line(text) == "last 5"
    assert final_line(" \n ") is None
