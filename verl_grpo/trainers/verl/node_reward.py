"""A run's own reward function (reward.path) on the GPU nodes: how it reaches them, and what verl is told.

A `.py` file travels through the run's store, content-addressed (`rewards/<sha256[:16]>/<file name>`, uploaded by the
launch), and every node that scores fetches it with the task's secrets into `<workdir>/rewards/<digest>/` before it
starts (`reward_fetch`): each trainer node (verl's reward-loop workers run on all of them), a job group's
reward-server, the vLLM eval task. Not SkyPilot's `file_mounts`: `sky exec` on an existing cluster syncs the workdir
only (sky/execution.py `exec`: stages SYNC_WORKDIR and EXEC), and a managed job's local file mounts go through an
intermediate bucket SkyPilot authenticates with the cloud's own credentials; the store is what the nodes already read
with the task's secrets, and a recovery fetches the very bytes the launch shipped. Only that file travels: a module
beside it does not (the dry run says so).

A module `pkg.module` does not travel: the nodes import it when the workdir's editable install brings its package
(pyproject's packages: verl_grpo, ...) or skypilot.node_packages installs it; `module_on_nodes` decides.

verl gets `pkg://verl_grpo.trainers.verl.user_entry` with `reward_kwargs` saying where the function is on the node,
the component keys every row returns (fixed here by scoring one sample row of the train split on the launcher, which
has imported the function already) and the first step's rows per reward-loop worker (its FailureGuard).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_grpo.config import RunConfig
from verl_grpo.contracts import Cluster, DatasetVersion
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.formats import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN
from verl_grpo.local_paths import repo_root
from verl_grpo.rewards.user_reward import RESERVED, UserReward
from verl_grpo.store import Store
from verl_grpo.store_layout import shipped_reward_dir

REWARD_URI_ENV = "VERL_GRPO_REWARD_URI"
REWARD_DIR_ENV = "VERL_GRPO_REWARD_DIR"
"""TrainSpec env: the shipped file's store folder and where the nodes fetch it to (the templates render the fetch)."""
FETCH_MODULE = "verl_grpo.trainers.verl.reward_fetch"
USER_ENTRY = "pkg://verl_grpo.trainers.verl.user_entry"
LOCAL_FUNCTION, REMOTE_FUNCTION = "compute_score", "compute_score_remote"
VERL_REWARD_WORKERS = 8
"""verl's reward.num_workers default (verl/trainer/config/reward/reward.yaml), over which a step's rows spread."""
DIGEST_CHARS = 16


def file_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:DIGEST_CHARS]


@dataclass(frozen=True)
class NodeReward:
    """The run's reward function as the nodes reach it."""

    source: str
    """reward.path on the launcher: a `.py` file or a module."""
    path: str
    """reward.path on the nodes: the fetched file, or the same module."""
    name: str
    timeout_s: float
    uri: str | None = None
    """Store URI of the folder the file ships in; None for a module (nothing travels)."""
    node_dir: str | None = None
    """Where the nodes fetch that folder to."""

    def env(self) -> dict[str, str]:
        """The TrainSpec env that makes the templates render the nodes' fetch ({} for a module)."""
        return {REWARD_URI_ENV: self.uri, REWARD_DIR_ENV: self.node_dir} if self.uri and self.node_dir else {}


def fetch_command(env: Mapping[str, str]) -> list[str] | None:
    """The node's fetch of a shipped reward file (`reward_fetch URI DIR`), from a TrainSpec's env (or
    NodeReward.env()); None when none ships."""
    if not (env.get(REWARD_URI_ENV) and env.get(REWARD_DIR_ENV)):
        return None
    return ["python", "-m", FETCH_MODULE, env[REWARD_URI_ENV], env[REWARD_DIR_ENV]]


def node_path(cfg: RunConfig, env: Mapping[str, str]) -> str | None:
    """reward.path as the nodes read it, from a TrainSpec's env: the fetched file, else cfg's (a module)."""
    if not cfg.reward.path:
        return None
    if env.get(REWARD_DIR_ENV) and cfg.reward.path.endswith(".py"):
        return f"{env[REWARD_DIR_ENV]}/{Path(cfg.reward.path).name}"
    return cfg.reward.path


def node_config(cfg: RunConfig, node: NodeReward | None) -> RunConfig:
    """cfg with reward.path where the nodes read it (what an eval spec carries to its node)."""
    if node is None or node.path == cfg.reward.path:
        return cfg
    return cfg.model_copy(update={"reward": cfg.reward.model_copy(update={"path": node.path})})


def node_reward(cfg: RunConfig, store: Store, workdir: str, on_this_machine: bool = False,
                upload: bool = True) -> NodeReward | None:
    """Where the nodes (run dir `workdir`) find the run's function (None without reward.path). A `.py` is uploaded
    to the store unless it is there already (upload=False: the dry run names where it would go); a module must be
    importable there (`module_on_nodes`). On this machine the path is used as it is."""
    reward = cfg.reward
    if not reward.path:
        return None
    if on_this_machine:
        return NodeReward(reward.path, reward.path, reward.name, reward.timeout_s)
    if not reward.path.endswith(".py"):
        module_on_nodes(cfg)
        return NodeReward(reward.path, reward.path, reward.name, reward.timeout_s)
    source = Path(reward.path)
    if not source.is_file():
        raise ConfigError(f"reward.path {reward.path} is not a file on this machine; give the path of your reward .py")
    rel = shipped_reward_dir(file_digest(source))
    if upload and not store.exists(rel, source.name):
        store.put_file(source, rel, source.name)
    node_dir = f"{workdir}/{rel}"
    return NodeReward(reward.path, f"{node_dir}/{source.name}", reward.name, reward.timeout_s, store.url(rel),
                      node_dir)


def workdir_packages(pyproject: Path | None = None) -> set[str]:
    """Top-level packages the nodes' editable install of the workdir (`uv pip install -e .`) makes importable:
    pyproject.toml's [tool.setuptools] packages, or its packages.find include with wildcards dropped."""
    path = pyproject or (repo_root() or Path.cwd()) / "pyproject.toml"
    try:
        packages = tomllib.loads(path.read_text())["tool"]["setuptools"]["packages"]
        include = packages if isinstance(packages, list) else packages["find"]["include"]
    except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError):
        return {"verl_grpo"}
    return {p.rstrip("*").split(".")[0] for p in include if p.rstrip("*")}


def module_on_nodes(cfg: RunConfig) -> str:
    """Where a reward module comes from on the nodes: the synced workdir's editable install, or
    skypilot.node_packages; ConfigError in one line when neither brings it."""
    from verl_grpo.node_imports import provided_imports

    module = cfg.reward.path
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return f"reward module {module} is in the nodes' Python standard library"
    root = repo_root()
    origin = UserReward(module, cfg.reward.name).source_file()
    if top in workdir_packages() and origin is not None and root is not None and origin.is_relative_to(root):
        return f"reward module {module} is in the synced workdir ({origin.relative_to(root)}, installed with -e .)"
    if top in provided_imports(cfg.skypilot.node_packages) - {"verl_grpo"}:
        return f"reward module {module} is installed on the nodes by skypilot.node_packages"
    raise ConfigError(f"reward.path {module} is a module the GPU nodes cannot import: it is neither in the synced "
                      f"workdir's packages ({', '.join(sorted(workdir_packages()))}) nor installed by "
                      f"skypilot.node_packages; add its distribution to skypilot.node_packages (e.g. "
                      f"'{top.replace('_', '-')} @ git+https://...') or give reward.path as a .py file, which ships "
                      "with the run")


@dataclass(frozen=True)
class SampleRow:
    """One row of the train split as verl's reward manager passes it, with a response that states its answer."""

    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any]
    response: str

    def call(self) -> tuple[str, str, Any, dict[str, Any]]:
        return self.data_source, self.response, self.ground_truth, self.extra_info


def reference_response(ground_truth: Any) -> str:
    """A response in the prompts' format whose answer block holds the row's answer: reasoning-gym's entry's
    `answer`, QA's first target, else the ground truth's text."""
    answer = ground_truth
    if isinstance(ground_truth, str):
        try:
            answer = json.loads(ground_truth)
        except json.JSONDecodeError:
            answer = ground_truth
        if not isinstance(answer, dict):
            answer = ground_truth
    if isinstance(answer, dict):
        targets = answer.get("target")
        answer = answer.get("answer", targets[0] if isinstance(targets, list) and targets else ground_truth)
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False, default=str)
    return f"{THINK_OPEN}Checking the reference answer.{THINK_CLOSE}\n{ANSWER_OPEN}{text}{ANSWER_CLOSE}"


def sample_row(cfg: RunConfig, dataset: DatasetVersion | None = None, store: Store | None = None) -> SampleRow:
    """The first row of the prepared train split, else (the dry run: nothing prepared) the first usable train row
    of the dataset's source, shaped as preparation shapes it. DataError when there is none."""
    if dataset is not None and store is not None and dataset.counts.get("train"):
        from verl_grpo.data.prepare import load_split

        frame = load_split(dataset, "train", store)
        if len(frame):
            row = frame.iloc[0]
            truth = (row["reward_model"] or {}).get("ground_truth")
            return SampleRow(str(row["data_source"]), truth, dict(row["extra_info"] or {}), reference_response(truth))
    from verl_grpo.data import builder_for
    from verl_grpo.data.schema import RowRejected
    from verl_grpo.data.sources import load_raw

    builder = builder_for(cfg.dataset)
    candidates = []
    for record in load_raw(cfg.dataset, builder, cfg.storage.endpoint_url).read_records():
        try:
            candidates.append(builder.to_problem(record))
        except RowRejected:
            continue
        if candidates[-1].split == "train":
            break
    if not candidates:
        raise DataError(f"dataset {cfg.task} has no usable row to score a sample of; fix its rows (see the data "
                        "check)")
    problem = next((p for p in candidates if p.split == "train"), candidates[0])
    extra = {"split": "train", "index": 0, "uid": problem.uid, **problem.extra}
    return SampleRow(problem.data_source or builder.name, problem.ground_truth, extra,
                     reference_response(problem.ground_truth))


def components_of(result: Mapping[str, Any]) -> tuple[str, ...]:
    """The function's numeric component keys in one normalised result (RESERVED keys left out)."""
    return tuple(k for k, v in result.items() if k not in RESERVED and isinstance(v, (int, float))
                 and not isinstance(v, bool))


def first_rows(cfg: RunConfig) -> int:
    """Rows one reward-loop worker scores in the first step: the step's responses over verl's reward.num_workers
    (an `reward.num_workers=N` extra override counts), and at least one prompt's group, so that one bad row scored
    first cannot stop a run."""
    workers = VERL_REWARD_WORKERS
    for override in cfg.verl.extra_overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key == "reward.num_workers" and value.strip().isdigit() and int(value) > 0:
            workers = int(value)
    return max(cfg.algorithm.rollouts, math.ceil(cfg.algorithm.train_batch_size * cfg.algorithm.rollouts / workers))


@dataclass(frozen=True)
class UserRewardPlan:
    """What a verl run scored by the user's function is told, and the sample that fixed its component keys."""

    node: NodeReward
    components: tuple[str, ...]
    first_rows: int
    sample: SampleRow | None = None
    """None where no row was scored (`placeholder`: the offline compose check)."""
    result: dict[str, Any] = field(default_factory=dict)
    """The launcher's normalised score of the sample row."""
    error: str | None = None
    """Why the launcher's call on the sample failed (None: it scored)."""
    loaded: bool = True
    """False when the launcher could not read a sample row or import the function (the data check says why)."""

    def reward_kwargs(self) -> dict[str, Any]:
        """verl's reward.custom_reward_function.reward_kwargs for user_entry."""
        return {"user_path": self.node.path, "user_name": self.node.name, "timeout_s": self.node.timeout_s,
                "components": list(self.components), "first_rows": self.first_rows}


def placeholder(cfg: RunConfig, node_dir: str) -> UserRewardPlan | None:
    """A plan of the run's function for composing verl's config only (no file read, nothing scored)."""
    reward = cfg.reward
    if not reward.path:
        return None
    path = f"{node_dir}/{Path(reward.path).name}" if reward.path.endswith(".py") else reward.path
    return UserRewardPlan(NodeReward(reward.path, path, reward.name, reward.timeout_s), (), first_rows(cfg))


def plan_user_reward(cfg: RunConfig, dataset: DatasetVersion | None, store: Store, cluster: Cluster,
                     upload: bool = True) -> UserRewardPlan | None:
    """The plan of a run with reward.path (None without): the function placed on the nodes, and its component keys
    from one sample row of the train split scored here with the launcher's copy of it."""
    node = node_reward(cfg, store, cluster.workdir, cluster.on_this_machine, upload)
    if node is None:
        return None
    rows = first_rows(cfg)
    try:
        sample = sample_row(cfg, dataset, store)
    except DataError as e:  # the data check (data.task_check.check_task) reports the same; resolve refuses the run
        return UserRewardPlan(node, (), rows, error=f"no sample row ({e})", loaded=False)
    reward = UserReward(cfg.reward.path, cfg.reward.name, cfg.reward.timeout_s)
    try:
        result, error = reward.score_or_error(*sample.call())
    except ConfigError as e:  # it does not import here: check_task says so (and refuses a real launch)
        return UserRewardPlan(node, (), rows, sample, error=str(e), loaded=False)
    return UserRewardPlan(node, components_of(result) if error is None else (), rows, sample, result, error)
