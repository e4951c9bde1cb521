"""Training samples: which steps keep them, how they are picked and cut, how they travel with checkpoints and
reach the store, and the flat rows the MLflow table shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_grpo.config import load_config
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store
from verl_grpo.trainers.worker.metrics import WorkerLogs, read_metrics
from verl_grpo.trainers.worker.samples import (
    RESPONSE_CHARS,
    Sample,
    first_groups,
    group_advantages,
    sample_rows,
    sampled_step,
    stored_samples,
)


def sample(prompt: str = "What is 2+3?", response: str = "<think>2+3=5</think> 5", **kw) -> Sample:
    fields = {"reward": 0.75, "advantage": 0.5, "truncated": False, "components": {"correctness": 1.0}} | kw
    return Sample(prompt, response, **fields)


def test_every_nth_step_is_sampled_and_zero_samples_none():
    assert [s for s in range(1, 7) if sampled_step(s, 1)] == [1, 2, 3, 4, 5, 6]
    assert [s for s in range(1, 7) if sampled_step(s, 3)] == [3, 6]
    assert not any(sampled_step(s, 0) for s in range(1, 7))


def test_the_knobs_are_validated_in_one_line():
    cfg = load_config(overrides=["trainer.log_samples_every=5", "trainer.samples_per_step=8"], env={})
    assert (cfg.trainer.log_samples_every, cfg.trainer.samples_per_step) == (5, 8)
    with pytest.raises(ConfigError, match="trainer.samples_per_step"):
        load_config(overrides=["trainer.samples_per_step=0"], env={})


@pytest.mark.parametrize("rewards", [[1.0, 0.0, 0.5, 0.5], [0.2, 0.2], [0.7], [0.0, 1.0, 1.0, 1.0, 0.25]])
def test_the_shown_advantages_are_the_ones_the_loop_trains_with(rewards):
    import torch

    from verl_grpo.trainers.loop.objective import group_advantages as trained

    shown = group_advantages(rewards)
    assert shown == pytest.approx(trained(torch.tensor([rewards], dtype=torch.float64))[0].tolist())
    assert (sum(shown) == pytest.approx(0.0)) and (len(set(rewards)) > 1 or shown == [0.0] * len(rewards))


def test_whole_groups_come_first_and_the_last_is_cut_to_fit():
    a, b, c = ([sample(prompt=p, response=f"{p}{i}") for i in range(3)] for p in "abc")
    picked = first_groups([a, b, c], 4)
    assert [s.response for s in picked] == ["a0", "a1", "a2", "b0"]
    assert first_groups([a], 10) == a


def test_a_record_cuts_runaway_text_and_drops_what_the_backend_lacks():
    long = "x" * (RESPONSE_CHARS + 500)
    record = sample(response=long).record()
    assert record["response"].startswith("x" * RESPONSE_CHARS) and record["response"].endswith("[500 more chars]")
    assert "policy_version" not in record and "source" not in record  # on-policy trainers have neither
    loop = sample(policy_version=3, source="replay").record()
    assert (loop["policy_version"], loop["source"]) == (3, "replay")


def test_rows_are_flat_with_a_column_per_reward_component():
    records = [{"step": 2, "samples": [sample().record()]},
               {"step": 4, "samples": [sample(components={"correctness": 0.0, "format": 1.0}).record()] * 2}]
    rows = sample_rows(records)
    assert [r["step"] for r in rows] == [2, 4, 4]
    assert rows[0]["reward/correctness"] == 1.0 and "components" not in rows[0]
    assert rows[1]["reward/format"] == 1.0 and rows[1]["prompt"] == "What is 2+3?"


def test_worker_logs_travel_inside_a_checkpoint_and_come_back_up_to_its_step(tmp_path):
    logs = WorkerLogs(tmp_path / "work")
    (tmp_path / "work").mkdir()
    logs.reset()
    for step in (1, 2, 3):
        logs.metrics.append({"step": step, "reward": step / 10})
        logs.samples.append({"step": step, "samples": [sample().record()]})
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    logs.copy_into(checkpoint)
    assert [r["step"] for r in read_metrics(checkpoint / "samples.jsonl")] == [1, 2, 3]

    resumed = WorkerLogs(tmp_path / "work")
    resumed.reset(checkpoint, upto_step=2)  # a later attempt restores the checkpoint of step 2
    assert [r["step"] for r in resumed.metrics.records()] == [1, 2]
    assert [r["step"] for r in resumed.samples.records()] == [1, 2]


def test_worker_logs_publish_beside_the_run_and_read_back_in_step_order(tmp_path):
    store = Store(f"file://{tmp_path / 'store'}")
    logs = WorkerLogs(tmp_path)
    logs.reset()
    logs.metrics.append({"step": 1, "reward": 0.1})
    for step in (4, 2):  # read back sorted, whatever the order of the lines
        logs.samples.append({"step": step, "samples": [sample().record()]})
    calls = []

    def retrying(what, fn):
        calls.append(what)
        return fn()

    uri = logs.publish(store, "r1", retrying)
    assert uri == store.url("runs", "r1", "metrics.jsonl")
    assert calls == ["upload samples", "upload metrics"]  # both through the store's retries
    assert [r["step"] for r in stored_samples(store, "r1")] == [2, 4]
    assert stored_samples(store, "another-run") == []
    assert json.loads(store.read_text("runs", "r1", "metrics.jsonl"))["reward"] == 0.1


# --- verl: its own rollout dumps (trainer.rollout_data_dir) ---------------------------------------------------------

def _dump(directory, step: int, prompts: int = 3, n: int = 2) -> None:
    """A dump laid out as verl's RayPPOTrainer._write_generations writes it (input, output, gts, score, step, then the
    reward's extra fields; a prompt's n rollouts consecutive), with our gsm8k scorer's fields. The stand-in's run
    (tests/integration/test_main_ppo_cpu.py) writes its dumps with verl's own writer."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{step}.jsonl", "w") as f:
        for i in range(prompts * n):
            score = float(i % n)
            f.write(json.dumps({"input": f"question {i // n}", "output": f"answer {i}", "gts": "5", "score": score,
                                "step": step, "correctness": score, "strict_format": 1.0, "acc": score,
                                "pred": "5"}) + "\n")


def test_verl_dumps_become_samples_of_whole_groups_with_advantages(tmp_path):
    from verl_grpo.trainers.verl.samples import SamplesPlan, dump_samples

    _dump(tmp_path, 3)
    plan = SamplesPlan(every=1, per_step=3, group_size=2)
    samples = dump_samples(tmp_path / "3.jsonl", plan)
    assert [s.prompt for s in samples] == ["question 0", "question 0", "question 1"]
    assert [s.reward for s in samples] == [0.0, 1.0, 0.0]
    assert samples[0].advantage == pytest.approx(-samples[1].advantage) and samples[1].advantage > 0
    assert samples[0].components == {"correctness": 0.0, "strict_format": 1.0}  # not score, acc, step or pred
    assert samples[0].truncated is None and "truncated" not in samples[0].record()


def test_verl_samples_merge_history_and_dumps_and_the_dumps_shrink(tmp_path):
    from verl_grpo.trainers.atomic_files import write_jsonl_atomic
    from verl_grpo.trainers.verl.samples import SamplesPlan, merged_samples, trim_dumps

    dumps, history = tmp_path / "rollouts", tmp_path / "history.jsonl"
    write_jsonl_atomic(history, [{"step": 1, "samples": [sample().record()]}, {"step": 5, "samples": []}])
    for step in (2, 3, 4):
        _dump(dumps, step)
    plan = SamplesPlan(every=2, per_step=3, group_size=2)
    merged = merged_samples(history, dumps, plan, upto_step=4)
    assert [r["step"] for r in merged] == [1, 2, 4]  # history up to 4, then the sampled dumps (every 2nd step)
    assert len(merged[1]["samples"]) == 3

    trim_dumps(dumps, plan, before_step=4)
    assert sorted(p.name for p in dumps.iterdir()) == ["2.jsonl", "4.jsonl"]  # step 3 was not sampled
    assert len((dumps / "2.jsonl").read_text().splitlines()) == 4  # two whole groups hold the 3 samples
    assert len((dumps / "4.jsonl").read_text().splitlines()) == 6  # the current step's dump may still be written
    assert merged_samples(history, dumps, plan, upto_step=4) == merged
    assert [r["step"] for r in merged_samples(history, dumps, None)] == [1, 5]  # no plan: the history alone


def test_verl_launch_dumps_rollouts_beside_the_checkpoints_and_tells_the_nodes_what_to_keep(tmp_path):
    from verl_grpo.trainers.verl.samples import SamplesPlan
    from verl_grpo.trainers.verl.settings import StoreSettings, checkpoint_env

    cfg = load_config(overrides=["trainer.log_samples_every=2", "trainer.samples_per_step=6", "algorithm.rollouts=4"],
                      env={})
    plan = SamplesPlan.of(cfg)
    env = {**checkpoint_env("file:///s", None, "r1", "/w/ckpt/r1", 2), **plan.env()}
    settings = StoreSettings.from_env(env)
    assert settings.samples == SamplesPlan(every=2, per_step=6, group_size=4) and plan.lines_kept == 8
    assert str(settings.rollout_dir) == "/w/ckpt/r1-rollouts"  # beside, never inside, what a checkpoint sync uploads
    assert SamplesPlan.of(load_config(overrides=["trainer.log_samples_every=0"], env={})) is None
    assert StoreSettings.from_env(checkpoint_env("file:///s", None, "r1", "/w/c", 2)).samples is None


def test_the_stand_in_writes_rollout_dumps_as_verls_own_writer_does(tmp_path):
    """The CPU stand-in's `write_generations` against `RayPPOTrainer._write_generations` in verl's source, read
    with ast (importing verl's ray_trainer costs ~40 s): the same file name and the same fields in the same order."""
    import ast
    import importlib.util

    from verl_grpo.trainers.verl.samples import DUMP_FIELDS, dump_steps
    from verl_grpo_rehearsal.standin_trainer import write_generations

    source = Path(importlib.util.find_spec("verl").origin).parent / "trainer" / "ppo" / "ray_trainer.py"
    tree = ast.parse(source.read_text())
    writer = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_write_generations")
    base = next(n.value for n in ast.walk(writer) if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", None) == "base_data")
    verl_fields = [k.value for k in base.keys]
    filename = next(ast.unparse(n) for n in ast.walk(writer) if isinstance(n, ast.JoinedStr))
    assert filename == "f'{global_steps}.jsonl'" and [a.arg for a in writer.args.args] == [
        "inputs", "outputs", "gts", "scores", "reward_extra_infos_dict", "dump_path", "global_steps"]

    write_generations(["q"], ["a"], ["5"], [0.5], {"correctness": [1.0], "acc": [1.0]}, str(tmp_path), 7)
    line = json.loads((tmp_path / "7.jsonl").read_text())
    assert list(line)[: len(verl_fields)] == verl_fields and set(verl_fields) <= DUMP_FIELDS
    assert line["correctness"] == 1.0 and list(dump_steps(tmp_path)) == [7]
