"""Benchmark P6: orchestration overhead of the `verl-grpo` Prefect flow; writes bench/results/flow.md.

The same run (tiny model, 4 GRPO steps, 8 eval problems) twice per round: once as plain Python
(`verl_grpo.plain_steps.run_pipeline`), once as the Prefect flow on the ephemeral API, exactly as
`verl-grpo run` does. Data preparation and the base-model eval are cached by a warm-up run first, so both
sides do the same work: train, evaluate, register. Goal: overhead < 10 s and < 5 % of the plain run.

Run: `python bench/flow_bench.py [--rounds 3]` (a few minutes on 2 cores). Numbers depend on machine load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "flow.md"
TINY_RUN = [
    "algorithm.total_steps=4", "algorithm.save_freq=2", "algorithm.train_batch_size=2", "algorithm.rollouts=2",
    "algorithm.max_response_length=16", "algorithm.lr=1e-4", "trainer.threads=1", "eval.limit=8",
    "eval.batch_size=8", "eval.max_new_tokens=16",
]


def _setup(home: Path) -> list[str]:
    """Isolated state dir and Prefect home; the tiny model from the shared test-model cache."""
    os.environ["VERL_GRPO_HOME"] = str(home)
    os.environ["PREFECT_HOME"] = str(home / "prefect")
    os.environ.pop("PREFECT_API_URL", None)
    sys.path.insert(0, str(REPO))
    from verl_grpo.models import build_tiny_model

    tiny = build_tiny_model(Path(os.environ.get("VERL_GRPO_TEST_MODEL_CACHE", REPO / ".state" / "test-models")) / "tiny")
    return [*TINY_RUN, f"model.name={tiny}"]


def _plain(overrides: list[str]) -> float:
    from verl_grpo.plain_steps import run_pipeline

    start = time.monotonic()
    run_pipeline(["gsm8k"], overrides, run_id=None, on_line=lambda line: None)
    return time.monotonic() - start


def _flow(overrides: list[str]) -> float:
    from verl_grpo_flows.verl_grpo import verl_grpo

    start = time.monotonic()
    verl_grpo(config=["gsm8k"], overrides=overrides)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="verl-grpo-flow-bench-") as tmp:
        overrides = _setup(Path(tmp))
        warm_up = _plain(overrides)
        plain, flow = [], []
        for i in range(args.rounds):  # alternate the order so drift in machine load hits both sides
            if i % 2:
                flow.append(_flow(overrides))
                plain.append(_plain(overrides))
            else:
                plain.append(_plain(overrides))
                flow.append(_flow(overrides))
    report = render(warm_up, plain, flow)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)


def render(warm_up: float, plain: list[float], flow: list[float]) -> str:
    p, f = statistics.median(plain), statistics.median(flow)
    overhead = f - p
    # The first flow call also starts the ephemeral Prefect API in-process (what every `verl-grpo run` pays).
    first = flow[0] - plain[0]
    rows = [
        ("P6 whole run, median", f"{p:.1f} s", f"{f:.1f} s", f"{overhead:+.1f} s ({100 * overhead / p:+.1f} %)",
         "< 10 s and < 5 %"),
        ("P6 first round (ephemeral API start-up)", f"{plain[0]:.1f} s", f"{flow[0]:.1f} s",
         f"{first:+.1f} s ({100 * first / plain[0]:+.1f} %)", ""),
    ]
    lines = [
        "# P6: Prefect flow orchestration overhead",
        "",
        f"Tiny model, 4 GRPO steps, 8 eval problems; data and base eval cached by a warm-up run ({warm_up:.1f} s). "
        f"{len(plain)} rounds, order alternating. Plain = `verl_grpo.plain_steps.run_pipeline`; "
        "flow = `verl_grpo_flows.verl_grpo.verl_grpo` on the ephemeral API (what `verl-grpo run` does).",
        "",
        "| measure | plain Python | Prefect flow | overhead | goal |",
        "|---|---:|---:|---:|---|",
        *(f"| {' | '.join(r)} |" for r in rows),
        "",
        "Rounds (s): plain " + ", ".join(f"{x:.1f}" for x in plain) + "; flow " + ", ".join(f"{x:.1f}" for x in flow),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
