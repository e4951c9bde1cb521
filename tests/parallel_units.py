"""How `make test` splits the suite over pytest-xdist workers (`-n N --dist loadgroup`).

Most of the suite's time is spent waiting on subprocesses (servers starting, a trainer's steps, a rehearsal's
nodes), so a few workers on 2 cores overlap that waiting. Two rules keep the split from costing more than it saves:

- **A world is built once.** A test that uses a module- or class-scoped fixture runs on the worker that runs the
  rest of its module, and the tests that read an expensive session-scoped world (`SHARED_SESSION_WORLDS`) share
  one worker too; every other test is a unit of its own.
- **Longest first.** Units are handed out in collection order: the whole-system tiers first (end-to-end, faults,
  slow, then integration, then unit tests), and within a tier the units whose tests took longest in a measured run
  (`tests/durations.json`, written by `bench/suite_durations.py --durations-out`) first, so no long test starts last
  while the unit tests fill the gaps. A test missing from the file counts as quick.

How: each worker decides every test's unit from its fixtures while collecting (only workers collect) and writes
them to a file in a directory the controller made (`UNITS_DIR_ENV`); the controller's scheduler, a
`LoadScopeScheduling` whose scope of a test is its unit, reads it when it splits the collection. (xdist's own
`xdist_group` mark relies on rewriting `item._nodeid`, which pytest 9 no longer reads.)

Parallel rehearsals are safe because each rehearsal job has its own network namespace
(`verl_grpo_rehearsal/network.py`); the local provider's services and every test server bind free ports.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SHARED_SESSION_WORLDS = frozenset({"reference", "first_cli_run"})
"""Session-scoped fixtures too costly to build on more than one worker (the fault suite's uninterrupted run, a new
user's first CLI run): the tests that read one form one unit."""
UNITS_DIR_ENV = "VERL_GRPO_TEST_UNITS_DIR"
DURATIONS_FILE = Path(__file__).with_name("durations.json")
_WIDER_THAN_A_TEST = ("module", "class", "package")
_TIERS = ("e2e", "faults", "slow")


def unit_of(item: pytest.Item) -> str:
    """The work unit of a test: a shared world's name, its module's path, or its own node id."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    module_wide = False
    for name in item.fixturenames:
        if name in SHARED_SESSION_WORLDS:
            return f"world:{name}"
        defs = definitions.get(name)
        module_wide = module_wide or bool(defs and defs[-1].scope in _WIDER_THAN_A_TEST)
    return item.nodeid.split("::", 1)[0] if module_wide else item.nodeid


def tier_of(item: pytest.Item) -> int:
    for rank, marker in enumerate(_TIERS):
        # tests/faults/conftest.py marks its tests in a later hook: its folder stands for the marker here
        if item.get_closest_marker(marker) is not None or f"/{marker}/" in str(item.path):
            return rank
    return len(_TIERS) + (0 if "/integration/" in str(item.path) else 1)


def _distributing(config: pytest.Config) -> bool:
    return config.getoption("dist", "no") == "loadgroup"


def pytest_configure(config: pytest.Config) -> None:
    if _distributing(config) and not hasattr(config, "workerinput"):  # the controller, before workers start
        os.environ[UNITS_DIR_ENV] = tempfile.mkdtemp(prefix="verl-grpo-test-units-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _distributing(config) and not hasattr(config, "workerinput") and UNITS_DIR_ENV in os.environ:
        shutil.rmtree(os.environ.pop(UNITS_DIR_ENV), ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not getattr(config.option, "loadgroup", False) or UNITS_DIR_ENV not in os.environ:
        return
    units = {item.nodeid: unit_of(item) for item in items}
    measured = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.is_file() else {}
    tier: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for item in items:  # a unit's tier is its most whole-system test's, so a unit stays together in the order
        unit = units[item.nodeid]
        tier[unit] = min(tier.get(unit, 99), tier_of(item))
        seconds[unit] = seconds.get(unit, 0.0) + float(measured.get(item.nodeid, 0.0))
    items.sort(key=lambda item: (tier[units[item.nodeid]], -seconds[units[item.nodeid]]))
    target = Path(os.environ[UNITS_DIR_ENV]) / f"{workerinput['workerid']}.json"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(units))
    tmp.replace(target)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if not _distributing(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        """xdist's load-scope scheduling, the scope of a test being its unit (`unit_of`, as the workers wrote it)."""

        _units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._units is None:
                files = sorted(Path(os.environ[UNITS_DIR_ENV]).glob("*.json"))
                self._units = json.loads(files[0].read_text()) if files else {}
            return self._units.get(nodeid, nodeid)

    return UnitScheduling(config, log)
