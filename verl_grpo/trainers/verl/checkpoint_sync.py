"""`python -m verl_grpo.trainers.verl.checkpoint_sync`: on every node of a multi-node verl run, upload what verl
writes into trainer.default_local_dir to the store (`runs/<run_id>/checkpoints`), with the task's own credentials.

Why not a SkyPilot bucket mount (MOUNT_CACHED): SkyPilot authenticates a mount with the cloud credentials it uploads
(an IAM role on AWS, elsewhere only ~/.aws/credentials; sky/clouds/aws.py get_credential_file_mounts), never with the
task's secrets, so with keys from the environment (as the launch passes them) a mount off AWS has none and
provisioning fails. This process runs in the task, where the secrets are.

It behaves like a write-back cache: a file is uploaded once it has been left unchanged for WRITE_BACK_S (verl writes
each shard once and closes it); files are never deleted from the store (the commit protocol prunes committed steps,
`storage.keep_last`). The head's commit waits until the store holds every node's shards (`commit.await_uploaded`)
before it writes the manifest, so a preempted node's unfinished uploads leave its step uncommitted, never torn.
On the head it runs in the background of the task's run (its output in `checkpoint-sync.log` beside the metrics):
the run itself lasts until finalize. A worker node's run would end once it joined Ray, and SkyPilot kills what a
node's run leaves behind when it exits (sky/skylet/subprocess_daemon.py), so there it runs in the foreground with
`--until-finished`: it ends, after a last upload, once the head has written the run's train_result.json (finalize
writes it after committing the final step, which waited for every node's uploads). There it also deletes uploaded
steps older than the latest committed one, which verl deletes only on the head. SIGTERM uploads what is pending
first. One process per checkpoint dir (a pid file).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from verl_grpo.checkpoints import CheckpointStore
from verl_grpo.store_layout import STEP_PREFIX, checkpoints_dir, train_result
from verl_grpo.trainers.verl.settings import StoreSettings

WRITE_BACK_S = 2.0
"""How long a file must be left unchanged before it is uploaded."""
SCAN_S = 1.0
PRUNE_S = 30.0
"""How often a worker node's sync asks the store for its latest committed step, to delete older local steps."""
UPLOAD_THREADS = 4
PID_FILE = "checkpoint-sync.pid"


class CheckpointSync:
    """Uploads the step dirs under `settings.checkpoint_dir` to the store as their files settle."""

    def __init__(self, settings: StoreSettings):
        self.settings = settings
        self.store = settings.store()
        self.base = checkpoints_dir(settings.run_id)
        self.synced: dict[str, tuple[int, int]] = {}
        """rel path -> (size, mtime_ns) of the local file when it was last uploaded (or found in the store)."""
        self.seen: dict[str, tuple[int, int, float]] = {}
        """rel path -> (size, mtime_ns, first time seen so) while a file settles."""

    def start(self) -> None:
        """Files already in the store at the same size (a restored step) count as uploaded."""
        stored = self._stored_sizes()
        for rel, stat in self._local().items():
            if stored.get(rel) == stat[0]:
                self.synced[rel] = stat

    def scan(self, now: float, flush: bool = False) -> list[str]:
        """Upload every settled (or, with flush, every) file that differs from its uploaded copy; returns them."""
        due = []
        for rel, stat in self._local().items():
            if self.synced.get(rel) == stat:
                continue
            size, mtime, since = self.seen.get(rel, (*stat, now))
            if (size, mtime) != stat:
                since = now
            self.seen[rel] = (*stat, since)
            if flush or now - since >= WRITE_BACK_S:
                due.append((rel, stat))
        if due:  # most scans find nothing to upload: no pool for them
            with ThreadPoolExecutor(max_workers=UPLOAD_THREADS, thread_name_prefix="ckpt-sync") as pool:
                list(pool.map(self._upload, due))
        return [rel for rel, _ in due]

    def prune_committed(self, committed_step: int) -> list[str]:
        """Delete this node's step dirs older than the store's latest committed step once every file of theirs is
        uploaded; returns their names. verl deletes old checkpoints only on global rank 0 (its checkpoint manager's
        ensure_checkpoint_capacity), so without this a worker node keeps every step's shards until its disk fills;
        a relaunch restores from the store, never from these."""
        local = self._local()
        removed = []
        for step_dir in sorted(self.settings.checkpoint_dir.glob(f"{STEP_PREFIX}*")):
            step = step_dir.name[len(STEP_PREFIX):]
            if not step.isdigit() or int(step) >= committed_step:
                continue
            files = {rel: stat for rel, stat in local.items() if rel.startswith(f"{step_dir.name}/")}
            if all(self.synced.get(rel) == stat for rel, stat in files.items()):
                shutil.rmtree(step_dir, ignore_errors=True)
                for rel in files:
                    self.synced.pop(rel, None)
                removed.append(step_dir.name)
        return removed

    def _upload(self, item: tuple[str, tuple[int, int]]) -> None:
        rel, stat = item
        self.store.put_file(self.settings.checkpoint_dir / rel, self.base, rel)
        self.synced[rel] = stat
        self.seen.pop(rel, None)

    def _local(self) -> dict[str, tuple[int, int]]:
        out = {}
        for step_dir in self.settings.checkpoint_dir.glob(f"{STEP_PREFIX}*"):
            for path in step_dir.rglob("*"):
                try:
                    stat = path.stat()
                except FileNotFoundError:  # verl deleted an old step dir while we listed it
                    continue
                if path.is_file():
                    out[path.relative_to(self.settings.checkpoint_dir).as_posix()] = (stat.st_size, stat.st_mtime_ns)
        return out

    def _stored_sizes(self) -> dict[str, int]:
        root = self.store.path(self.base)
        try:
            found = self.store.fs.find(root, detail=True)
        except FileNotFoundError:
            return {}
        return {p[len(root):].lstrip("/"): int(info.get("size") or 0) for p, info in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verl_grpo.trainers.verl.checkpoint_sync")
    parser.add_argument("--until-finished", action="store_true",
                        help="end once the run's train_result.json is in the store (a worker node's foreground sync)")
    args = parser.parse_args(argv)
    settings = StoreSettings.from_env()
    pid_file = settings.metrics_dir / PID_FILE
    settings.metrics_dir.mkdir(parents=True, exist_ok=True)
    if _running(pid_file):
        print(f"checkpoint sync of {settings.checkpoint_dir} already runs (pid {pid_file.read_text().strip()})")
        return 0
    pid_file.write_text(str(os.getpid()))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    sync = CheckpointSync(settings)
    sync.start()
    print(f"checkpoint sync: {settings.checkpoint_dir} -> {sync.store.url(sync.base)} (every {SCAN_S:.0f} s, "
          f"{len(sync.synced)} file(s) already in the store)", flush=True)
    finished = train_result(settings.run_id)
    checkpoints, pruned_at = CheckpointStore(sync.store), None
    while True:
        if args.until_finished and (pruned_at is None or time.monotonic() - pruned_at >= PRUNE_S):
            pruned_at = time.monotonic()
            _prune(sync, checkpoints)
        flush = bool(stopping) or (args.until_finished and _exists(sync.store, finished))
        try:
            uploaded = sync.scan(time.monotonic(), flush=flush)
        except Exception as e:  # the store is away for a moment: the next scan retries; commits wait for us
            print(f"checkpoint sync: upload failed, retrying: {type(e).__name__}: {e}", flush=True)
            uploaded = []
        if uploaded:
            print(f"checkpoint sync: uploaded {', '.join(sorted(uploaded))}", flush=True)
        if flush:
            if not stopping:
                print(f"checkpoint sync: run {settings.run_id} finished ({finished} is in the store)", flush=True)
            return 0
        time.sleep(SCAN_S)


def _prune(sync: CheckpointSync, checkpoints: CheckpointStore) -> None:
    run_id = sync.settings.run_id
    try:  # the newest step with a manifest: the head's commit checked its files before writing it
        latest = next((s for s in reversed(checkpoints.steps(run_id)) if checkpoints.manifest(run_id, s)), None)
    except Exception:  # the store is away for a moment: prune at the next round
        return
    if latest is not None and (removed := sync.prune_committed(latest)):
        print(f"checkpoint sync: step {latest} is committed; removed {', '.join(removed)} from this node's disk",
              flush=True)


def _exists(store, path: str) -> bool:
    try:
        return store.exists(path)
    except Exception:  # the store is away for a moment: ask again at the next scan
        return False


def _running(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    sys.exit(main())
