"""`make serve` for tests: serve.sh (what `make serve` runs) in a temporary VERL_GRPO_HOME / PREFECT_HOME on a
free loopback port, and stop.sh afterwards, which must leave no process behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ports import free_port
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect_template import seed_prefect_home

REPO = Path(__file__).resolve().parents[1]



@contextmanager
def served_prefect(home: Path, model_cache: Path, first_start: bool = False,
                   **env_overrides: str) -> Iterator[subprocess.CompletedProcess]:
    """Run serve.sh with `home` as the state dir, yield its completed process with PREFECT_API_URL pointing at
    the server, then stop.sh and check nothing of it is left running. Prefect's database is a copy of a migrated
    one (tests/prefect_template.py) unless `first_start`: the server then makes its schema, as on a new machine."""
    port = free_port()
    if not first_start:
        seed_prefect_home(home / "prefect")
    env = {**os.environ, "VERL_GRPO_HOME": str(home), "PREFECT_HOME": str(home / "prefect"),
           "PREFECT_SERVER_PORT": str(port), "MLFLOW_UI_PORT": str(free_port()), "VERL_GRPO_MODEL_CACHE": str(model_cache), "PREFECT_STOP_GRACE": "10",
           **env_overrides}
    env.pop("PREFECT_API_URL", None)
    started = subprocess.run([str(REPO / "infra/prefect/serve.sh")], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            yield started
    finally:
        stopped = subprocess.run([str(REPO / "infra/prefect/stop.sh")], env=env, cwd=REPO, capture_output=True,
                                 text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not list((home / "prefect").glob("*.pid"))
        leftovers = processes_with_env(f"PREFECT_HOME={home / 'prefect'}")
        assert not leftovers, f"processes left behind by make stop: {leftovers}"


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def processes_with_env(entry: str) -> list[str]:
    """Live processes (of this user) whose environment contains `entry`, e.g. PREFECT_HOME=<the test's>."""
    found = []
    needle = entry.encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0") and pid_alive(int(proc.name)):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {cmdline[:200]}")
        except OSError:
            continue
    return found
