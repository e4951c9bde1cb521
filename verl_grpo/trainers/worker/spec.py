"""`train_spec.json`: everything a local worker process needs (the trl and loop backends' workers), written by their
`plan` (`worker_train_spec`) and read back by the worker (`load_spec`)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
from verl_grpo.errors import ConfigError
from verl_grpo.privacy import quiet_env
from verl_grpo.store import Store
from verl_grpo.trainers.atomic_files import write_json_atomic

SPEC_VERSION = 1
SPEC_FILE = "train_spec.json"


@dataclass(frozen=True)
class WorkerSpec:
    """The parsed train_spec.json written by the backend's plan."""

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

    @property
    def planned_steps(self) -> int:
        """The steps this run trains: algorithm.total_steps, or fewer when algorithm.total_epochs ends it first."""
        return self.cfg.algorithm.planned_steps(self.dataset.counts.get("train"))


def load_spec(path: Path) -> WorkerSpec:
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"train spec {path} does not exist; it is written by the trl or loop backend's "
                          "plan()") from None
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


def worker_train_spec(backend: str, module: str, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str,
                      cluster: Cluster) -> TrainSpec:
    """A worker process's TrainSpec (`python -m <module> <workdir>/train_spec.json`), shared by the backends whose
    training runs in such a worker (trl, loop); writes the spec file."""
    if "train" not in dataset.splits:
        raise ConfigError(f"dataset {dataset.name}/{dataset.hash} has no train split; re-run data preparation")
    workdir = Path(cluster.workdir)
    spec = {
        "version": SPEC_VERSION,
        "backend": backend,
        "run_id": run_id,
        "workdir": str(workdir),
        "config": cfg.model_dump(mode="json"),
        "dataset": dataset.model_dump(mode="json"),
        "store": {"uri": store.uri, "endpoint_url": store.endpoint_url},
        "model_name": cfg.model.name,
        "model_path": _local_model_path(cfg, cluster),
    }
    spec_path = write_json_atomic(workdir / SPEC_FILE, spec)
    return TrainSpec(
        backend=backend,
        run_id=run_id,
        command=[sys.executable, "-m", module, str(spec_path)],
        env=worker_env(cfg),
        spec_uri=str(spec_path),
        total_steps=cfg.algorithm.planned_steps(dataset.counts.get("train")),
    )


def worker_env(cfg: RunConfig) -> dict[str, str]:
    """Non-secret environment of the worker process."""
    env = {**quiet_env(), "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if cfg.trainer.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(cfg.trainer.threads)
    return env


def _local_model_path(cfg: RunConfig, cluster: Cluster) -> str | None:
    """The resolved model directory when the worker runs on this machine; remote workers resolve it themselves."""
    if not cluster.on_this_machine:
        return None
    from verl_grpo.models import resolve_model

    return str(resolve_model(cfg.model.name))
