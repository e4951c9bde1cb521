"""`python -m verl_grpo.trainers.verl.ray_head stop TEMP_DIR PORT`: before a job starts its Ray head, stop the one an
earlier job left on this node, with every process it started.

A Ray head outlives the job that started it (`ray start` daemonizes), and its raylet hands its own environment to
every worker it starts: on a cluster reused with `sky exec`, verl's workers would run with the earlier job's run id,
checkpoint dir, secrets and services token. `ray stop` is no way out: it stops every Ray on the machine, SkyPilot's
own (port 6380) included. Our head is started with `--temp-dir TEMP_DIR`, so its processes name
`TEMP_DIR/session_...` on their command lines; those, the Ray client server on PORT and every process they started
(the dashboard and runtime-env agents rename themselves and would outlive their raylet) are killed.
"""

from __future__ import annotations

import sys

import psutil

WAIT_S = 10.0


def our_ray(temp_dir: str, port: int) -> list[psutil.Process]:
    """The processes of the Ray head started with `--temp-dir temp_dir` on `port`, with all their descendants."""
    session, client = f"{temp_dir.rstrip('/')}/session_", f":{port}"
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        args = proc.info["cmdline"] or []
        if any(session in a for a in args) or ("ray.util.client.server" in args
                                                and any(a.startswith("--address=") and a.endswith(client)
                                                        for a in args)):
            roots.append(proc)
    found = {p.pid: p for p in roots}
    for proc in roots:
        try:
            found.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def stop(temp_dir: str, port: int) -> int:
    """Kill our Ray head's processes; returns how many there were."""
    procs = our_ray(temp_dir, port)
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=WAIT_S)
    return len(procs)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "stop" or not args[2].isdigit():
        print("usage: python -m verl_grpo.trainers.verl.ray_head stop TEMP_DIR PORT", file=sys.stderr)
        return 2
    stopped = stop(args[1], int(args[2]))
    if stopped:
        print(f"stopped the Ray head an earlier job left on this node ({stopped} processes, temp dir {args[1]}): "
              "this job's Ray gets this job's environment", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
