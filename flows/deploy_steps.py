"""Prefect deployment build steps (prefect.yaml `build:`), run once by `prefect deploy` in the deploying shell."""

from __future__ import annotations

import os
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ValidationError

from verl_grpo.config.env import boolean, env_setting
from verl_grpo.paths import data_mirror_dir, model_cache_dir, state_dir

# Seconds between a flow run's heartbeats. The zombie automation marks a run Crashed after 90 s without one, so
# Prefect's default (180 s) would crash every healthy run longer than that; the deployment pins it for any worker.
HEARTBEAT_S = "30"


def flow_run_environment() -> dict[str, str]:
    """What every flow run of the deployment needs from its environment, resolved now (paths absolute): the state dir
    (store, MLflow, work dirs), the model cache, the data mirror and the heartbeat frequency. prefect.yaml puts them
    in the deployment's job variables, so every flow run, on any worker of the pool (a restarted one, started from
    another shell), resumes runs from the same store instead of looking for them in the worker's own default."""
    nightly_schedule()  # fail here, naming the variable, before prefect.yaml's `${VAR:-default}` takes a blank one
    return {"state_dir": str(state_dir()), "model_cache": str(model_cache_dir()),
            "data_mirror": str(data_mirror_dir()),
            "heartbeat": os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") or HEARTBEAT_S}


def nightly_schedule() -> dict[str, object]:
    """The nightly schedule prefect.yaml deploys: VERL_GRPO_NIGHTLY_CRON, _TZ and _ACTIVE, each checked (a cron
    Prefect accepts, an IANA timezone, true/false); unset ones keep their defaults."""
    return {"cron": env_setting("VERL_GRPO_NIGHTLY_CRON", _cron, "0 2 * * *", "a cron expression such as '30 1 * * *'"),
            "timezone": env_setting("VERL_GRPO_NIGHTLY_TZ", _timezone, "UTC", "an IANA timezone such as Europe/Berlin"),
            "active": env_setting("VERL_GRPO_NIGHTLY_ACTIVE", boolean, True, "true or false")}


def _cron(raw: str) -> str:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        return CronSchedule(cron=raw).cron
    except ValidationError:
        raise ValueError("") from None


def _timezone(raw: str) -> str:
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError("") from None
    return raw
