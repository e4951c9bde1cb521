"""`python -m verl_grpo.trainers.verl.preflight PACKAGE...`: the last line of a training task's setup.

Finds each top-level package the node's run imports (the static closure of `node_imports.needed_imports`, plus the
trainer's own package), without importing any. A package setup did not install fails here, in setup, and SkyPilot
ends a failed setup as FAILED_SETUP without a restart; in `run` the same ImportError would be restarted
max_restarts_on_errors times, each paying provisioning, setup, the model download and vLLM's start. Preemptions still
recover: they are no exit code. One line per missing package on stderr, exit 1; exit 0 when all are there.
"""

from __future__ import annotations

import importlib.util
import sys


def missing(packages: list[str]) -> list[str]:
    """The packages no finder on this node knows."""
    return [p for p in packages if importlib.util.find_spec(p) is None]


def main(argv: list[str] | None = None) -> int:
    packages = list(sys.argv[1:] if argv is None else argv)
    absent = missing(packages)
    for name in absent:
        print(f"preflight: No module named {name!r} on this node: its run imports it", file=sys.stderr, flush=True)
    if absent:
        print("preflight: this node's setup does not install what its run imports; failing setup (not retried)",
              file=sys.stderr, flush=True)
        return 1
    print(f"preflight: {len(packages)} packages the run imports are installed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
