"""What each rendered task's nodes import against what its setup installs, offline, before any spend.

A node has only what its setup's `pip install` lines bring (and their dependencies), never this machine's venv. Its
imports are the closure of the verl_grpo modules the task runs (`python -m verl_grpo...`, `pkg://verl_grpo...`,
`verl_grpo....Class` paths handed to verl), read statically: the import statements that run when a module is
imported (module and class level, not inside functions, not guarded by `except ImportError` or `TYPE_CHECKING`),
so an entry that cannot even start is caught; a function's lazy import is the path-dependent part this leaves out.
verl's own trackers add theirs (`trainer.logger=[...,mlflow]` makes verl import mlflow). The
installed side is each requirement with its dependencies as this machine's package metadata lists them; a package
not installed here counts as itself only (vLLM as its own requirements list it: `dependency_closure`).
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from verl_grpo.dependency_closure import resolve
from verl_grpo.errors import ConfigError
from verl_grpo.pip_args import install_args

PACKAGE = "verl_grpo"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
VERL_LOGGER_IMPORTS = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard", "swanlab": "swanlab"}
"""verl's `Tracking` imports these for the named `trainer.logger` backends (verl/utils/tracking.py)."""
_ENTRY = re.compile(r"(?:python3?\s+-m\s+|pkg://)(verl_grpo(?:\.\w+)*)|=(verl_grpo(?:\.\w+)*)\.[A-Z]\w*")
_LOGGERS = re.compile(r"trainer\.logger=\[([^\]]*)\]")


def check_node_imports(yamls: Mapping[str, str]) -> list[str]:
    """One line per task naming what its nodes import and that their setup installs all of it; ConfigError in one
    line naming each task's missing imports otherwise."""
    lines, problems = [], []
    for name, text in yamls.items():
        for task in yaml.safe_load_all(text):
            if not isinstance(task, dict) or not task.get("run"):
                continue
            label = task.get("name") or name
            needed = needed_imports(f"{task.get('setup') or ''}\n{task['run']}")
            requirements = setup_requirements(task.get("setup") or "")
            provided = provided_imports(requirements)
            missing = {imp: why for imp, why in needed.items() if imp not in provided}
            if missing:
                problems.append(f"task {label!r} imports "
                                f"{', '.join(f'{imp} ({why})' for imp, why in sorted(missing.items()))} "
                                "which its setup does not install")
            else:
                lines.append(f"task {label!r}: setup installs {' '.join(requirements)}; it brings all "
                             f"{len(needed)} packages the task imports ({', '.join(sorted(needed))})")
    if problems:
        raise ConfigError("; ".join(problems) + "; add them to CLUSTER_RUNTIME (verl_grpo/providers/skypilot/"
                          "templates.py) or to skypilot.node_packages")
    return lines


def entry_modules(script: str) -> set[str]:
    """The verl_grpo modules a script runs: `python -m`, `pkg://` and `module.Class` paths handed to verl."""
    return {a or b for a, b in _ENTRY.findall(script)}


def needed_imports(script: str) -> dict[str, str]:
    """Top-level third-party import name → the first node module (or verl logger) that imports it."""
    entries = entry_modules(script)
    needed: dict[str, str] = {}
    for module in sorted(_closure(entries)):
        for name in _third_party(module):
            needed.setdefault(name, module)
    for match in _LOGGERS.findall(script):
        for logger in (x.strip().strip("'\"") for x in match.split(",")):
            if logger in VERL_LOGGER_IMPORTS:
                needed.setdefault(VERL_LOGGER_IMPORTS[logger], f"verl's {logger} logger")
    return needed


def setup_requirements(setup: str) -> list[str]:
    """The requirements of every `pip install` / `uv pip install` line of a setup script (options and editable
    installs of the workdir left out)."""
    out: list[str] = []
    for line in setup.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i in range(len(words) - 1):
            if words[i] == "pip" and words[i + 1] == "install":
                out += _requirement_words(words[i + 2:])
                break
    return out


def provided_imports(requirements: Iterable[str]) -> set[str]:
    """Top-level import names the installed distributions (with their dependencies) provide, and verl_grpo's."""
    dists = _distributions(tuple(sorted(set(requirements))))
    names = {PACKAGE}
    for top, owners in _import_owners().items():
        if any(canonicalize_name(o) in dists for o in owners):
            names.add(top)
    names |= {d.replace("-", "_") for d in dists}  # not installed here: its import name is most often its own
    return names


@cache
def _distributions(specs: tuple[str, ...]) -> frozenset[str]:
    """Every distribution a node gets from installing these requirements (each task of a group has its setup)."""
    reqs = []
    for spec in specs:
        try:
            reqs.append(Requirement(spec))
        except InvalidRequirement:
            continue
    return frozenset(resolve(reqs).names())


def _requirement_words(words: list[str]) -> list[str]:
    """The requirements among an install line's words: not options or their values (editables and requirement
    files included), nor local paths."""
    return [word for option, word in install_args(words) if option is None and not word.startswith((".", "/"))]


@cache
def _import_owners() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def _closure(entries: Iterable[str]) -> set[str]:
    """Every verl_grpo module the entries reach (packages' __init__ included)."""
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        if module in seen or _module_file(module) is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [name for name in _imports(module) if name.split(".")[0] == PACKAGE]
    return seen


def file_imports(path: Path, stdlib: bool = False) -> tuple[list[str], list[str]]:
    """A user's file's top-level imports outside the stdlib (only the stdlib's with `stdlib`): (those that run when
    it is imported, those only in its functions or guarded by `except ImportError`). Relative imports are its
    package's own and left out."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    on_import = {name.split(".")[0] for name in _import_names(tree, "") if name and not name.startswith(".")}
    every = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            every |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            every.add(node.module.split(".")[0])
    keep = sorted(n for n in every if (n in sys.stdlib_module_names) == stdlib and n != "__future__")
    return [n for n in keep if n in on_import], [n for n in keep if n not in on_import]


def _third_party(module: str) -> list[str]:
    tops = {name.split(".")[0] for name in _imports(module)}
    return sorted(t for t in tops if t != PACKAGE and t not in sys.stdlib_module_names and t != "__future__")


@cache
def _module_file(module: str) -> Path | None:
    path = PACKAGE_ROOT.joinpath(*module.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@cache
def _imports(module: str) -> tuple[str, ...]:
    """Absolute names of what the module imports, unguarded (`from a import b` yields `a` and `a.b`)."""
    path = _module_file(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return tuple(_import_names(ast.parse(path.read_text()), package))


def _import_names(tree: ast.AST, package: str) -> Iterator[str]:
    for node in _unguarded(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _unguarded(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes that run when the module is imported: outside function bodies, `try: ... except ImportError` bodies
    and `if TYPE_CHECKING:` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.Try) and any(_catches_import_error(h) for h in child.handlers):
            for part in (child.handlers, child.orelse, child.finalbody):
                for sub in part:
                    yield from _walk(sub)
            continue
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for sub in child.orelse:
                yield from _walk(sub)
            continue
        yield child
        yield from _unguarded(child)


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    yield from _unguarded(node)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
