"""A rehearsal node's Python environments, holding only what the node's setup installs.

A real node starts with a bare interpreter and gets packages from its setup's `pip install` / `uv pip install`
lines (and their dependencies) in the venv `uv venv` made. A rehearsal node does the same, with one difference:
nothing is downloaded. Each installed distribution (with its dependencies, per its metadata) is linked from this
machine's venv into the node's venv, entry by entry, so the node can import exactly what its setup brought and
nothing else from our venv. A package the node imports without installing it fails there with Python's own
`ModuleNotFoundError`, as on the cloud.

Stood in (each said in one `rehearsal:` line): GPU-only packages are not linked, their CPU-capable requirements
are (vLLM's from `KNOWN_REQUIRES`); a dependency not installed here is left out; where the node's resolver would
pick another version (a CUDA build of torch, the transformers that verl's GPU extras pin) this machine's
version is linked.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from packaging.utils import canonicalize_name

from verl_grpo.dependency_closure import installed

ENV_BASE_ENV = "VERL_GRPO_REHEARSAL_BASE_ENV"
"""On a node: the environment of its bare `python`/`pip` before any `uv venv` is activated (made when first used)."""
LINKED_MARKER = ".rehearsal-linked-"
"""A file per distribution linked into an env's site-packages (named after it)."""
PYTHON_NAME = f"python{sys.version_info.major}.{sys.version_info.minor}"
"""The real interpreter inside each node venv (`python` and `python3` there are the rehearsal's shims)."""


def create_env(path: Path, shims: Path) -> None:
    """A bare venv at `path` on this machine's base interpreter (no site packages), whose `python` and `python3`
    are the rehearsal's shims (so `python -m verl.trainer.main_ppo` is stood in wherever it is run from)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True)
    for name in ("python", "python3"):
        link = path / "bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(shims / name)


def site_packages(env: Path) -> Path:
    return env / "lib" / PYTHON_NAME / "site-packages"


def is_env(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file() and (path / "bin" / PYTHON_NAME).exists()


def link(env: Path, dists: Iterable[metadata.Distribution]) -> int:
    """Link each distribution's files into the env's site-packages and write its console scripts; returns how many
    were new. A directory other distributions of this machine share (a namespace package) is made, not linked,
    and only the wanted distributions' entries are linked inside it."""
    target = site_packages(env)
    dists = list(dists)
    wanted = {canonicalize_name(d.metadata["Name"]) for d in dists} | {
        m.name.removeprefix(LINKED_MARKER) for m in target.glob(f"{LINKED_MARKER}*")}
    new = 0
    for dist in dists:
        name = canonicalize_name(dist.metadata["Name"])
        marker = target / f"{LINKED_MARKER}{name}"
        if marker.exists():
            continue
        for entry in _entries(name):
            _link_entry(Path(dist.locate_file("")), target, entry, wanted)
        _write_scripts(env, dist)
        marker.touch()
        new += 1
    return new


def install_project(env: Path, project: Path, name: str, version: str, scripts: dict[str, str]) -> None:
    """An editable install of a local project: a .pth naming its directory, its dist-info and console scripts."""
    target = site_packages(env)
    canonical = canonicalize_name(name).replace("-", "_")
    (target / f"__editable__.{canonical}.pth").write_text(f"{project.absolute()}\n")
    info = target / f"{canonical}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("verl-grpo-rehearsal\n")
    for script, target_ref in scripts.items():
        _write_script(env, script, target_ref)


@cache
def _entries(name: str) -> frozenset[tuple[str, ...]]:
    """The distribution's installed paths relative to its site-packages, cut to their first two parts (what linking
    needs; none outside site-packages, no caches). Read from RECORD as text: thousands of lines per package."""
    record = installed()[name].read_text("RECORD") or ""
    out = set()
    for line in record.splitlines():
        path = line.rsplit(",", 2)[0].strip('"')
        parts = tuple(path.split("/")[:3])
        if parts and parts[0] not in ("..", "") and "__pycache__" not in parts:
            out.add(parts[:2] if len(parts) > 2 else parts)
    return frozenset(out)


@cache
def _owners() -> dict[tuple[str, ...], frozenset[str]]:
    """Every installed directory prefix (one and two levels deep) -> the distributions with files under it."""
    owners: dict[tuple[str, ...], set[str]] = {}
    for name in installed():
        for parts in _entries(name):
            for depth in (1, 2):
                if len(parts) > depth or (depth == 1 and len(parts) == 2):
                    owners.setdefault(parts[:depth], set()).add(name)
    return {k: frozenset(v) for k, v in owners.items()}


def _link_entry(source_root: Path, target: Path, entry: tuple[str, ...], wanted: set[str]) -> None:
    """Link the top of `entry` unless another (unwanted) distribution shares it; then go one level deeper."""
    for depth in range(1, len(entry) + 1):
        prefix = entry[:depth]
        owners = _owners().get(prefix)
        if owners is not None and not owners <= wanted and depth < len(entry):
            (target.joinpath(*prefix)).mkdir(parents=True, exist_ok=True)
            continue
        destination = target.joinpath(*prefix)
        if not destination.exists() and not destination.is_symlink():
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.symlink_to(source_root.joinpath(*prefix))
        return


def _write_scripts(env: Path, dist: metadata.Distribution) -> None:
    for ep in dist.entry_points:
        if ep.group in ("console_scripts", "gui_scripts"):
            _write_script(env, ep.name, ep.value)


def _write_script(env: Path, name: str, ref: str) -> None:
    """A console script as pip writes one: `module:attr` called with the env's interpreter."""
    module, _, attr = ref.partition(":")
    attr = attr.split("[")[0].strip()
    path = env / "bin" / name
    path.write_text(
        f"#!{env / 'bin' / PYTHON_NAME}\n"
        "import sys\n"
        f"from {module.strip()} import {attr.split('.')[0]} as _entry\n"
        + "".join(f"_entry = _entry.{part}\n" for part in attr.split(".")[1:])
        + "if __name__ == '__main__':\n"
        "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
        "    sys.exit(_entry())\n")
    path.chmod(0o755)


def active_env(shims: Path) -> Path:
    """The environment a bare `python` or `pip` on the node means: the activated venv, else the node's base one."""
    venv = os.environ.get("VIRTUAL_ENV")
    if venv and is_env(Path(venv)):
        return Path(venv)
    base = Path(os.environ[ENV_BASE_ENV])
    if not is_env(base):
        create_env(base, shims)
    return base
