"""Where everything lives in the store: every path under the store root is named here and nowhere else.

```
datasets/{name}/{hash}/{train,val,test}.parquet, rejected.parquet, manifest.json
runs/{run_id}/config.yaml, run.json, train_result.json, metrics.jsonl, reward_curve.png
runs/{run_id}/checkpoints/global_step_{N}/…  + MANIFEST.json, written last
runs/{run_id}/model/
runs/{run_id}/warm_start/model/, metrics.jsonl, result.json (written last)
runs/{run_id}/eval/{split}.parquet, {split}.json, {split}-vllm-spec.json
runs/{run_id}/services/{task}/        (services/{task}/ outside a run)
eval-cache/{model_key}/{split}-{settings}.parquet + .json (the report, written last)
retrieval/{index}/
```

All paths are relative to the store root (`Store.url(path)` makes a URI of one). The same relative dataset
path names the dataset's mount point under a remote cluster's workdir.
"""

from __future__ import annotations

import re

DATASETS = "datasets"
DATASET_MANIFEST = "manifest.json"
DATASET_REJECTED = "rejected.parquet"
"""A dataset version's quarantined rows, each with its reason."""
RUNS = "runs"
RUN_CONFIG = "config.yaml"
RUN_RECORD = "run.json"
TRAIN_RESULT = "train_result.json"
METRICS_FILE = "metrics.jsonl"
"""One JSON object per logged training step; beside the run, and inside every checkpoint."""
SAMPLES_FILE = "samples.jsonl"
"""`{"step": N, "samples": [...]}` per sampled training step (trainer.log_samples_every); travels like metrics."""
CHECKPOINT_MANIFEST = "MANIFEST.json"
"""Written last into a checkpoint directory: a checkpoint without it is not complete."""
STEP_PREFIX = "global_step_"
"""verl's checkpoint directory names (`global_step_{N}`), used by both trainers."""
EVAL_CACHE = "eval-cache"
RETRIEVAL = "retrieval"
SERVICES = "services"
_RUN_MODEL = re.compile(rf"/{RUNS}/(?P<run_id>[^/]+)/model/?$")


def dataset_dir(name: str, digest: str) -> str:
    return f"{DATASETS}/{name}/{digest}"


def published_model_dir(name: str, digest: str) -> str:
    """A model that exists only on the launching machine (tiny, a local directory), shipped to a cluster through
    the store; content-addressed, so the same files are uploaded once."""
    return f"models/{name}/{digest}"


def shipped_reward_dir(digest: str) -> str:
    """A run's own reward file (reward.path), shipped to the nodes that score through the store; content-addressed
    (`rewards/<sha256[:16]>/<file>`). The nodes fetch it to the same relative folder under their workdir."""
    return f"rewards/{digest}"


def dataset_versions(name: str) -> str:
    """The directory holding every prepared version (one per content hash) of a dataset."""
    return f"{DATASETS}/{name}"


def run_dir(run_id: str) -> str:
    return f"{RUNS}/{run_id}"


def run_config(run_id: str) -> str:
    """The run's one resolved config, written when the run begins."""
    return f"{run_dir(run_id)}/{RUN_CONFIG}"


def run_record(run_id: str) -> str:
    """The run's status record (running/failed/completed, timestamps, model version)."""
    return f"{run_dir(run_id)}/{RUN_RECORD}"


def train_result(run_id: str) -> str:
    """The TrainResult the trainer writes last, once the model is in the store."""
    return f"{run_dir(run_id)}/{TRAIN_RESULT}"


def run_metrics(run_id: str) -> str:
    return f"{run_dir(run_id)}/{METRICS_FILE}"


def run_samples(run_id: str) -> str:
    return f"{run_dir(run_id)}/{SAMPLES_FILE}"


def run_reward_curve(run_id: str) -> str:
    """The run's reward curve (PNG), drawn from its metrics when it is registered."""
    return f"{run_dir(run_id)}/reward_curve.png"


def checkpoints_dir(run_id: str) -> str:
    return f"{run_dir(run_id)}/checkpoints"


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def checkpoint_dir(run_id: str, step: int) -> str:
    return f"{checkpoints_dir(run_id)}/{step_dir_name(step)}"


def checkpoint_manifest(run_id: str, step: int) -> str:
    return f"{checkpoint_dir(run_id, step)}/{CHECKPOINT_MANIFEST}"


def model_dir(run_id: str) -> str:
    """The run's final Hugging Face model directory."""
    return f"{run_dir(run_id)}/model"


def warm_start_dir(run_id: str) -> str:
    """The warm start (SFT) phase's model, metrics and `result.json`; the result is written last (its commit)."""
    return f"{run_dir(run_id)}/warm_start"


WARM_START_RESULT = "result.json"


def warm_start_result(run_id: str) -> str:
    """The warm start's commit: present once its model and metrics are in the store."""
    return f"{warm_start_dir(run_id)}/{WARM_START_RESULT}"


def warm_start_model_dir(run_id: str) -> str:
    return f"{warm_start_dir(run_id)}/model"


def run_of_model(model_uri: str) -> str | None:
    """The run id of a `…/runs/{run_id}/model` URI or path, else None."""
    match = _RUN_MODEL.search(model_uri)
    return match["run_id"] if match else None


def eval_table(run_id: str, split: str) -> str:
    """The per-problem parquet of a run's held-out eval."""
    return f"{run_dir(run_id)}/eval/{split}.parquet"


def eval_report(run_id: str, split: str) -> str:
    """A run's EvalReport JSON, beside its table (written by the CPU and the GPU eval alike)."""
    return f"{run_dir(run_id)}/eval/{split}.json"


def eval_spec(run_id: str, split: str) -> str:
    """What the GPU eval task evaluates (an EvalSpec), written before the task launches."""
    return f"{run_dir(run_id)}/eval/{split}-vllm-spec.json"


def eval_cache_table(model_key: str, split: str, settings: str) -> str:
    return f"{EVAL_CACHE}/{model_key}/{split}-{settings}.parquet"


def eval_cache_report(model_key: str, split: str, settings: str) -> str:
    """Written after the table: an entry counts as cached only when both exist."""
    return f"{EVAL_CACHE}/{model_key}/{split}-{settings}.json"


def services_dir(task: str, run_id: str | None = None) -> str:
    """A service's state: under its run, or at the store root for services started without one."""
    return f"{run_dir(run_id)}/{SERVICES}/{task}" if run_id else f"{SERVICES}/{task}"


def retrieval_index_dir(name: str) -> str:
    return f"{RETRIEVAL}/{name}"
