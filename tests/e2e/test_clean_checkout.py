"""A run writes nothing outside its state dir: not into the checkout, not into the directory it is started from,
not into HOME.

One tiny-flow run of the CLI (`first_cli_run`), started from an empty directory with VERL_GRPO_HOME a nested
directory that does not exist yet (so it also shows `VERL_GRPO_HOME=/new/nested/dir verl-grpo run ...` succeeds),
then the checkout's `git status --porcelain --ignored` (every file, bytecode caches aside) must be what it was before,
and the working directory must hold nothing (no mlruns/, wandb/, outputs/, .sky, prefect files, lightning_logs, ...) and
HOME no more
than library caches.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkout_files import checkout_status

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
LIBRARY_CACHES = (".cache", ".config/matplotlib")


def _everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_a_run_from_another_directory_writes_only_into_its_new_state_dir(first_cli_run):
    if subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    done, cwd, home, state = first_cli_run.done, first_cli_run.cwd, first_cli_run.home, first_cli_run.state
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "eval accuracy" in done.stdout and "Traceback" not in output
    assert (state / "store").is_dir() and (state / "mlflow.db").is_file() and (state / "prefect").is_dir()
    assert _everything_under(cwd) == [], "the working directory got files"
    # HOME may get library caches in their XDG places (matplotlib's font list), never state
    assert [p for p in _everything_under(home) if p != ".config" and not p.startswith(LIBRARY_CACHES)] == [], \
        "HOME got files"
    before, after = first_cli_run.checkout_before, checkout_status()
    assert [line for line in after if line not in before] == [], "the checkout got files"
    assert [line for line in before if line not in after] == [], "files of the checkout went away"


@pytest.mark.parametrize("var, value", [("VERL_GRPO_HOME", ""), ("PREFECT_HOME", " "), ("VERL_GRPO_MODEL_CACHE", ""),
                                        ("PREFECT_HOME", "{file}/sub"), ("VERL_GRPO_MODEL_CACHE", "{file}/sub"),
                                        ("VERL_GRPO_DATA_MIRROR", "{file}")])
def test_a_path_var_that_cannot_be_used_is_one_line_naming_it(var, value, tmp_path):
    """Empty, or under a regular file (which stops root too): exit 2 before Prefect starts, one line on stderr."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "VERL_GRPO_"))}
    env.update(HOME=str(tmp_path / "home"), VERL_GRPO_HOME=str(tmp_path / "state"))
    env[var] = value.format(file=blocker)
    done = subprocess.run([str(VENV_BIN / "verl-grpo"), "run", "-c", "gsm8k", "-c", "local", "-o", "model.name=tiny"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and var in done.stderr, done.stderr
    assert not (tmp_path / "state" / "prefect" / "prefect.db").exists()
