"""The Prefect task runner of the flow's concurrent tasks, chosen by the run's `orchestration` config.

The flow enters it around the eval step only (`with task_runner(cfg.orchestration) as runner:`), so the choice
follows each run's config however the flow is started (CLI, deployment, test), and a local Ray lives only as
long as the tasks that use it.
"""

from __future__ import annotations

import os
import sys

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

from verl_grpo.config import OrchestrationConfig

# Ray resolves a node address of 127.0.0.1 to the machine's outward IP and binds its gRPC servers to all
# interfaces unless "clusters" are disabled, which is what a single-machine local Ray wants anyway. Read when
# ray is first imported, and inherited by the raylet and workers. (Usage stats: verl_grpo.privacy.)
_LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def task_runner(orchestration: OrchestrationConfig) -> TaskRunner:
    """A thread pool, a local Ray on 127.0.0.1, or a runner joining the Ray cluster at ray_address."""
    if orchestration.task_runner == "thread":
        return ThreadPoolTaskRunner()
    if orchestration.ray_address is None:
        _keep_local_ray_on_loopback()
    from prefect_ray.task_runners import RayTaskRunner

    if orchestration.ray_address is None:
        return RayTaskRunner(init_kwargs=local_ray_init_kwargs())
    # prefect-ray treats "auto" as "no address"; passed as a keyword, ray.init joins the running cluster or fails.
    if orchestration.ray_address == "auto":
        return RayTaskRunner(init_kwargs={"address": "auto"})
    return RayTaskRunner(address=orchestration.ray_address)


def local_ray_init_kwargs() -> dict:
    """ray.init settings of a local, private Ray: a fresh instance (never a `ray start` cluster found on this
    machine), one task slot per core this process may use, no dashboard, loopback only."""
    return {
        "address": "local",
        "num_cpus": len(os.sched_getaffinity(0)),
        "include_dashboard": False,
        "_node_ip_address": "127.0.0.1",
        "log_to_driver": True,
    }


def _keep_local_ray_on_loopback() -> None:
    for name, value in _LOOPBACK_ONLY.items():
        os.environ[name] = value
    if "ray" in sys.modules:  # imported before the variable was set: the flag it read at import is stale
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
