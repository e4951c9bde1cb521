"""The mirror interface: a best-effort copy of a registered run's metrics to another service.

MLflow is the system of record. A mirror (W&B today; a remote artifact store or a webhook tomorrow) is checked
before anything is spent (`preflight`) and sent to after registration (`send`); a failed send is a result, not an
error of the run, and `verl-grpo mirror` sends again later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from verl_grpo.config import RunConfig


@dataclass(frozen=True)
class RunMetrics:
    """What a mirror receives: the run's per-step training metrics (metrics.jsonl lines) and its eval summary."""

    cfg: RunConfig
    run_id: str
    metrics_lines: Sequence[str]
    summary: Mapping[str, float]


@dataclass(frozen=True)
class Readiness:
    """What a preflight established, one line; `warning` when it could not verify everything (and goes on)."""

    detail: str
    warning: bool = False


class MirrorFailed(Exception):
    """A send that could not be done (service down, credentials rejected); the message is one line, no secrets."""


class Mirror(Protocol):
    name: str
    secret_env: tuple[str, ...]
    """Environment variables whose values must never appear in a message (they are redacted if they do)."""

    def enabled(self, env: Mapping[str, str]) -> bool:
        """True when the environment asks for this mirror."""

    def preflight(self, env: Mapping[str, str]) -> Readiness:
        """Check settings and credentials before anything is spent; ConfigError (one line naming the setting and
        the fix) for what the user must fix, a warning Readiness for what could not be checked."""

    def send(self, run: RunMetrics) -> str:
        """Copy the run; return where it went. Raises MirrorFailed (or anything else: callers catch it)."""
