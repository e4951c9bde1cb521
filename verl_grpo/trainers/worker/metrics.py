"""A local worker's step logs, `metrics.jsonl` and `samples.jsonl`: one JSON object per logged step each, travelling
inside every checkpoint and rewritten from a checkpoint's copy on resume."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_grpo.store_layout import METRICS_FILE, SAMPLES_FILE, run_metrics, run_samples
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


class WorkerLogs:
    """A worker's metrics.jsonl and samples.jsonl (trainer.log_samples_every), side by side in its work dir."""

    def __init__(self, workdir: Path):
        self.metrics = MetricsLog(Path(workdir) / METRICS_FILE)
        self.samples = MetricsLog(Path(workdir) / SAMPLES_FILE)

    def reset(self, step_dir: Path | None = None, upto_step: int = 0) -> None:
        """Start over from a restored checkpoint's copies up to its step, or empty."""
        for log in (self.metrics, self.samples):
            log.reset(step_dir / log.path.name if step_dir else None, upto_step)

    def copy_into(self, step_dir: Path) -> None:
        """Put both logs inside a checkpoint about to be committed."""
        for log in (self.metrics, self.samples):
            if log.path.is_file():
                shutil.copyfile(log.path, Path(step_dir) / log.path.name)

    def publish(self, store: Any, run_id: str, retrying: Callable[[str, Callable[[], str]], str]) -> str:
        """Upload both beside the run (`runs/<run_id>/`) through the store's retries; returns metrics.jsonl's URI."""
        if self.samples.path.is_file():
            retrying("upload samples", lambda: store.put_file(self.samples.path, run_samples(run_id)))
        return retrying("upload metrics", lambda: store.put_file(self.metrics.path, run_metrics(run_id)))


def read_metrics(path: Path | None) -> list[dict[str, Any]]:
    """Lines of a local metrics.jsonl (or samples.jsonl), as `step_records`; [] when there is no file."""
    if path is None or not Path(path).is_file():
        return []
    return step_records(Path(path).read_text())


def step_records(text: str) -> list[dict[str, Any]]:
    """A step log's JSON lines, deduplicated by step (the last line of a step wins), in step order."""
    by_step: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            by_step[int(record["step"])] = record
    return [by_step[s] for s in sorted(by_step)]
