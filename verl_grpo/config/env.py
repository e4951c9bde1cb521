"""The env vars that are settings but no RunConfig field (the nightly schedules and the GPU deployments' store, read at
deploy time; the reward client's patience, `make serve`'s zombie timeout), each read through `env_setting`: unset keeps
the default; set to nothing, to blanks or to a value that does not parse, it fails in one line naming the variable and
the fix.

(The env knobs that are RunConfig fields go through `loader.load_config`; the path variables through
`verl_grpo.local_paths.env_path`.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import TypeVar
from urllib.parse import urlparse

from verl_grpo.errors import ConfigError

T = TypeVar("T")


def env_setting(var: str, parse: Callable[[str], T], default: T, expected: str,
                env: Mapping[str, str] | None = None) -> T:
    """`parse` of the variable's value (surrounding blanks dropped), `default` when it is unset; `expected` says
    what a good value looks like, e.g. "a number of seconds > 0"."""
    raw = (os.environ if env is None else env).get(var)
    if raw is None:
        return default
    if not raw.strip():
        raise ConfigError(f"{var} is set but empty; unset it to use the default ({default}) or set it to {expected}")
    try:
        return parse(raw.strip())
    except (ValueError, TypeError, ArithmeticError) as e:
        detail = f" ({e})" if str(e) else ""
        raise ConfigError(f"{var}={raw!r} is not {expected}{detail}; fix it or unset it to use the default "
                          f"({default})") from None


def positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0:
        raise ValueError("must be > 0")
    return value


def non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def boolean(raw: str) -> bool:
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ValueError("")


_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def s3_uri(raw: str) -> str:
    """`s3://bucket[/prefix]` with a valid bucket name; returned without a trailing slash."""
    bucket = raw.removeprefix("s3://").split("/", 1)[0]
    if not raw.startswith("s3://") or not _S3_BUCKET.fullmatch(bucket):
        raise ValueError("")
    return raw.rstrip("/")


def http_url(raw: str) -> str:
    """An http(s):// URL with a host."""
    parsed = urlparse(raw)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError("")
    return raw.rstrip("/")
