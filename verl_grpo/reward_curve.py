"""A run's learning as text: total reward and each reward component per step, read from its metrics.jsonl.

Pure functions (lines in, a small dict out) shared by the CLI summary, the Prefect summary artifact, the MLflow
run's `reward_curve.md` and its PNG. Both trainers' names are read: TRL's `reward`, `rewards/<component>/mean`,
`completions/mean_length`, `completions/clipped_ratio`; verl's `critic/score/mean`, `response_length/mean`,
`response_length/clip_ratio`. `signal/tied_group_share` (groups whose rollouts all scored alike) shows when
logged. Long runs are averaged into at most MAX_ROWS rows of equal windows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

MAX_ROWS = 20
TOTAL = "reward"
TOTAL_KEYS = ("reward", "critic/score/mean")
"""The total (weighted) reward per step: TRL's name, verl's name."""
DIAGNOSTICS = (("length", ("completions/mean_length", "response_length/mean")),
               ("clipped", ("completions/clipped_ratio", "response_length/clip_ratio")),
               ("tied", ("signal/tied_group_share",)),
               ("failed", ("reward/failed",)))
"""Columns after the reward components: mean response tokens, share cut at the length budget, share of GRPO
groups with no reward spread (no learning signal), rows on which the user's reward function failed (scored 0)."""
_COMPONENT_PREFIX, _COMPONENT_SUFFIX = "rewards/", "/mean"
CLASH = "r."
"""Prefix of a component column whose name is also a column of its own (a user's `length` component)."""
NOT_COMPONENTS = {"score"}
"""`rewards/score/mean`: the one function of a run scored by the user's own function, i.e. the total again."""


def records(lines: Iterable[str]) -> list[dict[str, Any]]:
    """One record per step (a later line of a step wins), in step order; lines that are not JSON are skipped
    (the last line of a log killed mid-write)."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), (int, float)):
            by_step.setdefault(int(record["step"]), {}).update(record)
    return [by_step[s] for s in sorted(by_step)]


def reward_series(lines: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """Column → (step, value) points of the total reward and each component; no diagnostics (the PNG's lines)."""
    recs = records(lines)
    columns = [c for c in _columns(recs) if c not in {name for name, _ in DIAGNOSTICS}]
    return {c: pts for c in columns if (pts := [(int(r["step"]), v) for r in recs if (v := _value(r, c)) is not None])}


def reward_curve(lines: Iterable[str], max_rows: int = MAX_ROWS) -> dict[str, Any] | None:
    """`{"columns": ["step", "reward", <components>, ...], "rows": [[step, value, ...]], "steps": n, "window": k}`:
    each row the mean of `window` consecutive steps (labelled by the last); None without a reward per step."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    recs = records(lines)
    columns = _columns(recs)
    if not columns:
        return None
    window = math.ceil(len(recs) / max_rows)
    rows = []
    for start in range(0, len(recs), window):
        chunk = recs[start : start + window]
        rows.append([int(chunk[-1]["step"]), *(_mean([_value(r, c) for r in chunk]) for c in columns)])
    return {"columns": ["step", *columns], "rows": rows, "steps": len(recs), "window": window}


def caption(curve: dict[str, Any]) -> str:
    window = f", each row the mean of {curve['window']} steps" if curve["window"] > 1 else ""
    return f"reward per training step ({curve['steps']} steps{window}): the weighted total, then each component"


def curve_text(curve: dict[str, Any]) -> str:
    """The curve as an aligned text table under its caption."""
    cells = [[_cell(col, v) for col, v in zip(curve["columns"], row)] for row in curve["rows"]]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(curve["columns"])]
    line = lambda values: "  ".join(v.rjust(w) for v, w in zip(values, widths))  # noqa: E731
    return "\n".join([caption(curve), line(curve["columns"]), *(line(c) for c in cells)])


def curve_markdown(curve: dict[str, Any]) -> str:
    """The curve as a markdown table under its caption."""
    head = "| " + " | ".join(curve["columns"]) + " |"
    rule = "|" + "---:|" * len(curve["columns"])
    body = ["| " + " | ".join(_cell(col, v) for col, v in zip(curve["columns"], row)) + " |" for row in curve["rows"]]
    return "\n".join([f"{caption(curve)}:", "", head, rule, *body])


def _columns(recs: list[dict[str, Any]]) -> list[str]:
    """`reward`, then each component in the order first logged, then the diagnostics present; [] without a
    total reward."""
    if not any(_value(r, TOTAL) is not None for r in recs):
        return []
    components: dict[str, None] = {}
    taken = {TOTAL, "step", *(name for name, _ in DIAGNOSTICS)}
    for r in recs:
        for key in r:
            if key.startswith(_COMPONENT_PREFIX) and key.endswith(_COMPONENT_SUFFIX):
                name = key[len(_COMPONENT_PREFIX) : -len(_COMPONENT_SUFFIX)]
                if name not in NOT_COMPONENTS:
                    components.setdefault(f"{CLASH}{name}" if name in taken else name, None)
    diagnostics = [name for name, _ in DIAGNOSTICS if any(_value(r, name) is not None for r in recs)]
    return [TOTAL, *components, *diagnostics]


def _value(record: dict[str, Any], column: str) -> float | None:
    component = column.removeprefix(CLASH)
    keys = TOTAL_KEYS if column == TOTAL else dict(DIAGNOSTICS).get(column, (f"{_COMPONENT_PREFIX}{component}"
                                                                          f"{_COMPONENT_SUFFIX}",))
    for key in keys:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _cell(column: str, value: float | None) -> str:
    if value is None:
        return "-"
    if column == "step":
        return str(int(value))
    if column == "failed":
        return f"{value:g}"
    return f"{value:.1f}" if column == "length" else f"{value:.3f}"
