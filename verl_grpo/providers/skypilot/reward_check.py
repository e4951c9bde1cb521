"""The dry run's check of a run's own reward function (reward.path) against the GPU nodes, offline.

Three lines: which file ships to which node path for which tasks (node_reward); the file's own top-level imports
against what each scoring task's setup installs (plus the stdlib); and the function imported in the nodes' package
set, scoring one sample row of the train split there. "The nodes' package set" is what every scoring task's setup
installs (`node_imports.setup_requirements` / `provided_imports`) plus the stdlib: the probe (`_reward_probe.py`) runs
the function in a subprocess of this venv whose imports of any other top-level module are refused, as on a node
without it. A package the nodes lack, a module beside the file (only the file travels) or a call that fails on the
sample row each fail the dry run in one line naming the package or the error, the file and the fix. A task whose
own scorer needs a package (reasoning-gym) is checked to have it wherever its rows are scored.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from verl_grpo.config import RunConfig
from verl_grpo.errors import ConfigError
from verl_grpo.node_imports import file_imports, provided_imports, setup_requirements
from verl_grpo.providers.skypilot.templates import TASK_PACKAGES, task_packages
from verl_grpo.rewards.user_reward import LOAD_TIMEOUT_S, WORKER_SCRIPT, normalise
from verl_grpo.trainers.verl.node_reward import FETCH_MODULE, REMOTE_FUNCTION, UserRewardPlan
from verl_grpo.trainers.verl.overrides import REMOTE_REWARD_MODULE

PROBE_SCRIPT = Path(__file__).with_name("_reward_probe.py")
SHOWN_CHARS = 120
"""How much of the sample response the line shows."""
FIX = "add {}'s distribution to skypilot.node_packages (installed on every node that scores)"


@dataclass(frozen=True)
class ScoringTask:
    """A rendered task whose nodes run the user's function, and the import names its setup provides."""

    label: str
    role: str
    provided: frozenset[str]


def scoring_tasks(yamls: Mapping[str, str]) -> list[ScoringTask]:
    """The rendered tasks that score rows: the trainer (verl's reward loop, unless it asks the reward-server), a
    job group's reward-server, the vLLM eval."""
    out = []
    for name, text in yamls.items():
        for task in yaml.safe_load_all(text):
            if not isinstance(task, dict) or not task.get("run"):
                continue
            run = task["run"]
            remote = REMOTE_FUNCTION in run or REMOTE_REWARD_MODULE in run
            role = ("verl's reward loop" if "reward.custom_reward_function.path=" in run and not remote else
                    "the reward-server" if "verl_grpo.services.reward_server" in run else
                    "the vLLM eval" if "verl_grpo.evaluate.vllm_runner" in run else None)
            if role:
                provided = provided_imports(setup_requirements(task.get("setup") or ""))
                out.append(ScoringTask(task.get("name") or name, role, frozenset(provided)))
    return out


def check_task_scorer(cfg: RunConfig, yamls: Mapping[str, str]) -> str:
    """A task whose scorer needs a package (TASK_PACKAGES: reasoning-gym's score_answer, imported lazily, so the
    static import check cannot see it) has it installed by every task that scores its rows."""
    distribution, module = TASK_PACKAGES[cfg.dataset.name]
    tasks = scoring_tasks(yamls)
    lacking = [t.label for t in tasks if module not in t.provided]
    if lacking:
        raise ConfigError(f"dataset.name={cfg.dataset.name} rows are scored with {distribution}, which the setup of "
                          f"{', '.join(lacking)} does not install (fix task_packages in verl_grpo/providers/skypilot/"
                          "templates.py)")
    return (f"{cfg.dataset.name}: every task that scores its rows installs {', '.join(task_packages(cfg))} "
            f"({', '.join(f'{t.label}: {t.role}' for t in tasks)})")


def check_user_reward(yamls: Mapping[str, str], plan: UserRewardPlan | None) -> list[str]:
    """The three lines of the reward check (see the module doc); ConfigError in one line when one fails."""
    if plan is None:
        return []
    tasks = scoring_tasks(yamls)
    if not tasks:
        raise ConfigError("reward.path is set but no rendered task runs it (fix verl_grpo/providers/skypilot "
                          "templates)")
    lines = [shipping_line(plan, tasks, yamls)]
    if plan.node.source.endswith(".py"):
        lines.append(static_imports_line(Path(plan.node.source), tasks))
    lines.append(probe_line(plan, tasks))
    return lines


def shipping_line(plan: UserRewardPlan, tasks: list[ScoringTask], yamls: Mapping[str, str]) -> str:
    """Which file goes to which node path for which tasks (and that each of them fetches it)."""
    node = plan.node
    where = ", ".join(f"{t.label} ({t.role})" for t in tasks)
    if node.uri is None:
        return f"reward: module {node.source} is imported on the nodes of {where}; nothing ships"
    fetching = {t.get("name") or n for n, text in yamls.items() for t in yaml.safe_load_all(text)
                if isinstance(t, dict) and FETCH_MODULE in (t.get("run") or "")}
    missing = [t.label for t in tasks if t.label not in fetching]
    if missing:
        raise ConfigError(f"task {', '.join(missing)} runs reward.path but does not fetch it from the store (fix "
                          "verl_grpo/providers/skypilot templates)")
    name = Path(node.source).name
    return (f"reward: {node.source} ships through the store ({node.uri}/{name}, uploaded at launch) to {node.path} "
            f"on the nodes of {where}; each fetches it (sha256-checked) before it scores")


def beside(source: Path, module: str) -> bool:
    """Whether `module` is a file or package next to the reward file (importable here, never on a node)."""
    return (source.parent / f"{module}.py").is_file() or (source.parent / module).is_dir()


def static_imports_line(source: Path, tasks: list[ScoringTask]) -> str:
    """The file's own top-level imports outside the stdlib, each against every scoring task's setup; a module beside
    the file (which does not travel) or a package a task lacks fails in one line."""
    try:
        on_import, lazy = file_imports(source)
        stdlib = [n for part in file_imports(source, stdlib=True) for n in part]
    except (OSError, SyntaxError) as e:
        raise ConfigError(f"reward.path {source} cannot be read as Python ({type(e).__name__}: {e}); fix the "
                          "file") from None
    siblings = [n for n in on_import if beside(source, n)]
    if siblings:
        raise ConfigError(f"reward.path {source} imports {', '.join(siblings)} from beside it, which does not travel "
                          "to the nodes (only the file ships); copy what it needs into the file, or install it "
                          "with skypilot.node_packages and give reward.path as that module")
    for name in on_import:
        lacking = [t.label for t in tasks if name not in t.provided]
        if lacking:
            raise ConfigError(f"reward.path {source} imports {name}, which the setup of {', '.join(lacking)} does "
                              f"not install; {FIX.format(name)}")
    absent = [n for n in lazy if any(n not in t.provided for t in tasks)]
    shown = ", ".join([*on_import, *(f"{n} (in a function or guarded)" for n in lazy),
                       *(f"{n} (stdlib)" for n in sorted(stdlib))]) or "nothing"
    note = (f"; not on every scoring node: {', '.join(absent)} (guarded or in a function: the sample row below "
            "shows whether the call reaches them)" if absent else "")
    return f"reward: {source.name} imports {shown}; every task that scores installs what it imports on load{note}"


def probe(plan: UserRewardPlan, allowed: set[str], timeout_s: float | None = None) -> dict:
    """Run `_reward_probe.py` on the plan's sample row with only `allowed` (and the stdlib) importable."""
    sample = plan.sample
    request = {"allowed": sorted(allowed), "path": plan.node.source, "name": plan.node.name,
               "worker": str(WORKER_SCRIPT), "row": list(sample.call())}
    timeout = timeout_s or LOAD_TIMEOUT_S + plan.node.timeout_s
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="verl-grpo-probe-") as f:
        json.dump(request, f, default=str)
        f.flush()
        try:
            done = subprocess.run([sys.executable, str(PROBE_SCRIPT), f.name], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"it did not import and score within {timeout:.0f}s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " ".join(done.stderr.strip().splitlines()[-1:]) or f"exit code {done.returncode}"
        return {"error": f"the probe failed ({tail})"}
    return json.loads(lines[-1])


def probe_line(plan: UserRewardPlan, tasks: list[ScoringTask]) -> str:
    """The function imported with only the scoring tasks' common packages and scoring the sample row there."""
    if not plan.loaded or plan.sample is None:  # the data check fails on it, in its own line
        return f"reward: not imported in the nodes' package set: {plan.error or 'no sample row'}"
    allowed = set.intersection(*(set(t.provided) for t in tasks))
    answer = probe(plan, allowed)
    label = f"{plan.node.name} in {plan.node.source} (reward.path)"
    if missing := answer.get("missing"):
        if plan.node.source.endswith(".py") and beside(Path(plan.node.source), missing):
            raise ConfigError(f"reward function {label} imports {missing} from beside it, which does not travel to "
                              "the nodes (only the file ships); copy what it needs into the file, or install it with "
                              "skypilot.node_packages and give reward.path as that module")
        lacking = ", ".join(t.label for t in tasks if missing not in t.provided)
        raise ConfigError(f"reward function {label} imports {missing}, which the nodes of {lacking} do not install "
                          f"(the dry run imported it in their package set); {FIX.format(missing)}")
    sample = plan.sample
    shown = repr(sample.response[:SHOWN_CHARS] + ("..." if len(sample.response) > SHOWN_CHARS else ""))
    if "error" in answer:
        raise ConfigError(f"reward function {label} failed on a sample row of the train split (data_source "
                          f"{sample.data_source!r}, response {shown}) in the nodes' package set: {answer['error']}; "
                          "fix it, then check it with `verl-grpo score -c <your config> FILE.jsonl`")
    result, why = normalise(answer["result"], plan.components)
    if why is not None:
        raise ConfigError(f"reward function {label} on a sample row of the train split {why}; return a number or a "
                          "dict with a finite 'score'")
    keys = ", ".join(plan.components) or "none"
    where = ", ".join(t.label for t in tasks)
    return (f"reward: {label} imports in the nodes' package set (the stdlib and what {where} install) and scored a "
            f"sample row there: data_source {sample.data_source!r}, response {shown} -> {result} (components "
            f"{keys}: every row's keys on the nodes)")
