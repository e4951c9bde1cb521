"""What the end of `verl-grpo run` prints and the Prefect summary artifact shows: the learning and every metric."""

from metrics_lines import COMPONENTS, trl_lines
from registry_runs import outcome

from verl_grpo.comparison import MetricChange
from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion, EvalReport, ModelVersion, RunCost, TrainResult
from verl_grpo.reward_curve import reward_curve
from verl_grpo.summary import STATE_MESSAGE_CHARS, state_message, summary_dict, summary_markdown
from verl_grpo_cli.main import _print_where_to_look

PNG = "/state/store/runs/run-1/reward_curve.png"
METRICS = {"accuracy": 0.3, "mean_score": 0.4, "format_rate": 0.5, "mean_response_tokens": 80.0,
           "truncated_rate": 0.1, **{f"reward/{c}": 0.2 for c in COMPONENTS}}


def _summary(curve, png=PNG, health=()):
    def report(scale):
        return EvalReport(model_uri="m", split="test", n=50, metrics={k: v * scale for k, v in METRICS.items()},
                          table_uri="t", settings_key="s")

    trained, base = report(1.0), report(0.5)
    changes = [MetricChange(m, base.metrics[m], trained.metrics[m], 0.01, "Wilcoxon") for m in sorted(METRICS)]
    dataset = DatasetVersion(name="gsm8k", hash="h1", uri="file:///d", splits={}, counts={})
    result = TrainResult(run_id="run-1", final_step=40, checkpoint=None, model_uri="file:///m",
                         metrics_uri="file:///m.jsonl")
    version = ModelVersion(name="verl-grpo-gsm8k", version="2", aliases=["challenger"], mlflow_run_id="abc",
                           decision="kept champion v1: v2 is not better", health=list(health))
    return summary_dict(outcome(RunConfig(), dataset, result, trained, base, version=version), changes, curve, png)


def test_cli_prints_every_metric_the_reward_curve_and_its_png(capsys):
    _print_where_to_look(_summary(reward_curve(trl_lines(40, tied=True))), RunConfig())

    out = capsys.readouterr().out
    for metric in METRICS:
        assert f"    {metric}: " in out and "Wilcoxon p=0.01" in out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("    reward per training step ("))
    assert "(40 steps, each row the mean of 2 steps)" in lines[start]
    assert lines[start + 1].split() == ["step", "reward", *COMPONENTS, "length", "clipped", "tied"]
    assert len([line for line in lines[start + 2:] if line.split()[0].isdigit()]) == 20
    assert lines[start + 22] == f"    reward curve PNG: {PNG}"


def test_cli_says_when_no_reward_was_logged(capsys):
    _print_where_to_look(_summary(None, ""), RunConfig())

    out = capsys.readouterr().out
    assert "reward curve: no reward was logged per step" in out and "PNG" not in out


def test_summary_artifact_shows_the_curve_as_a_table_and_names_the_png():
    md = summary_markdown(_summary(reward_curve(trl_lines(3))), "[abc](http://x)")

    assert "## Learning\n\nreward per training step (3 steps): the weighted total, then each component:\n\n| step | reward | correctness |" in md
    assert "| 3 | 0.030 | 0.003 |" in md
    assert f"PNG: `{PNG}`" in md and "| reward_curve |" not in md  # the curve is a table, not a fact
    assert "| reward/no_trailing | 0.1000 | 0.2000 | 0.1000 | Wilcoxon p=0.01 |" in md


def test_the_actual_cloud_cost_is_printed_and_the_local_provider_says_nothing(capsys):
    cost = RunCost(node_hours=4.5, cost_usd=65.0, run_hours=2.03, jobs=2, recoveries=1, pricing="spot",
                   priced_at="spot runpod/US")
    dataset = DatasetVersion(name="gsm8k", hash="h1", uri="file:///d", splits={}, counts={})
    result = TrainResult(run_id="run-1", final_step=40, checkpoint=None, model_uri="file:///m", metrics_uri="file:///m")
    report = EvalReport(model_uri="m", split="test", n=50, metrics={"accuracy": 0.3}, table_uri="t", settings_key="s")
    sky = RunConfig.model_validate({"infra": {"provider": "skypilot"}})
    version = ModelVersion(name="v", version="2", mlflow_run_id="abc", cloud_cost=cost)
    summary = summary_dict(outcome(sky, dataset, result, report, report, version=version))
    _print_where_to_look(summary, sky)

    out = capsys.readouterr().out
    assert "  cloud cost        4.50 node-hours (2.03 h running, 1 recoveries, 2 job(s)): $65.00 at spot runpod/US" in out
    assert "| cloud_cost | 4.50 node-hours" in summary_markdown(summary, "abc")
    local = summary_dict(outcome(RunConfig(), dataset, result, report, report,
                                 version=version.model_copy(update={"cloud_cost": None})))
    assert "cloud_cost" not in local
    assert summary["warnings"] == []
    # A launch that went on demand though infra.spot=true asked for spot is a warning of the run, as no signal is.
    fallback = "infra.spot=true but no catalog offer of H100:8 on lambda sells spot: launching on-demand"
    fell_back = summary_dict(outcome(sky, dataset, result, report, report, version=version.model_copy(
        update={"cloud_cost": cost.model_copy(update={"pricing": "on-demand", "warnings": [fallback]})})))
    assert fell_back["warnings"] == [fallback] and state_message(fell_back).startswith(f"Warning: {fallback}")
    assert f"**Warning:** {fallback}" in summary_markdown(fell_back, "abc")


def test_a_run_without_learning_signal_is_a_warning_in_the_artifact_and_the_cli(capsys):
    """A page shows the finding once: as the warning line below the decision."""
    finding = "no learning signal for 3 consecutive steps (steps 3-5): the rollouts of every prompt scored alike"
    summary = _summary(None, "", health=[finding])
    assert summary["warnings"] == [finding]
    markdown = summary_markdown(summary, "[abc](http://x)")
    assert "**Decision:** kept champion v1: v2 is not better\n" in markdown
    assert f"**Warning:** {finding}" in markdown
    _print_where_to_look(summary, RunConfig())
    out = capsys.readouterr().out
    assert f"  warning           {finding}" in out and out.count(finding) == 1
    assert "(kept champion v1: v2 is not better)" in out
    # and the flow run's final state says it first, so the run does not read as a plain success in the runs list
    assert state_message(summary) == f"Warning: {finding} Decision: kept champion v1: v2 is not better"
    assert state_message(_summary(None, "")) == "Decision: kept champion v1: v2 is not better"
    long = state_message(_summary(None, "", health=[finding * 20]))
    assert len(long) == STATE_MESSAGE_CHARS and long.endswith("…")
