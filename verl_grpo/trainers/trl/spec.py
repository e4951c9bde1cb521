"""`train_spec.json`: everything the TRL worker process needs, written by TrlTrainer.plan and read back here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.contracts import DatasetVersion
from verl_grpo.errors import ConfigError
from verl_grpo.store import Store

SPEC_VERSION = 1
SPEC_FILE = "train_spec.json"


@dataclass(frozen=True)
class WorkerSpec:
    """The parsed train_spec.json written by TrlTrainer.plan."""

    run_id: str
    workdir: Path
    cfg: RunConfig
    dataset: DatasetVersion
    store_uri: str
    store_endpoint: str | None
    model_name: str
    model_path: str | None

    @property
    def store(self) -> Store:
        return Store(self.store_uri, self.store_endpoint)


def load_spec(path: Path) -> WorkerSpec:
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"train spec {path} does not exist; it is written by the trl backend's plan()") from None
    return WorkerSpec(
        run_id=raw["run_id"],
        workdir=Path(raw["workdir"]),
        cfg=RunConfig.model_validate(raw["config"]),
        dataset=DatasetVersion.model_validate(raw["dataset"]),
        store_uri=raw["store"]["uri"],
        store_endpoint=raw["store"].get("endpoint_url"),
        model_name=raw["model_name"],
        model_path=raw.get("model_path"),
    )
