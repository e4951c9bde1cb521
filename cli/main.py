"""`verl-grpo` command line: run the whole flow, or one step at a time.

It lives outside the domain package because `run` and `launch` start the Prefect flow; the partial commands run
the same chain (verl_grpo.chain) with plain functions for steps.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from verl_grpo.errors import ConfigError, DataError, VerlGrpoError

_CONFIG_HELP = "Config file or shipped profile (gsm8k, math, mbpp, local); repeat to merge in order."
_OVERRIDE_HELP = "Dotted override applied last, e.g. -o algorithm.rollouts=8; repeatable."


def _config_options(fn: Callable) -> Callable:
    fn = click.option("-o", "--override", "overrides", multiple=True, help=_OVERRIDE_HELP)(fn)
    return click.option("-c", "--config", "configs", multiple=True, help=_CONFIG_HELP)(fn)


def _user_errors(fn: Callable) -> Callable:
    """Our own errors become a one-paragraph message and exit code 2 (config/data) or 1 (other)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VerlGrpoError as e:
            click.secho(f"error ({type(e).__name__}): {e}", fg="red", err=True)
            sys.exit(2 if isinstance(e, (ConfigError, DataError)) else 1)

    return wrapper


def _load(configs: tuple[str, ...], overrides: tuple[str, ...], data: bool = False):
    """The config, checked before anything starts; the local directories it names exist afterwards (and with
    `data`, for a run, the data mirror it names holds the dataset)."""
    from verl_grpo.config import config_files, load_config
    from verl_grpo.plain_steps import prepare_local_state

    cfg = load_config(config_files(configs), list(overrides))
    prepare_local_state(cfg, data=data)
    return cfg


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """GRPO post-training pipeline: prepare → provision → train → evaluate → register."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("verl_grpo").setLevel(logging.DEBUG if verbose else logging.INFO)


@main.command()
@_config_options
@click.option("--run-id", default=None, help="Resume this run id; it must exist in the store (default: resume an "
                                             "unfinished run with the same config, else start one).")
@click.option("--fresh", is_flag=True, help="Start a new run (named --run-id when given) even if an unfinished one "
                                            "with the same config exists.")
@_user_errors
def run(configs: tuple[str, ...], overrides: tuple[str, ...], run_id: str | None, fresh: bool) -> None:
    """Run the whole `verl-grpo` Prefect flow (ephemeral Prefect unless PREFECT_API_URL is set)."""
    cfg = _load(configs, overrides, data=True)  # fail on a bad config or an unknown run id before Prefect starts
    if run_id:
        from verl_grpo import runs
        from verl_grpo.store import Store

        runs.checked_run_id(Store.from_config(cfg.storage), cfg, run_id, fresh=fresh)
    _print_where_to_look(_run_flow(configs, overrides, run_id, fresh), cfg)


def _print_where_to_look(summary: dict, cfg) -> None:
    from verl_grpo.summary import (
        curve_lines,
        metrics_heading,
        mlflow_ui_command,
        outcome_lines,
    )

    click.echo("")
    click.secho("verl-grpo run finished", fg="green", bold=True)
    delta = summary.get("delta")
    click.echo(f"  eval accuracy     {summary['accuracy']:.4f} on {summary['eval_split']}"
               f" (base {summary['base_accuracy']:.4f}, delta {delta:+.4f})")
    if summary.get("grpo"):
        click.echo(f"  GRPO's own share  {summary['grpo']}")
    if summary.get("tools"):
        click.echo(f"  search tool       {summary['tools'].removeprefix('search tool: ')}")
    click.echo(f"  registered model  {summary['registered']}  aliases: {summary['aliases'] or '-'}  "
               f"({summary['decision']})")
    if summary.get("quarantined"):
        click.echo(f"  quarantined       {summary['quarantined']}")
    for line in summary.get("warnings", []):
        click.secho(f"  warning           {line}", fg="yellow")
    click.echo(f"  checkpoint        {summary['checkpoint']}")
    click.echo(f"  final model       {summary['model_uri']}")
    click.echo(f"  run id            {summary['run_id']}  (config digest {summary['config_digest']})")
    for line in summary.get("async_loop", []):
        click.echo(f"  {line}")
    click.echo(f"  MLflow UI         {mlflow_ui_command(cfg.tracking.mlflow_uri)}")
    if summary.get("cloud_cost"):
        click.echo(f"  cloud cost        {summary['cloud_cost']}")
    click.echo(f"  {metrics_heading(summary)}")
    for line in outcome_lines(summary)[2:]:
        if line in (summary.get("grpo"), summary.get("tools")):  # printed above
            continue
        click.echo(f"    {line}")
    click.echo("  learning:")
    for line in curve_lines(summary):
        click.echo(f"    {line}")


@main.command()
@_config_options
@_user_errors
def validate(configs: tuple[str, ...], overrides: tuple[str, ...]) -> None:
    """Check a config and its inputs (data, model, store, tracking, trainer mapping) without running anything."""
    from verl_grpo.validate import validate_run

    cfg = _load(configs, overrides)
    checks = validate_run(cfg)
    for check in checks:
        click.echo(f"  [{'ok' if check.ok else 'FAIL'}] {check.name}: {check.detail}")
    failed = [c.name for c in checks if not c.ok]
    if failed:
        raise ConfigError(f"checks failed: {', '.join(failed)}")
    click.echo(f"config OK (digest {cfg.digest()})")


@main.command()
@_config_options
@click.option("--dataset", default=None, help="Shortcut for -c NAME -o dataset.name=NAME (gsm8k, math, mbpp, squad, "
              "reasoning_gym); your own task is named by its config (-c FILE).")
@_user_errors
def prepare(configs: tuple[str, ...], overrides: tuple[str, ...], dataset: str | None) -> None:
    """Prepare verl-format parquet in the store and print its manifest."""
    from verl_grpo import plain_steps
    from verl_grpo.store import Store
    from verl_grpo.store_layout import DATASET_MANIFEST, dataset_dir

    if dataset:
        overrides = (*overrides, f"dataset.name={dataset}")
    if dataset and not configs:
        configs = (dataset,)
    cfg = _load(configs, overrides)
    version = plain_steps.prepare(cfg)
    store = Store.from_config(cfg.storage)
    click.echo(store.read_text(dataset_dir(version.name, version.hash), DATASET_MANIFEST))


@main.command()
@_config_options
@click.option("--run-id", default=None, help="Resume this run id; it must exist in the store.")
@click.option("--fresh", is_flag=True, help="Start a new run (named --run-id when given).")
@_user_errors
def train(configs: tuple[str, ...], overrides: tuple[str, ...], run_id: str | None, fresh: bool) -> None:
    """Prepare (cached), provision, train and tear down, without Prefect; prints the TrainResult."""
    from verl_grpo import plain_steps
    from verl_grpo.chain import run_chain
    from verl_grpo.config import config_files

    run = plain_steps.resolve(config_files(configs), list(overrides), run_id, fresh=fresh)
    outcome = run_chain(run, plain_steps.PlainSteps(on_line=click.echo), through="train")
    click.echo(outcome.train.model_dump_json(indent=1))


@main.command()
@_config_options
@click.option("--model", "model_uri", default=None,
              help="Model dir, store URI or model name to evaluate through the eval cache (default: the base model).")
@click.option("--run-id", default=None, help="Evaluate this run's final model.")
@_user_errors
def evaluate(configs: tuple[str, ...], overrides: tuple[str, ...], model_uri: str | None, run_id: str | None) -> None:
    """Held-out evaluation; prints the metrics."""
    from verl_grpo import held_out, plain_steps

    cfg = _load(configs, overrides)
    dataset = plain_steps.prepare(cfg)
    if run_id:
        model_uri = model_uri or _stored_train_result(cfg, run_id).model_uri
        report = held_out.evaluate_trained(cfg, dataset, run_id, model_uri)
    else:
        report = held_out.evaluate_cached_model(cfg, dataset, model_uri)
    _echo_json(report.model_dump())


@main.command()
@_config_options
@click.option("--run-id", required=True, help="The trained and evaluated run to register.")
@_user_errors
def register(configs: tuple[str, ...], overrides: tuple[str, ...], run_id: str) -> None:
    """Register a trained, evaluated run in MLflow (idempotent); prints the model version."""
    from verl_grpo import plain_steps
    from verl_grpo.chain import ResolvedRun
    from verl_grpo.contracts import EvalReport
    from verl_grpo.held_out import evaluate_base
    from verl_grpo.store import Store
    from verl_grpo.store_layout import eval_report

    cfg = _load(configs, overrides)
    store = Store.from_config(cfg.storage)
    dataset = plain_steps.prepare(cfg)
    result = _stored_train_result(cfg, run_id)
    try:
        report = EvalReport.model_validate_json(store.read_text(eval_report(run_id, cfg.eval.split)))
    except FileNotFoundError:
        raise ConfigError(f"run {run_id} has no eval report for split {cfg.eval.split}; run `verl-grpo evaluate "
                          f"--run-id {run_id}` first") from None
    base = evaluate_base(cfg, dataset)
    version = plain_steps.register(ResolvedRun(cfg, run_id, resumed=True), dataset, result, report, base)
    _echo_json(version.model_dump())


def _stored_train_result(cfg, run_id: str):
    from verl_grpo.contracts import TrainResult
    from verl_grpo.store import Store
    from verl_grpo.store_layout import train_result

    store = Store.from_config(cfg.storage)
    try:
        return TrainResult.model_validate_json(store.read_text(train_result(run_id)))
    except FileNotFoundError:
        raise ConfigError(f"run {run_id} has no finished training in {store.uri}; check --run-id or run `verl-grpo "
                          "train`") from None


@main.command()
@_config_options
@click.option("--provider", type=click.Choice(["skypilot", "local"]), default="skypilot", show_default=True,
              help="Where to train; skypilot implies trainer.backend=verl (which has no warm start phase yet: "
                   "warm_start.enabled=false unless you set it).")
@click.option("--dry-run", is_flag=True, help="Run every offline check, print the task YAML(s) and a cost estimate; "
                                              "launch nothing.")
@click.option("--rehearse", is_flag=True,
              help="Run the whole flow on a local rehearsal of the cloud: the rendered YAML runs on this machine "
                   "(verl's trainer and vLLM stood in on the CPU); the last check before a real launch.")
@click.option("--preempt-at", "preempt_at", type=click.IntRange(min=1), multiple=True, metavar="STEP",
              help="With --rehearse: preempt the training nodes once the trainer logs STEP; repeatable.")
@click.option("--fail-at", "fail_at", type=click.IntRange(min=1), default=None, metavar="STEP",
              help="With --rehearse: the stand-in trainer fails once at STEP (user code), as a real bug would.")
@click.option("--cluster", default=None, help="Run the next training round on this existing SkyPilot cluster (sky "
                                              "exec).")
@click.option("--run-id", default=None, help="Resume this run id from its last committed checkpoint; it must exist in "
                                              "the store (default: resume an unfinished run with the same config, "
                                              "else start one).")
@click.option("--fresh", is_flag=True, help="Start a new run (named --run-id when given) even if an unfinished one "
                                            "with the same config exists.")
@_user_errors
def launch(configs: tuple[str, ...], overrides: tuple[str, ...], provider: str, dry_run: bool, rehearse: bool,
           preempt_at: tuple[int, ...], fail_at: int | None, cluster: str | None, run_id: str | None,
           fresh: bool) -> None:
    """Train on cloud GPUs with SkyPilot (verl backend); every check runs before anything is spent."""
    overrides = (*overrides, f"infra.provider={provider}", *([f"skypilot.cluster={cluster}"] if cluster else []))
    if provider == "skypilot":
        from verl_grpo.config.cloud import SKYPILOT_IMPLIES

        overrides = (*SKYPILOT_IMPLIES, *overrides)
    if (preempt_at or fail_at) and not rehearse:
        raise ConfigError("--preempt-at and --fail-at inject faults into a rehearsal; add --rehearse")
    if rehearse and (provider != "skypilot" or dry_run):
        raise ConfigError("--rehearse rehearses a SkyPilot launch: use it with --provider skypilot and without "
                          "--dry-run")
    if rehearse and run_id and not fresh:
        raise ConfigError("--rehearse starts from an empty rehearsal store, where no run can be resumed; drop --run-id "
                          "or add --fresh to name the rehearsed run")
    if rehearse:
        from verl_grpo.extras import require

        require("rehearsal", "verl-grpo launch --rehearse")
    # On SkyPilot the dry run (which a real launch runs first) reports missing data among all its other checks.
    cfg = _load(configs, overrides, data=provider != "skypilot" or rehearse)
    if rehearse:
        _rehearse(configs, overrides, cfg, preempt_at, fail_at, run_id, fresh)
        return
    if run_id:  # the dry run checks it too: a resume of a run the store lacks fails before anything starts
        from verl_grpo import runs
        from verl_grpo.store import Store

        runs.checked_run_id(Store.from_config(cfg.storage), cfg, run_id, fresh=fresh)
    if provider == "skypilot":
        from verl_grpo.providers.skypilot.dry_run import dry_run as sky_dry_run

        click.echo(sky_dry_run(cfg).render())
    if dry_run:
        return
    _print_where_to_look(_run_flow(configs, overrides, run_id, fresh), cfg)


def _run_flow(configs: tuple[str, ...], overrides: tuple[str, ...], run_id: str | None = None,
              fresh: bool = False) -> dict:
    from verl_grpo_flows.local_api import use_local_prefect

    use_local_prefect()  # before Prefect is imported: it reads its settings then
    from verl_grpo_flows.verl_grpo import verl_grpo

    return verl_grpo(config=list(configs), overrides=list(overrides), run_id=run_id, fresh=fresh)


def _rehearse(configs: tuple[str, ...], overrides: tuple[str, ...], cfg, preempt_at: tuple[int, ...],
              fail_at: int | None, run_id: str | None = None, fresh: bool = False) -> None:
    """The real flow on the local rehearsal of SkyPilot (the `rehearsal` extra, found by its entry point)."""
    from verl_grpo.plugins import entry_point

    rehearse = entry_point("verl_grpo.launch", "rehearse",
                           "--rehearse needs the rehearsal extra: pip install 'verl-grpo[rehearsal]'")
    summary, cfg = rehearse(cfg, overrides, preempt_at, fail_at, load=lambda o: _load(configs, tuple(o)),
                            run_flow=lambda o: _run_flow(configs, tuple(o), run_id, fresh), echo=click.echo)
    _print_where_to_look(summary, cfg)


@main.command()
@_config_options
@click.option("--run-id", required=True, help="The registered run to send again.")
@click.option("--to", "only", multiple=True, help="Only this mirror (wandb); repeatable. Default: every configured "
                                                  "one.")
@_user_errors
def mirror(configs: tuple[str, ...], overrides: tuple[str, ...], run_id: str, only: tuple[str, ...]) -> None:
    """Send a registered run's metrics to its optional mirrors again (W&B), e.g. after a mirror failed at
    registration."""
    from verl_grpo.errors import InfraError
    from verl_grpo.registry.mirroring import mirror_run

    results = mirror_run(_load(configs, overrides), run_id, only)
    for result in results:
        if result.ok:
            click.echo(f"{result.name}: {result.where}")
    if failed := [r for r in results if not r.ok]:
        raise InfraError("; ".join(f"{r.name} mirror failed: {r.reason}" for r in failed))


@main.command()
@_user_errors
def home() -> None:
    """Create the state dir and every directory the libraries expect in it; print where each thing lives."""
    from verl_grpo.local_paths import data_mirror_dir, ensure_dir, model_cache_dir, prefect_home, state_dir
    from verl_grpo.registry.relocate import relocate_artifacts

    cfg = _load((), ())  # creates the state dir, the store and the MLflow DB's directory
    if moved_from := relocate_artifacts(cfg.tracking.mlflow_uri):
        click.echo(f"MLflow store moved: artifact paths rewritten from {moved_from}", err=True)
    for name, where in (("state dir (VERL_GRPO_HOME)", state_dir()), ("store", cfg.storage.uri),
                        ("MLflow", cfg.tracking.mlflow_uri),
                        ("Prefect home", ensure_dir(prefect_home(), "PREFECT_HOME")),
                        ("model cache", model_cache_dir()), ("data mirror", data_mirror_dir())):
        click.echo(f"{name:27} {where}")


@main.group()
def jobs() -> None:
    """A run's SkyPilot jobs (`verl-grpo-{run_id}`, `-eval`): list, follow, cancel; on the rehearsal when
    VERL_GRPO_SKY_BOUNDARY names it (docs/gpu-skypilot.md)."""


_CLUSTER_JOBS_HELP = "The jobs run with `sky exec` on this existing cluster (default: managed jobs)."


@jobs.command("queue")
@click.option("--cluster", default=None, help=_CLUSTER_JOBS_HELP)
@_user_errors
def jobs_queue(cluster: str | None) -> None:
    """Every SkyPilot job, newest first, as `sky jobs queue` (or `sky queue CLUSTER`) lists it."""
    from verl_grpo.providers.skypilot import jobs as sky_jobs

    for line in sky_jobs.queue_lines(sky_jobs.queue(sky_jobs.provider(), cluster)):
        click.echo(line)


@jobs.command("logs")
@click.option("--run-id", required=True, help="The run whose job to show (the `run id` the launch printed).")
@click.option("--follow/--no-follow", default=True, show_default=True, help="Stream until the job ends.")
@click.option("--eval", "eval_task", is_flag=True, help="The run's eval task instead of its training job.")
@click.option("--cluster", default=None, help=_CLUSTER_JOBS_HELP)
@_user_errors
def jobs_logs(run_id: str, follow: bool, eval_task: bool, cluster: str | None) -> None:
    """The log of the run's newest training (or eval) job from its start, as `sky jobs logs` prints it."""
    from verl_grpo.providers.skypilot import jobs as sky_jobs

    for line in sky_jobs.logs(sky_jobs.provider(), run_id, follow=follow, eval_task=eval_task, cluster=cluster):
        click.echo(line)


@jobs.command("cancel")
@click.option("--run-id", required=True, help="The run whose live jobs to cancel (training and eval).")
@click.option("--cluster", default=None, help=_CLUSTER_JOBS_HELP)
@_user_errors
def jobs_cancel(run_id: str, cluster: str | None) -> None:
    """Cancel the run's live jobs; its committed checkpoints stay in the store, and a launch with --run-id resumes."""
    from verl_grpo.providers.skypilot import jobs as sky_jobs

    cancelled = sky_jobs.cancel(sky_jobs.provider(), run_id, cluster)
    for job in cancelled:
        click.echo(f"cancelled {job.job.name} (id {job.job.id}, was {job.status})")
    if not cancelled:
        click.echo(f"no live job of run {run_id}: nothing to cancel")


@main.group()
def models() -> None:
    """Registered model versions in MLflow: list them, compare some."""


@models.command("list")
@_config_options
@click.argument("name", required=False)
@_user_errors
def models_list(configs: tuple[str, ...], overrides: tuple[str, ...], name: str | None) -> None:
    """Every version of NAME (default: the config's registered model), newest first."""
    _print_versions(_load(configs, overrides), name, ())


@models.command("compare")
@_config_options
@click.argument("name")
@click.argument("versions", nargs=-1)
@_user_errors
def models_compare(configs: tuple[str, ...], overrides: tuple[str, ...], name: str, versions: tuple[str, ...]) -> None:
    """Side by side: VERSIONS of NAME (numbers or aliases such as champion/challenger; default all), then every
    eval metric of each, read from its MLflow run."""
    _print_versions(_load(configs, overrides), name, versions, metrics=True)


def _print_versions(cfg, name: str | None, versions: tuple[str, ...], metrics: bool = False) -> None:
    from verl_grpo.registry import list_models
    from verl_grpo.summary import metrics_table, versions_table

    rows = list_models(cfg, name)
    if versions:
        wanted = set(versions)
        rows = [r for r in rows if str(r["version"]) in wanted or wanted & set(r["aliases"])]
        missing = wanted - {str(r["version"]) for r in rows} - {a for r in rows for a in r["aliases"]}
        if missing:
            raise ConfigError(f"model {name or cfg.registered_model_name} has no version or alias "
                              f"{', '.join(sorted(missing))}")
    if not rows:
        click.echo(f"no registered versions of {name or cfg.registered_model_name} at {cfg.tracking.mlflow_uri}")
        return
    click.echo(versions_table(rows))
    if metrics:
        click.echo("")
        click.echo(metrics_table(rows))


@main.command()
@click.option("--dataset", default=None,
              type=click.Choice(["gsm8k", "math", "mbpp", "squad", "nq_hotpotqa", "reasoning_gym"]),
              help="Score with this shipped task's scorer (without -c).")
@_config_options
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_user_errors
def score(dataset: str | None, configs: tuple[str, ...], overrides: tuple[str, ...], file: Path) -> None:
    """Score responses by hand: each JSONL line {solution_str, ground_truth[, extra_info][, data_source]} → the line
    plus its score dict. `--dataset NAME` scores with a shipped task's scorer; `-c/-o` with a run's: its own function
    (reward.path; a call that fails adds `error` to its line) or its task's scorer."""
    from verl_grpo.rewards.score_file import score_file

    if dataset is None and not configs and not overrides:
        raise ConfigError("verl-grpo score needs the scorer: --dataset NAME (a shipped task), or your run's config "
                          "(-c FILE, -o reward.path=... ) to score with its own function")
    user, source = None, dataset
    if configs or overrides:
        from verl_grpo.config import config_files, load_config
        from verl_grpo.rewards.user_reward import UserReward

        cfg = load_config(config_files(configs), list(overrides))
        user, source = UserReward.of(cfg), dataset or _task_data_source(cfg)
    for entry in score_file(source, file, user):
        click.echo(json.dumps(entry, default=str))


def _task_data_source(cfg) -> str:
    """The data_source a run's rows carry, for lines that name none."""
    return {"custom": cfg.task, "reasoning_gym": "reasoning_gym"}.get(cfg.dataset.name, cfg.dataset.name)


if __name__ == "__main__":
    main()
