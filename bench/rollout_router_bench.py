"""Benchmark: rollouts/s through the rollout router with 2 CPU rollout servers vs 1 → bench/results/rollout_router.md.

Both sides are the real processes the loop uses (`start_rollout_fleet`: rollout servers with 1 torch thread
each and the router in front, subprocesses on 127.0.0.1) and the trainer's client (`RouterClient`), so the
numbers include HTTP, routing and JSON. Each side answers the same requests — same prompts, same sampling
settings, the same seed per request, hence the same generated tokens — sent by `--clients` concurrent client
threads. A rollout is one sampled response. Sides alternate (1, 2, 1, 2, …) for `--rounds` rounds after one
warm-up round per fleet, so machine drift hits both; the table gives each round and the median ratio.

Run: `python bench/rollout_router_bench.py [--model tiny|smollm2-135m] [--requests 48] [--clients 4]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from verl_grpo.local_paths import data_mirror_dir  # noqa: E402
from verl_grpo.models import resolve_model  # noqa: E402
from verl_grpo.services.rollout_client import RouterClient  # noqa: E402
from verl_grpo.services.rollout_fleet import RolloutFleet, start_rollout_fleet  # noqa: E402

OUT = REPO / "bench" / "results" / "rollout_router.md"


def gsm8k_prompts(count: int) -> list[str]:
    lines = (data_mirror_dir() / "gsm8k" / "train.jsonl").read_text().splitlines()[:count]
    return [f"Question: {json.loads(line)['question']}\nAnswer:" for line in lines]


def server_cpu_s(fleet: RolloutFleet) -> float:
    """CPU seconds (user + system) the fleet's rollout servers have used so far."""
    ticks = 0
    for name, pid in fleet.pids.items():
        if name.startswith("rollout-") and name != "rollout-router":
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def run_side(fleet: RolloutFleet, batches: list[list[str]], args: argparse.Namespace) -> tuple[float, float]:
    """Seconds to answer every batch through the router with args.clients concurrent clients, and the cores the
    servers got meanwhile (their CPU seconds / wall seconds)."""
    token = Path(fleet.token_file).read_text().strip()
    with RouterClient(fleet.router_url, token=token) as client, ThreadPoolExecutor(args.clients) as pool:
        cpu_before, started = server_cpu_s(fleet), time.perf_counter()
        responses = list(pool.map(lambda ib: client.generate(ib[1], n=args.n, max_new_tokens=args.max_new_tokens,
                                                             temperature=1.0, seed=ib[0]), enumerate(batches)))
        seconds = time.perf_counter() - started
        cores = (server_cpu_s(fleet) - cpu_before) / seconds
    assert sum(len(r.outputs) for r in responses) == len(batches) * args.prompts_per_request * args.n
    return seconds, cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--prompts-per-request", type=int, default=2)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    model = resolve_model(args.model)
    prompts = gsm8k_prompts(args.requests * args.prompts_per_request)
    batches = [prompts[i:i + args.prompts_per_request] for i in range(0, len(prompts), args.prompts_per_request)]
    rollouts = len(batches) * args.prompts_per_request * args.n
    times: dict[int, list[float]] = {1: [], 2: []}
    cores: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp, \
            start_rollout_fleet(model, 1, Path(tmp) / "one", threads_per_server=1) as one, \
            start_rollout_fleet(model, 2, Path(tmp) / "two", threads_per_server=1) as two:
        fleets = {1: one, 2: two}
        for servers, fleet in fleets.items():
            run_side(fleet, batches[: args.clients * 2], args)  # warm-up
        for _ in range(args.rounds):
            for servers, fleet in fleets.items():
                seconds, got = run_side(fleet, batches, args)
                times[servers].append(seconds)
                cores[servers].append(got)
                print(f"{servers} server(s): {rollouts / seconds:.1f} rollouts/s on {got:.2f} cores", flush=True)
    write_report(args, rollouts, times, cores)


def write_report(args: argparse.Namespace, rollouts: int, times: dict[int, list[float]],
                 cores: dict[int, list[float]]) -> None:
    rates = {s: [rollouts / t for t in ts] for s, ts in times.items()}
    ratios = [b / a for a, b in zip(rates[1], rates[2])]
    per_core = {s: [r / c for r, c in zip(rates[s], cores[s])] for s in rates}
    core_ratios = [b / a for a, b in zip(per_core[1], per_core[2])]
    rows = "\n".join(f"| {i + 1} | {rates[1][i]:.1f} | {cores[1][i]:.2f} | {rates[2][i]:.1f} | {cores[2][i]:.2f} "
                     f"| {ratios[i]:.2f} | {per_core[1][i]:.1f} | {per_core[2][i]:.1f} | {core_ratios[i]:.2f} |"
                     for i in range(len(ratios)))
    med = statistics.median
    load = os.getloadavg()
    noisy = ("\nThe load average says other processes shared the cores during the run: read the per-round rows as "
             "noisy and the median ratio as the figure.\n" if load[0] > (os.cpu_count() or 1) else "")
    OUT.write_text(f"""# Rollout router: 2 CPU rollout servers vs 1

`python bench/rollout_router_bench.py --model {args.model} --requests {args.requests} --clients {args.clients} \
--prompts-per-request {args.prompts_per_request} --n {args.n} --max-new-tokens {args.max_new_tokens} \
--rounds {args.rounds}` on {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, \
{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC (load average before writing: {load[0]:.2f}).

Each side: rollout servers with 1 torch thread each behind the router, {args.clients} concurrent clients, the same
{args.requests} seeded requests of {args.prompts_per_request} GSM8K prompts x {args.n} samples x up to \
{args.max_new_tokens} new tokens ({rollouts} rollouts per round; identical tokens on both sides). Goal: >= 1.8x.

"cores" = CPU seconds the rollout servers used / wall seconds of the round: what the machine gave them (a
2-server side short of 2.0 was sharing the cores with other processes).

The last three columns divide each side's rate by the cores it got: rollouts per server CPU-second, and their
ratio (2 servers / 1), which is 1.0 when the router and the second server add no cost per rollout.

| round | 1 server rollouts/s | cores | 2 servers rollouts/s | cores | ratio (2 / 1) | 1 server rollouts/CPU-s \
| 2 servers rollouts/CPU-s | ratio per CPU-s |
|---|---|---|---|---|---|---|---|---|
{rows}
| median (ratios: of the rounds' ratios) | {med(rates[1]):.1f} | {med(cores[1]):.2f} | {med(rates[2]):.1f} \
| {med(cores[2]):.2f} | {med(ratios):.2f} | {med(per_core[1]):.1f} | {med(per_core[2]):.1f} | {med(core_ratios):.2f} |
{noisy}""")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
