"""The layering the code relies on, read from every import statement (those inside functions too): the package graph
has no cycle, each layer of ARCHITECTURE.md's drawing imports only the layers below it, no product module imports the
rehearsal, and the domain package never reaches up into Prefect, the flows, tasks or CLI."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from import_graph import PACKAGE_DIRS, PRODUCT, REPO, Edge, cycles, edges, layers, modules, unit

IMPORT_EVERY_DOMAIN_MODULE = """
import importlib, pkgutil, sys
import verl_grpo
names = [module.name for module in pkgutil.walk_packages(verl_grpo.__path__, "verl_grpo.")]
# The workers' entry modules hide PEFT, W&B and scikit-learn for the rest of their process
# (trainers/lean_imports.py), which verl's modules import: they go last, as in a worker they come first and alone.
entries = {"verl_grpo.trainers.trl.worker", "verl_grpo.trainers.loop.worker"}
assert entries <= set(names), entries - set(names)
for name in sorted(names, key=lambda name: name in entries):
    importlib.import_module(name)
upper = sorted(m for m in sys.modules if m.split(".")[0] in {"prefect", "verl_grpo_flows", "verl_grpo_tasks", "verl_grpo_cli",
                                                            "verl_grpo_rehearsal"})
assert not upper, f"importing verl_grpo loaded {upper}"
"""


def module_cycles(graph_edges: list[Edge]) -> list[str]:
    """One line per import cycle between modules, with the imports that close it."""
    graph = defaultdict(set)
    for e in graph_edges:
        graph[e.source].add(e.target)
    lines = []
    for component in cycles(graph):
        members = set(component)
        lines.append("cycle: " + "; ".join(f"{e.source} -> {e.target} ({e.where})" for e in graph_edges
                                           if e.source in members and e.target in members))
    return lines


def unit_cycles(graph_edges: list[Edge]) -> list[str]:
    graph = defaultdict(set)
    for e in graph_edges:
        if None not in (unit(e.source), unit(e.target)) and unit(e.source) != unit(e.target):
            graph[unit(e.source)].add(unit(e.target))
    return [f"units in a cycle: {', '.join(component)}" for component in cycles(graph)]


def upward_imports(graph_edges: list[Edge], drawing: list[tuple[str, list[str]]]) -> list[str]:
    """Each import of a unit in a higher layer than the importer's, or of a unit the drawing lacks."""
    layer_of = {u: (i, name) for i, (name, units) in enumerate(drawing) for u in units}
    lines = []
    for e in graph_edges:
        source, target = unit(e.source), unit(e.target)
        if target is None or source == target:
            continue
        missing = [u for u in (source, target) if u not in layer_of]
        if missing:
            lines.append(f"{e.where}: {', '.join(missing)} is in no layer of ARCHITECTURE.md")
        elif layer_of[target][0] > layer_of[source][0]:
            lines.append(f"{e.where}: {e.source} ({layer_of[source][1]}) imports {e.target} "
                         f"({layer_of[target][1]}, a higher layer)")
    return lines


def _graph(root: Path = REPO) -> list[Edge]:
    return list(edges(modules(root), root))


def _drawing(root: Path = REPO) -> list[tuple[str, list[str]]]:
    return layers((root / "ARCHITECTURE.md").read_text())


def test_the_package_graph_has_no_cycle():
    assert module_cycles(_graph()) == []
    assert unit_cycles(_graph()) == []


def test_each_layer_imports_only_the_layers_below_it():
    assert upward_imports(_graph(), _drawing()) == []


def test_the_drawing_places_every_unit_once():
    placed = [u for _, units in _drawing() for u in units]
    assert len(placed) == len(set(placed)), sorted(u for u in placed if placed.count(u) > 1)
    units = {unit(m) for m in modules()} - {None}
    assert units == set(placed), {"undrawn": sorted(units - set(placed)), "gone": sorted(set(placed) - units)}


def test_no_product_module_imports_the_rehearsal():
    into = [f"{e.where}: {e.source} imports {e.target}" for e in _graph()
            if e.source.split(".")[0] in PRODUCT and e.target.split(".")[0] == "verl_grpo_rehearsal"]
    assert into == []


def test_the_checks_find_a_cycle_and_an_upward_import_inside_a_function(tmp_path):
    """A low module importing a high one inside a function, and the high one importing it back: both reported."""
    (tmp_path / "verl_grpo").mkdir()
    (tmp_path / "verl_grpo" / "__init__.py").write_text("")
    (tmp_path / "verl_grpo" / "low.py").write_text("def f():\n    from verl_grpo import high\n    return high\n")
    (tmp_path / "verl_grpo" / "high.py").write_text("from verl_grpo.low import f\n")
    (tmp_path / "ARCHITECTURE.md").write_text("<!-- layers: tests/unit/test_layers.py -->\n```\ntop high\ncore low\n```\n")
    graph = list(edges(modules(tmp_path, ["verl_grpo"]), tmp_path))
    assert module_cycles(graph) == ["cycle: verl_grpo.high -> verl_grpo.low (verl_grpo/high.py:1); "
                                    "verl_grpo.low -> verl_grpo.high (verl_grpo/low.py:2)"]
    assert unit_cycles(graph) == ["units in a cycle: high, low"]
    assert upward_imports(graph, _drawing(tmp_path)) == [
        "verl_grpo/low.py:2: verl_grpo.low (core) imports verl_grpo.high (top, a higher layer)"]


def test_the_wheel_installs_every_package_and_no_generic_top_level_name():
    """pyproject.toml lists the packages (the app's folders installed under names of their own): every folder that
    holds one is listed, and each top-level name is this project's."""
    import tomllib

    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    folders = {name: REPO / PACKAGE_DIRS.get(name, name) for name in ("verl_grpo", "verl_grpo_rehearsal", *PACKAGE_DIRS)}
    found = {".".join([top, *init.parent.relative_to(folder).parts])
             for top, folder in folders.items() for init in folder.rglob("__init__.py")}
    assert sorted(listed) == sorted(found)
    assert {name.split(".")[0] for name in listed} == {"verl_grpo", "verl_grpo_rehearsal", "verl_grpo_cli",
                                                      "verl_grpo_flows", "verl_grpo_tasks"}


def test_every_domain_module_imports_without_prefect_or_the_layers_above():
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERY_DOMAIN_MODULE], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
