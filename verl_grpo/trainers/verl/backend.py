"""The `verl` trainer backend: plans a `python -m verl.trainer.main_ppo` run on the cluster a provider brought up.

The overrides come from `overrides.verl_overrides` and are checked offline by `validation`; the restore and
finalize entries that the cluster task runs around main_ppo are named here too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from verl_grpo.checkpoints import sha256_file
from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion, TrainSpec
from verl_grpo.mirrors.wandb_mirror import quiet_wandb
from verl_grpo.models import resolve_model
from verl_grpo.store import Store, local_path
from verl_grpo.store_layout import checkpoints_dir, dataset_dir, published_model_dir
from verl_grpo.trainers.protocol import TrainProgress
from verl_grpo.trainers.verl import progress
from verl_grpo.trainers.verl.fully_async import (
    ENTRY_MODULE,
    fully_async_overrides,
    planned_checkpoint_steps,
    validate_fully_async_overrides,
)
from verl_grpo.trainers.verl.node_reward import UserRewardPlan, placeholder, plan_user_reward
from verl_grpo.trainers.verl.overrides import (
    cluster_nodes,
    run_paths,
    ships_with_run,
    tool_env,
    uses_fully_async,
    verl_overrides,
)
from verl_grpo.trainers.verl.samples import SamplesPlan
from verl_grpo.trainers.verl.settings import checkpoint_env
from verl_grpo.trainers.verl.validation import VerlValidation, validate_verl_overrides

MAIN_MODULE = "verl.trainer.main_ppo"
SECRET_ENV_VARS = ("WANDB_API_KEY", "HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                   "VERL_GRPO_SERVICES_TOKEN")
"""Secrets a verl run may need; they reach the cluster as SkyPilot secrets, never as overrides or envs."""


class VerlTrainer:
    """Trainer backend `verl`: plans a main_ppo run on the cluster a provider brought up."""

    name = "verl"
    signal_watched_in_log = True
    """verl's trainer loop offers no per-step hook that could warn or stop (the checkpoint callback runs only at
    saves), so `plain_steps.train` watches the learning signal in the step lines it streams."""

    def __init__(self, check_reward: bool = True, ship_models: bool = True):
        self.check_reward = check_reward
        self.ship_models = ship_models
        """Upload a model that exists only on this machine, and the retrieval corpus a remote retrieval-server reads,
        to the store at plan() (False: the dry run, which names where they would go without uploading)."""
        self.last_validation: VerlValidation | None = None
        """What the latest plan() established offline (shown by the dry run)."""
        self.last_user_reward: UserRewardPlan | None = None
        """The latest plan()'s placement of the user's reward function (reward.path) and its sample row."""

    def check(self, cfg: RunConfig) -> str:
        """Compose the overrides against verl's own config and run its validation, with placeholder data paths."""
        files = {split: f"/tmp/verl-grpo/data/{split}.parquet" for split in ("train", "val")}
        user = placeholder(cfg, "/tmp/verl-grpo/rewards/check")
        paths = replace(run_paths(cfg, "/tmp/verl-grpo/checkpoints/check", user),
                        model_path="/tmp/verl-grpo/models/check")
        module, overrides, validation = self._composed(cfg, files, paths, "check")
        return f"verl {module.rsplit('.', 1)[-1]}: {len(overrides)} overrides; " + "; ".join(validation.checks)

    def _composed(self, cfg: RunConfig, data_files: Mapping[str, str], paths, run_id: str
                  ) -> tuple[str, list[str], VerlValidation]:
        """(entry module, overrides, offline validation): verl's fully-async trainer on the rollout_group shape,
        main_ppo otherwise."""
        if uses_fully_async(cfg):
            overrides = fully_async_overrides(cfg, data_files, paths, run_id)
            return ENTRY_MODULE, overrides, validate_fully_async_overrides(overrides, check_reward=self.check_reward)
        overrides = verl_overrides(cfg, data_files, paths, run_id)
        return MAIN_MODULE, overrides, validate_verl_overrides(overrides, check_reward=self.check_reward)

    def plan(self, cfg: RunConfig, dataset: DatasetVersion, store: Store, run_id: str, cluster: Cluster) -> TrainSpec:
        """Render and validate the main_ppo command (verl reads the overrides, not a spec file); the only writes
        ship what exists only on this machine to the store: a model (once per content), the retrieval corpus and
        the user's reward file (node_reward)."""
        data_files, env = data_files_on_cluster(dataset, store, cluster)
        model_path, model_env = model_on_cluster(cfg, store, cluster, upload=self.ship_models)
        env.update(model_env)
        if self.ship_models:  # the dry run: whether the store holds the index already is not known offline
            corpus_on_cluster(cfg, store, cluster)
        self.last_user_reward = user = plan_user_reward(cfg, dataset, store, cluster, upload=self.ship_models)
        if user is not None:
            env.update(user.node.env())
        paths = replace(run_paths(cfg, f"{cluster.workdir}/checkpoints/{run_id}", user), model_path=model_path)
        module, overrides, self.last_validation = self._composed(cfg, data_files, paths, run_id)
        if cluster.on_this_machine:  # a cluster's nodes log with verl's console and file loggers, never to MLflow
            env["MLFLOW_TRACKING_URI"] = cfg.tracking.mlflow_uri
        quiet_wandb(env)  # verl's wandb logger runs in these processes
        env.update(checkpoint_env(cfg.storage.uri, cfg.storage.endpoint_url, run_id, paths.checkpoint_dir,
                                  cfg.storage.keep_last, checkpoint_mount(cfg, store, run_id, cluster)))
        if samples := SamplesPlan.of(cfg):
            env.update(samples.env())
        env.update(tool_env(cfg))
        return TrainSpec(
            backend=self.name,
            run_id=run_id,
            command=["python", "-m", module, *overrides],
            env=env,
            overrides=overrides,
            total_steps=planned_checkpoint_steps(cfg, dataset.counts.get("train")),
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


def corpus_on_cluster(cfg: RunConfig, store: Store, cluster: Cluster) -> None:
    """Publish the retrieval corpus for a retrieval-server the run starts off this machine: it reads the corpus from
    the store (`services.commands.retrieval_corpus_uri`), never from a path on the machine that launched (nothing to
    publish when the store holds the index already)."""
    if cluster.on_this_machine or "retrieval" not in cfg.services.started:
        return
    from verl_grpo.services.commands import publish_retrieval_corpus

    publish_retrieval_corpus(cfg, store)


MODEL_URI_ENV = "VERL_GRPO_MODEL_URI"
MODEL_MOUNT_ENV = "VERL_GRPO_MODEL_MOUNT"
MOUNTS = ((DATASET_URI_ENV, DATASET_MOUNT_ENV), (MODEL_URI_ENV, MODEL_MOUNT_ENV))
"""(store URI, mount path) env pairs of a TrainSpec: what the provider mounts on every node (or restore fetches)."""


def model_on_cluster(cfg: RunConfig, store: Store, cluster: Cluster, upload: bool = True
                     ) -> tuple[str | None, dict[str, str]]:
    """Where verl loads the policy from, and the env telling a remote provider what to mount.

    An alias or HF id is loaded from the hub on the cluster (None: the overrides use the id). A model that exists only
    on this machine (tiny, a local directory) is shipped through the store, content-addressed
    (`models/{name}/{digest}`), and mounted at `{workdir}/models/{name}/{digest}` like the dataset.
    """
    if not ships_with_run(cfg.model.name):
        return None, {}
    local = Path(resolve_model(cfg.model.name))
    if cluster.on_this_machine:
        return str(local), {}
    rel = published_model_dir(local.name, directory_digest(local))
    if upload and not store.exists(rel, PUBLISHED_MARKER):
        store.put_dir(local, rel)
        store.write_text("", rel, PUBLISHED_MARKER)  # last: a half-uploaded model is never mounted
    return f"{cluster.workdir}/{rel}", {MODEL_URI_ENV: store.url(rel), MODEL_MOUNT_ENV: f"{cluster.workdir}/{rel}"}


PUBLISHED_MARKER = ".published"


def directory_digest(path: Path) -> str:
    """First 16 hex of the sha256 over every file's relative path and sha256."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(path)}\0{sha256_file(file)}\n".encode())
    return digest.hexdigest()[:16]


def checkpoint_mount(cfg: RunConfig, store: Store, run_id: str, cluster: Cluster) -> str | None:
    """The store URI every node of a multi-node run uploads trainer.default_local_dir to (`runs/{run_id}/checkpoints`,
    where committed checkpoints live; `checkpoint_sync`), else None. verl's ranks write their shards on their own
    nodes; through the syncs they all land in one place, and the commit writes the manifest in place."""
    if cluster_nodes(cfg) < 2 or cluster.on_this_machine:
        return None
    return store.url(checkpoints_dir(run_id))


def restore_command(spec_env: Mapping[str, str]) -> list[str]:
    """The pre-main_ppo entry: restore the latest committed checkpoint (and fetch the dataset and a shipped model
    where they are not mounted: `sky exec` syncs no file mounts)."""
    cmd = ["python", "-m", "verl_grpo.trainers.verl.restore"]
    for (uri_env, mount_env), flag in zip(MOUNTS, ("dataset", "model")):
        if spec_env.get(uri_env) and spec_env.get(mount_env):
            cmd += [f"--{flag}-uri", spec_env[uri_env], f"--{flag}-dir", spec_env[mount_env]]
    return cmd


def finalize_command(cfg: RunConfig) -> list[str]:
    """The post-main_ppo entry: merge the final actor with verl.model_merger, publish model, metrics, TrainResult."""
    return ["python", "-m", "verl_grpo.trainers.verl.finalize", "--backend", cfg.verl.strategy,
            "--train-batch-size", str(cfg.algorithm.train_batch_size)]
