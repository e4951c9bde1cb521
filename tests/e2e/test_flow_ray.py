"""The flow's eval step sharded on both task runners: its tables and metrics equal one unsharded eval of the
same models (the base model, and the model the run trained), and a local Ray stays on loopback and stops.

Base and trained model are evaluated at once; on threads that once loaded corrupted models (transformers'
from_pretrained is not thread-safe), which these exact comparisons caught."""

from __future__ import annotations

import time

import pandas as pd
import psutil
import pytest
from prefect.testing.utilities import prefect_test_harness

from verl_grpo.config import OrchestrationConfig, load_config
from verl_grpo.contracts import EvalReport
from verl_grpo.evaluate import evaluate_model
from verl_grpo.models import resolve_model
from verl_grpo.pipeline import prepare
from verl_grpo.layout import eval_report
from verl_grpo.store import Store

pytestmark = pytest.mark.e2e

RAY_PROCESSES = {"raylet", "gcs_server"}


@pytest.fixture(scope="module")
def prefect_harness():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def check_sharded_flow_equals_unsharded_evals(overrides: list[str]) -> None:
    from flows.verl_grpo import verl_grpo

    summary = verl_grpo(config=["gsm8k"], overrides=overrides)
    sharded_cfg = load_config(["gsm8k"], overrides)
    assert sharded_cfg.eval.shards == 2
    cfg = load_config(["gsm8k"], [*overrides, "eval.shards=1", "orchestration.task_runner=thread"])
    store = Store.from_config(cfg.storage)
    dataset = prepare(cfg)  # content-hashed: the flow's dataset version, found again
    assert summary["dataset"] == f"{dataset.name}@{dataset.hash}"
    base = evaluate_model(cfg, str(resolve_model(cfg.model.name)), dataset, store, out_rel="check/base.parquet",
                          progress=lambda *_: None)
    trained = evaluate_model(cfg, summary["model_uri"], dataset, store, out_rel="check/trained.parquet",
                             progress=lambda *_: None)

    assert (summary["accuracy"], summary["base_accuracy"]) == (trained.metrics["accuracy"], base.metrics["accuracy"])
    flow_trained = EvalReport.model_validate_json(store.read_text(eval_report(summary["run_id"], "test")))
    assert (flow_trained.metrics, flow_trained.settings_key) == (trained.metrics, trained.settings_key)
    pd.testing.assert_frame_equal(_table(store, flow_trained.table_uri), _table(store, trained.table_uri))
    [cached_base] = [rel for rel in _files(store, "eval-cache") if rel.endswith(".parquet")]
    assert cached_base.endswith(f"-{base.settings_key}.parquet")  # shards do not change the cache key
    pd.testing.assert_frame_equal(_table(store, store.url(cached_base)), _table(store, base.table_uri))


def test_two_shards_on_threads_equal_one_task(prefect_harness, tiny_overrides):
    check_sharded_flow_equals_unsharded_evals([*tiny_overrides, "eval.shards=2"])


def test_two_shards_on_local_ray_equal_one_task_and_leave_no_ray_behind(prefect_harness, tiny_overrides):
    check_sharded_flow_equals_unsharded_evals([*tiny_overrides, "eval.shards=2", "orchestration.task_runner=ray"])
    import ray

    assert not ray.is_initialized()
    assert wait_for_no_ray_processes() == []


def test_local_ray_listens_on_loopback_only_and_stops_with_the_runner():
    import ray  # noqa: F401  (imported before the runner is made, as any earlier use of Ray would)

    from flows.task_runners import task_runner

    assert wait_for_no_ray_processes() == []  # none left by an earlier test
    with task_runner(OrchestrationConfig(task_runner="ray")):
        children = psutil.Process().children(recursive=True)
        names = {_name(p) for p in children}
        listening = {(_name(p), c.laddr.ip) for p in children for c in _connections(p) if c.status == psutil.CONN_LISTEN}
    assert RAY_PROCESSES <= names
    assert listening and {ip.removeprefix("::ffff:") for _, ip in listening} == {"127.0.0.1"}, listening
    assert wait_for_no_ray_processes() == []


def _table(store: Store, uri: str) -> pd.DataFrame:
    with store.fs.open(uri.removeprefix("file://"), "rb") as f:
        return pd.read_parquet(f)


def _files(store: Store, prefix: str) -> list[str]:
    root = store.path(prefix)
    return [f"{prefix}/{path.removeprefix(root).lstrip('/')}" for path in store.fs.find(root)]


def wait_for_no_ray_processes(deadline_s: float = 30.0) -> list[str]:
    """Names of raylet / gcs_server processes under this one still alive after up to deadline_s."""
    end = time.monotonic() + deadline_s
    while True:
        alive = [p.name() for p in psutil.Process().children(recursive=True) if _name(p) in RAY_PROCESSES]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.5)


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""


def _connections(process: psutil.Process) -> list:
    try:
        return process.net_connections(kind="inet")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
