"""Benchmark: what a rehearsal of a cloud launch costs beside the plain local run; writes bench/results/rehearsal.md.

Both sides are the user's commands on the same settings (`-c gsm8k -c local -o model.name=tiny`), each in a fresh
state dir so neither finds the other's cache:
- local:     `verl-grpo run …` (TRL on this machine, local store);
- rehearsal: `verl-grpo launch … --rehearse --preempt-at 2` (the SkyPilot provider's YAML on the local rehearsal:
  loopback S3, a node in its own namespaces, Ray, the CPU stand-in for main_ppo, one recovery, the eval task).
Rounds alternate the order, so drift in machine load hits both sides.

Run: `python bench/rehearsal_bench.py [--rounds 1]` (about 6 minutes a round on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "rehearsal.md"
SETTINGS = ["-c", "gsm8k", "-c", "local", "-o", "model.name=tiny"]
COMMANDS = {
    "local": ["run", *SETTINGS],
    "rehearsal": ["launch", *SETTINGS, "--rehearse", "--preempt-at", "2"],
}


def timed(name: str, home: Path) -> float:
    env = {**os.environ, "VERL_GRPO_HOME": str(home), "PREFECT_HOME": str(home / "prefect")}
    env.pop("PREFECT_API_URL", None)
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "verl_grpo_cli", *COMMANDS[name]], cwd=REPO, env=env,
                            capture_output=True, text=True)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"{name} failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"local": [], "rehearsal": []}
    with tempfile.TemporaryDirectory(prefix="verl-grpo-rehearsal-bench-") as tmp:
        for i in range(args.rounds):
            for name in (("local", "rehearsal") if i % 2 == 0 else ("rehearsal", "local")):
                times[name].append(timed(name, Path(tmp) / f"{name}-{i}"))
    report = render(times)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)


def render(times: dict[str, list[float]]) -> str:
    local, rehearsal = statistics.median(times["local"]), statistics.median(times["rehearsal"])
    return "\n".join([
        "# Rehearsal of a cloud launch vs the plain local run",
        "",
        "Same settings (`-c gsm8k -c local -o model.name=tiny`: 6 GRPO steps, 20 eval problems), fresh state dir each "
        "(data preparation and the base eval included on both sides). Whole-command wall time, median of "
        f"{len(times['local'])} round(s).",
        "",
        "| measure | local run (`verl-grpo run`) | rehearsal (`launch --rehearse --preempt-at 2`) | ratio |",
        "|---|---:|---:|---:|",
        f"| wall time | {local:.1f} s | {rehearsal:.1f} s | {rehearsal / local:.2f}x |",
        "",
        "Rounds (s): local " + ", ".join(f"{x:.1f}" for x in times["local"]) + "; rehearsal "
        + ", ".join(f"{x:.1f}" for x in times["rehearsal"]),
        "",
    ])


if __name__ == "__main__":
    main()
