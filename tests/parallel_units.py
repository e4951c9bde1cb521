"""How `make test` splits the suite over pytest-xdist workers (`--dist loadgroup`).

Most of the suite's time is spent waiting on subprocesses (servers starting, a trainer's steps, a rehearsal's
nodes), so a few workers on 2 cores overlap that waiting. Two rules keep the split from costing more than it saves:

- **A world is built once.** A test that uses a module- or class-scoped fixture runs on the worker that runs the
  rest of its module (one xdist group per module), and the tests of an expensive session-scoped world (the fault
  suite's uninterrupted `reference` run) share one group too; every other test is its own unit.
- **Longest first.** Units are handed out in collection order, so the whole-system tiers go first (end-to-end,
  faults, slow, then integration, then unit tests) and no long test starts last, while the unit tests fill the gaps.

Parallel rehearsals are safe because each rehearsal job has its own network namespace
(`verl_grpo/rehearsal/network.py`); the local provider's services and every test server bind free ports.
"""

from __future__ import annotations

import pytest

SHARED_SESSION_WORLDS = frozenset({"reference", "first_cli_run"})
"""Session-scoped fixtures too costly to build on more than one worker (the fault suite's uninterrupted run, a new
user's first CLI run): the tests that read one form one group."""
_WIDER_THAN_A_TEST = ("module", "class", "package")
_TIERS = ("e2e", "faults", "slow")


def _group(item: pytest.Item) -> str | None:
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in item.fixturenames:
        defs = definitions.get(name)
        if not defs:
            continue
        scope = defs[-1].scope
        if name in SHARED_SESSION_WORLDS:
            return f"world-{name}"
        if scope in _WIDER_THAN_A_TEST:
            return item.module.__name__ if item.module is not None else None
    return None


def _tier(item: pytest.Item) -> int:
    for rank, marker in enumerate(_TIERS):
        # tests/faults/conftest.py marks its tests in a later hook: its folder stands for the marker here
        if item.get_closest_marker(marker) is not None or f"/{marker}/" in str(item.path):
            return rank
    return len(_TIERS) + (0 if "/integration/" in str(item.path) else 1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") != "loadgroup":
        return
    for item in items:
        if (group := _group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # A unit's tier is its most whole-system test's: a group stays together in the order.
    tier_of_group: dict[str, int] = {}
    for item in items:
        if (group := _group(item)) is not None:
            tier_of_group[group] = min(tier_of_group.get(group, 99), _tier(item))
    items.sort(key=lambda item: tier_of_group.get(_group(item) or "", _tier(item)))
