"""The distributions a set of requirements brings, read offline from this machine's package metadata.

Used where we reason about what a node's setup installs without downloading anything: the dry run's import check
(`node_imports`: which import names a setup's requirements provide) and the rehearsal's node
environments (`verl_grpo_rehearsal.node_env`: which distributions to link into a node's venv). A package that cannot be
installed here (GPU-only, e.g. vLLM) contributes its known requirements (`KNOWN_REQUIRES`); any other one not
installed here counts as itself only.
"""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

KNOWN_REQUIRES = {
    "vllm": ("torch", "transformers", "tokenizers", "huggingface-hub", "tqdm", "numpy", "pydantic", "requests"),
}
"""Requirements of GPU-only packages that cannot be installed here to read their metadata (vLLM's own
requirements/common.txt and requirements/cuda.txt, which pins its torch)."""


@dataclass
class Resolution:
    """What installing a set of requirements brings."""

    dists: dict[str, metadata.Distribution] = field(default_factory=dict)
    """Distributions installed here, by canonical name."""
    stood_in: set[str] = field(default_factory=set)
    """GPU-only packages (and `name[extra]` for GPU extras) a real node installs and this machine cannot."""
    unavailable: set[str] = field(default_factory=set)
    """Dependencies a real node installs that are not installed on this machine."""
    other_version: dict[str, tuple[str, str]] = field(default_factory=dict)
    """name -> (what a dependency asks for, this machine's version) where the node would get another version."""

    def names(self) -> set[str]:
        """Every distribution name a node ends up with (installed here or not)."""
        return set(self.dists) | {n for n in self.stood_in if "[" not in n} | self.unavailable


@cache
def installed() -> dict[str, metadata.Distribution]:
    """This machine's distributions (the running interpreter's), by canonical name."""
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        found.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
    return found


def resolve(requirements: Iterable[Requirement], gpu_only: Iterable[str] = KNOWN_REQUIRES,
            gpu_extras: Iterable[str] = ()) -> Resolution:
    """The distributions installing `requirements` brings (transitively, markers with extras evaluated)."""
    gpu_only, gpu_extras = frozenset(gpu_only), frozenset(gpu_extras)
    out = Resolution()
    done: dict[str, set[str]] = {}
    todo = list(requirements)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in gpu_only:
            out.stood_in.add(name)
            todo += [Requirement(r) for r in KNOWN_REQUIRES.get(name, ())]
            continue
        dist = installed().get(name)
        if dist is None:
            out.unavailable.add(name)
            continue
        if req.specifier and not req.specifier.contains(dist.version, prereleases=True):
            out.other_version.setdefault(name, (str(req), dist.version))
        wanted = ({""} | set(req.extras)) - done.setdefault(name, set())
        if not wanted:
            continue
        done[name] |= wanted
        out.dists[name] = dist
        out.stood_in |= {f"{name}[{e}]" for e in wanted & gpu_extras}
        for line in dist.requires or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in wanted):
                dep.marker = None
                todo.append(dep)
    return out
