"""The arguments of a `pip install` / `uv pip install` command line, read offline: which words are options, which are
their values and which are requirements or paths.

Shared by the SkyPilot provider's node-import check (`node_imports`) and the rehearsal's pip/uv
shims (`verl_grpo_rehearsal.shims`); standard library only, as the shims import it at every stood-in python start.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

VALUED_OPTIONS = frozenset((
    "-e", "--editable", "-r", "--requirement", "-c", "--constraint",
    "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--torch-backend",
    "--python", "-p", "--prefix", "--target", "-t", "--cache-dir", "--index-strategy", "--trusted-host",
    "--upgrade-package", "-P", "--extra", "--group", "--override"))
"""pip/uv install options whose value is the next word (that word is not a requirement)."""


def install_args(args: Iterable[str]) -> Iterator[tuple[str | None, str | None]]:
    """The install arguments (after `install`) in order, each as (option, value): (option, its value) for one of
    VALUED_OPTIONS (value None when the line ends there), (option, None) for any other word starting with `-`
    (`--no-deps`, `--index-url=URL`), and (None, word) for a requirement or a path."""
    it = iter(args)
    for arg in it:
        if arg in VALUED_OPTIONS:
            yield arg, next(it, None)
        elif arg.startswith("-"):
            yield arg, None
        else:
            yield None, arg
