"""data-server: batches of prompts with ground truth from a prepared dataset, in deterministic epochs.

`GET /batch?size=&split=` returns the next `size` rows of `split`. Epoch e visits every row once in the
order of a permutation seeded with (seed, e); a batch that crosses the end of an epoch continues into
the next. Each split's cursor (epoch, position) is written to the store before the batch is returned,
so a restarted server continues where it stopped; `PUT /cursor` moves it (e.g. to a checkpoint's position).

The dataset is a prepared version directory (`--dataset-uri`, env `VERL_GRPO_DATASET_URI`), or the newest
prepared version of `--dataset NAME` in the store.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import click
import numpy as np
from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from verl_grpo.contracts import DatasetVersion
from verl_grpo.data.prepare import load_split, version_from_manifest
from verl_grpo.errors import DataError
from verl_grpo.services import SERVICES
from verl_grpo.services.http import ERROR_RESPONSES, ServiceError, create_app
from verl_grpo.services.serving import Serving, serve_command, service_cli
from verl_grpo.services.state import ServiceState, service_state, store_options
from verl_grpo.store import Store, strip_scheme
from verl_grpo.store_layout import DATASET_MANIFEST as MANIFEST, dataset_dir, dataset_versions

logger = logging.getLogger(__name__)
SPEC = SERVICES["data"]
DATASET_URI_ENV = "VERL_GRPO_DATASET_URI"
CURSOR_FILE = "cursor.json"


@dataclass(frozen=True)
class Cursor:
    epoch: int = 0
    position: int = 0


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """Row order of one epoch: a permutation of range(n) fixed by (seed, epoch)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def take(n: int, seed: int, cursor: Cursor, size: int) -> tuple[list[tuple[int, int]], Cursor]:
    """The next `size` (epoch, row index) pairs from `cursor`, and the cursor after them."""
    if n <= 0:
        raise DataError("the split has no rows; prepare the dataset with rows in it or choose another split")
    out: list[tuple[int, int]] = []
    epoch, pos = cursor.epoch, cursor.position
    while len(out) < size:
        order = epoch_order(n, seed, epoch)
        chunk = order[pos : pos + size - len(out)]
        out += [(epoch, int(i)) for i in chunk]
        pos += len(chunk)
        if pos >= n:
            epoch, pos = epoch + 1, 0
    return out, Cursor(epoch, pos)


class Message(BaseModel):
    role: str
    content: str


class PromptRow(BaseModel):
    data_source: str
    prompt: list[Message]
    ability: str | None = None
    reward_model: dict[str, Any]
    """`{"style": "rule", "ground_truth": ...}` as verl expects."""
    extra_info: dict[str, Any] = {}
    epoch: int
    """Epoch this row was served in."""


class CursorModel(BaseModel):
    split: str
    epoch: int = Field(ge=0)
    position: int = Field(ge=0)


class BatchResponse(BaseModel):
    split: str
    start: CursorModel
    next: CursorModel
    rows: list[PromptRow]


class DataServer:
    """Splits of one dataset version, their cursors, and the store file that persists the cursors."""

    def __init__(self, dataset: DatasetVersion, store: Store, state: ServiceState, seed: int = 0):
        self.dataset = dataset
        self.store = store
        self.state = state
        self.seed = seed
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.cursors = self._load_cursors()

    def _load_cursors(self) -> dict[str, Cursor]:
        rel = self.state.rel(CURSOR_FILE)
        if not self.state.store.exists(rel):
            return {}
        saved = json.loads(self.state.store.read_text(rel))
        if saved.get("dataset_hash") != self.dataset.hash or saved.get("seed") != self.seed:
            logger.warning("cursor file %s belongs to dataset %s seed %s; starting from the beginning",
                           self.state.store.url(rel), saved.get("dataset_hash"), saved.get("seed"))
            return {}
        return {split: Cursor(**c) for split, c in saved["cursors"].items()}

    def _save_cursors(self, cursors: dict[str, Cursor]) -> None:
        blob = {"dataset": self.dataset.name, "dataset_hash": self.dataset.hash, "seed": self.seed,
                "cursors": {s: {"epoch": c.epoch, "position": c.position} for s, c in cursors.items()}}
        self.state.store.write_text(json.dumps(blob, sort_keys=True), self.state.rel(CURSOR_FILE))

    def rows(self, split: str) -> list[dict[str, Any]]:
        if split not in self.dataset.splits:
            raise ServiceError(422, "unknown_split", f"split {split!r} is not in dataset {self.dataset.name} "
                                                     f"{self.dataset.hash}; available: "
                                                     f"{', '.join(self.dataset.splits)}")
        if split not in self._rows:
            self._rows[split] = load_split(self.dataset, split, self.store).to_dict("records")
        return self._rows[split]

    def batch(self, split: str, size: int) -> BatchResponse:
        with self._lock:
            rows = self.rows(split)
            start = self.cursors.get(split, Cursor())
            picked, after = take(len(rows), self.seed, start, size)
            self._save_cursors({**self.cursors, split: after})  # durable before the batch is handed out
            self.cursors[split] = after
        return BatchResponse(
            split=split,
            start=CursorModel(split=split, epoch=start.epoch, position=start.position),
            next=CursorModel(split=split, epoch=after.epoch, position=after.position),
            rows=[PromptRow(**_row_fields(rows[i]), epoch=e) for e, i in picked],
        )

    def set_cursor(self, cursor: CursorModel) -> CursorModel:
        with self._lock:
            n = len(self.rows(cursor.split))
            if cursor.position >= n:
                raise ServiceError(422, "invalid_cursor", f"position {cursor.position} is past the end of split "
                                                          f"{cursor.split!r} ({n} rows); use 0..{n - 1}")
            new = Cursor(cursor.epoch, cursor.position)
            self._save_cursors({**self.cursors, cursor.split: new})
            self.cursors[cursor.split] = new
        return cursor


def _row_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in ("data_source", "prompt", "ability", "reward_model")} | {
        "extra_info": row.get("extra_info") or {}
    }


def find_dataset(store: Store, dataset_uri: str | None = None, name: str | None = None) -> DatasetVersion:
    """The dataset version at `dataset_uri` (a version dir), else the newest prepared version of `name`."""
    uri = dataset_uri or os.environ.get(DATASET_URI_ENV)
    if uri:
        rel = _relative_to_store(store, uri)
        if not store.exists(rel, MANIFEST):
            raise DataError(f"{uri} has no {MANIFEST}; pass the directory of a prepared dataset version "
                            "(`verl-grpo prepare` prints it)")
        return version_from_manifest(store, rel, json.loads(store.read_text(rel, MANIFEST)))
    if not name:
        raise DataError(f"no dataset: pass --dataset-uri (or set {DATASET_URI_ENV}) or --dataset NAME")
    newest: tuple[str, str, dict] | None = None
    for digest in store.listdir(dataset_versions(name)):
        rel = dataset_dir(name, digest)
        if store.exists(rel, MANIFEST):
            manifest = json.loads(store.read_text(rel, MANIFEST))
            if newest is None or manifest.get("created_at", "") > newest[0]:
                newest = (manifest.get("created_at", ""), rel, manifest)
    if newest is None:
        raise DataError(f"no prepared version of dataset {name!r} in {store.uri}; run `verl-grpo prepare --dataset "
                        f"{name}`")
    return version_from_manifest(store, newest[1], newest[2])


def _relative_to_store(store: Store, uri: str) -> str:
    root, path = strip_scheme(store.uri).rstrip("/"), strip_scheme(uri).rstrip("/")
    if not path.startswith(root + "/"):
        raise DataError(f"dataset {uri} is not under the store {store.uri}; pass --store-uri of the store holding it")
    return path[len(root) + 1 :]


def build_app(server: DataServer, token: str | None, max_body_bytes: int, max_batch: int = 1024):
    app, auth = create_app(
        SPEC.task, token, max_body_bytes,
        description="Prompt batches with ground truth from a prepared dataset, in deterministic seeded epochs.",
        health_info=lambda: {"dataset": server.dataset.name, "hash": server.dataset.hash,
                             "splits": server.dataset.counts},
    )
    router = APIRouter(dependencies=[Depends(auth)], responses=ERROR_RESPONSES)

    @router.get("/batch", response_model=BatchResponse)
    def get_batch(size: int = Query(ge=1, le=max_batch), split: str = Query("train", max_length=64)) -> BatchResponse:
        """The next `size` rows of `split`; the cursor is persisted before they are returned."""
        return server.batch(split, size)

    @router.get("/cursor", response_model=list[CursorModel])
    def get_cursors() -> list[CursorModel]:
        return [CursorModel(split=s, epoch=c.epoch, position=c.position) for s, c in sorted(server.cursors.items())]

    @router.put("/cursor", response_model=CursorModel)
    def put_cursor(cursor: CursorModel) -> CursorModel:
        """Move a split's cursor (e.g. back to the data position of the checkpoint training resumed from)."""
        return server.set_cursor(cursor)

    app.include_router(router)
    return app


cli = service_cli("data-server: prompt batches from a prepared dataset.")


@serve_command(cli, SPEC.port, store_options,
               click.option("--dataset-uri", default=None,
                            help=f"Prepared dataset version dir (default: ${DATASET_URI_ENV})."),
               click.option("--dataset", "dataset_name", default=None,
                            help="Dataset name; serves its newest prepared version."),
               click.option("--seed", type=int, default=0, show_default=True),
               click.option("--max-batch", type=int, default=1024, show_default=True))
def serve(serving: Serving, store_uri, store_endpoint, run_id, dataset_uri, dataset_name, seed, max_batch) -> None:
    state = service_state(SPEC.task, store_uri, store_endpoint, run_id)
    dataset = find_dataset(state.store, dataset_uri, dataset_name)
    server = DataServer(dataset, state.store, state, seed=seed)
    serving.run(build_app(server, serving.token, serving.max_body_bytes, max_batch))


if __name__ == "__main__":
    cli()
