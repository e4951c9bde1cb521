"""A rehearsal node's Python environment (`verl_grpo_rehearsal.node_env`): a bare venv that imports exactly what its
setup's install lines brought, linked from this machine's venv."""

from __future__ import annotations

import subprocess
import sys

from packaging.requirements import Requirement

from verl_grpo.dependency_closure import resolve
from verl_grpo_rehearsal import node_env
from verl_grpo_rehearsal.shims import GPU_EXTRAS, GPU_ONLY, write_shims
from verl_grpo_rehearsal.sky_boundary import PACKAGE_ROOT


def _env(tmp_path):
    shims = tmp_path / "shims"
    write_shims(shims, sys.executable, PACKAGE_ROOT)
    env = tmp_path / "env"
    node_env.create_env(env, shims)
    return env


def _imports(env, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(env / "bin" / node_env.PYTHON_NAME), "-c", code], capture_output=True, text=True)


def test_a_node_env_imports_what_was_linked_and_nothing_else(tmp_path):
    env = _env(tmp_path)
    assert "No module named 'tenacity'" in _imports(env, "import tenacity").stderr  # bare: not our venv
    plan = resolve([Requirement("tenacity"), Requirement("protobuf"), Requirement("tqdm")],
                            GPU_ONLY, GPU_EXTRAS)
    assert set(plan.dists) == {"tenacity", "protobuf", "tqdm"} and not plan.unavailable
    assert node_env.link(env, plan.dists.values()) == 3
    assert node_env.link(env, plan.dists.values()) == 0  # idempotent

    ok = _imports(env, "import tenacity, tqdm, google.protobuf; print('ok')")
    assert ok.stdout.strip() == "ok", ok.stderr
    # google/ is shared by several distributions here: only protobuf's part of it is linked
    assert "No module named 'google.api'" in _imports(env, "import google.api").stderr
    assert "No module named 'yaml'" in _imports(env, "import yaml").stderr
    script = subprocess.run([str(env / "bin" / "tqdm"), "--version"], capture_output=True, text=True)
    assert script.returncode == 0 and script.stdout.strip()[0].isdigit()
    # `python` in the env is the rehearsal's shim, so `python -m verl.trainer.main_ppo` there is still stood in
    assert (env / "bin" / "python").resolve() == (tmp_path / "shims" / "python").resolve()


def test_verl_with_its_gpu_extra_resolves_to_what_a_node_gets_with_each_substitution_named():
    plan = resolve([Requirement("verl[vllm]==0.9.1")], GPU_ONLY, GPU_EXTRAS)
    assert {"verl", "torch", "transformers", "ray", "tensordict"} <= set(plan.dists)
    assert {"vllm", "verl[vllm]"} <= plan.stood_in
    assert plan.other_version["torch"][0] == "torch==2.11.0"  # the CUDA build verl[vllm] pins; this machine's CPU one
    assert "transferqueue" in plan.unavailable  # a dependency the node installs that this machine lacks
    assert "mlflow" not in plan.dists  # so verl's mlflow logger fails on a node whose setup installs only verl
