"""One execution-pool worker: a long-lived, stdlib-only process that runs untrusted MBPP programs.

Started by `sandbox.ExecutionPool` as `python -I <this file>` with a scrubbed environment; it reads one
JSON job per line on stdin and answers one JSON line on stdout.

Isolation ("namespaces" mode, when the worker may create namespaces, e.g. as root):
- the worker enters its own network namespace (no interface up: every connect fails) and its own
  mount namespace once, where /tmp, /var/tmp and /dev/shm are private tmpfs (wiped after every
  program) and home directories that hide the interpreter (e.g. /root, mode 0700) are replaced by an
  empty tmpfs with only the interpreter's directories bound back;
- each program runs in a process cloned into a new PID namespace (the "jail", PID 1 there: when it
  ends the kernel kills everything it forked, so fork bombs and orphans cannot outlive it), which sets
  rlimits, drops to uid nobody (cannot signal root processes, read their /proc files or write
  root-owned paths), scrubs the environment and sends stdout/stderr to /dev/null.
Without namespaces ("basic" mode) the jail is a plain fork in its own process group with the same
rlimits, uid and environment, socket constructors disabled, and a temp dir under the worker's home.

A test counts as passed only when the jail reports it over a pipe right after its assert line ran
without raising, so `sys.exit(0)`/`os._exit(0)` before the asserts scores 0; exit codes only
explain failures. This file must stay importable without the `verl_grpo` package.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import secrets
import select
import shutil
import signal
import sys
import tempfile
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(os.uname().machine)

NOBODY = 65534
RESULT_FD = 3
MAX_RESULT_BYTES = 64 * 1024
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm")
EOF_GRACE_S = 1.0
# Imported once in the worker, so programs get them without touching the stdlib files (faster, and
# available in basic mode even when uid nobody cannot read the interpreter's directory).
PREIMPORT = (
    "array", "bisect", "cmath", "collections", "copy", "datetime", "decimal", "fractions", "functools",
    "heapq", "itertools", "math", "operator", "random", "re", "socket", "statistics", "string", "typing",
    "unicodedata",
)

_libc = ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(
        source.encode(), target.encode(), fstype.encode() if fstype else None, flags, data.encode() if data else None
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _clone_into_new_pid_namespace() -> int:
    """fork(), but the child is PID 1 of a new PID namespace. -1 when not permitted.

    Python has no clone(); the raw syscall behaves like fork() in this single-threaded worker (no
    locks are held, the GIL was released by ctypes around the call and is simply re-taken).
    """
    if SYS_CLONE is None:
        return -1
    return _libc.syscall(SYS_CLONE, ctypes.c_ulong(CLONE_NEWPID | signal.SIGCHLD), None, None, None, None)


def hidden_interpreter_dirs() -> dict[str, list[str]]:
    """Interpreter directories other users cannot reach, keyed by the ancestor that blocks them.

    E.g. a pyenv Python under /root (mode 0700) gives {"/root": ["/root/.pyenv/versions/3.11.7"]}.
    """
    wanted = {os.path.realpath(p) for p in [sys.base_prefix, sys.prefix, *sys.path] if p and os.path.isdir(p)}
    plan: dict[str, list[str]] = {}
    for path in sorted(wanted):
        parts = path.split("/")
        for i in range(2, len(parts) + 1):
            ancestor = "/".join(parts[:i])
            if not os.stat(ancestor).st_mode & 0o001:
                subs = plan.setdefault(ancestor, [])
                if ancestor != path and not any(path == s or path.startswith(s + "/") for s in subs):
                    subs.append(path)
                break
    return plan


def enter_worker_namespaces() -> tuple[str, str]:
    """Once per worker: private network and mount namespace. Returns (isolation, network)."""
    network = "isolated" if _unshare(CLONE_NEWNET) else "shared"
    if not _unshare(CLONE_NEWNS):
        return "basic", network
    try:
        _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
        for ancestor, subs in hidden_interpreter_dirs().items():
            fds = [os.open(sub, os.O_RDONLY | os.O_DIRECTORY) for sub in subs]
            _mount("tmpfs", ancestor, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for sub, fd in zip(subs, fds):
                os.makedirs(sub, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", sub, None, MS_BIND | MS_REC, None)
                os.close(fd)
        for path in PRIVATE_TMPFS:
            if os.path.isdir(path):
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=256m,mode=1777")
    except OSError:
        return "basic", network
    pid = _clone_into_new_pid_namespace()
    if pid == 0:
        os._exit(0 if os.getpid() == 1 else 1)
    if pid < 0:
        return "basic", network
    _, status = os.waitpid(pid, 0)
    return ("namespaces" if os.waitstatus_to_exitcode(status) == 0 else "basic"), network


# ---------------------------------------------------------------------------------------------- jail


def _enter_jail(job: dict, workdir: str, isolation: str) -> None:
    """Runs in the jail, before the untrusted code."""
    os.setsid()  # own process group: `os.kill(0, 9)` from the program only hits the program
    os.chdir(workdir)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(RESULT_FD + 1, 65536)

    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir})

    limits = {
        resource.RLIMIT_CPU: int(float(job["timeout_s"])) + 1,
        resource.RLIMIT_AS: int(job["memory_bytes"]),
        resource.RLIMIT_FSIZE: int(job["fsize_bytes"]),
        resource.RLIMIT_NPROC: int(job["nproc"]),
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NOFILE: 256,
    }
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    if isolation != "namespaces":
        _block_sockets()
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def _block_sockets() -> None:
    """Without a network namespace: every socket constructor fails."""
    import _socket
    import socket

    def refuse(*_a: object, **_k: object) -> None:
        raise PermissionError("network access is disabled in the sandbox")

    for mod in (socket, _socket):
        for name in ("socket", "socketpair", "create_connection", "fromfd", "create_server"):
            if hasattr(mod, name):
                setattr(mod, name, refuse)


def _run_untrusted(job: dict, token: bytes) -> None:
    """Run solution + setup, then each assert line; report `token:i` after each assert that passed."""

    def report(line: bytes) -> None:
        try:
            os.write(RESULT_FD, line)
        except OSError:
            pass

    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    # Setup after the solution: MBPP's setup code builds fixtures from the solution's classes (task 367).
    source = f"{job['code']}\n{job['setup_code']}" if job["setup_code"] else job["code"]
    try:
        exec(compile(source, "<solution>", "exec"), namespace)
    except BaseException as e:  # SystemExit included: the asserts never ran
        report(token + b":E:" + type(e).__name__.encode()[:64] + b"\n")
        return
    for i, test in enumerate(job["tests"]):
        try:
            exec(compile(test, f"<test {i}>", "exec"), namespace)
        except BaseException:
            continue
        report(token + b":%d\n" % i)


def _jail_main(job: dict, workdir: str, isolation: str, result_w: int, token: bytes) -> None:
    try:
        if result_w != RESULT_FD:
            os.dup2(result_w, RESULT_FD)
        _enter_jail(job, workdir, isolation)
    except BaseException as e:
        os.write(RESULT_FD, token + b":S:" + f"{type(e).__name__}: {e}".encode()[:200] + b"\n")
        os._exit(3)
    _run_untrusted(job, token)
    os._exit(0)


# -------------------------------------------------------------------------------------------- worker


def run_job(job: dict, isolation: str, home: str) -> dict:
    """Run one program in a fresh jail; returns {passed, total, reason}."""
    total = len(job["tests"])
    token = secrets.token_hex(16).encode()
    scratch = "/tmp" if isolation == "namespaces" else home
    workdir = tempfile.mkdtemp(prefix="prog-", dir=scratch)
    if os.geteuid() == 0:
        os.chown(workdir, NOBODY, NOBODY)
    result_r, result_w = os.pipe()
    jail = _clone_into_new_pid_namespace() if isolation == "namespaces" else os.fork()
    if jail == 0:
        os.close(result_r)
        _jail_main(job, workdir, isolation, result_w, token)
    os.close(result_w)
    if jail < 0:
        os.close(result_r)
        return {"passed": 0, "total": total, "reason": f"could not start the jail: {os.strerror(ctypes.get_errno())}"}

    pidfd = os.pidfd_open(jail)
    ended, _, _ = select.select([pidfd], [], [], float(job["timeout_s"]))
    os.close(pidfd)
    timed_out = not ended
    _kill_group(jail)  # the jail's group: leftovers in basic mode, the whole timed-out program either way
    _, status = os.waitpid(jail, 0)
    results = _read_until_eof(result_r, time.monotonic() + EOF_GRACE_S, MAX_RESULT_BYTES)
    os.close(result_r)
    _clean_scratch(isolation, workdir)

    passed: set[int] = set()
    reason = ""
    for line in results.splitlines():
        head, _, rest = line.partition(b":")
        if head != token:
            continue
        if rest.startswith(b"E:"):
            reason = f"solution raised {rest[2:].decode(errors='replace')} before the tests ran"
        elif rest.startswith(b"S:"):
            reason = f"sandbox setup failed: {rest[2:].decode(errors='replace')}"
        elif rest.isdigit() and int(rest) < total:
            passed.add(int(rest))
    if not reason:
        reason = _end_reason(os.waitstatus_to_exitcode(status), timed_out, len(passed), total)
    return {"passed": len(passed), "total": total, "reason": reason}


def _end_reason(code: int, timed_out: bool, passed: int, total: int) -> str:
    if timed_out:
        return f"timeout after {passed}/{total} tests"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name} after {passed}/{total} tests"
    if code != 0:
        return f"program exited with code {code} after {passed}/{total} tests"
    return "ok" if passed == total else f"{total - passed} of {total} tests failed"


def _kill_group(pid: int) -> None:
    for target in (-pid, pid):
        try:
            os.kill(target, signal.SIGKILL)
        except OSError:
            pass


def _clean_scratch(isolation: str, workdir: str) -> None:
    """Remove what the program wrote: its workdir, and in namespaces mode all of the private tmpfs."""
    if isolation != "namespaces":
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for root in PRIVATE_TMPFS:
        try:
            entries = os.listdir(root)
        except OSError:
            continue
        for name in entries:
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _read_until_eof(fd: int, deadline: float, limit: int) -> bytes:
    """Read a pipe until every writer closed it or the deadline; keep at most `limit` bytes."""
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        data = os.read(fd, 65536)
        if not data:
            break
        if size < limit:
            chunks.append(data[: limit - size])
            size += len(chunks[-1])
    return b"".join(chunks)


def main() -> None:
    for name in PREIMPORT:
        __import__(name)
    home = os.getcwd()
    isolation, network = enter_worker_namespaces()
    out = sys.stdout.buffer
    out.write(json.dumps({"ready": True, "isolation": isolation, "network": network}).encode() + b"\n")
    out.flush()
    for line in sys.stdin.buffer:
        job = json.loads(line)
        try:
            result = run_job(job, isolation, home)
        except Exception as e:  # a worker-side failure scores the sample 0 and keeps the worker alive
            result = {"passed": 0, "total": len(job.get("tests", [])), "reason": f"worker error: {e!r}"}
        result["id"] = job.get("id")
        out.write(json.dumps(result).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
