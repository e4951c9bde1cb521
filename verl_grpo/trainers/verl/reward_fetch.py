"""`python -m verl_grpo.trainers.verl.reward_fetch URI DIR`: a node's copy of the run's shipped reward file.

Run by every node that scores before it starts (the trainer nodes, a job group's reward-server, the vLLM eval task;
see node_reward): the store folder `URI` (`.../rewards/<digest>`) is copied into `DIR` with the task's secrets
(VERL_GRPO_STORE_ENDPOINT names a non-AWS endpoint), and each file's sha256 must start with the folder's digest, so a
torn or altered copy is fetched again rather than imported. A folder already holding a whole copy is kept (a
recovery on the same node). Exit codes as the other cluster entries: 2 the user fixes it, 75 retryable.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from verl_grpo.errors import DataError, InfraError
from verl_grpo.store import filesystem_for, strip_scheme
from verl_grpo.trainers.exits import run_entry

ENDPOINT_ENV = "VERL_GRPO_STORE_ENDPOINT"
"""The store's S3 endpoint (settings.ENV_STORE_ENDPOINT; named again so this entry imports nothing heavy)."""


def whole(folder: Path, digest: str) -> list[Path]:
    """The files of folder whose content matches the digest (every file does in a whole copy)."""
    files = [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
    return files if files and all(hashlib.sha256(p.read_bytes()).hexdigest().startswith(digest)
                                  for p in files) else []


def fetch(uri: str, local_dir: Path, endpoint_url: str | None = None) -> list[Path]:
    """Copy the store folder `uri` into local_dir unless a whole copy is there; returns its files."""
    local_dir = Path(local_dir)
    digest = uri.rstrip("/").rsplit("/", 1)[-1]
    if files := whole(local_dir, digest):
        return files
    fs = filesystem_for(uri, endpoint_url)
    remote = strip_scheme(uri).rstrip("/")
    try:
        names = [p for p in fs.ls(remote, detail=False) if not fs.isdir(p)]
    except FileNotFoundError:
        names = []
    except Exception as e:  # noqa: BLE001 - s3fs raises botocore errors that are not OSError
        raise InfraError(f"reward file {uri}: cannot list it in the store ({type(e).__name__}: {e}); retry") from e
    if not names:
        raise DataError(f"reward file {uri} is not in the store; launch the run again through verl-grpo, which "
                        "uploads reward.path")
    local_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = local_dir / name.rsplit("/", 1)[-1]
        tmp = target.with_name(f".{target.name}.part")
        fs.get(name, str(tmp))
        os.replace(tmp, target)
    files = whole(local_dir, digest)
    if not files:
        raise DataError(f"reward file {uri}: the copy in {local_dir} does not match its digest {digest}; the store's "
                        "copy was altered, launch the run again")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_grpo.trainers.verl.reward_fetch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("uri", help="store URI of the shipped reward folder (…/rewards/<digest>)")
    parser.add_argument("dir", help="where this node's scorers read it")
    args = parser.parse_args(argv)

    def body() -> None:
        files = fetch(args.uri, Path(args.dir), os.environ.get(ENDPOINT_ENV) or None)
        print(f"reward file {', '.join(p.name for p in files)} fetched from {args.uri} into {args.dir}", flush=True)

    return run_entry("reward_fetch", body)


if __name__ == "__main__":
    sys.exit(main())
