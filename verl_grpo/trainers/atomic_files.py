"""Local files replaced atomically: a crash leaves the old content or the new one, never a part."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def write_text_atomic(path: Path, text: str) -> Path:
    """Replace `path` with `text` at once (temp file in the same dir, fsync, rename): readers and crashes see the
    old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=1))


def write_jsonl_atomic(path: Path, records: Iterable[Mapping[str, Any]]) -> Path:
    """One JSON object per line (numpy and torch scalars become floats)."""
    return write_text_atomic(path, "".join(json.dumps(r, default=float) + "\n" for r in records))
