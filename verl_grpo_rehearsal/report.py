"""What a rehearsal exercised, for `verl-grpo launch --rehearse` to print: every job the flow launched on the
rehearsal with its tasks, setup/run exit codes, preemptions and recoveries, the checkpoints committed and restored,
the model registered, and what the launch would have cost on the cloud."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.trainers.verl.commit import COMMITTED_LINE
from verl_grpo.trainers.verl.restore import RESTORED_LINE

STAND_INS = (
    "verl.trainer.main_ppo → verl_grpo_rehearsal.main_ppo_cpu (verl's config, dataset, reward loader, checkpoint "
    "layout, callback and resume; a CPU policy-gradient step instead of Ray/FSDP/vLLM)",
    "vLLM in the eval task → transformers generate on the CPU (same runner entry point and report)",
    "package installs in setup → an offline check of each requirement and of requires-python",
)


def log_facts(lines: Sequence[str]) -> tuple[list[int], list[int]]:
    """(steps committed to the store, steps restored from it), in log order, from a job's log lines."""
    commits = [int(m[1]) for line in lines if (m := COMMITTED_LINE.match(line))]
    restores = [int(m[1]) for line in lines if (m := RESTORED_LINE.match(line))]
    return commits, restores


def rehearsal_jobs() -> list[dict[str, Any]]:
    """`sky_boundary.summary` of every job of the current rehearsal (managed and on clusters), oldest first."""
    from verl_grpo_rehearsal import sky_boundary

    base = sky_boundary.state_dir()
    jobs = [sky_boundary.summary(r.job_id) for r in sky_boundary.queue()]
    for cluster in sorted(p.name for p in (base / "clusters").glob("*")):
        jobs += [sky_boundary.summary(r.job_id, cluster) for r in sky_boundary.cluster_queue(cluster)]
    return sorted(jobs, key=lambda j: min((e.get("ts", 0) for e in j["events"]), default=0))


def describe_event(event: dict[str, Any]) -> str | None:
    """One line for an event of the rehearsal's events.jsonl; None for bookkeeping events."""
    kind = event.get("event")
    node = f"{event.get('task')}[{event.get('rank')}] (attempt {event.get('attempt')})"
    if kind == "task_launched":
        return f"launched {event['task']} on {event.get('num_nodes', 1)} node(s), attempt {event.get('attempt')}"
    if kind == "node_setup_exited":
        return f"{node} setup exit {event.get('exit_code')}"
    if kind == "node_run_exited":
        return f"{node} run exit {event.get('exit_code')}"
    if kind == "preempted":
        return f"preempted at step {event.get('step')}: the nodes' processes killed"
    if kind == "recovering":
        return f"RECOVERING (recovery {event.get('recovery_count')}): {event.get('reason')}"
    if kind == "restarted_after_error":
        return (f"user-code failure (exit {event.get('exit_codes')}): restart {event.get('restart')} of "
                f"max_restarts_on_errors={event.get('max_restarts_on_errors')}")
    if kind in ("auxiliary_terminating", "auxiliary_terminated", "auxiliary_failed", "prechecks_failed"):
        return " ".join([kind.replace("_", " "), *(f"{k}={v}" for k, v in event.items() if k not in ("ts", "event"))])
    if kind == "job_ended":
        reason = f" ({event['failure_reason']})" if event.get("failure_reason") else ""
        return f"ended {event.get('status')}{reason}"
    return None


def render_job(job: dict[str, Any]) -> list[str]:
    lines = [f"  job {job['job_id']} {job['name']}: {job['status']}, recovery_count {job['recovery_count']}"]
    lines += [f"    {text}" for e in job["events"] if (text := describe_event(e))]
    log = Path(job["job_dir"]) / "run.log"
    commits, restores = log_facts(log.read_text(errors="replace").splitlines() if log.is_file() else [])
    if commits or restores:
        lines.append(f"    checkpoints committed at steps {commits or '-'}; restored at start: {restores or '-'}")
    return lines


def rehearsal_report(session: Any, cfg: RunConfig, costs: Sequence[Any], summary: dict[str, Any] | None) -> str:
    """The whole report: jobs, the registered version, the stand-ins and the cost of the real launch."""
    lines = ["", f"Rehearsal of the SkyPilot launch ({cfg.skypilot.shape}; state in {session.root}):"]
    for job in rehearsal_jobs():
        lines += render_job(job)
    if summary:
        lines.append(f"  registered {summary['registered']} ({summary['decision']}) in the rehearsal's registry "
                     f"{cfg.tracking.mlflow_uri}; final step {summary.get('steps')}")
    else:
        lines.append("  nothing registered: the flow failed (see the error below)")
    lines.append("  stood in (no GPU here):")
    lines += [f"    - {s}" for s in STAND_INS]
    if costs:
        c = min(costs, key=lambda c: c.on_demand)
        spot = f", ${c.spot:,.2f} on spot" if c.spot is not None else ""
        lines.append(f"  the real launch: {cfg.infra.nodes} x {c.instance_type} ({c.cloud}) for an estimated "
                     f"{c.hours:.2f} h: ${c.on_demand:,.2f} on demand{spot}")
    return "\n".join(lines)
