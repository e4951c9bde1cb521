from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from verl_grpo import plain_steps
from verl_grpo.chain import ResolvedRun


@task(name="resolve-config", cache_policy=NO_CACHE)
def resolve_config(config_files: list[str], overrides: list[str], run_id: str | None, fresh: bool) -> ResolvedRun:
    """Validate the config, pick/resume the run id and store the resolved config: once per run."""
    return plain_steps.resolve(config_files, overrides, run_id, fresh=fresh)
