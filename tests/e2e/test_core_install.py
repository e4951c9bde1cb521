"""The core install alone (pyproject.toml's dependencies, no extra) runs the local flow to a registered model, and a
setting that needs an extra fails there in one line naming it.

The venv is built the way `make install` builds one, less the extras: torch first from the machine's find-links (the
CPU build), then this checkout, editable, with requirements.lock as constraints, by uv from its cache (hardlinks:
seconds), asking the registry only for what the cache lacks.
"""

from __future__ import annotations

import ast
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from user_env import user_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"
EXTRA_MODULES = ("sky", "verl", "faiss", "bm25s", "prefect_ray")
"""One top-level module of each optional package the core must not bring: SkyPilot, verl, the retrieval stack, the
Ray task runner."""
UV_ENV = {**os.environ, "HOME": pwd.getpwuid(os.getuid()).pw_dir}
"""uv with the user's own HOME (the suite's is a temporary one, tests/conftest.py): its cache, where the locked
packages already are."""


def pip_find_links() -> list[str]:
    """The find-links pip reads here (its config files and PIP_FIND_LINKS), where the Makefile's `pip install torch`
    finds the CPU build: uv reads no pip config, and an index would give it the CUDA one."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            timeout=60, check=True).stdout
    links = [link for line in listed.splitlines() if line.partition("=")[0].endswith(".find-links")
             for link in ast.literal_eval(line.partition("=")[2]).split()]
    return list(dict.fromkeys(links))


def uv_install(python: Path, *args: str) -> None:
    """`uv pip install` under requirements.lock, from the cache alone when it holds everything, else the registry."""
    command = [str(UV), "pip", "install", "-q", "--python", str(python), "-c", str(REPO / "requirements.lock"), *args]
    done = subprocess.run([*command, "--offline"], env=UV_ENV, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        done = subprocess.run(command, env=UV_ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory) -> Path:
    """A venv holding the core install of this checkout, editable."""
    venv = tmp_path_factory.mktemp("core-install") / "venv"
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], env=UV_ENV, check=True, timeout=120)
    python = venv / "bin" / "python"
    uv_install(python, *(f"--find-links={link}" for link in pip_find_links()), "torch==2.13.0")
    uv_install(python, "-e", str(REPO))
    return venv


def core_env(tmp_path: Path, **values: str) -> dict[str, str]:
    """A user's environment with a new HOME and state dir; no PYTHONPATH, so only the core venv is importable."""
    env = user_env(HOME=str(tmp_path / "home"), VERL_GRPO_HOME=str(tmp_path / "state"), PYTHONUNBUFFERED="1", **values)
    env.pop("PYTHONPATH", None)
    return env


def test_the_core_install_has_no_extra_and_names_the_one_a_setting_needs(core_venv, tmp_path):
    probe = ("import importlib\nfor name in %r:\n    try:\n        importlib.import_module(name)\n"
             "    except ModuleNotFoundError:\n        print(name)\n") % (EXTRA_MODULES,)
    done = subprocess.run([str(core_venv / "bin" / "python"), "-c", probe], cwd=tmp_path, env=core_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tuple(done.stdout.split()) == EXTRA_MODULES

    done = subprocess.run([str(core_venv / "bin" / "verl-grpo"), "run", "-c", "gsm8k", "-c", "local",
                           "-o", "model.name=tiny", "-o", "infra.provider=skypilot"], cwd=tmp_path,
                          env=core_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == ("error (ConfigError): infra.provider=skypilot needs the cloud extra: "
                                   "pip install 'verl-grpo[cloud]'")


def test_the_core_install_runs_gsm8k_to_a_registered_model(core_venv, tmp_path, tiny_model_dir, data_mirror, tiny_run):
    env = core_env(tmp_path, VERL_GRPO_DATA_MIRROR=str(data_mirror), VERL_GRPO_MODEL_CACHE=str(tiny_model_dir.parent))
    args = [str(core_venv / "bin" / "verl-grpo"), "run", "-c", "gsm8k", "-c", "local",
            *(a for override in tiny_run for a in ("-o", override))]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert "registered model  verl-grpo-gsm8k-tiny v1" in done.stdout, done.stdout[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'state' / 'mlflow.db'}")
    assert int(client.get_model_version_by_alias("verl-grpo-gsm8k-tiny", "champion").version) == 1
