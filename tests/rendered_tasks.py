"""Today's rendered SkyPilot training task of each shape, built as `VerlTrainer.plan` and the provider build it: the
golden-file tests read it as text, the rehearsal engine's tests run it on hermetic nodes."""

from __future__ import annotations

from run_configs import VERL_H100_8, build_config

from verl_grpo.contracts import TrainSpec
from verl_grpo.providers.skypilot import templates
from verl_grpo.trainers.verl.backend import DATASET_MOUNT_ENV, DATASET_URI_ENV
from verl_grpo.trainers.verl.fully_async import ENTRY_MODULE, fully_async_overrides
from verl_grpo.trainers.verl.overrides import VerlPaths, run_paths, verl_overrides
from verl_grpo.trainers.verl.samples import SamplesPlan
from verl_grpo.trainers.verl.settings import checkpoint_env

MOUNT = "/tmp/verl-grpo/datasets/gsm8k/abc123"
SERVICES_ON = "services.enabled=[data,reward,retrieval]"
CKPT_MOUNT = "s3://bucket/store/runs/run-1/checkpoints"
"""What VerlTrainer.plan mounts at the checkpoint dir of a multi-node run (backend.checkpoint_mount)."""


def shape_config(shape: str, *extra: str):
    services = [SERVICES_ON] if shape == "job_group" else []
    return build_config(*VERL_H100_8, "infra.nodes=2", "infra.spot=true", f"skypilot.shape={shape}",
                        "skypilot.cloud=aws", "storage.uri=s3://bucket/store", *services, *extra)


def render(shape: str, env: dict[str, str], *extra: str, workdir: str = "/src/verl-grpo",
           override: tuple[str, str] | None = None) -> templates.RenderedTask:
    """The rendered task; `override` replaces one verl override's text before the plan is made (as a code change
    that renders it would)."""
    cfg = shape_config(shape, *extra)
    files = {"train": f"{MOUNT}/train.parquet", "val": f"{MOUNT}/val.parquet"}
    paths = VerlPaths("/tmp/verl-grpo/checkpoints/run-1")
    if shape == "rollout_group":  # as VerlTrainer.plan composes it: rewards through the reward-server's client
        paths = run_paths(cfg, paths.checkpoint_dir)
        module, ov = ENTRY_MODULE, fully_async_overrides(cfg, files, paths, "run-1", env=env)
    else:
        module, ov = "verl.trainer.main_ppo", verl_overrides(cfg, files, paths, "run-1", env=env)
    if override is not None:
        ov = [o.replace(*override) for o in ov]
    spec = TrainSpec(backend="verl", run_id="run-1", command=["python", "-m", module, *ov],
                     overrides=ov, total_steps=20,
                     env={DATASET_URI_ENV: "s3://bucket/store/datasets/gsm8k/abc123", DATASET_MOUNT_ENV: MOUNT,
                          **checkpoint_env("s3://bucket/store", None, "run-1", "/tmp/verl-grpo/checkpoints/run-1", 2,
                                           CKPT_MOUNT if cfg.infra.nodes > 1 else None),
                          **(plan.env() if (plan := SamplesPlan.of(cfg)) else {})})
    return templates.render(cfg, spec, env, workdir=workdir)
