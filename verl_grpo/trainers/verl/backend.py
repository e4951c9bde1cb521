"""The `verl` trainer backend: plans a `python -m verl.trainer.main_ppo` run on the cluster a provider brought up.

The overrides come from `overrides.verl_overrides` and are checked offline by `validation`; the restore and
finalize entries that the cluster task runs around main_ppo are named here too.
"""

from __future__ import annotations

from collections.abc import Mapping

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
from verl_grpo.layout import dataset_dir
from verl_grpo.store import Store, local_path
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.verl import progress
from verl_grpo.trainers.verl.overrides import run_paths, verl_overrides
from verl_grpo.trainers.verl.settings import checkpoint_env
from verl_grpo.trainers.verl.validation import VerlValidation, validate_verl_overrides

MAIN_MODULE = "verl.trainer.main_ppo"
SECRET_ENV_VARS = ("WANDB_API_KEY", "HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                   "VERL_GRPO_SERVICES_TOKEN")
"""Secrets a verl run may need; they reach the cluster as SkyPilot secrets, never as overrides or envs."""


class VerlTrainer:
    """Trainer backend `verl`: plans a main_ppo run on the cluster a provider brought up."""

    name = "verl"

    def __init__(self, check_reward: bool = True):
        self.check_reward = check_reward
        self.last_validation: VerlValidation | None = None
        """What the latest plan() established offline (shown by the dry run)."""

    def check(self, cfg: RunConfig) -> str:
        """Compose the overrides against verl's own config and run its validation, with placeholder data paths."""
        files = {split: f"/tmp/verl-grpo/data/{split}.parquet" for split in ("train", "val")}
        overrides = verl_overrides(cfg, files, run_paths(cfg, "/tmp/verl-grpo/checkpoints/check"), "check")
        validation = validate_verl_overrides(overrides, check_reward=self.check_reward)
        return f"verl main_ppo: {len(overrides)} overrides; " + "; ".join(validation.checks)

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Render and validate the main_ppo command; writes nothing (verl reads the overrides, not a spec file)."""
        data_files, env = data_files_on_cluster(dataset, store, cluster)
        paths = run_paths(cfg, f"{cluster.workdir}/checkpoints/{run_id}")
        overrides = verl_overrides(cfg, data_files, paths, run_id)
        self.last_validation = validate_verl_overrides(overrides, check_reward=self.check_reward)
        env["MLFLOW_TRACKING_URI"] = mlflow_uri_on_cluster(cfg, cluster)
        env.update(checkpoint_env(cfg.storage.uri, cfg.storage.endpoint_url, run_id, paths.checkpoint_dir,
                                  cfg.storage.keep_last))
        return TrainSpec(
            backend=self.name,
            run_id=run_id,
            command=["python", "-m", MAIN_MODULE, *overrides],
            env=env,
            overrides=overrides,
            total_steps=cfg.algorithm.total_steps,
        )

    def parse_progress(self, line: str, total_steps: int) -> TrainProgress | None:
        """verl's console `step:k - critic/score/mean:… - …` lines (see verl.progress)."""
        return progress.parse_progress(line, total_steps)


DATASET_URI_ENV = "VERL_GRPO_DATASET_URI"
DATASET_MOUNT_ENV = "VERL_GRPO_DATASET_MOUNT"


def data_files_on_cluster(dataset: DatasetVersion, store: Store,
                          cluster: Cluster) -> tuple[dict[str, str], dict[str, str]]:
    """Parquet paths the trainer reads, and the env telling a remote provider what to mount where.

    On this machine (Cluster.on_this_machine) with a local store the store paths are used as they are; anywhere else the
    dataset directory is mounted at `{workdir}/datasets/{name}/{hash}` (the provider reads the two env vars).
    """
    if cluster.on_this_machine and store.is_local:
        return {split: str(local_path(uri)) for split, uri in dataset.splits.items()}, {}
    mount = f"{cluster.workdir}/{dataset_dir(dataset.name, dataset.hash)}"
    files = {split: f"{mount}/{uri.rstrip('/').rsplit('/', 1)[-1]}" for split, uri in dataset.splits.items()}
    return files, {DATASET_URI_ENV: dataset.uri, DATASET_MOUNT_ENV: mount}


def restore_command(spec_env: Mapping[str, str]) -> list[str]:
    """The pre-main_ppo entry: restore the latest committed checkpoint (and fetch the dataset if not mounted)."""
    cmd = ["python", "-m", "verl_grpo.trainers.verl.restore"]
    if spec_env.get(DATASET_URI_ENV) and spec_env.get(DATASET_MOUNT_ENV):
        cmd += ["--dataset-uri", spec_env[DATASET_URI_ENV], "--dataset-dir", spec_env[DATASET_MOUNT_ENV]]
    return cmd


def finalize_command(cfg: RunConfig) -> list[str]:
    """The post-main_ppo entry: merge the final actor with verl.model_merger, publish model, metrics, TrainResult."""
    return ["python", "-m", "verl_grpo.trainers.verl.finalize", "--backend", cfg.verl.strategy,
            "--train-batch-size", str(cfg.algorithm.train_batch_size)]


def mlflow_uri_on_cluster(cfg: RunConfig, cluster: Cluster) -> str:
    """A tracking server URI is used as is; a local SQLite default becomes a SQLite file in the cluster workdir."""
    uri = cfg.tracking.mlflow_uri
    if cluster.on_this_machine or uri.startswith(("http://", "https://", "databricks")):
        return uri
    return f"sqlite:///{cluster.workdir}/mlflow.db"
