"""The layering the code relies on: the domain package never reaches up into Prefect, the flows, tasks or CLI."""

from __future__ import annotations

import subprocess
import sys

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
upper = sorted(m for m in sys.modules if m.split(".")[0] in {"prefect", "flows", "tasks", "cli"})
assert not upper, f"importing verl_grpo loaded {upper}"
"""


def test_every_domain_module_imports_without_prefect_or_the_layers_above():
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERY_DOMAIN_MODULE], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
