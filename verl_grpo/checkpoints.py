"""Checkpoint store with a commit protocol: files first, MANIFEST.json last.

A checkpoint exists only once its manifest (files, sizes, sha256, step, trainer state) is written.
`latest_complete` never returns a checkpoint whose manifest is missing or unreadable, and `restore`
verifies every file's size and hash before the trainer sees it.

Uploads: `concurrency` files at once, largest first. On S3, a file above 2 × `part_size` goes up as a
multipart upload with `part_concurrency` parts in flight (smaller ones in one PUT), so one save holds
at most concurrency × part_concurrency × part_size bytes (4 × 4 × 16 MiB = 256 MiB by default).
Every transfer is retried with exponential backoff (`retries` attempts, the delay doubling from
`backoff_s`); a store that stays down longer fails with an InfraError that says "retry budget".
Errors a retry cannot cure (no space left, permission denied) fail at once with a ConfigError.

`BackgroundSaver` takes uploads off the training thread: it snapshots each checkpoint with hard links,
uploads the snapshot in a background thread, and lets the trainer wait only when the previous upload
is still running at the next save. Snapshots not yet committed survive a crash on local disk and are
committed by the next attempt (`commit_pending`).
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from verl_grpo.contracts import CheckpointRef
from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.store import Store, checkpoints_dir

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
STEP_PREFIX = "global_step_"
_CHUNK = 1 << 20
PART_SIZE = 16 << 20
"""Multipart part size on S3 (S3's minimum is 5 MiB; s3fs's default of 50 MiB holds more memory per file)."""

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def _transient_errors() -> tuple[type[BaseException], ...]:
    """Errors a retry may cure: store/network trouble. botocore's connection errors are not OSErrors."""
    errors: list[type[BaseException]] = [InfraError, OSError]
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError

        errors += [BotoConnectionError, HTTPClientError]
    except ImportError:  # file:// stores do not need botocore
        pass
    return tuple(errors)


_TRANSIENT = _transient_errors()


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError an exception is or wraps (Store wraps OSErrors into InfraError)."""
    for e in (exc, exc.__cause__):
        if isinstance(e, OSError):
            return e
    return None


def permanent_error(what: str, where: str, exc: BaseException) -> ConfigError | None:
    """A ConfigError naming the path and the fix when `exc` is disk-full or permission trouble, else None."""
    os_error = _os_error(exc)
    if os_error is None:
        return None
    path = os_error.filename or where
    if os_error.errno in _NO_SPACE:
        return ConfigError(
            f"{what}: no space left on the device holding {path}; free space there, lower storage.keep_last, "
            "or move that directory to a bigger disk"
        )
    if os_error.errno in _NO_PERMISSION or isinstance(os_error, PermissionError):
        return ConfigError(
            f"{what}: permission denied on {path} ({os_error.strerror or os_error}); make it writable by uid "
            f"{os.getuid()} (chown/chmod) or point the run at a directory it may write"
        )
    return None


class CheckpointStore:
    """Checkpoints of runs under `{store}/runs/{run_id}/checkpoints/global_step_{N}/`."""

    def __init__(self, store: Store, *, retries: int = 4, backoff_s: float = 1.0, concurrency: int = 8):
        self.store = store
        self.concurrency = concurrency
        self.retries = retries
        self.backoff_s = backoff_s

    def save(self, run_id: str, step: int, local_dir: Path, state: dict[str, Any] | None = None) -> CheckpointRef:
        """Upload every file of local_dir, then commit by writing the manifest."""
        local_dir = Path(local_dir)
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())
        if not files:
            raise InfraError(f"checkpoint dir {local_dir} is empty; nothing to save for step {step}")
        base = (checkpoints_dir(run_id), step_dir_name(step))

        def upload(path: Path) -> dict[str, Any]:
            rel = path.relative_to(local_dir).as_posix()
            entry = {"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)}
            self._with_retries(f"upload {rel}", lambda: self.store.put_file(path, *base, rel))
            return entry

        # Large files first so the slowest upload starts earliest.
        files.sort(key=lambda p: -p.stat().st_size)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            entries = sorted(pool.map(upload, files), key=lambda e: e["path"])
        manifest = {
            "run_id": run_id,
            "step": step,
            "files": entries,
            "state": state or {},
            "created_at": time.time(),
        }
        self._with_retries("commit manifest", lambda: self.store.write_text(json.dumps(manifest, indent=1), *base, MANIFEST))
        log.info("checkpoint step %d committed (%d files) at %s", step, len(entries), self.store.url(*base))
        return CheckpointRef(run_id=run_id, step=step, uri=self.store.url(*base))

    def steps(self, run_id: str) -> list[int]:
        """Steps with a checkpoint directory (complete or not), ascending."""
        out = []
        for name in self.store.listdir(checkpoints_dir(run_id)):
            if name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX) :].isdigit():
                out.append(int(name[len(STEP_PREFIX) :]))
        return sorted(out)

    def manifest(self, run_id: str, step: int) -> dict[str, Any] | None:
        """The manifest of a committed checkpoint, or None when it is missing or torn."""
        try:
            data = json.loads(self.store.read_text(checkpoints_dir(run_id), step_dir_name(step), MANIFEST))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if data.get("step") != step or not isinstance(data.get("files"), list):
            return None
        return data

    def latest_complete(self, run_id: str) -> CheckpointRef | None:
        """The newest checkpoint whose manifest is committed and whose files are all present at their sizes."""
        for step in reversed(self.steps(run_id)):
            manifest = self.manifest(run_id, step)
            if manifest is None:
                log.warning("checkpoint step %d of run %s has no committed manifest; skipped", step, run_id)
                continue
            if self._files_present(run_id, step, manifest):
                return CheckpointRef(run_id=run_id, step=step, uri=self.store.url(checkpoints_dir(run_id), step_dir_name(step)))
            log.warning("checkpoint step %d of run %s is missing files; skipped", step, run_id)
        return None

    def restore(self, ref: CheckpointRef, local_dir: Path) -> dict[str, Any]:
        """Download a committed checkpoint into local_dir and verify sizes and hashes; returns its manifest."""
        manifest = self.manifest(ref.run_id, ref.step)
        if manifest is None:
            raise InfraError(f"checkpoint {ref.uri} has no committed manifest; it cannot be restored")
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        base = (checkpoints_dir(ref.run_id), step_dir_name(ref.step))
        for entry in manifest["files"]:
            dest = local_dir / entry["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not (dest.is_file() and dest.stat().st_size == entry["size"] and sha256_file(dest) == entry["sha256"]):
                remote = self.store.path(*base, entry["path"])
                self._with_retries(f"download {entry['path']}", lambda r=remote, d=dest: self.store.fs.get_file(r, str(d)))
            if dest.stat().st_size != entry["size"] or sha256_file(dest) != entry["sha256"]:
                raise InfraError(
                    f"checkpoint {ref.uri}: {entry['path']} does not match its manifest (size/sha256); "
                    "the store copy is corrupt — delete that global_step dir to fall back to the previous one"
                )
        return manifest

    def prune(self, run_id: str, keep: int, best_step: int | None = None) -> list[int]:
        """Delete all but the newest `keep` complete checkpoints (and `best_step`); torn ones older than the newest complete go too."""
        steps = self.steps(run_id)
        complete = [s for s in steps if self.manifest(run_id, s) is not None]
        kept = set(complete[-keep:]) if keep > 0 else set()
        if best_step is not None:
            kept.add(best_step)
        newest = max(complete) if complete else -1
        removed = [s for s in steps if s not in kept and s < newest]
        for step in removed:
            # Remove the manifest first so a half-deleted checkpoint is never seen as complete.
            self.store.rm(checkpoints_dir(run_id), step_dir_name(step), MANIFEST)
            self.store.rm(checkpoints_dir(run_id), step_dir_name(step))
        return removed

    def _files_present(self, run_id: str, step: int, manifest: dict[str, Any]) -> bool:
        base = self.store.path(checkpoints_dir(run_id), step_dir_name(step))
        try:
            sizes = {p[len(base) :].lstrip("/"): info.get("size") for p, info in self.store.fs.find(base, detail=True).items()}
        except FileNotFoundError:
            return False
        return all(sizes.get(e["path"]) == e["size"] for e in manifest["files"])

    def _with_retries(self, what: str, fn: Callable[[], Any]) -> Any:
        delay = self.backoff_s
        for attempt in itertools.count(1):
            try:
                return fn()
            except (InfraError, OSError) as e:
                if attempt == self.retries:
                    raise InfraError(f"checkpoint store {self.store.uri}: {what} failed after {attempt} attempts: {e}") from e
                log.warning("checkpoint store: %s failed (%s); retry %d in %.1fs", what, e, attempt, delay)
                time.sleep(delay)
                delay *= 2


class BackgroundSaver:
    """Uploads checkpoints in a background thread so training does not stall on the store.

    Training waits only when the previous upload is still running at the next save (bounded memory:
    at most one checkpoint in flight). Errors surface at the next `submit` or at `wait`.
    """

    def __init__(self, checkpoints: CheckpointStore, on_committed: Callable[[CheckpointRef], None] | None = None):
        self.checkpoints = checkpoints
        self.on_committed = on_committed
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")
        self._pending: Future | None = None
        self.waited_s = 0.0
        """Total time training spent blocked on a previous upload."""

    def submit(self, run_id: str, step: int, local_dir: Path, state: dict[str, Any] | None = None) -> None:
        start = time.monotonic()
        self.wait()
        self.waited_s += time.monotonic() - start
        self._pending = self._executor.submit(self._save, run_id, step, Path(local_dir), state)

    def wait(self) -> CheckpointRef | None:
        """Block until the in-flight upload (if any) is committed; re-raises its error."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> CheckpointRef | None:
        try:
            return self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def _save(self, run_id: str, step: int, local_dir: Path, state: dict[str, Any] | None) -> CheckpointRef:
        ref = self.checkpoints.save(run_id, step, local_dir, state)
        if self.on_committed is not None:
            self.on_committed(ref)
        return ref
