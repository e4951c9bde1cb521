"""Prefect deployment build steps (prefect.yaml `build:`), run once by `prefect deploy` in the deploying shell."""

from __future__ import annotations

import os
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ValidationError

from verl_grpo.config.cloud import SKYPILOT_IMPLIES
from verl_grpo.config.env import boolean, env_setting, http_url, s3_uri
from verl_grpo.local_paths import data_mirror_dir, model_cache_dir, state_dir

# Seconds between a flow run's heartbeats. The zombie automation marks a run Crashed after 90 s without one, so
# Prefect's default (180 s) would crash every healthy run longer than that; the deployment pins it for any worker.
HEARTBEAT_S = "30"

NIGHTLY_ORDER = ("gsm8k", "math", "mbpp", "gsm8k-gpu", "math-gpu", "mbpp-gpu")
"""prefect.yaml's deployments in the order their nightly runs start: the k-th at VERL_GRPO_NIGHTLY_CRON's minute + k
(modulo 60, same hour), so no two start in the same minute."""
GPU_SUFFIX = "-gpu"


def flow_run_environment() -> dict[str, str]:
    """What every flow run of the deployment needs from its environment, resolved now (paths absolute): the state dir
    (store, MLflow, work dirs), the model cache, the data mirror and the heartbeat frequency. prefect.yaml puts them
    in the deployment's job variables, so every flow run, on any worker of the pool (a restarted one, started from
    another shell), resumes runs from the same store instead of looking for them in the worker's own default."""
    nightly_schedule()  # fail here, naming the variable, before any deployment is written
    gpu_store()
    return {"state_dir": str(state_dir()), "model_cache": str(model_cache_dir()),
            "data_mirror": str(data_mirror_dir()),
            "heartbeat": os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") or HEARTBEAT_S}


def nightly_schedule() -> dict[str, object]:
    """The nightly schedule prefect.yaml deploys: VERL_GRPO_NIGHTLY_CRON, _TZ and _ACTIVE, each checked (a cron
    Prefect accepts whose minute is one number, an IANA timezone, true/false); unset ones keep their defaults."""
    return {"cron": env_setting("VERL_GRPO_NIGHTLY_CRON", _cron, "0 2 * * *",
                                "a cron expression whose minute is one number, such as '30 1 * * *'"),
            "timezone": env_setting("VERL_GRPO_NIGHTLY_TZ", _timezone, "UTC", "an IANA timezone such as Europe/Berlin"),
            "active": env_setting("VERL_GRPO_NIGHTLY_ACTIVE", boolean, True, "true or false")}


def gpu_store() -> dict[str, str | None]:
    """Where the nightly GPU deployments keep their runs: VERL_GRPO_GPU_STORE (an s3:// bucket the cluster's nodes
    reach; unset: none, and their schedules are deployed paused) and VERL_GRPO_GPU_STORE_ENDPOINT (an S3-compatible
    endpoint for that bucket, e.g. R2 or MinIO; unset: AWS)."""
    return {"uri": env_setting("VERL_GRPO_GPU_STORE", s3_uri, None, "an s3://bucket/prefix the cluster's nodes reach"),
            "endpoint_url": env_setting("VERL_GRPO_GPU_STORE_ENDPOINT", http_url, None,
                                        "the http(s):// endpoint of an S3-compatible store")}


def nightly_schedules() -> dict[str, dict[str, object]]:
    """One schedule per deployment of NIGHTLY_ORDER, staggered a minute apart; a GPU deployment's is active only when
    VERL_GRPO_GPU_STORE names its bucket (a nightly cloud run without one would fail at its first check). `note`
    ends the deployment's description: why its schedule is paused ("" when it is active)."""
    base = nightly_schedule()
    has_store = gpu_store()["uri"] is not None
    out = {}
    for k, name in enumerate(NIGHTLY_ORDER):
        why = ("VERL_GRPO_NIGHTLY_ACTIVE is false" if not base["active"] else
               "VERL_GRPO_GPU_STORE (its bucket) was unset when `make serve` deployed it; set it and run `make serve` "
               "again" if name.endswith(GPU_SUFFIX) and not has_store else "")
        out[name] = {"cron": staggered(str(base["cron"]), k), "timezone": base["timezone"], "active": not why,
                     "note": f" Nightly schedule paused: {why}." if why else ""}
    return out


def gpu_overrides() -> dict[str, list[str]]:
    """The overrides of a GPU deployment: SkyPilot with what it implies (as `verl-grpo launch` sets them), and the
    store of VERL_GRPO_GPU_STORE when set (else the run names none, and its launch fails naming storage.uri)."""
    store = gpu_store()
    overrides = ["infra.provider=skypilot", *SKYPILOT_IMPLIES]
    if store["uri"]:
        overrides.append(f"storage.uri={store['uri']}")
    if store["endpoint_url"]:
        overrides.append(f"storage.endpoint_url={store['endpoint_url']}")
    return {"overrides": overrides}


def staggered(cron: str, minutes: int) -> str:
    """`cron` with `minutes` added to its minute field (modulo 60: the hour and day fields stay as they are)."""
    minute, rest = cron.split(maxsplit=1)
    return f"{(int(minute) + minutes) % 60} {rest}"


def _cron(raw: str) -> str:
    from prefect.client.schemas.schedules import CronSchedule

    try:
        cron = CronSchedule(cron=raw).cron
    except ValidationError:
        raise ValueError("") from None
    if not cron.split(maxsplit=1)[0].isdigit():  # '*/5', '0,30' or '@daily' cannot be staggered minute by minute
        raise ValueError("its minute is not one number, which the deployments are staggered from")
    return cron


def _timezone(raw: str) -> str:
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError("") from None
    return raw
