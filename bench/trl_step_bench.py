"""Benchmark: our TRL training step against a bare TRL GRPOTrainer script; writes bench/results/trl_step.md.

Settings come from the loaded config (`-c gsm8k -c local`, the `make run` profile), so the bench follows it:
same model, prompts per step, rollouts, response length, learning rate and torch threads on both sides.

- ours: the worker process exactly as `TrlTrainer.plan` writes it (`python -m verl_grpo.trainers.trl.worker SPEC`,
  the plan's environment, the local provider's cwd): our data loading, reward adapter, sampler, callbacks,
  metrics.jsonl and checkpoint commits to the store;
- bare: this file run as `--bare SETTINGS`: `trl.GRPOTrainer` on the same model directory and the same prepared
  train parquet, the same GRPOConfig values, one plain reward function returning `verl_grpo.rewards.scoring`'s
  GSM8K score, nothing else. It also times (bench only) generation, scoring and the rest of each step.

Both processes start in turn, one at a time, in one run. A step's time is the wall-clock interval between two
consecutive per-step log lines as they reach this process (so it includes the optimizer step, callbacks and
checkpoint saves), steps 2..N (step 1 carries the warm-up); TRL's own `step_time` metric (generation + scoring +
forward/backward, without optimizer step and callbacks) is reported beside it. The FLOP bound divides the step's
FLOPs (2·params per token generated + attention; ≈6·params per token trained) by this machine's matmul GFLOP/s.

The profile's warm start (cold-start SFT before GRPO) is switched off on both sides: the bench times GRPO steps.

Run: `python bench/trl_step_bench.py [--steps 4] [--rounds 1]` (about 8 minutes on 2 idle cores at the profile's
128-token responses). `-o key=value` adds config overrides (e.g. `-o trainer.threads=1`).
"""

from __future__ import annotations

import argparse
import json
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
RESULTS = REPO / "bench" / "results" / "trl_step.md"
CONFIGS = ["gsm8k", "local"]
RUN_ID = "trl-step-bench"
OURS_LINE = "step "
BARE_LINE = "bare-step "

# GRPOConfig fields a user of bare TRL would set for the same run; checked equal to our mapping (grpo_args).
SAME_FIELDS = (
    "num_generations", "epsilon", "epsilon_high", "beta", "loss_type", "num_iterations", "scale_rewards",
    "temperature", "top_p", "top_k", "max_completion_length", "per_device_train_batch_size",
    "gradient_accumulation_steps", "steps_per_generation", "learning_rate", "lr_scheduler_type", "warmup_steps",
    "max_steps", "seed", "data_seed", "shuffle_dataset", "save_strategy", "save_steps", "save_only_model",
    "save_total_limit", "logging_strategy", "logging_steps", "report_to", "disable_tqdm", "log_completions",
    "use_cpu", "bf16", "fp16", "gradient_checkpointing", "dataloader_num_workers", "remove_unused_columns",
)


# --- the bare side (runs in its own process) -------------------------------------------------------------------------


def bare_main(settings_path: str) -> None:
    """A plain TRL GRPO script: model, parquet prompts, one reward function, GRPOConfig; timing hooks for the split."""
    settings = json.loads(Path(settings_path).read_text())
    import torch

    if settings["threads"]:
        torch.set_num_threads(settings["threads"])
    import pyarrow.parquet as pq
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from verl_grpo.rewards.scoring import compute_scores

    rows = pq.read_table(settings["train_parquet"]).to_pylist()
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]}
                                 for r in rows])

    def gsm8k_reward(completions, ground_truth, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(r["score"]) for r in compute_scores("gsm8k", texts, ground_truth)]

    timers = {"generate": 0.0, "score": 0.0, "prepare": 0.0}
    shapes: dict[str, int] = {}

    class TimedGRPOTrainer(GRPOTrainer):
        """Bench-only: accumulate the seconds of generation, scoring and the whole rollout preparation."""

        def _timed(self, key, fn, *args):
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                timers[key] += time.perf_counter() - start

        def _generate(self, prompts):
            return self._timed("generate", super()._generate, prompts)

        def _calculate_rewards(self, *args):
            return self._timed("score", super()._calculate_rewards, *args)

        def _generate_and_score_completions(self, inputs):
            batch = self._timed("prepare", super()._generate_and_score_completions, inputs)
            shapes["prompt_len"] = batch["prompt_ids"].shape[1]  # padded: what the update's forward runs over
            shapes["completion_len"] = batch["completion_ids"].shape[1]
            return batch

    class StepLines(TrainerCallback):
        """One line per step (like our progress line) with the step's split; the bench timestamps it."""

        begin = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()
            for key in timers:
                timers[key] = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            self.inner = time.perf_counter() - self.begin

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "reward" not in logs:
                return
            record = {"step": state.global_step, "inner_s": self.inner, **{f"{k}_s": v for k, v in timers.items()},
                      **shapes,
                      **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
            print(BARE_LINE + json.dumps(record), flush=True)

    model = AutoModelForCausalLM.from_pretrained(settings["model_dir"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"])
    trainer = TimedGRPOTrainer(model=model, reward_funcs=[gsm8k_reward], processing_class=tokenizer,
                               args=GRPOConfig(output_dir=settings["output_dir"], **settings["grpo"]),
                               train_dataset=dataset, callbacks=[StepLines()])
    trainer.remove_callback(PrinterCallback)
    trainer.train()


# --- contention probe (runs in its own process) ------------------------------------------------------------------


def contention_main(settings_path: str) -> None:
    """Seconds of one fixed-length generate (the step's rollout batch) with the run's threads and with 1 thread,
    each alone and beside one other busy process (a pure-Python loop, like a test run on the same machine)."""
    settings = json.loads(Path(settings_path).read_text())
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(settings["model_dir"], padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(settings["model_dir"], dtype=torch.float32)
    batch = tokenizer([tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
                       for p in settings["prompts"]], return_tensors="pt", padding=True)
    tokens = settings["tokens"]

    def generate() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                           pad_token_id=tokenizer.pad_token_id)
        return time.perf_counter() - start

    results = {}
    for threads in dict.fromkeys([settings["threads"], 1]):
        torch.set_num_threads(threads)
        generate()  # warm-up
        alone = generate()
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.5)
            busy = generate()
        finally:
            hog.kill()
            hog.wait()
        results[threads] = {"alone": alone, "busy": busy}
    print(json.dumps(results), flush=True)


def run_contention(cfg, model_dir: Path, dataset, root: Path, tokens: int) -> dict[int, dict[str, float]]:
    from verl_grpo.data.prepare import load_split

    rows = load_split(dataset, "train", _store(cfg))["prompt"].tolist()[: cfg.algorithm.train_batch_size]
    settings = {"threads": cfg.trainer.threads or os.cpu_count(), "model_dir": str(model_dir), "tokens": tokens,
                "prompts": [list(p) for p in rows for _ in range(cfg.algorithm.rollouts)]}
    root.mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps(settings))
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--contention", str(root / "settings.json")],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"contention probe failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def _store(cfg):
    from verl_grpo.store import Store

    return Store.from_config(cfg.storage)


# --- the driver ---------------------------------------------------------------------------------------------------


def _setup(home: Path, steps: int, extra: list[str]):
    """Config (the make-run profile, `steps` steps), model dir, prepared dataset in a throwaway store."""
    # The converted SmolLM2 is cached in the checkout's state dir (or VERL_GRPO_MODEL_CACHE): converted once.
    sys.path.insert(0, str(REPO))
    from verl_grpo.local_paths import model_cache_dir

    os.environ.setdefault("VERL_GRPO_MODEL_CACHE", str(model_cache_dir()))
    os.environ["VERL_GRPO_HOME"] = str(home)
    from transformers import AutoTokenizer

    from verl_grpo.config import load_config
    from verl_grpo.data import prepare_dataset
    from verl_grpo.models import resolve_model
    from verl_grpo.store import Store

    # The GRPO step is compared: the profile's cold-start SFT phase (warm_start) runs before the first step and is off.
    cfg = load_config(CONFIGS, [f"algorithm.total_steps={steps}", "warm_start.enabled=false",
                                f"storage.uri=file://{home / 'store'}", *extra])
    model_dir = Path(resolve_model(cfg.model.name))
    store = Store.from_config(cfg.storage)
    dataset = prepare_dataset(cfg, store, tokenizer=AutoTokenizer.from_pretrained(str(model_dir)))
    return cfg, model_dir, store, dataset


def bare_grpo_kwargs(cfg) -> dict[str, Any]:
    """What a user writes into GRPOConfig for the run by hand, from the same config values."""
    alg, tr = cfg.algorithm, cfg.trainer
    completions = alg.train_batch_size * alg.rollouts
    micro = tr.micro_batch_size or completions
    return {
        "num_generations": alg.rollouts, "epsilon": alg.clip_low, "epsilon_high": alg.clip_high, "beta": alg.kl_coef,
        "loss_type": {"token-mean": "dapo", "seq-mean-token-mean": "grpo",
                      "seq-mean-token-sum-norm": "dr_grpo"}[alg.loss_agg_mode],
        "num_iterations": 1, "scale_rewards": "group", "temperature": alg.temperature, "top_p": alg.top_p,
        "top_k": max(0, alg.top_k), "max_completion_length": alg.max_response_length,
        "per_device_train_batch_size": micro, "gradient_accumulation_steps": completions // micro,
        "steps_per_generation": completions // micro, "learning_rate": alg.lr, "lr_scheduler_type": "constant",
        "warmup_steps": 0, "max_steps": alg.total_steps, "seed": alg.seed, "data_seed": alg.seed,
        "shuffle_dataset": True, "save_strategy": "steps", "save_steps": alg.save_freq, "save_only_model": False,
        "save_total_limit": 1, "logging_strategy": "steps", "logging_steps": tr.logging_steps, "report_to": [],
        "disable_tqdm": True, "log_completions": False, "use_cpu": True, "bf16": False, "fp16": False,
        "gradient_checkpointing": False, "dataloader_num_workers": 0, "remove_unused_columns": False,
    }


def check_same_settings(cfg, bare: dict[str, Any]) -> None:
    """The bare script's GRPOConfig must equal ours field by field (else the ratio compares different runs)."""
    from verl_grpo.trainers.trl.backend import grpo_args

    ours = grpo_args(cfg, "unused", use_cpu=True)
    diff = {f: (getattr(ours, f), bare[f]) for f in SAME_FIELDS if getattr(ours, f) != bare[f]}
    if diff:
        sys.exit(f"the bare script's GRPOConfig differs from ours: {diff}")


def _stream(cmd: list[str], env: dict[str, str], cwd: Path, prefix: str, log: Path) -> list[tuple[float, str]]:
    """Run cmd, timestamping (seconds since its start) every line that starts with prefix; exit on failure."""
    stamped: list[tuple[float, str]] = []
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic() - start
            out.write(line)
            if line.startswith(prefix):
                stamped.append((now, line.rstrip("\n")))
        code = proc.wait()
    if code != 0:
        sys.exit(f"{cmd[:4]} failed ({code}); log tail:\n{log.read_text()[-3000:]}")
    return stamped


def intervals(stamps: list[float]) -> list[float]:
    """Step k's wall time = stamp(k) - stamp(k-1), k = 2..N (step 1 has no start stamp and carries the warm-up)."""
    return [b - a for a, b in zip(stamps, stamps[1:])]


def run_ours(cfg, store, dataset, root: Path) -> dict[str, Any]:
    from verl_grpo.contracts import Cluster
    from verl_grpo.trainers.trl.backend import TrlTrainer
    from verl_grpo.trainers.worker.metrics import read_metrics

    workdir = root / "work"
    workdir.mkdir(parents=True)
    cluster = Cluster(provider="local", name="bench", workdir=str(workdir), on_this_machine=True)
    # a run id of its own: a second round under the same id would resume the first round's finished run
    spec = TrlTrainer().plan(cfg, dataset, store, f"{RUN_ID}-{root.name}", cluster)
    env = {**os.environ, **spec.env, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    lines = _stream(spec.command, env, workdir, OURS_LINE, root / "ours.log")
    total = time.monotonic() - start
    metrics = read_metrics(workdir / "metrics.jsonl")
    return {"wall": intervals([t for t, _ in lines]), "step_time": [m["step_time"] for m in metrics[1:]],
            "lengths": [m.get("completions/mean_length") for m in metrics], "process_s": total,
            "first_step_s": lines[0][0]}


def run_bare(cfg, model_dir: Path, dataset, store, env_extra: dict[str, str], root: Path) -> dict[str, Any]:
    from verl_grpo.store import local_path

    root.mkdir(parents=True)
    settings = {"threads": cfg.trainer.threads, "model_dir": str(model_dir), "output_dir": str(root / "out"),
                "train_parquet": str(local_path(dataset.splits["train"])), "grpo": bare_grpo_kwargs(cfg)}
    (root / "settings.json").write_text(json.dumps(settings))
    env = {**os.environ, **env_extra, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    lines = _stream([sys.executable, str(Path(__file__).resolve()), "--bare", str(root / "settings.json")], env,
                    root, BARE_LINE, root / "bare.log")
    total = time.monotonic() - start
    records = [json.loads(line[len(BARE_LINE):]) for _, line in lines]
    return {"wall": intervals([t for t, _ in lines]), "step_time": [r["step_time"] for r in records[1:]],
            "lengths": [r.get("completions/mean_length") for r in records], "process_s": total,
            "first_step_s": lines[0][0], "records": records}


# --- machine and FLOP bound --------------------------------------------------------------------------------------


def matmul_gflops(threads: int | None, n: int = 1024, seconds: float = 3.0) -> float:
    """Best fp32 GFLOP/s of an n×n matmul with the run's torch thread count."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best, until = 0.0, time.monotonic() + seconds
    while time.monotonic() < until:
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        best = max(best, 4 * 2 * n ** 3 / (time.perf_counter() - start) / 1e9)
    return best


def flop_bound(model_dir: Path, cfg, metrics: list[dict[str, Any]], gflops: float) -> dict[str, float]:
    """FLOPs of one median step (from the measured prompt/completion lengths) and the time they need at gflops."""
    from transformers import AutoConfig

    mc = AutoConfig.from_pretrained(str(model_dir))
    # Parameters that do matmuls per token: every layer's weights + the (tied) LM head; the embedding lookup is free.
    d, inter, layers = mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers
    kv = mc.num_key_value_heads * (d // mc.num_attention_heads)
    per_layer = d * d * 2 + d * kv * 2 + 3 * d * inter
    params = layers * per_layer + d * mc.vocab_size
    rows = cfg.algorithm.train_batch_size * cfg.algorithm.rollouts
    later = metrics[1:] or metrics
    prompt_len = statistics.median(m.get("prompt_len", 0) for m in later)
    # generate() runs every row until the longest completion ends (or max_response_length)
    gen_len = statistics.median(m["completion_len"] for m in later)
    mean_len = statistics.median(m["completions/mean_length"] for m in later)

    def attn(ctx: float) -> float:  # QK^T and AV over ctx keys, per token, all layers (2 FLOPs per MAC)
        return 2 * 2 * layers * ctx * mc.num_attention_heads * (d // mc.num_attention_heads)

    prefill = rows * prompt_len * (2 * params + attn(prompt_len / 2))
    decode = rows * gen_len * (2 * params + attn(prompt_len + gen_len / 2))
    seq = prompt_len + gen_len  # training runs the padded batch: prompt + the longest completion
    update = rows * seq * (6 * (params - d * mc.vocab_size) + 3 * attn(seq / 2)) + rows * gen_len * 6 * d * mc.vocab_size
    total = prefill + decode + update
    return {"params_m": params / 1e6, "prompt_len": prompt_len, "gen_len": gen_len, "mean_len": mean_len,
            "gen_gflop": (prefill + decode) / 1e9, "update_gflop": update / 1e9, "total_gflop": total / 1e9,
            "gen_s": (prefill + decode) / 1e9 / gflops, "update_s": update / 1e9 / gflops,
            "bound_s": total / 1e9 / gflops, "weights_mb": params * 4 / 1e6}


def copy_bandwidth(mib: int = 256) -> float:
    """GB/s of one large tensor copy (read + write), best of a few."""
    import torch

    src = torch.empty(mib * 2 ** 20 // 4)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return best


def machine_facts() -> dict[str, Any]:
    import torch
    import transformers
    import trl

    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {"cpu": model, "cores": os.cpu_count(), "load": os.getloadavg(), "python": platform.python_version(),
            "torch": torch.__version__, "trl": trl.__version__, "transformers": transformers.__version__}


# --- main and report ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per side (median over steps 2..N)")
    parser.add_argument("--rounds", type=int, default=1, help="ours/bare pairs, order alternating")
    parser.add_argument("-o", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--probe-tokens", type=int, default=16,
                        help="tokens per row of the contention probe's generate (0 skips the probe)")
    parser.add_argument("--bare", help=argparse.SUPPRESS)
    parser.add_argument("--contention", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        bare_main(args.bare)
        return
    if args.contention:
        contention_main(args.contention)
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="verl-grpo-trl-step-bench-") as tmp:
        root = Path(tmp)
        cfg, model_dir, store, dataset = _setup(root / "home", args.steps, args.overrides)
        bare_kwargs = bare_grpo_kwargs(cfg)
        check_same_settings(cfg, bare_kwargs)
        facts = machine_facts()
        gflops = matmul_gflops(cfg.trainer.threads)
        bandwidth = copy_bandwidth()
        from verl_grpo.trainers.worker.spec import worker_env

        ours_runs, bare_runs = [], []
        for i in range(args.rounds):  # alternate the order so drift in machine load hits both sides
            for side in (("ours", "bare") if i % 2 == 0 else ("bare", "ours")):
                where = root / f"{side}-{i}"
                if side == "ours":
                    ours_runs.append(run_ours(cfg, store, dataset, where))
                else:
                    bare_runs.append(run_bare(cfg, model_dir, dataset, store, worker_env(cfg), where))
        facts["load_after"] = os.getloadavg()
        contention = (run_contention(cfg, model_dir, dataset, root / "contention", args.probe_tokens)
                      if args.probe_tokens else {})
    bound = flop_bound(model_dir, cfg, [r for run in bare_runs for r in run["records"]], gflops)
    report = render(cfg, facts, gflops, bandwidth, bound, ours_runs, bare_runs, contention, args.probe_tokens,
                    time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)


GAP_NOTES = """### Step time beside other load: threads and OMP wait policy

Measured on 2026-11-24 on this 2-core host: a fixed 8 rows × 64 tokens generate and one forward/backward/AdamW update
(SmolLM2-135M, float32; "alone" = the quietest runs, the machine's other load was never zero; "busy process" = a
one-thread Python loop):

| setting | generate | update |
|---|---:|---:|
| 2 threads, alone | 7.3–9.3 s | 7.3–8.0 s |
| 1 thread, alone | 9.2–11.3 s | 12.3–14.1 s |
| 2 threads + one busy process | 107–147 s | 23–35 s |
| 1 thread + one busy process | 9.6–19.6 s | 13.0–23.6 s |
| 2 threads + one busy process, OMP_WAIT_POLICY=PASSIVE | 16–27 s | 18–20 s |
| 2 threads, alone, OMP_WAIT_POLICY=PASSIVE | 10.0–13.8 s | 8.9–15.3 s |

- `make run` step time, same profile: 19–22 s on a quiet machine, 47–64 s while other work held a core.
- Load average during these measurements: 1–9; `make run` step 1 under that load: 99 s; this bench's step times:
  26–248 s from one step to the next, on both sides alike.
- `trainer.threads: 1` against 2 on an idle machine: about 1.4× slower; OMP_WAIT_POLICY=PASSIVE: about 5× less
  busy-machine penalty, 20–45 % slower when idle.

Other factors measured at the same time:
- `make run`'s own processes (sampled from /proc every 10 s during training): the CLI/flow process 0 %, its Prefect
  API server 1 % of a core; the base and trained evals run after training (`chain.run_chain`).
- our worker vs bare TRL: the same step time within noise (the table above; 0.99x at 1 thread).
- the reward server: not enabled by the gsm8k/local profile; in-process scoring: ~1 ms a step.
- KV cache: on in the model and generation configs; a cache-less generate of the same 8 rows × 16 tokens: 15.5 s
  against 2.3 s.
- padding: TRL left-pads each step's prompts to the longest; the same config and seed give the same prompts and
  shapes in every run.
- gradient checkpointing, torch.compile: off (`gradient_checkpointing=False`; TRL's GenerationConfig has
  `disable_compile=True`).
- precision: float32 in every run (`model.dtype` float32, `bf16=False`); on this AVX512-BF16 EPYC a bf16 576×1536
  matmul: ~2× faster than float32 (bench/results/precision.md measures a whole step).
- tokenizers parallelism: TOKENIZERS_PARALLELISM=false in the worker.
- checkpoint uploads (background thread): training waited 0.00 s for them; an upload is ~1.5 s of CPU (sha256 + copy
  of 1.6 GB) and added ~0.9 s to a 2-thread generate it overlapped.
"""


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(x for run in runs for x in run[key])


def split(bare_runs: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per part over steps 2..N of the bare runs; the parts add up to the mean step."""
    parts: dict[str, list[float]] = {k: [] for k in ("generate", "score", "batch", "optimise", "between", "step")}
    for run in bare_runs:
        for wall, r in zip(run["wall"], run["records"][1:]):
            parts["generate"].append(r["generate_s"])
            parts["score"].append(r["score_s"])
            parts["batch"].append(r["prepare_s"] - r["generate_s"] - r["score_s"])
            parts["optimise"].append(r["inner_s"] - r["prepare_s"])
            parts["between"].append(wall - r["inner_s"])
            parts["step"].append(wall)
    return {k: statistics.mean(v) for k, v in parts.items()}


def render(cfg, facts, gflops, bandwidth, bound, ours_runs, bare_runs, contention, probe_tokens, bench_s) -> str:
    alg, threads = cfg.algorithm, cfg.trainer.threads
    ours_wall, bare_wall = _med(ours_runs, "wall"), _med(bare_runs, "wall")
    ours_trl, bare_trl = _med(ours_runs, "step_time"), _med(bare_runs, "step_time")
    part = split(bare_runs)
    decode_s = bound["gen_len"] * bound["weights_mb"] / 1e3 / bandwidth
    same_lengths = all(o["lengths"] == b["lengths"] for o, b in zip(ours_runs, bare_runs))
    fmt = lambda xs: ", ".join(f"{x:.1f}" for x in xs)  # noqa: E731
    share = lambda x: f"{100 * x / part['step']:.0f} %"  # noqa: E731
    lines = [
        "# TRL training step: ours vs bare TRL GRPOTrainer",
        "",
        f"Written by `python bench/trl_step_bench.py` on {time.strftime('%Y-%m-%d')}.",
        "",
        f"Settings from `-c {' -c '.join(CONFIGS)}` (the `make run` profile): SmolLM2-135M-Instruct (float32), "
        f"{alg.train_batch_size} prompts × {alg.rollouts} rollouts per step, max_response_length "
        f"{alg.max_response_length}, lr {alg.lr:g}, trainer.threads {threads}, save_freq {alg.save_freq}; "
        f"{alg.total_steps} steps per side, {len(ours_runs)} round(s), one process at a time. "
        "Step time = wall-clock interval between consecutive per-step log lines (optimizer step, callbacks and "
        f"checkpoint saves included), median over steps 2..{alg.total_steps}; TRL `step_time` = its own metric "
        "(generation + scoring + forward/backward). Both sides sample the same prompts with the same seed"
        + (" and generated the same completion lengths step by step." if same_lengths else
           "; their completion lengths differed (see the steps below)."),
        "",
        "| measure | ours (worker process) | bare TRL script | ratio ours/bare | goal |",
        "|---|---:|---:|---:|---|",
        f"| step time, median | {ours_wall:.2f} s | {bare_wall:.2f} s | {ours_wall / bare_wall:.3f}x | ≤ 1.05x |",
        f"| TRL `step_time`, median | {ours_trl:.2f} s | {bare_trl:.2f} s | {ours_trl / bare_trl:.3f}x | |",
        f"| process start → step 1 logged (imports, data, model, step 1) | "
        f"{statistics.median(r['first_step_s'] for r in ours_runs):.1f} s | "
        f"{statistics.median(r['first_step_s'] for r in bare_runs):.1f} s | | |",
        f"| whole process (load, {alg.total_steps} steps, final save) | "
        f"{statistics.median(r['process_s'] for r in ours_runs):.1f} s | "
        f"{statistics.median(r['process_s'] for r in bare_runs):.1f} s | | |",
        "",
        "## Where a step's time goes (bare side, mean of steps 2..N)",
        "",
        "| part | seconds | share |",
        "|---|---:|---:|",
        f"| generation (`model.generate`, {alg.train_batch_size * alg.rollouts} rows) | {part['generate']:.2f} | "
        f"{share(part['generate'])} |",
        f"| scoring (reward function) | {part['score']:.3f} | {100 * part['score'] / part['step']:.2f} % |",
        f"| rest of the rollout batch (tokenise, pad, advantages) | {part['batch']:.2f} | {share(part['batch'])} |",
        f"| optimisation (forward + backward + optimizer step) | {part['optimise']:.2f} | "
        f"{share(part['optimise'])} |",
        f"| between steps (logging, checkpoint saves, data) | {part['between']:.2f} | {share(part['between'])} |",
        f"| step (mean) | {part['step']:.2f} | 100 % |",
        "",
        "## FLOP bound on this machine",
        "",
        f"Matmul throughput: {gflops:.0f} GFLOP/s (fp32 1024×1024 matmul, best of 3 s, {threads} thread(s)); memory "
        f"bandwidth {bandwidth:.1f} GB/s (256 MiB copy). {bound['params_m']:.0f} M matmul parameters per token "
        "(every layer's weights + the tied 49k-vocab LM head). Median step: prompt "
        f"{bound['prompt_len']:.0f} tokens (padded), generate() ran {bound['gen_len']:.0f} tokens per row "
        f"(mean completion {bound['mean_len']:.0f}).",
        "",
        "| part | GFLOP | FLOP bound | measured (mean) |",
        "|---|---:|---:|---:|",
        f"| generation (prefill + decode: 2·params per token + attention) | {bound['gen_gflop']:.0f} | "
        f"{bound['gen_s']:.2f} s | {part['generate']:.2f} s |",
        f"| update (≈6·params per token trained + attention) | {bound['update_gflop']:.0f} | "
        f"{bound['update_s']:.2f} s | {part['optimise']:.2f} s |",
        f"| step | {bound['total_gflop']:.0f} | {bound['bound_s']:.2f} s | {part['step']:.2f} s |",
        "",
        f"Decoding at batch {alg.train_batch_size * alg.rollouts} is bandwidth-bound rather than FLOP-bound: every "
        f"generated token reads all {bound['weights_mb']:.0f} MB of float32 weights, {decode_s:.2f} s for "
        f"{bound['gen_len']:.0f} tokens at the measured bandwidth.",
        "",
        f"Machine: {facts['cpu']}, {facts['cores']} cores; load average before {facts['load'][0]:.2f}, after "
        f"{facts['load_after'][0]:.2f} (this machine is shared: other processes on its cores slow a step that "
        "uses every core several-fold, see below); Python "
        f"{facts['python']}, torch {facts['torch']}, transformers {facts['transformers']}, TRL {facts['trl']}. "
        f"Bench wall time {bench_s:.0f} s.",
        "",
        "Steps (s, 2..N): " + "; ".join(f"ours {fmt(o['wall'])} / bare {fmt(b['wall'])}"
                                        for o, b in zip(ours_runs, bare_runs)),
        "",
    ]
    if contention:
        lines += [
            "## Steps on a busy machine",
            "",
            f"One `generate` of the step's {alg.train_batch_size * alg.rollouts} rows × {probe_tokens} new tokens, "
            "alone and beside one other busy process (a one-thread Python loop, as a test run or a second "
            "training would be):",
            "",
            "| torch threads | alone | beside one busy process | slowdown |",
            "|---|---:|---:|---:|",
            *(f"| {t} | {v['alone']:.2f} s | {v['busy']:.2f} s | {v['busy'] / v['alone']:.1f}x |"
              for t, v in contention.items()),
            "",
            GAP_NOTES,
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
