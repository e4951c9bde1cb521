"""Commands on a rehearsal node's PATH that stand in for what needs GPUs or the network: python, pip and uv (and
nvidia-smi, on the nodes of a task that asks for accelerators only: a CPU node has none).

Stood in: `python -m verl.trainer.main_ppo` and the rollout group's `python -m
verl_grpo.trainers.verl.fully_async_entry`
(exec'd as their CPU stand-in modules, in the node's environment), `pip install` / `uv pip install` (each
requirement is checked offline against this machine's installed packages, then linked with its dependencies into
the node's environment instead of downloaded, see `node_env`; GPU-only packages are reported and stood in) and
`uv venv` (a bare venv, its `python` these shims). Runs for real: every other python invocation, in the node's
environment (the activated venv, else the node's bare base one), never this machine's venv. Each stand-in prints
`rehearsal:` lines on stderr, so captured stdout (`$(python3 -c ...)`) stays clean.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import platform
import stat
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from verl_grpo.dependency_closure import resolve
from verl_grpo.pip_args import install_args
from verl_grpo_rehearsal import DEFAULT_DRIVER, DEFAULT_MAIN_PPO, ENV_DRIVER, ENV_MAIN_PPO, ENV_ON_NODE, node_env

VERL_MAIN_PPO = "verl.trainer.main_ppo"
FULLY_ASYNC_ENTRY = "verl_grpo.trainers.verl.fully_async_entry"
"""The rollout_group shape's trainer entry (verl's fully_async_main with the checkpoint seam)."""
FULLY_ASYNC_STANDIN = "verl_grpo_rehearsal.fully_async_cpu"
GPU_ONLY = frozenset(canonicalize_name(n) for n in (
    "vllm", "sglang", "sgl-kernel", "flash-attn", "flash_attn", "flashinfer", "flashinfer-python", "xformers"))
"""Packages that only build/run with CUDA: missing here is expected, the rehearsal stands in for them."""
GPU_STACK = frozenset(canonicalize_name(n) for n in ("torch", "torchvision", "torchaudio", "transformers"))
"""Packages whose version the GPU nodes' stack fixes (verl[vllm]==0.9.1 pins torch 2.11.0, CUDA 13, and transformers
5.9.0): a pin this CPU rehearsal cannot match runs with this machine's version and says so."""
GPU_EXTRAS = frozenset(("vllm", "sglang", "gpu", "flash-attn", "flashinfer"))
"""Extras (of e.g. verl) that pull GPU-only packages."""
STANDINS_FILE = Path("/tmp/.verl_grpo_rehearsal_standins")
"""On a rehearsal node (its own /tmp): the GPU-only packages setup installed, as stood in, one name a line. What
the node's code would find installed on a GPU node; the trainer stand-in reads it (e.g. flash-attn)."""
SHIM_NAMES = ("python", "python3", "pip", "uv")
GPU_SHIMS = "gpu"
"""Subdirectory of the shims dir with the GPU tools' stand-ins (`nvidia-smi`): on PATH only on a GPU task's nodes."""
NVIDIA_SMI_QUERY = ("--query-gpu=driver_version", "--format=csv,noheader")
"""The one nvidia-smi command line stood in (the arguments in any order): the driver version, one line per GPU."""
SHIMMED_TOOLS = frozenset(("uv",))
"""Tools setup installs to run them next; on a rehearsal node the shim of the same name stands in for them, so this
interpreter need not have them (a clean checkout's venv has no uv)."""


def write_shims(shims_dir: Path, real_python: str, package_root: Path) -> None:
    """Small executable scripts, one per stood-in command, that run `main` below with the real interpreter."""
    shims_dir.mkdir(parents=True, exist_ok=True)
    for name in SHIM_NAMES:
        path = shims_dir / name
        path.write_text(
            f"#!{real_python}\n"
            "import sys\n"
            f"sys.path.insert(0, {str(package_root)!r})\n"
            "from verl_grpo_rehearsal.shims import main\n"
            f"sys.exit(main({name!r}, sys.argv[1:], {real_python!r}))\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    gpu = shims_dir / GPU_SHIMS
    gpu.mkdir(exist_ok=True)
    smi = gpu / "nvidia-smi"
    smi.write_text(nvidia_smi_script())
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def nvidia_smi_script() -> str:
    """`nvidia-smi` of a rehearsal GPU node (bash: it runs in every setup's driver check): answers only
    NVIDIA_SMI_QUERY, with the rehearsed driver ($VERL_GRPO_REHEARSAL_DRIVER, else DEFAULT_DRIVER) once per GPU of the
    node ($SKYPILOT_NUM_GPUS_PER_NODE, at least 1); says on stderr that it stands in."""
    a, b = NVIDIA_SMI_QUERY
    return f"""#!/bin/bash
# rehearsal: stands in for nvidia-smi on a GPU node (verl_grpo_rehearsal/shims.py)
driver="${{{ENV_DRIVER}:-{DEFAULT_DRIVER}}}"
echo "rehearsal: nvidia-smi stands in (driver $driver)" >&2
if ! {{ [ $# = 2 ] && {{ [ "$1 $2" = "{a} {b}" ] || [ "$2 $1" = "{a} {b}" ]; }}; }}; then
  echo "rehearsal: nvidia-smi $*: not stood in (only nvidia-smi {a} {b})" >&2
  exit 2
fi
gpus="${{SKYPILOT_NUM_GPUS_PER_NODE:-1}}"
case "$gpus" in ''|*[!0-9]*|0) gpus=1 ;; esac
for ((i = 0; i < gpus; i++)); do echo "$driver"; done
"""


def main(command: str, args: list[str], real_python: str) -> int:
    """Entry of every shim; returns the exit code (or never returns: exec)."""
    if command in ("python", "python3"):
        return _python(args, _node_python(real_python))
    if command == "pip":
        return _pip(args)
    return _uv(args, real_python)


def _node_env() -> Path | None:
    """The environment this command acts in on a node: the venv whose `bin/python` it was run as, else the
    activated venv, else the node's base one. None off a node (the shims' own tests)."""
    if not os.environ.get(ENV_ON_NODE):
        return None
    invoked = Path(sys.argv[0])
    if invoked.parent.name == "bin" and node_env.is_env(invoked.parent.parent):
        return invoked.parent.parent
    return node_env.active_env(_shims_dir())


def _shims_dir() -> Path:
    return Path(sys.argv[0]).resolve().parent


def _node_python(real_python: str) -> str:
    env = _node_env()
    return real_python if env is None else str(env / "bin" / node_env.PYTHON_NAME)


def _say(line: str) -> None:
    print(f"rehearsal: {line}", file=sys.stderr, flush=True)


def _python(args: list[str], real_python: str) -> int:
    flags = []
    rest = list(args)
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c") and len(rest[0]) <= 3:
        flags.append(rest.pop(0))  # e.g. -u, -B before -m
    if rest[:2] == ["-m", VERL_MAIN_PPO]:
        module = os.environ.get(ENV_MAIN_PPO) or DEFAULT_MAIN_PPO
        _say(f"python -m {VERL_MAIN_PPO} runs as -m {module} (CPU stand-in for verl's GPU trainer)")
        os.execv(real_python, [real_python, *flags, "-m", module, *rest[2:]])
    if rest[:2] == ["-m", FULLY_ASYNC_ENTRY]:
        _say(f"python -m {FULLY_ASYNC_ENTRY} runs as -m {FULLY_ASYNC_STANDIN} (CPU stand-in for verl's fully-async "
             "GPU trainer)")
        os.execv(real_python, [real_python, *flags, "-m", FULLY_ASYNC_STANDIN, *rest[2:]])
    if rest[:2] == ["-m", "pip"]:
        return _pip(rest[2:])
    os.execv(real_python, [real_python, *args])
    return 0  # unreachable


def _pip(args: list[str]) -> int:
    if not args or args[0] != "install":
        _say(f"pip {' '.join(args[:1])} is not stood in (only `pip install`)")
        return 1
    return _install("pip install", args[1:])


def _uv(args: list[str], real_python: str) -> int:
    if args[:2] == ["pip", "install"]:
        return _install("uv pip install", args[2:])
    if args[:1] == ["venv"]:
        return _uv_venv(args[1:], real_python)
    _say(f"uv {' '.join(args[:2])} is not stood in (only `uv pip install` and `uv venv`)")
    return 2


def _install(command: str, args: list[str]) -> int:
    env = _node_env()
    if env is None:
        _say(f"{command} is checked offline against this machine's packages, nothing is installed")
        return check_install(args)
    _say(f"{command} is checked offline against this machine's packages and linked into {env}, nothing is "
         "downloaded")
    return check_install(args, env)


def _uv_venv(args: list[str], real_python: str) -> int:
    wanted, target = None, None
    it = iter(args)
    for arg in it:
        if arg in ("--python", "-p"):
            wanted = next(it, None)
        elif arg.startswith("--python="):
            wanted = arg.split("=", 1)[1]
        elif not arg.startswith("-"):
            target = arg
    if wanted and not python_satisfies(wanted):
        print(f"error: No interpreter found for Python {wanted} (rehearsal: no Python {wanted} here; "
              f"the real interpreter is {platform.python_version()})", file=sys.stderr)
        return 2
    venv = Path(target or ".venv").absolute()
    if node_env.is_env(venv):
        _say(f"uv venv {venv}: kept (it exists)")
        return 0
    node_env.create_env(venv, _shims_dir())
    _say(f"uv venv {venv}: a bare venv on {real_python}'s base interpreter; its python is the rehearsal's shim")
    return 0


def python_satisfies(wanted: str) -> bool:
    """Whether this interpreter answers uv's `--python X` (a version like 3.11, a specifier, or pythonX.Y)."""
    version = platform.python_version()
    text = wanted.strip()
    if text.startswith("python"):
        text = text[len("python"):]
    if text.startswith("/"):
        return os.path.realpath(text) == os.path.realpath(sys.executable)
    if text and text[0] in "<>=!~":
        return SpecifierSet(text).contains(version, prereleases=True)
    return version == text or version.startswith(text + ".")


def check_install(args: list[str], env: Path | None = None) -> int:
    """Check each requirement of a pip/uv install command line; 0 when all are satisfied or stood in. With `env`
    (a node's environment), then link what the line installs into it."""
    specs: list[str] = []
    projects: list[Path] = []
    no_deps = "--no-deps" in args
    for option, word in install_args(args):
        if option in ("-e", "--editable"):
            projects.append(Path("." if word is None else word))
        elif option in ("-r", "--requirement"):
            specs += _read_requirements(Path(word or ""))
        elif option is not None:
            continue
        elif word in (".", "..") or word.startswith(("./", "/", "../")):
            projects.append(Path(word))
        else:
            specs.append(word)
    failures: list[str] = []
    for project in projects:
        failures += _check_project(project, no_deps, specs)
    for spec in specs:
        failures += _check_requirement(spec)
    if failures:
        print(f"rehearsal: install check failed: {'; '.join(failures)}", file=sys.stderr, flush=True)
        return 1
    if env is not None:
        _link_requirements(env, specs)
        for project in projects:
            _link_project(env, project, no_deps)
    return 0


def _link_requirements(env: Path, specs: list[str]) -> None:
    requirements = []
    for spec in specs:
        req = _requirement(spec)
        if req is not None and canonicalize_name(req.name) not in SHIMMED_TOOLS \
                and (req.marker is None or req.marker.evaluate()):
            requirements.append(req)
    if not requirements:
        return
    plan = resolve(requirements, GPU_ONLY, GPU_EXTRAS)
    new = node_env.link(env, plan.dists.values())
    _say(f"linked {new} distribution(s) into {env} ({len(plan.dists)} with their dependencies)")
    if plan.stood_in:
        _say(f"not installed, stood in (GPU-only): {', '.join(sorted(plan.stood_in))}")
        _record_standins(n for n in plan.stood_in if "[" not in n)
    if plan.other_version:
        _say("this machine's version where the node's resolver picks another: " + ", ".join(
            f"{name} {have} (asked: {asked})" for name, (asked, have) in sorted(plan.other_version.items())))
    if plan.unavailable:
        _say(f"dependencies a node would install, not installed here, left out: {', '.join(sorted(plan.unavailable))}")


def _requirement(spec: str) -> Requirement | None:
    try:
        return Requirement(spec)
    except InvalidRequirement:
        return None


def _link_project(env: Path, project: Path, no_deps: bool) -> None:
    meta = tomllib.loads((project / "pyproject.toml").read_text()).get("project", {})
    name, version = meta.get("name", project.absolute().name), meta.get("version", "0")
    node_env.install_project(env, project.absolute(), name, version, meta.get("scripts", {}))
    _say(f"{project} installed editable into {env} as {name} {version}" + (" (--no-deps)" if no_deps else ""))


def _read_requirements(path: Path) -> list[str]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("-")]


def _check_project(project: Path, no_deps: bool, specs: list[str]) -> list[str]:
    pyproject = project / "pyproject.toml"
    if not pyproject.is_file():
        return [f"{project}: no pyproject.toml"]
    meta = tomllib.loads(pyproject.read_text()).get("project", {})
    requires_python = meta.get("requires-python")
    version = platform.python_version()
    if requires_python and not SpecifierSet(requires_python).contains(version, prereleases=True):
        name = meta.get("name", project)
        print(f"  × No solution found when resolving dependencies:\n  ╰─▶ Because the current Python version "
              f"({version}) does not satisfy Python{requires_python} and {name} depends on "
              f"Python{requires_python}, we can conclude that {name} cannot be used.", file=sys.stderr)
        return [f"{name} requires Python {requires_python}, the interpreter is {version}"]
    print(f"rehearsal: {project} (editable): requires-python {requires_python or 'any'} satisfied by {version}",
          file=sys.stderr)
    if not no_deps:
        specs += list(meta.get("dependencies", []))
    return []


def _stood_in(spec: str, name: str, why: str) -> list[str]:
    _say(f"{spec}: {why}, stood in: GPU-only")
    _record_standins([name])
    return []


def _record_standins(names: Iterable[str]) -> None:
    if os.environ.get(ENV_ON_NODE):
        with STANDINS_FILE.open("a") as f:
            f.writelines(name + "\n" for name in names)


def stood_in_packages() -> set[str]:
    """The GPU-only packages this rehearsal node's setup installed (canonical names)."""
    try:
        return set(STANDINS_FILE.read_text().split())
    except FileNotFoundError:
        return set()


def _check_requirement(spec: str) -> list[str]:
    try:
        req = Requirement(spec)
    except InvalidRequirement as e:
        return [f"{spec!r}: not a requirement ({e})"]
    if req.marker is not None and not req.marker.evaluate():
        _say(f"{spec}: not for this platform (marker), skipped")
        return []
    name = canonicalize_name(req.name)
    if name in SHIMMED_TOOLS:
        _say(f"{spec}: stood in by the rehearsal's {name} shim")
        return []
    gpu_only = name in GPU_ONLY
    try:
        installed = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        if gpu_only:
            return _stood_in(spec, name, "missing")
        _say(f"{spec}: missing")
        return [f"{spec} is not installed"]
    if req.specifier and not req.specifier.contains(installed, prereleases=True):
        if gpu_only:
            return _stood_in(spec, name, f"{installed} installed")
        if name in GPU_STACK:
            _say(f"{spec}: the GPU nodes' version; this CPU rehearsal runs {installed}, the version installed here")
            return []
        _say(f"{spec}: version mismatch, {installed} installed")
        return [f"{spec} does not match the installed {req.name} {installed}"]
    failures = [f for extra in sorted(req.extras) for f in _check_extra(req.name, extra)]
    if not failures:
        _say(f"{spec}: satisfied ({installed})")
    return failures


def _check_extra(dist: str, extra: str) -> list[str]:
    """The requirements an installed package's extra adds; GPU extras are stood in without looking further."""
    if extra in GPU_EXTRAS:
        _say(f"{dist}[{extra}]: stood in: GPU-only")
        return []
    failures: list[str] = []
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}) and not req.marker.evaluate({"extra": ""}):
            req.marker = None
            failures += _check_requirement(str(req))
    return failures
