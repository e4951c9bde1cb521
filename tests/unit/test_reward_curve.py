import json

import pytest
from metrics_lines import COMPONENTS, trl_lines

from verl_grpo.reward_curve import curve_markdown, curve_text, reward_curve, reward_series


def test_short_run_has_one_row_per_step_with_each_component_and_the_diagnostics():
    curve = reward_curve(trl_lines(3))

    assert curve["columns"] == ["step", "reward", *COMPONENTS, "length", "clipped"]
    assert (curve["steps"], curve["window"]) == (3, 1)
    assert curve["rows"][2] == [3, 0.03, *[0.003] * 5, 63.0, 0.5]
    text = curve_text(curve).splitlines()
    assert text[0] == "reward per training step (3 steps): the weighted total, then each component"
    assert text[1].split() == ["step", "reward", *COMPONENTS, "length", "clipped"]
    assert text[4].split() == ["3", "0.030", *["0.003"] * 5, "63.0", "0.500"]


def test_long_run_is_averaged_into_at_most_twenty_rows_and_shows_tied_groups():
    curve = reward_curve(trl_lines(100, tied=True))

    assert curve["columns"][-1] == "tied" and (curve["steps"], curve["window"]) == (100, 5)
    assert len(curve["rows"]) == 20
    assert curve["rows"][0][:2] == [5, pytest.approx(0.03)]  # mean of steps 1..5, labelled by the last
    assert curve["rows"][-1][:2] == [100, pytest.approx(0.98)]
    assert "each row the mean of 5 steps" in curve_text(curve)
    md = curve_markdown(curve).splitlines()
    assert md[2] == "| step | reward | " + " | ".join(COMPONENTS) + " | length | clipped | tied |"
    assert len(md) == 4 + 20


def test_verl_names_a_repeated_step_and_a_torn_last_line():
    lines = [json.dumps({"step": 1, "critic/score/mean": 0.1, "response_length/mean": 200.0}),
             json.dumps({"step": 2, "critic/score/mean": 0.2}),
             json.dumps({"step": 2, "critic/score/mean": 0.4, "response_length/clip_ratio": 0.25}),
             '{"step": 3, "critic/sco']

    curve = reward_curve(lines)

    assert curve["columns"] == ["step", "reward", "length", "clipped"]
    assert curve["rows"] == [[1, 0.1, 200.0, None], [2, 0.4, None, 0.25]]
    assert curve_text(curve).splitlines()[2].split() == ["1", "0.100", "200.0", "-"]
    assert reward_series(lines) == {"reward": [(1, 0.1), (2, 0.4)]}


def test_no_reward_no_curve_and_a_bad_row_budget_is_one_line():
    assert reward_curve(["", json.dumps({"step": 1, "loss": 0.3})]) is None
    assert reward_curve([]) is None
    with pytest.raises(ValueError, match="max_rows must be at least 1, got 0"):
        reward_curve(trl_lines(2), max_rows=0)
