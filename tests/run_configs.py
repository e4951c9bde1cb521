"""The RunConfigs tests start from, built as the product builds a run's: `load_config` merging config files, env
knobs and `-o key=value` overrides. A test module names its base once (`_cfg = partial(build_config, *VERL_H100_8)`)
and each test adds its own overrides."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from verl_grpo.config import RunConfig, load_config

VERL_ON_SKYPILOT = ("trainer.backend=verl", "infra.provider=skypilot")
"""A verl run placed by SkyPilot, on the accelerators of the field's default."""
VERL_H100_1 = (*VERL_ON_SKYPILOT, "infra.accelerators=H100:1")
"""A verl run on one SkyPilot node with one H100."""
VERL_H100_8 = (*VERL_ON_SKYPILOT, "infra.accelerators=H100:8")
"""A verl run on one SkyPilot node of 8 H100s."""
VERL_ROLLOUT_GROUP = (*VERL_H100_8, "skypilot.shape=rollout_group")
"""verl's fully-async trainer: the trainer's nodes and a group of rollout nodes."""


VERL_FILES = {"train": "/w/train.parquet", "val": "/w/val.parquet"}
"""Where a verl plan reads its splits, as the overrides tests pass them."""


def overrides_dict(overrides: Sequence[str]) -> dict[str, str]:
    """Hydra `key=value` overrides by key."""
    return dict(o.split("=", 1) for o in overrides)


def build_config(*overrides: str, files: Sequence[str | Path] = (), env: Mapping[str, str] | None = None) -> RunConfig:
    """`load_config(files, overrides, env)`: no files is the fields' defaults, `env=None` reads the knobs of
    os.environ (conftest unsets those a developer's shell may hold), `env={}` none."""
    return load_config(files, list(overrides), env=env)


def tiny_cpu_run(model_dir: str | Path, *overrides: str, verl_extra: Sequence[str] = ()) -> RunConfig:
    """The tiny model trained on CPU by verl's own trainers (the rehearsal's stand-ins): gsm8k, a 16-row validation
    split, 2 rollouts a prompt, micro-batches of 2, 64 training rows, plus `verl_extra` verl overrides."""
    return build_config("dataset.name=gsm8k", "dataset.val_size=16", f"model.name={model_dir}", "algorithm.rollouts=2",
                      "verl.micro_batch_size_per_gpu=2",
                      f"verl.extra_overrides={json.dumps(['data.train_max_samples=64', *verl_extra])}", *overrides,
                      env={})


def prepared_files(model_dir: str | Path, run: Sequence[str], store_dir: Path) -> dict[str, str]:
    """The local parquet files of `tiny_cpu_run(model_dir, *run)`'s dataset, prepared into a file store at
    `store_dir` with the model's tokenizer, by split."""
    from transformers import AutoTokenizer

    from verl_grpo.data import prepare_dataset
    from verl_grpo.store import Store, strip_scheme

    version = prepare_dataset(tiny_cpu_run(model_dir, *run), Store(f"file://{store_dir}"),
                              tokenizer=AutoTokenizer.from_pretrained(model_dir))
    return {split: strip_scheme(uri) for split, uri in version.splits.items()}
