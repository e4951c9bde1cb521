"""Fault-injection suite: every test here is marked `faults` (run alone with `pytest -m faults`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from faultlib import RUN_ID, TcpProxy, Worker, metrics_lines, plan_run

from verl_grpo.store import Store

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def s3_proxy(s3_bucket):
    """A bucket on the moto server reached through a TcpProxy. Yields (uri, proxy endpoint, proxy)."""
    uri, endpoint = s3_bucket
    proxy = TcpProxy(int(endpoint.rsplit(":", 1)[1]))
    proxy.up()
    yield uri, f"http://127.0.0.1:{proxy.port}", proxy
    proxy.down()


@pytest.fixture(scope="session")
def reference(tmp_path_factory, tiny_model_dir, data_mirror):
    """The uninterrupted run every fault run is compared with: (store, metrics records)."""
    root = tmp_path_factory.mktemp("reference")
    store = Store(f"file://{root / 'store'}")
    spec = plan_run(root / "work", tiny_model_dir, data_mirror, store)
    worker = Worker(spec, root / "home")
    assert worker.finish() == 0, worker.output()[-4000:]
    return store, metrics_lines(store.read_text("runs", RUN_ID, "metrics.jsonl"))
