"""No traffic leaves the machine unless the user asked for it: the telemetry, usage statistics and error reporting
of every library the project runs are off, in every process it starts.

`QUIET_ENV` is the one list. `apply_quiet_env()` puts it into this process's environment; entry points call it
before the libraries are imported, since most read their switch then. `quiet_env(environ)` gives the same
settings for a process started elsewhere (a trainer worker, a service, a SkyPilot task). A variable already set
in the environment wins either way, so a user opts back in by setting it (e.g. MLFLOW_DISABLE_TELEMETRY=false).

`python -m verl_grpo.privacy` prints the settings not yet set as shell `export` lines (infra/prefect/serve.sh).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, MutableMapping

QUIET_ENV: dict[str, str] = {
    # The consoledonottrack.com convention: Prefect's client analytics, huggingface_hub, SkyPilot's Scarf ping.
    # MLflow accepts only "true" for it, hence its own switch below.
    "DO_NOT_TRACK": "1",
    # The Prefect server's telemetry service; on the ephemeral API its heartbeat also raced the run for SQLite's
    # lock ("send_telemetry_heartbeat … database is locked"). Prefect's client reads it from the server too.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # transformers, datasets and TRL send their telemetry through huggingface_hub.
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "WANDB_ERROR_REPORTING": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
}


def quiet_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """QUIET_ENV with the values `environ` (default: this process's environment) already sets for its names."""
    environ = os.environ if environ is None else environ
    return {name: environ.get(name, value) for name, value in QUIET_ENV.items()}


def apply_quiet_env(environ: MutableMapping[str, str] | None = None) -> None:
    """Set every QUIET_ENV variable that `environ` (default: os.environ) does not set yet."""
    environ = os.environ if environ is None else environ
    for name, value in QUIET_ENV.items():
        environ.setdefault(name, value)


def export_lines(environ: Mapping[str, str] | None = None) -> list[str]:
    """`export NAME=value` for each QUIET_ENV variable `environ` does not set yet."""
    environ = os.environ if environ is None else environ
    return [f"export {name}={shlex.quote(value)}" for name, value in QUIET_ENV.items() if name not in environ]


if __name__ == "__main__":
    print("\n".join(export_lines()))
