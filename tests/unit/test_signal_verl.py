"""verl's metric names in the signal vocabulary (checked against the installed verl), and the orchestrator's watch
of verl's step lines in plain_steps.train."""

from __future__ import annotations

import inspect

from verl_grpo.config import load_config
from verl_grpo.errors import TrainingError
from verl_grpo.trainers.signal import ALL_TIED, CLIPPED_RATIO, LOSS, MEAN_LENGTH, REWARD, TIED_GROUP_SHARE

VERL_STEP = {"critic/score/mean": 0.0, "critic/score/max": 0.0, "critic/score/min": 0.0,
             "critic/advantages/max": 0.0, "critic/advantages/min": 0.0, "actor/pg_loss": 0.0,
             "response_length/mean": 16.0, "response_length/clip_ratio": 1.0, "actor/lr": 1e-6}


def test_verl_logs_the_names_the_mapping_relies_on():
    from verl.trainer.ppo import metric_utils

    from verl_grpo.trainers.verl.metrics import VERL_NAMES

    source = inspect.getsource(metric_utils)
    for key in [*VERL_NAMES, "critic/score/max", "critic/score/min", "critic/advantages/max",
                "critic/advantages/min"]:
        if key != "actor/pg_loss":  # the actor's own metrics (verl/workers/...)
            assert f'"{key}"' in source, key


def test_verl_figures_in_the_vocabulary():
    from verl_grpo.trainers.verl.metrics import common_figures

    assert common_figures(VERL_STEP) == {REWARD: 0.0, LOSS: 0.0, MEAN_LENGTH: 16.0, CLIPPED_RATIO: 1.0,
                                         ALL_TIED: 1.0}
    varied = {**VERL_STEP, "critic/score/max": 1.0, "critic/advantages/max": 0.7, "critic/advantages/min": -0.7}
    assert common_figures(varied)[ALL_TIED] == 0.0
    tied_apart = {**varied, "critic/advantages/max": 0.0, "critic/advantages/min": 0.0}
    assert common_figures(tied_apart)[ALL_TIED] == 1.0, "groups tied at 0 and at 1: every advantage exactly 0"
    noisy = {**varied, "critic/advantages/max": 0.05, "critic/advantages/min": -0.05}
    assert common_figures(noisy)[ALL_TIED] == 0.0, "float noise is not certainty"
    assert TIED_GROUP_SHARE not in common_figures(VERL_STEP), "verl logs nothing the share follows from"
    assert common_figures({"actor/lr": 1e-6, "critic/score/max": 1.0, "critic/score/min": 0.0}) == {}


def test_verl_records_and_progress_carry_the_vocabulary(tmp_path):
    import json

    from verl_grpo.trainers import get_trainer
    from verl_grpo.trainers.verl.metrics import merged_metrics
    from verl_grpo.trainers.verl.settings import StoreSettings

    settings = StoreSettings(uri=f"file://{tmp_path}", endpoint_url=None, run_id="r", checkpoint_dir=tmp_path / "c")
    settings.metrics_dir.mkdir(parents=True)
    settings.verl_metrics_path.write_text(json.dumps({"step": 1, "data": VERL_STEP}) + "\n")
    (record,) = merged_metrics(settings)
    assert record[ALL_TIED] == 1.0 and record[CLIPPED_RATIO] == 1.0 and record["actor/lr"] == 1e-6

    line = "step:4 - " + " - ".join(f"{k}:{v!r}" for k, v in VERL_STEP.items())
    progress = get_trainer("verl").parse_progress(line, 10)
    assert progress.metrics[ALL_TIED] == 1.0 and progress.metrics[MEAN_LENGTH] == 16.0
    assert progress.metrics[LOSS] == 0.0 and progress.reward == 0.0


# ---- verl: the orchestrator watches its step lines ------------------------------------------------------------------

class FakeJob:
    """A provider whose job prints the given lines and succeeds; records what the pipeline cancels."""

    name = "fake"

    def __init__(self, store, lines: list[str]):
        self.store, self.lines, self.cancelled = store, lines, []

    def submit(self, cluster, spec):
        from verl_grpo.contracts import Job

        return Job(provider="fake", id="1", name="j")

    def logs(self, job, follow=False):
        yield from self.lines

    def status(self, job):
        from verl_grpo.contracts import JobState, TrainResult

        result = TrainResult(run_id="r", final_step=4, checkpoint=None, model_uri="m", metrics_uri="x")
        self.store.write_text(result.model_dump_json(), "runs", "r", "train_result.json")
        return JobState(phase="SUCCEEDED")

    def cancel(self, job):
        self.cancelled.append(job.id)


def verl_line(n: int, score_max: float = 0.0) -> str:
    metrics = {**VERL_STEP, "critic/score/max": score_max, "critic/advantages/max": 0.7 if score_max else 0.0}
    return f"step:{n} - " + " - ".join(f"{k}:{v!r}" for k, v in metrics.items())


def run_pipeline_train(tmp_path, monkeypatch, lines: list[str], *overrides: str, backend: str = "verl"):
    from verl_grpo import plain_steps, providers, trainers
    from verl_grpo.chain import ResolvedRun
    from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
    from verl_grpo.store import Store

    trainer = trainers.get_trainer(backend)
    # planning needs a model and data; the command is never run
    trainer.plan = lambda cfg, *_: TrainSpec(backend=backend, run_id="r", command=["train"],
                                             total_steps=cfg.algorithm.total_steps)
    cfg = load_config(overrides=[f"storage.uri=file://{tmp_path}", f"trainer.backend={backend}",
                                 "algorithm.total_steps=4", "algorithm.max_response_length=16", *overrides], env={})
    provider = FakeJob(Store.from_config(cfg.storage), lines)
    monkeypatch.setattr(providers, "get_provider", lambda name: provider)
    monkeypatch.setattr(trainers, "get_trainer", lambda name: trainer)
    provider.seen = []
    dataset = DatasetVersion(name="gsm8k", hash="h", uri="u", splits={}, counts={})
    cluster = Cluster(provider="fake", name="c", workdir=str(tmp_path), on_this_machine=True)
    try:
        plain_steps.train(ResolvedRun(cfg, "r", False), dataset, cluster, on_line=provider.seen.append)
    except TrainingError as e:
        return provider, e
    return provider, None


def test_pipeline_warns_on_verl_step_lines_without_signal(tmp_path, monkeypatch):
    lines = ["step:0 - val-core/openai/gsm8k/acc/mean@1:0.0", verl_line(1), verl_line(2, score_max=1.0),
             verl_line(3), verl_line(4), verl_line(5)]
    provider, error = run_pipeline_train(tmp_path, monkeypatch, lines, "trainer.no_signal_steps=3")
    assert error is None
    warnings = [line for line in provider.seen if line.startswith("warning:")]
    assert len(warnings) == 1 and provider.seen.index(warnings[0]) == len(provider.seen) - 1
    assert "for 3 consecutive steps (steps 3-5)" in warnings[0]
    assert "responses truncated" in warnings[0] and "(now 16)" in warnings[0]
    assert provider.cancelled == []


def test_pipeline_cancels_a_verl_job_without_signal_on_stop_on_no_signal(tmp_path, monkeypatch):
    lines = [verl_line(1), verl_line(2), verl_line(3)]
    provider, error = run_pipeline_train(tmp_path, monkeypatch, lines, "trainer.no_signal_steps=2",
                                        "trainer.stop_on_no_signal=true")
    assert str(error).startswith("no learning signal for 2 consecutive steps (steps 1-2)")
    assert "trainer.stop_on_no_signal=false" in str(error)
    assert provider.cancelled == ["1"], "follow_job cancels the job the watch stopped"
    assert provider.seen == lines[:2], "nothing is read after the stop"


def test_pipeline_does_not_watch_trl_step_lines(tmp_path, monkeypatch):
    """The TRL worker watches its own steps: the orchestrator must not warn a second time."""
    lines = [f"step {n}/4 reward=0 tied=1 clip=1" for n in (1, 2, 3, 4)]
    provider, error = run_pipeline_train(tmp_path, monkeypatch, lines, "trainer.no_signal_steps=2",
                                        "trainer.stop_on_no_signal=true", backend="trl")
    assert error is None and provider.seen == lines and provider.cancelled == []
