"""Base → warm start → trained: each step's paired test on the same problems, and GRPO's own share as one line in
the CLI's output, the summary artifact and (through the registry) the version's decision."""

from __future__ import annotations

import pandas as pd
import pytest
from registry_runs import outcome

from verl_grpo.comparison import EvalTables, compare_to_base, grpo_line, side_by_side
from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, TrainResult
from verl_grpo.store import Store
from verl_grpo.summary import outcome_lines, summary_dict, summary_markdown
from verl_grpo_cli.main import _print_where_to_look

N = 60


def _report(store: Store, name: str, correct: list[int], score: list[float]) -> EvalReport:
    table = pd.DataFrame({"id": [f"p{i}" for i in range(N)], "correct": correct, "score": score})
    path = store.path(f"{name}.parquet")
    store.fs.makedirs(store.path(), exist_ok=True)
    with store.fs.open(path, "wb") as f:
        table.to_parquet(f, index=False)
    metrics = {"accuracy": sum(correct) / N, "mean_score": sum(score) / N, "n": float(N)}
    return EvalReport(model_uri=name, split="test", n=N, metrics=metrics, table_uri=store.url(f"{name}.parquet"),
                      settings_key="k")


@pytest.fixture
def three(tmp_path):
    """The SFT phase lifts the format score on every problem; GRPO adds correctness on a third of them."""
    store = Store(f"file://{tmp_path / 'store'}")
    base = _report(store, "base", [0] * N, [0.0] * N)
    warm = _report(store, "warm", [0] * N, [0.3 + 0.001 * i for i in range(N)])
    gains = [1 if i % 3 == 0 else 0 for i in range(N)]
    trained = _report(store, "trained", gains, [0.3 + 0.001 * i + 0.6 * g for i, g in enumerate(gains)])
    return store, base, warm, trained


def test_each_step_has_its_own_paired_test(three):
    store, base, warm, trained = three
    by_metric = {c.metric: c for c in compare_to_base(trained, base, EvalTables(store), warm)}

    score = by_metric["mean_score"]
    assert score.warm_start_delta == pytest.approx(warm.metrics["mean_score"])
    assert score.grpo_delta == pytest.approx(0.6 * 20 / N)
    assert score.test == "Wilcoxon" and score.warm_start_p_value < 1e-6 and score.grpo_p_value < 1e-3
    acc = by_metric["accuracy"]
    assert acc.test == "McNemar" and acc.warm_start_p_value == 1.0  # no problem changed between base and warm start
    assert acc.grpo_p_value == pytest.approx(2 * 0.5 ** 20)  # 20 discordant pairs, all for the trained model
    assert "n" not in by_metric
    # Without a warm start nothing of it is computed.
    plain = {c.metric: c for c in compare_to_base(trained, base, EvalTables(store))}["mean_score"]
    assert (plain.warm_start, plain.grpo_p_value, plain.grpo_delta) == (None, None, None)
    assert plain.p_value == pytest.approx(score.p_value)


def test_grpo_line_states_the_total_reward_step_and_its_p_value(three):
    store, base, warm, trained = three
    line = grpo_line(compare_to_base(trained, base, EvalTables(store), warm))
    assert line.startswith("GRPO added +0.2000 mean_score over the warm start (0.3295 -> 0.5295, Wilcoxon p=")
    assert grpo_line(compare_to_base(trained, base, EvalTables(store))) == ""
    same = grpo_line(compare_to_base(warm, base, EvalTables(store), warm))
    assert same == "GRPO added +0.0000 mean_score over the warm start (0.3295 -> 0.3295, Wilcoxon p=1)"


def _summary(three, with_warm: bool) -> dict:
    store, base, warm, trained = three
    dataset = DatasetVersion(name="gsm8k", hash="h1", uri="file:///d", splits={}, counts={})
    result = TrainResult(run_id="run-1", final_step=40, checkpoint=None, model_uri="file:///m", metrics_uri="file:///m")
    version = ModelVersion(name="verl-grpo-gsm8k", version="1", mlflow_run_id="abc", decision="first")
    warm = warm if with_warm else None
    return summary_dict(outcome(RunConfig(), dataset, result, trained, base, warm, version=version),
                        compare_to_base(trained, base, EvalTables(store), warm))


def test_the_cli_and_the_artifact_show_three_columns_and_grpos_share(three, capsys):
    summary = _summary(three, with_warm=True)
    assert summary["warm_start_accuracy"] == 0.0 and summary["grpo"].startswith("GRPO added +0.2000 mean_score")
    lines = outcome_lines(summary)
    assert lines[2] == summary["grpo"]
    [score] = [line for line in lines if line.startswith("mean_score: ")]
    assert score.startswith("mean_score: 0.0000 -> 0.3295 -> 0.5295 (warm start 0.3295, Wilcoxon p=")
    assert "; GRPO 0.2000, Wilcoxon p=" in score

    _print_where_to_look(summary, RunConfig())
    out = capsys.readouterr().out
    assert "  base -> warm start -> trained, per eval metric (paired test on the same problems):" in out
    assert f"  GRPO's own share  {summary['grpo']}" in out
    assert out.count(summary["grpo"]) == 1  # once, not again among the metric lines

    md = summary_markdown(summary, "abc")
    assert f"**GRPO's own share:** {summary['grpo']}" in md
    assert "| metric | base | warm start | trained | warm start - base | p-value | trained - warm start (GRPO) |" in md
    assert "| accuracy | 0.0000 | 0.0000 | 0.3333 | 0.0000 | McNemar p=1 | 0.3333 | McNemar p=1.91e-06 |" in md


def test_a_run_without_warm_start_keeps_two_columns(three, capsys):
    summary = _summary(three, with_warm=False)
    assert summary["grpo"] == "" and "warm_start_accuracy" not in summary
    assert not any("warm_start" in m for m in summary["metrics"])
    _print_where_to_look(summary, RunConfig())
    out = capsys.readouterr().out
    assert "  base -> trained, per eval metric" in out and "GRPO's own share" not in out
    assert "| metric | base | trained | delta | p-value |" in summary_markdown(summary, "abc")


def test_side_by_side_puts_each_models_response_beside_the_others_and_flipped_problems_first():
    def table(responses, correct):
        prompts = [f"<|im_start|>system\nBe careful.<|im_end|>\n<|im_start|>user\nq{i}<|im_end|>\n" for i in "abc"]
        return pd.DataFrame({"id": ["a", "b", "c"], "prompt": prompts, "ground_truth": ["1", "2", "3"],
                             "response": responses, "correct": correct,
                             "score": [float(c) + 0.4000000096857548 for c in correct]})

    base = table(["b-a", "b-b", "b-c"], [True, False, False])
    warm = table(["w-a", "w-b", "w-c"], [True, True, False])
    trained = table(["t-a", "t-b", "t-c"], [False, True, False])
    rows = side_by_side(trained, base, warm).to_dict("records")
    assert [(r["id"], r["flip"]) for r in rows] == [("b", "fixed"), ("a", "broke"), ("c", "")]
    # the question leads (not the chat template), scores to 3 decimals, the id last
    assert list(rows[0].items()) == [
        ("question", "qb"), ("ground_truth", "2"), ("base_response", "b-b"), ("base_correct", False),
        ("base_score", 0.4), ("warm_start_response", "w-b"), ("warm_start_correct", True), ("warm_start_score", 1.4),
        ("trained_response", "t-b"), ("trained_correct", True), ("trained_score", 1.4), ("flip", "fixed"),
        ("id", "b")]
    assert "warm_start_response" not in side_by_side(trained, base).columns


def test_a_run_with_the_search_tool_states_what_the_tool_carries(three, capsys):
    """The trained model evaluated again without the tool: the same problems, McNemar on right/wrong, and the share
    of answers that searched; in the CLI, the artifact and the outcome lines."""
    from verl_grpo.comparison import tools_line
    from verl_grpo.registry.register import without_tools_metrics

    store, base, warm, trained = three
    searched = [1 if i % 2 == 0 else 0 for i in range(N)]
    with_tool = _report(store, "with-tool", [1 if i % 3 == 0 else 0 for i in range(N)], [0.5] * N)
    table = pd.read_parquet(store.path("with-tool.parquet")).assign(searched=searched)
    table.to_parquet(store.path("with-tool.parquet"), index=False)
    with_tool = with_tool.model_copy(update={"metrics": {**with_tool.metrics, "tool_use_rate": 0.5}})
    without = _report(store, "without-tool", [0] * N, [0.5] * N)

    changes = compare_to_base(with_tool, without, EvalTables(store))
    line = tools_line(changes, with_tool)
    assert line == ("search tool: used in 50% of the trained model's answers; accuracy 0.3333 with it, 0.0000 "
                    "without (McNemar p=1.91e-06)")
    assert tools_line([], with_tool) == ""
    metrics = without_tools_metrics(without, changes)
    assert metrics["without_tools.accuracy"] == 0.0
    assert metrics["pvalue.with_vs_without_tools.accuracy"] == pytest.approx(2 * 0.5 ** 20)

    dataset = DatasetVersion(name="squad", hash="h1", uri="file:///d", splits={}, counts={})
    result = TrainResult(run_id="run-1", final_step=40, checkpoint=None, model_uri="file:///m", metrics_uri="file:///m")
    version = ModelVersion(name="verl-grpo-squad", version="1", mlflow_run_id="abc", decision="first")
    summary = summary_dict(outcome(RunConfig(), dataset, result, with_tool, base, warm, version=version),
                           compare_to_base(with_tool, base, EvalTables(store), warm), without_tools=changes)
    assert summary["tools"] == line and line in outcome_lines(summary)
    _print_where_to_look(summary, RunConfig())
    out = capsys.readouterr().out
    assert f"  search tool       {line.removeprefix('search tool: ')}" in out and out.count(line[13:]) == 1
    assert f"**Search tool:** {line.removeprefix('search tool: ')}" in summary_markdown(summary, "abc")
