"""Benchmark: the loop backend's step split (rollout, reward, replay, update, weight push) beside the synchronous TRL
step at the same settings; writes bench/results/loop_step.md.

Both sides run the same config (`-c gsm8k -c local`, the `make run` profile, plus `-o` overrides) with the same
data-server, reward-server and replay buffer started as the local provider starts them (separate processes; TRL
scores through the reward-server too), one worker after the other:

- loop: `python -m verl_grpo.trainers.loop.worker SPEC` as LoopTrainer.plan writes it: two CPU rollout servers and
  the router (async_training.rollout_servers), generation running ahead of the update in a producer thread;
  the split comes from its metrics.jsonl (`time/*`: what the trainer thread waited for or spent per step;
  `time/generate` and `time/reward` are the producer's seconds for the batch the step trained on, overlapped);
- trl: `python -m verl_grpo.trainers.trl.worker SPEC`: generation, scoring and the update in turn, in one process.

A step's wall time is the interval between two consecutive progress lines as they reach this process, steps 2..N
(step 1 carries the warm-up: for the loop, also the rollout fleet's start).

Run: `python bench/loop_step_bench.py [--steps 6] [-o model.name=tiny]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "loop_step.md"
CONFIGS = ["gsm8k", "local"]
SPLIT = ("rollout_wait", "generate", "reward", "replay", "update", "weight_push")


def _setup(home: Path, steps: int, extra: list[str]):
    sys.path.insert(0, str(REPO))
    from verl_grpo.local_paths import model_cache_dir

    os.environ.setdefault("VERL_GRPO_MODEL_CACHE", str(model_cache_dir()))
    os.environ["VERL_GRPO_HOME"] = str(home)
    from transformers import AutoTokenizer

    from verl_grpo.config import load_config
    from verl_grpo.data import prepare_dataset
    from verl_grpo.models import resolve_model
    from verl_grpo.store import Store

    base = [f"algorithm.total_steps={steps}", f"algorithm.save_freq={steps}", "warm_start.enabled=false",
            f"storage.uri=file://{home / 'store'}", "services.enabled=[data, reward, replay]",
            "services.termination_delay_s=0", *extra]
    loop_cfg = load_config(CONFIGS, [*base, "trainer.backend=loop"])
    trl_cfg = load_config(CONFIGS, [*base, "trainer.backend=trl"])
    model_dir = Path(resolve_model(loop_cfg.model.name))
    store = Store.from_config(loop_cfg.storage)
    dataset = prepare_dataset(loop_cfg, store, tokenizer=AutoTokenizer.from_pretrained(str(model_dir)))
    return loop_cfg, trl_cfg, store, dataset


def _run(cfg, store, dataset, root: Path, run_id: str) -> dict[str, Any]:
    """Start the services, plan and run the backend's worker, stop the services; step stamps and metrics."""
    from verl_grpo.contracts import Cluster
    from verl_grpo.services.local_group import start_local_services, stop_local_services
    from verl_grpo.trainers import get_trainer
    from verl_grpo.trainers.worker.metrics import read_metrics

    workdir = root / run_id
    workdir.mkdir(parents=True)
    group = start_local_services(cfg, run_id, workdir, dataset.uri)
    try:
        cluster = Cluster(provider="local", name="bench", workdir=str(workdir), on_this_machine=True)
        spec = get_trainer(cfg.trainer.backend).plan(cfg, dataset, store, run_id, cluster)
        env = {**os.environ, **spec.env, **group.env, "PYTHONPATH": str(REPO)}
        stamps: list[float] = []
        start = time.monotonic()
        with open(workdir / "worker.log", "w") as log:
            proc = subprocess.Popen(spec.command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, bufsize=1)
            for line in proc.stdout:
                log.write(line)
                if line.startswith("step "):
                    stamps.append(time.monotonic() - start)
            code = proc.wait()
        if code != 0:
            sys.exit(f"{cfg.trainer.backend} worker failed ({code}):\n{(workdir / 'worker.log').read_text()[-3000:]}")
    finally:
        stop_local_services(workdir, delay_s=0)
    return {"wall": [b - a for a, b in zip(stamps, stamps[1:])], "first_step_s": stamps[0],
            "metrics": read_metrics(workdir / "metrics.jsonl")}


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def table(loop: dict[str, Any], trl: dict[str, Any]) -> str:
    later = loop["metrics"][1:]
    rows = [("step wall time (steps 2..N)", _mean(loop["wall"]), _mean(trl["wall"]))]
    for name in SPLIT:
        rows.append((f"loop time/{name}", _mean([m[f"time/{name}"] for m in later if f"time/{name}" in m]), None))
    rows.append(("trl step_time (generation + scoring + update)", None,
                 _mean([m["step_time"] for m in trl["metrics"][1:] if "step_time" in m])))
    rows.append(("first step (start-up + step 1)", loop["first_step_s"], trl["first_step_s"]))
    lines = ["| seconds per step | loop | trl |", "|---|---|---|"]
    for name, a, b in rows:
        lines.append(f"| {name} | {'' if a is None else f'{a:.3f}'} | {'' if b is None else f'{b:.3f}'} |")
    ratio = _mean(trl["wall"]) / _mean(loop["wall"])
    lines.append(f"| **trl ÷ loop wall time per step** | | **{ratio:.2f}×** |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("-o", "--override", action="append", default=[])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="loop-bench-") as tmp:
        home = Path(tmp)
        loop_cfg, trl_cfg, store, dataset = _setup(home, args.steps, args.override)
        loop = _run(loop_cfg, store, dataset, home / "work", "loop-bench")
        trl = _run(trl_cfg, store, dataset, home / "work", "trl-bench")
    alg, at = loop_cfg.algorithm, loop_cfg.async_training
    settings = (f"model {loop_cfg.model.name}, {alg.train_batch_size} prompts x {alg.rollouts} rollouts per step, "
                f"{alg.max_response_length}-token responses, {args.steps} steps, trainer.threads="
                f"{loop_cfg.trainer.threads}; loop: {at.rollout_servers} rollout servers (1 thread each), replay_share "
                f"{at.replay_share}, weights pushed every {at.trigger_parameter_sync_step} step(s)")
    body = (f"# Loop step split vs the synchronous TRL step\n\n`python bench/loop_step_bench.py --steps {args.steps}"
            f"{''.join(f' -o {o}' for o in args.override)}` on {platform.machine()} with {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')}.\n\nSettings: {settings}.\n\n{table(loop, trl)}\n\n"
            "The loop's generation and scoring run in its producer thread and rollout servers while the trainer "
            "updates: `time/rollout_wait` is what the trainer waited for them; `time/generate` / `time/reward` are "
            "their own seconds for the step's batch (overlapped, not added to the step).\n\n"
            f"Load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores): other "
            "processes on these cores slow both sides, and the loop's overlap needs spare cores to pay off.\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(body)
    print(body)


if __name__ == "__main__":
    main()
