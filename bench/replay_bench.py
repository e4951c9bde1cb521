"""Replay-buffer benchmark → bench/results/replay.md.

The loop trainer's replay draw (`POST /sample`, unique, within the staleness bound, excluding the groups waiting to
be retired, as `trainers/loop/training.py` asks it) timed through the replay-buffer service at 1,000 and at 100,000
stored groups: p50 / p99 latency per request and the ratio of the two sides. The groups are the loop's own payload
(`Group.payload`: prompt tokens, 4 rollouts of token ids, behaviour log-probs and rewards), with synthetic tokens.
The service runs as the loop runs it (`start_local_services`), on a store in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from verl_grpo.config import RunConfig
from verl_grpo.services.client import ServiceClient
from verl_grpo.services.local_group import start_local_services, stop_local_services
from verl_grpo.trainers.loop.batch import Group, Rollout

OUT = Path(__file__).resolve().parent / "results" / "replay.md"
SIDES = (1_000, 100_000)
ADD_BATCH = 1_000
VERSIONS = 50
"""Policy versions the stored groups spread over (the draw keeps those within the staleness bound)."""


def group(rng: random.Random, i: int, prompt_tokens: int, response_tokens: int, rollouts: int) -> Group:
    return Group(
        prompt_id=f"0:{i}", prompt_token_ids=[rng.randrange(50_000) for _ in range(prompt_tokens)],
        rollouts=[Rollout([rng.randrange(50_000) for _ in range(response_tokens)],
                          [round(-rng.random() * 5, 4) for _ in range(response_tokens)], float(rng.random() < 0.3))
                  for _ in range(rollouts)],
        policy_version=i * VERSIONS // SIDES[-1])


def fill(client: ServiceClient, upto: int, start: int, rng: random.Random, args) -> float:
    """Add groups start..upto-1 in batches; the seconds per 1,000 groups added."""
    started = time.perf_counter()
    for first in range(start, upto, ADD_BATCH):
        groups = [group(rng, i, args.prompt_tokens, args.response_tokens, args.rollouts)
                  for i in range(first, min(upto, first + ADD_BATCH))]
        client.post("/add", {"items": [{"data": g.payload(), "reward": g.mean_reward,
                                        "policy_version": g.policy_version} for g in groups]})
    return (time.perf_counter() - started) / max(1, (upto - start) / 1000)


def draws(client: ServiceClient, args) -> np.ndarray:
    """Seconds per /sample request the way the loop asks: `size` distinct groups, staleness filter, exclusions."""
    client.post("/sample", {"size": args.size, "unique": True})  # warm-up
    seconds = []
    for k in range(args.requests):
        started = time.perf_counter()
        client.post("/sample", {"size": args.size, "unique": True, "min_policy_version": VERSIONS - 1 - args.staleness,
                                "exclude_ids": list(range(k, k + args.exclude))})
        seconds.append(time.perf_counter() - started)
    return np.array(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--size", type=int, default=8, help="groups per draw (the loop draws 4x its replay groups)")
    parser.add_argument("--staleness", type=int, default=49, help="versions back the draw accepts (49 = all)")
    parser.add_argument("--exclude", type=int, default=16, help="ids excluded per draw (groups waiting to retire)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=64)
    parser.add_argument("--rollouts", type=int, default=4)
    args = parser.parse_args()
    rng = random.Random(0)
    rows, added = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.model_validate({
            "storage": {"uri": f"file://{tmp}/store"},
            "services": {"enabled": ["replay"], "termination_delay_s": 0, "max_body_bytes": 256 << 20,
                         "replay": {"capacity": SIDES[-1]}}})
        workdir = Path(tmp) / "work"
        group_ = start_local_services(cfg, "replay-bench", workdir)
        os.environ["VERL_GRPO_SERVICES_TOKEN_FILE"] = group_.token_file
        try:
            with ServiceClient(group_.endpoints["replay-buffer"], timeout_s=600) as client:
                for stored in SIDES:
                    add_s = fill(client, stored, added, rng, args)
                    added = stored
                    seconds = draws(client, args)
                    rows.append((stored, add_s, np.percentile(seconds, 50), np.percentile(seconds, 99)))
                    print(f"{stored} groups: add {add_s:.3f} s/1k, sample p50 {rows[-1][2] * 1e3:.1f} ms "
                          f"p99 {rows[-1][3] * 1e3:.1f} ms", flush=True)
        finally:
            stop_local_services(workdir, delay_s=0)
    (small, *_, p50_small, p99_small), (big, *_, p50_big, p99_big) = rows[0], rows[-1]
    lines = [
        "# Replay buffer: the loop's draw at 1,000 vs 100,000 stored groups", "",
        f"`python bench/replay_bench.py` on {platform.machine()}, {os.cpu_count()} CPU cores, Python "
        f"{sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (load average before "
        f"writing: {os.getloadavg()[0]:.2f}).", "",
        f"Each group: {args.prompt_tokens} prompt tokens, {args.rollouts} rollouts x {args.response_tokens} tokens "
        f"with behaviour log-probs (the loop's `Group.payload`). Each draw: {args.size} distinct groups by priority, "
        f"policy versions >= {VERSIONS - 1 - args.staleness} of {VERSIONS}, {args.exclude} ids excluded; "
        f"{args.requests} sequential requests through the service (HTTP + JSON of the drawn groups included).", "",
        "| stored groups | add (s per 1,000 groups, store log included) | sample p50 (ms) | sample p99 (ms) |",
        "|---|---|---|---|",
        *[f"| {n:,} | {a:.3f} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} |" for n, a, p50, p99 in rows], "",
        f"**p50 at {big:,} / p50 at {small:,}: {p50_big / p50_small:.2f}x** "
        f"({p50_big * 1e3:.2f} ms vs {p50_small * 1e3:.2f} ms; p99 {p99_big / p99_small:.2f}x).", "",
    ]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
