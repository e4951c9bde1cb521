"""Where the suite's minutes go: reads the logs of `pytest --durations=0` runs and writes a markdown table.

Usage: `python bench/suite_durations.py LABEL=LOG [LABEL=LOG ...] [--wall LABEL=SECONDS ...] [--out FILE]`

Each LOG is the output of a `pytest -q --durations=0 ...` run (serial, or with xdist: then the test times add up to
more than the wall time, the difference being what ran side by side). Per label it lists the wall time (from
pytest's closing line, or --wall), the summed setup / call / teardown time per tier (end-to-end, faults, load,
integration, unit) and the slowest tests; tests are matched across labels by node id (an xdist group suffix
`@...` is dropped), so a table holds both sides of each figure.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")
CLOSING = re.compile(r"(\d+) passed\b.*? in ([\d.]+)s")
TIERS = ("e2e", "faults", "load", "integration", "unit")


def tier_of(nodeid: str) -> str:
    return next((t for t in TIERS if nodeid.startswith(f"tests/{t}/")), "other")


def parse(log: Path) -> tuple[dict[str, dict[str, float]], float | None, int | None]:
    """{node id: {phase: seconds}}, the wall seconds and the passed count of one log."""
    tests: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wall = passed = None
    for line in log.read_text(errors="replace").splitlines():
        if m := LINE.match(line):
            tests[m[3].split("@", 1)[0]][m[2]] += float(m[1])
        elif m := CLOSING.search(line):
            passed, wall = int(m[1]), float(m[2])
    return tests, wall, passed


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def table(runs: dict[str, tuple[dict, float | None, int | None]], top: int) -> str:
    labels = list(runs)
    out = ["| | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    out.append("| wall time (min) | " + " | ".join(minutes(w) if w else "?" for _, w, _ in runs.values()) + " |")
    out.append("| tests passed | " + " | ".join(str(p) if p is not None else "?" for _, _, p in runs.values()) + " |")
    out.append("| summed test time (min) | " + " | ".join(
        minutes(sum(sum(ph.values()) for ph in t.values())) for t, _, _ in runs.values()) + " |")
    for tier in TIERS:
        for phase in ("setup", "call", "teardown"):
            cells = []
            for tests, _, _ in runs.values():
                cells.append(minutes(sum(ph.get(phase, 0.0) for n, ph in tests.items() if tier_of(n) == tier)))
            out.append(f"| {tier}: {phase} (min) | " + " | ".join(cells) + " |")
    first = runs[labels[0]][0]
    slowest = sorted(first, key=lambda n: -sum(first[n].values()))[:top]
    out += ["", f"Slowest {top} tests of `{labels[0]}` (seconds, setup + call + teardown):", "",
            "| test | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for node in slowest:
        cells = [f"{sum(t[node].values()):.0f}" if node in t else "–" for t, _, _ in runs.values()]
        out.append(f"| `{node}` | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", metavar="LABEL=LOG")
    parser.add_argument("--wall", action="append", default=[], metavar="LABEL=SECONDS")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--durations-out", type=Path, help="write {node id: seconds} of the first log (the order "
                        "tests/parallel_units.py hands units out in)")
    args = parser.parse_args()
    runs = {}
    for spec in args.logs:
        label, log = spec.split("=", 1)
        runs[label] = parse(Path(log))
    for spec in args.wall:
        label, seconds = spec.split("=", 1)
        tests, _, passed = runs[label]
        runs[label] = (tests, float(seconds), passed)
    text = table(runs, args.top)
    if args.durations_out:
        first = runs[next(iter(runs))][0]
        slow = {n: round(sum(ph.values())) for n, ph in first.items() if sum(ph.values()) >= 2}  # the rest: quick
        args.durations_out.write_text(json.dumps(slow, indent=0, sort_keys=True) + "\n")
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
