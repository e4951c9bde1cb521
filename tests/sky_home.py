"""A HOME for SkyPilot in tests: `~/.sky/catalogs/v8` holds the shipped catalog copy (../shared/data), as SkyPilot
reads it offline, plus any extra cloud's `vms.csv` a test needs."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from verl_grpo.local_paths import data_mirror_dir


def sky_home(home: Path, extra_clouds: Mapping[str, str] | None = None) -> Path:
    """Copy the shipped catalog into `home/.sky/catalogs/v8` (fails the test when the copy is missing) and write
    `extra_clouds` (cloud → vms.csv text) beside it; returns `home`."""
    catalog = data_mirror_dir() / "skypilot-catalog" / "v8"
    if not (catalog / "lambda" / "vms.csv").is_file():
        pytest.fail(f"SkyPilot catalog copy missing at {catalog}")
    target = home / ".sky" / "catalogs" / "v8"
    shutil.copytree(catalog, target)
    for cloud, csv in (extra_clouds or {}).items():
        (target / cloud).mkdir()
        (target / cloud / "vms.csv").write_text(csv)
    return home
