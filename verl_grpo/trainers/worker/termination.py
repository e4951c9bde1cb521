"""How a local worker process stops on SIGTERM without tearing a checkpoint upload."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Termination:
    """SIGTERM handling: exit at once, except while a checkpoint upload runs; then exit right after it."""

    def __init__(self) -> None:
        self.requested = False
        self._uploading = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        print("received SIGTERM; stopping", file=sys.stderr, flush=True)
        if not self._uploading:
            raise SystemExit(128 + signum)

    @contextmanager
    def upload(self) -> Iterator[None]:
        self._uploading = True
        try:
            yield
        finally:
            self._uploading = False
        if self.requested:
            raise SystemExit(128 + signal.SIGTERM)
