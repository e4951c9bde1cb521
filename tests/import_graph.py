"""Every import statement of the product and the rehearsal, read from the source (those inside functions too; not
those under `if TYPE_CHECKING:`, which never run), as edges between modules, and the package's layers as ARCHITECTURE.md draws them; tests/unit/test_layers.py holds the
one to the other."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
"""Installed package name → its folder, for the app's folders (cli/, flows/, tasks/)."""
TOPS = ("verl_grpo", "verl_grpo_rehearsal", *PACKAGE_DIRS)
"""The packages whose imports are read: the domain package, the rehearsal, and the app on top of them."""
PRODUCT = ("verl_grpo", *PACKAGE_DIRS)
LAYERS_MARK = "<!-- layers: tests/unit/test_layers.py -->"
"""ARCHITECTURE.md's drawing of the layers is the fenced block after this line."""


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str
    """`path:line` of the import statement."""


def modules(root: Path = REPO, tops: Iterable[str] = TOPS) -> dict[str, Path]:
    """Dotted module name (as installed) → source file, for every module of the packages `tops`."""
    found = {}
    for top in tops:
        folder = root / PACKAGE_DIRS.get(top, top)
        for path in sorted(folder.rglob("*.py")):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def edges(found: dict[str, Path], root: Path = REPO) -> Iterator[Edge]:
    """Each import of one read module by another. `from pkg import name` depends on the submodule `pkg.name` when
    there is one (Python runs pkg/__init__ first either way), else on `pkg` itself."""
    for name, path in found.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking(block) for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, found) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, is_package, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else _known(base, found)
                           for a in node.names]
            else:
                continue
            where = f"{path.relative_to(root)}:{node.lineno}"
            for target in {t for t in targets if t and t != name}:
                yield Edge(name, target, where)


def _is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:`: imports for annotations alone, which never run (every module here postpones them)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = name.split(".") if is_package else name.split(".")[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _known(dotted: str, found: dict[str, Path]) -> str | None:
    """The longest read module that `dotted` names or lies in (None: another distribution's)."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in found:
        parts.pop()
    return ".".join(parts) or None


def unit(module: str) -> str | None:
    """A module's unit in the layer drawing: the top-level module or subpackage of verl_grpo it belongs to, or the
    top package for the app and the rehearsal (None: verl_grpo/__init__ itself)."""
    parts = module.split(".")
    if parts[0] != "verl_grpo":
        return parts[0]
    return parts[1] if len(parts) > 1 else None


def layers(text: str) -> list[tuple[str, list[str]]]:
    """ARCHITECTURE.md's layers, bottom first: (layer name, its units)."""
    after = text.split(LAYERS_MARK, 1)[1]
    block = re.search(r"```\w*\n(.*?)```", after, flags=re.DOTALL)[1]
    rows = [line.split() for line in block.splitlines() if line.strip()]
    return [(row[0], row[1:]) for row in reversed(rows)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
