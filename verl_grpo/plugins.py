"""Name → implementation tables (providers, trainers), imported on first use so one backend never imports another's
stack; and entry points, through which an installed extra adds to the product without the product importing it."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from verl_grpo.errors import ConfigError


def load_named(field: str, table: dict[str, str], name: str) -> Any:
    """The object `table[name]` ("module:attr") points at, or ConfigError naming `field` and the valid names."""
    target = table.get(name)
    if target is None:
        raise ConfigError(f"{field} {name!r} is not registered; use one of: {', '.join(sorted(table))}")
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def entry_point(group: str, name: str, missing: str) -> Any:
    """The object an installed distribution registers as entry point `name` of `group`; ConfigError(missing), the
    one line that says which extra to install, when none does."""
    found = entry_points(group=group, name=name)
    if not found:
        raise ConfigError(missing)
    return next(iter(found)).load()
