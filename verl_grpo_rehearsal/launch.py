"""`verl-grpo launch --rehearse`: the real flow on the local rehearsal of SkyPilot.

The CLI finds `rehearse` through the `verl_grpo.launch` entry point (pyproject.toml), so no product module imports
the rehearsal; it hands in how it loads a config and runs the flow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from verl_grpo.config import RunConfig
from verl_grpo.providers.skypilot.dry_run import dry_run as sky_dry_run
from verl_grpo_rehearsal import sky_boundary
from verl_grpo_rehearsal.report import rehearsal_report
from verl_grpo_rehearsal.session import rehearsal_session


def rehearse(cfg: RunConfig, overrides: Sequence[str], preempt_at: Sequence[int], fail_at: int | None, *,
             load: Callable[[Sequence[str]], RunConfig], run_flow: Callable[[Sequence[str]], dict],
             echo: Callable[[str], None]) -> tuple[dict, RunConfig]:
    """Run the flow with `overrides` plus the rehearsal's own (its store, its cluster) and print what it exercised,
    also when the run fails (the error is raised after the report). Returns the flow's summary and the config it
    ran with."""
    with rehearsal_session(cfg, preempt_at, fail_at) as session:
        overrides = (*overrides, *session.overrides)
        cfg = load(overrides)
        dry = sky_dry_run(cfg)  # fail-before-spend runs first, as for a real launch
        echo("\n".join(["Dry run checks passed:", *(f"  - {c}" for c in dry.checks)]))
        if cfg.skypilot.cluster:
            sky_boundary.create_cluster(cfg.skypilot.cluster)
        summary, error = None, None
        try:
            summary = run_flow(overrides)
        except Exception as e:  # the report says what ran before the failure; the error is re-raised below
            error = e
        echo(rehearsal_report(session, cfg, dry.costs, summary))
    if error is not None:
        raise error
    return summary, cfg
