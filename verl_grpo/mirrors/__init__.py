"""Optional mirrors of a registered run (base.Mirror): checked before anything is spent, sent to after registration,
and never able to fail the run; a failed send is one warning line and can be sent again (`verl-grpo mirror`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from verl_grpo.contracts import MirrorResult
from verl_grpo.errors import ConfigError
from verl_grpo.mirrors.base import Mirror, MirrorFailed, Readiness, RunMetrics
from verl_grpo.mirrors.wandb_mirror import WandbMirror

__all__ = ["MIRRORS", "Mirror", "MirrorFailed", "Readiness", "RunMetrics", "check", "enabled_mirrors", "preflight",
           "retry_hint", "send_all", "warning_line"]

log = logging.getLogger(__name__)

MIRRORS: tuple[Mirror, ...] = (WandbMirror(),)


def enabled_mirrors(env: Mapping[str, str] | None = None, only: Sequence[str] = ()) -> list[Mirror]:
    """The mirrors the environment asks for (restricted to the names in `only`, when given)."""
    env = os.environ if env is None else env
    unknown = set(only) - {m.name for m in MIRRORS}
    if unknown:
        raise ConfigError(f"unknown mirror {', '.join(sorted(unknown))}; known: {', '.join(m.name for m in MIRRORS)}")
    return [m for m in MIRRORS if m.enabled(env) and (not only or m.name in only)]


def check(env: Mapping[str, str] | None = None) -> dict[str, Readiness]:
    """Each enabled mirror's preflight; ConfigError (one line, no secret) for a setting the user must fix."""
    env = os.environ if env is None else env
    out = {}
    for mirror in enabled_mirrors(env):
        try:
            out[mirror.name] = mirror.preflight(env)
        except ConfigError as e:
            raise ConfigError(redact(str(e), mirror, env)) from None
    return out


def preflight(env: Mapping[str, str] | None = None) -> dict[str, Readiness]:
    """`check`, with what could not be verified logged once as a warning: the first step of a run."""
    ready = check(env)
    for name, readiness in ready.items():
        (log.warning if readiness.warning else log.info)("%s mirror: %s", name, readiness.detail)
    return ready


def send_all(run: RunMetrics, mirrors: Sequence[Mirror] | None = None, warn: bool = True) -> list[MirrorResult]:
    """Send the run to each mirror (default: the enabled ones). A failure is a result and (`warn`) one warning line,
    never an exception: the run is registered whatever a mirror does."""
    results = []
    for mirror in enabled_mirrors() if mirrors is None else mirrors:
        try:
            results.append(MirrorResult(name=mirror.name, ok=True, where=mirror.send(run)))
        except Exception as e:  # best effort by design: a mirror's bug or outage must not fail a registered run
            reason = str(e) if isinstance(e, MirrorFailed) else f"{type(e).__name__}: {e}"
            result = MirrorResult(name=mirror.name, ok=False, reason=redact(_one_line(reason), mirror))
            if warn:
                log.warning(warning_line(result, run.run_id))
            results.append(result)
    return results


def warning_line(result: MirrorResult, run_id: str) -> str:
    return f"{result.name} mirror failed: {result.reason}; {retry_hint(run_id)}"


def retry_hint(run_id: str) -> str:
    return f"the run is registered; send it again with `verl-grpo mirror --run-id {run_id}` (and the run's -c/-o)"


def redact(text: str, mirror: Mirror, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    for name in mirror.secret_env:
        if secret := env.get(name):
            text = text.replace(secret, f"<{name}>")
    return text


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
