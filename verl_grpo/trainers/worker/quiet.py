"""No progress bars in a training worker's output: its log is streamed line by line into the run's log (the CLI's
output, the Prefect flow run's log), where a bar's redraws become screens of lines. The trainer reports its own
progress in `step k/N` lines instead."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

NO_PROGRESS_BARS: dict[str, str] = {
    # datasets' `Map`/`Filter` bars (TRL's SFT tokenizes the warm-start set with them)
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    # huggingface_hub's download bars, which transformers' own bars (checkpoint shards) follow
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def no_progress_bars(environ: MutableMapping[str, str] | None = None) -> None:
    """Set NO_PROGRESS_BARS where `environ` (default: os.environ) does not set them; before the libraries are
    imported, which read them then."""
    environ = os.environ if environ is None else environ
    for name, value in NO_PROGRESS_BARS.items():
        environ.setdefault(name, value)
