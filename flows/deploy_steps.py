"""Prefect deployment build steps (prefect.yaml `build:`), run once by `prefect deploy` in the deploying shell."""

from __future__ import annotations

import os

from verl_grpo.paths import data_mirror_dir, model_cache_dir, state_dir

# Seconds between a flow run's heartbeats. The zombie automation marks a run Crashed after 90 s without one, so
# Prefect's default (180 s) would crash every healthy run longer than that; the deployment pins it for any worker.
HEARTBEAT_S = "30"


def flow_run_environment() -> dict[str, str]:
    """What every flow run of the deployment needs from its environment, resolved now (paths absolute): the state dir
    (store, MLflow, work dirs), the model cache, the data mirror and the heartbeat frequency. prefect.yaml puts them
    in the deployment's job variables, so every flow run, on any worker of the pool (a restarted one, started from
    another shell), resumes runs from the same store instead of looking for them in the worker's own default."""
    return {"state_dir": str(state_dir()), "model_cache": str(model_cache_dir()),
            "data_mirror": str(data_mirror_dir()),
            "heartbeat": os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") or HEARTBEAT_S}
