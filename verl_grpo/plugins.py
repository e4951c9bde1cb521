"""Name → implementation tables (providers, trainers), imported on first use so one backend never imports another's
stack."""

from __future__ import annotations

import importlib
from typing import Any

from verl_grpo.errors import ConfigError


def load_named(field: str, table: dict[str, str], name: str) -> Any:
    """The object `table[name]` ("module:attr") points at, or ConfigError naming `field` and the valid names."""
    target = table.get(name)
    if target is None:
        raise ConfigError(f"{field} {name!r} is not registered; use one of: {', '.join(sorted(table))}")
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)
