"""Small, serialisable objects passed between pipeline steps (URIs, not tensors)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetVersion(_Record):
    """A prepared, content-hashed dataset in the store."""

    name: str
    hash: str
    uri: str
    """Directory `{store}/datasets/{name}/{hash}`."""
    splits: dict[str, str]
    """Split name (train/val/test) → parquet URI."""
    counts: dict[str, int]
    """Split name → accepted rows."""
    rejected: int = 0
    """Rows quarantined in rejected.parquet."""
    rejected_by_reason: dict[str, int] = {}
    """Reason (data.schema.Reason) → quarantined rows."""
    source: str = ""
    """Where the raw data came from (mirror path or hub id)."""


class CheckpointRef(_Record):
    """A complete checkpoint: its manifest exists and lists every file with size and sha256."""

    run_id: str
    step: int
    uri: str
    """Directory `{store}/runs/{run_id}/checkpoints/global_step_{step}`."""


class Cluster(_Record):
    """Compute a provider brought up for one run."""

    provider: str
    name: str
    workdir: str
    """Working directory of the run on the cluster (local path for the local provider)."""
    endpoints: dict[str, str] = Field(default_factory=dict)
    """Service name → URL (reward-server, retrieval-server, ...)."""
    on_this_machine: bool = False
    """The cluster is the machine the pipeline runs on: it reads local paths and reaches loopback services, so
    trainers need neither mounts nor a remote tracking server."""
    run_id: str = ""
    """The run the compute was brought up for; with config_uri, everything a provider built fresh needs."""
    config_uri: str = ""
    """Store URI of the run's resolved config (`runs/{run_id}/config.yaml`), read by a provider that did not call
    up() itself (a Prefect retry, a re-run after a crash, teardown in another process)."""
    store_endpoint: str | None = None
    """The store's S3 endpoint (storage.endpoint_url) for reading config_uri; None for AWS S3 or a local store."""
    reused: bool = False
    """The compute is the user's existing cluster: jobs run on it, and teardown leaves it up."""


class TrainSpec(_Record):
    """What to execute for training: produced by a Trainer's plan(), offline and side-effect free."""

    backend: str
    run_id: str
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    """Non-secret environment; secrets are injected by the provider from its own secret source."""
    overrides: list[str] = Field(default_factory=list)
    """Backend-level overrides (Hydra for verl), as passed on the command line."""
    spec_uri: str = ""
    """The written spec file the training process reads (the resolved config + inputs)."""
    total_steps: int


Phase = Literal["PENDING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED"]


class Job(_Record):
    """A submitted training job."""

    provider: str
    id: str
    name: str
    log_path: str = ""
    log_offset: int = 0
    """Where this job's output starts in log_path: a resumed job appends to the log of the attempts before it."""


class JobState(_Record):
    phase: Phase
    recovery_count: int = 0
    failure_reason: str | None = None
    preempted: bool = False
    """True when the job ended because its machines or process were taken away (resume will continue it)."""
    error_type: str | None = None
    """Name of the verl_grpo error class the training process reported (ConfigError, DataError, InfraError, ...)."""


class TrainResult(_Record):
    run_id: str
    final_step: int
    checkpoint: CheckpointRef | None
    model_uri: str
    """Final HF model directory in the store (`runs/{run_id}/model`)."""
    metrics_uri: str
    """JSONL of per-step training metrics."""
    summary: dict[str, float] = Field(default_factory=dict)


class EvalReport(_Record):
    model_uri: str
    split: str
    n: int
    metrics: dict[str, float]
    table_uri: str
    """Parquet with one row per problem (id, response, extracted answer, correct, components)."""
    settings_key: str
    """Hash of the eval settings (split, subset, generation params) used for caching and fair comparison."""


class MirrorResult(_Record):
    """How one optional mirror (verl_grpo.mirrors) fared with a registered run; a failure never fails the run."""

    name: str
    """The mirror (`wandb`)."""
    ok: bool
    where: str = ""
    """Where the copy is (the W&B run URL, or its offline dir) when ok."""
    reason: str = ""
    """Why it failed, one line without secrets, when not ok."""


class RunCost(_Record):
    """What a run's cloud jobs cost, from their timelines in the provider's job queue (SkyPilot)."""

    node_hours: float
    """Σ nodes × (end − provisioning start) over the run's training and eval jobs, recoveries included."""
    cost_usd: float | None
    """node-hours × the catalog $/h of each task's resources; None where the catalog has no price for one."""
    run_hours: float
    """Hours the jobs' commands ran (SkyPilot's job_duration: provisioning and recovery excluded)."""
    jobs: int
    recoveries: int
    pricing: str
    """`spot` or `on-demand`, as launched."""
    priced_at: str
    """Which catalog prices were used, one line."""
    warnings: list[str] = Field(default_factory=list)
    """Where the launch went otherwise than the config asked (infra.spot=true launched on-demand), one line each."""

    def line(self) -> str:
        cost = f"${self.cost_usd:,.2f}" if self.cost_usd is not None else "no catalog price"
        return (f"{self.node_hours:.2f} node-hours ({self.run_hours:.2f} h running, {self.recoveries} recoveries, "
                f"{self.jobs} job(s)): {cost} at {self.priced_at} prices")


class ModelVersion(_Record):
    name: str
    version: str
    aliases: list[str] = Field(default_factory=list)
    mlflow_run_id: str
    decision: str = ""
    mirrors: list[MirrorResult] = Field(default_factory=list)
    """The optional mirrors the registration sent the run to (none unless one is configured)."""
    cloud_cost: RunCost | None = None
    """The run's actual cloud cost (SkyPilot provider); None on the local provider."""
    health: list[str] = Field(default_factory=list)
    """What went wrong in training without failing it (e.g. no learning signal for several steps), one line each;
    the version's description has a warning paragraph for each below the decision."""
