"""A local worker's `metrics.jsonl`: one JSON object per logged step, rewritten from a checkpoint's copy on resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verl_grpo.trainers.atomic_files import write_jsonl_atomic


class MetricsLog:
    """`metrics.jsonl`: one JSON object per logged step, unique by `step`, travelling with every checkpoint."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def records(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def reset(self, source: Path | None = None, upto_step: int = 0) -> None:
        """Start over from `source`'s lines up to `upto_step` (a restored checkpoint), or empty."""
        kept = [r for r in read_metrics(source) if r["step"] <= upto_step] if source else []
        write_jsonl_atomic(self.path, kept)

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: Path | None) -> list[dict[str, Any]]:
    """Lines of a metrics.jsonl, deduplicated by step (the last line of a step wins), in step order."""
    if path is None or not Path(path).is_file():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            by_step[int(record["step"])] = record
    return [by_step[s] for s in sorted(by_step)]
