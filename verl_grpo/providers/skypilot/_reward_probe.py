"""Import the user's reward function with only the nodes' packages importable, and score one row: stdlib only.

`python _reward_probe.py REQUEST.json` reads {"allowed": [top-level import names], "path", "name", "worker": the
path of rewards/_user_reward_worker.py, "row": [data_source, solution_str, ground_truth, extra_info]} and prints one
JSON object: {"result": ...} or {"error": "Type: message (at file:line)", "missing": the refused module the failure
is about (or null), "refused": [names]}. The import system finds no top-level module outside `allowed`, the stdlib
and what the interpreter had loaded before the user's code ran, as on a node without that package (`find_spec` is
None, `import` raises ModuleNotFoundError); `refused` lists what was asked for.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig


class NodePackages:
    """sys.meta_path's finders behind one that finds no top-level module the nodes do not have: for those,
    `importlib.util.find_spec` gives None and `import` raises ModuleNotFoundError, as on such a node."""

    def __init__(self, allowed: set[str], finders: list):
        self.allowed = (allowed | set(sys.stdlib_module_names) | set(sys.builtin_module_names)
                        | {m.partition(".")[0] for m in sys.modules})
        self.finders = finders
        self.refused: list[str] = []
        self.stdlib_dirs = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep
                                  for k in ("stdlib", "platstdlib")})

    def in_stdlib(self, name: str) -> bool:
        """A module of the interpreter's own library that stdlib_module_names does not list (_sysconfigdata_*)."""
        spec = importlib.machinery.PathFinder.find_spec(name)
        origin = os.path.realpath(spec.origin) if spec is not None and spec.origin else ""
        return origin.startswith(self.stdlib_dirs) and "site-packages" not in origin

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in self.allowed and not (name == top and self.in_stdlib(name)):
            if top not in self.refused:
                self.refused.append(top)
            return None
        for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                return spec
        return None

    def invalidate_caches(self) -> None:
        for finder in self.finders:
            if hasattr(finder, "invalidate_caches"):
                finder.invalidate_caches()

    def install(self) -> None:
        sys.meta_path[:] = [self]


def plain(value):
    """A JSON value of the function's result (numpy scalars as numbers, anything else as text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item"):
        try:
            return plain(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def main() -> int:
    with open(sys.argv[1]) as f:
        request = json.load(f)
    spec = importlib.util.spec_from_file_location("verl_grpo_reward_worker", request["worker"])
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    guard = NodePackages(set(request["allowed"]), list(sys.meta_path))
    guard.install()
    stdout, sys.stdout = sys.stdout, sys.stderr  # what the user's code prints is not the answer
    data_source, solution_str, ground_truth, extra_info = request["row"]
    try:
        function = worker.load(request["path"], request["name"])
        answer = {"result": plain(function(data_source=data_source, solution_str=solution_str,
                                           ground_truth=ground_truth, extra_info=extra_info))}
    except BaseException as exc:  # noqa: BLE001 - the user's code: any failure is reported in one line
        missing = exc.name if isinstance(exc, ImportError) and exc.name in guard.refused else None
        answer = {"error": worker.describe(exc), "missing": missing, "refused": guard.refused}
    stdout.write(json.dumps(answer) + "\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
