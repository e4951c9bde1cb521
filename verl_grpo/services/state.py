"""Where a service keeps its state: the run's store (`VERL_GRPO_STORE_URI`), under the run when one is known.

The job-group template starts services with only `serve --host --port`, so the store and run come from the
same env vars the verl task gets (`VERL_GRPO_STORE_URI`, `VERL_GRPO_STORE_ENDPOINT`, `VERL_GRPO_RUN_ID`);
CLI options override them. State lives at `runs/{run_id}/services/{task}/` (or `services/{task}/` without a run).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import click

from verl_grpo.config import StorageConfig
from verl_grpo.store import Store
from verl_grpo.store_layout import services_dir

STORE_URI_ENV = "VERL_GRPO_STORE_URI"
STORE_ENDPOINT_ENV = "VERL_GRPO_STORE_ENDPOINT"
RUN_ID_ENV = "VERL_GRPO_RUN_ID"


@dataclass(frozen=True)
class ServiceState:
    """A store and the prefix of one service's state in it."""

    store: Store
    prefix: str

    def rel(self, *parts: str) -> str:
        return "/".join([self.prefix, *parts])


def store_options(fn: Callable) -> Callable:
    """Click options naming the store and run (defaults from the env vars above)."""
    fn = click.option("--run-id", default=None, help=f"Run whose state dir to use (default: ${RUN_ID_ENV}).")(fn)
    fn = click.option("--store-endpoint", default=None, help=f"S3 endpoint (default: ${STORE_ENDPOINT_ENV}).")(fn)
    fn = click.option("--store-uri", default=None,
                      help=f"Store root, file:// or s3:// (default: ${STORE_URI_ENV}, else the local store).")(fn)
    return fn


def open_store(store_uri: str | None = None, endpoint: str | None = None) -> Store:
    uri = store_uri or os.environ.get(STORE_URI_ENV) or StorageConfig().uri
    return Store(uri, endpoint or os.environ.get(STORE_ENDPOINT_ENV) or None)


def service_state(task: str, store_uri: str | None = None, endpoint: str | None = None,
                  run_id: str | None = None) -> ServiceState:
    run_id = run_id or os.environ.get(RUN_ID_ENV) or None
    prefix = services_dir(task, run_id)
    return ServiceState(open_store(store_uri, endpoint), prefix)
