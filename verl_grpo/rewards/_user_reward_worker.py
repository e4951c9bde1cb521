"""One worker process of a user's reward function (see verl_grpo.rewards.user_reward): stdlib only.

`python _user_reward_worker.py PATH_OR_MODULE NAME` imports the function once, writes one hello frame (`ok` or the
import error), then answers frames: each request a pickled (data_source, solution_str, ground_truth, extra_info),
each answer a pickled ("ok", result) or ("error", "Type: message"). A frame is a 4-byte big-endian length and the
pickle. The parent kills the process when a call runs over its time limit and starts a new one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import struct
import sys
import traceback

_HEADER = struct.Struct(">I")


def load(target: str, name: str):
    """The function `name` of a `.py` file (its directory importable beside it) or of an importable module."""
    if target.endswith(".py"):
        folder = os.path.dirname(os.path.abspath(target))
        sys.path.insert(0, folder)
        module_name = "verl_grpo_user_reward_" + os.path.splitext(os.path.basename(target))[0]
        spec = importlib.util.spec_from_file_location(module_name, target)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {target} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    function = getattr(module, name, None)
    if function is None:
        defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise AttributeError(f"it defines no {name!r} (callables there: {', '.join(defined[:8]) or 'none'})")
    if not callable(function):
        raise TypeError(f"{name!r} is a {type(function).__name__}, not a function")
    return function


def write(stream, payload) -> None:
    blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(blob)) + blob)
    stream.flush()


def read(stream):
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(header)
    return pickle.loads(stream.read(size))


def describe(exc: BaseException) -> str:
    """`Type: message` and where in the user's code it was raised (its last frame)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f.filename != __file__ and not f.filename.startswith("<")]
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}{where}"


def main() -> int:
    target, name = sys.argv[1], sys.argv[2]
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # what the user's code prints must not corrupt the frames
    try:
        function = load(target, name)
    except BaseException as exc:  # noqa: BLE001 - any import failure is reported to the parent in one line
        write(stdout, ("error", describe(exc)))
        return 1
    write(stdout, ("ok", None))
    while (request := read(stdin)) is not None:
        data_source, solution_str, ground_truth, extra_info = request
        try:  # by keyword, as verl's reward managers call it
            answer = ("ok", function(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                                     extra_info=extra_info))
        except BaseException as exc:  # noqa: BLE001 - the user's function: every failure scores its row 0
            answer = ("error", describe(exc))
        try:
            write(stdout, answer)
        except Exception as exc:  # noqa: BLE001 - a result pickle cannot carry
            write(stdout, ("error", f"returned a {type(answer[1]).__name__} that cannot be sent back ({exc})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
