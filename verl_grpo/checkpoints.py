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
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn

from tenacity import RetryCallState

from verl_grpo.contracts import CheckpointRef
from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.retry import Backoff, last_error
from verl_grpo.store import Store
from verl_grpo.store_layout import (
    CHECKPOINT_MANIFEST,
    STEP_PREFIX,
    checkpoint_dir,
    checkpoint_manifest,
    checkpoints_dir,
    step_dir_name,
)

log = logging.getLogger(__name__)

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


def _transient_errors() -> tuple[type[BaseException], ...]:
    """Errors a retry may cure: store/network trouble. botocore's connection errors are not OSErrors."""
    errors: list[type[BaseException]] = [InfraError, OSError]
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError, HTTPClientError

        errors += [BotoConnectionError, HTTPClientError]
    except ImportError:  # file:// stores do not need botocore
        pass
    return tuple(errors)


_TRANSIENT = _transient_errors()
_NOT_FOUND = (FileNotFoundError, IsADirectoryError, NotADirectoryError)
"""Answers, not failures: the caller decides what a missing path means, so they are never retried."""


def _worth_retrying(exc: BaseException) -> bool:
    return isinstance(exc, _TRANSIENT) and not isinstance(exc, _NOT_FOUND)


def _log_retry(what: str, state: RetryCallState) -> None:
    log.warning("checkpoint store: %s failed (%s); retry %d in %.1fs", what, last_error(state), state.attempt_number,
                state.upcoming_sleep)


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

    def __init__(self, store: Store, *, retries: int = 4, backoff_s: float = 1.0, concurrency: int = 4,
                 part_size: int = PART_SIZE, part_concurrency: int = 4):
        if retries < 1:
            raise ConfigError(f"storage.upload_retries must be >= 1 (got {retries})")
        self.store = store
        self.retries = retries
        self.backoff_s = backoff_s
        self.concurrency = concurrency
        self.part_size = part_size
        self.part_concurrency = part_concurrency

    @classmethod
    def from_config(cls, store: Store, storage: Any) -> CheckpointStore:
        """A store with the retry budget of a StorageConfig (`upload_retries`, `upload_backoff_s`)."""
        return cls(store, retries=storage.upload_retries, backoff_s=storage.upload_backoff_s)

    def save(self, run_id: str, step: int, local_dir: Path, state: dict[str, Any] | None = None) -> CheckpointRef:
        """Upload every file of local_dir, then commit by writing the manifest."""
        local_dir = Path(local_dir)
        files = sorted(p for p in local_dir.rglob("*") if p.is_file())
        if not files:
            raise InfraError(f"checkpoint dir {local_dir} is empty; nothing to save for step {step}")
        base = checkpoint_dir(run_id, step)

        def upload(path: Path) -> dict[str, Any]:
            rel = path.relative_to(local_dir).as_posix()
            entry = {"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)}
            self.retrying(f"upload {rel}", lambda: self._put(path, base, rel))
            return entry

        # Large files first so the slowest upload starts earliest.
        files.sort(key=lambda p: -p.stat().st_size)
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="ckpt-file") as pool:
                entries = sorted(pool.map(upload, files), key=lambda e: e["path"])
            self._write_manifest(run_id, step, entries, state)
        except InfraError as e:
            raise InfraError(f"{e}; checkpoint step {step} is not committed, its files are kept at {local_dir}") from e
        log.info("checkpoint step %d committed (%d files) at %s", step, len(entries), self.store.url(base))
        return CheckpointRef(run_id=run_id, step=step, uri=self.store.url(base))

    def commit_in_place(self, run_id: str, step: int, state: dict[str, Any] | None = None) -> CheckpointRef:
        """Commit a step dir whose files are already in the store (uploaded by a multi-node run's nodes): hash every
        file as the store holds it, then write the manifest. The caller first waits until the store holds the whole
        dir."""
        base = checkpoint_dir(run_id, step)
        listing = self.listing(run_id, step)
        if not listing:
            raise InfraError(f"checkpoint step {step} has no files at {self.store.url(base)}; nothing to commit")

        def entry(rel: str) -> dict[str, Any]:
            digest = self.retrying(f"hash {rel}", lambda: self._stored_sha256(self.store.path(base, rel)))
            return {"path": rel, "size": listing[rel], "sha256": digest}

        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="ckpt-hash") as pool:
            entries = sorted(pool.map(entry, sorted(listing)), key=lambda e: e["path"])
        self._write_manifest(run_id, step, entries, state)
        log.info("checkpoint step %d committed in place (%d files) at %s", step, len(entries), self.store.url(base))
        return CheckpointRef(run_id=run_id, step=step, uri=self.store.url(base))

    def listing(self, run_id: str, step: int) -> dict[str, int]:
        """{path relative to the step dir: size} of every file the store holds for `step`, its manifest left out."""
        base = self.store.path(checkpoint_dir(run_id, step))
        self.store.fs.invalidate_cache(base)
        try:
            found = self.retrying(f"list files of step {step}", lambda: self.store.fs.find(base, detail=True))
        except FileNotFoundError:
            return {}
        sizes = {p[len(base):].lstrip("/"): int(info.get("size") or 0) for p, info in found.items()
                 if info.get("type", "file") != "directory"}
        sizes.pop(CHECKPOINT_MANIFEST, None)
        return sizes

    def discard(self, run_id: str, step: int) -> None:
        """Delete step's files and manifest (manifest first: a half-deleted checkpoint is never seen as complete)."""
        self.retrying(f"delete step {step}", lambda: (
            self.store.rm(checkpoint_manifest(run_id, step)),
            self.store.rm(checkpoint_dir(run_id, step))))

    def steps(self, run_id: str) -> list[int]:
        """Steps with a checkpoint directory (complete or not), ascending."""
        out = []
        # Other processes write checkpoints: s3fs would otherwise answer from its listing cache.
        self.store.fs.invalidate_cache(self.store.path(checkpoints_dir(run_id)))
        names = self.retrying("list checkpoints", lambda: self.store.listdir(checkpoints_dir(run_id)))
        for name in names:
            if name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX) :].isdigit():
                out.append(int(name[len(STEP_PREFIX) :]))
        return sorted(out)

    def manifest(self, run_id: str, step: int) -> dict[str, Any] | None:
        """The manifest of a committed checkpoint, or None when it is missing or torn."""
        try:
            text = self.retrying(f"read manifest of step {step}", lambda: self.store.read_text(
                checkpoint_manifest(run_id, step)))
            data = json.loads(text)
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
                return CheckpointRef(run_id=run_id, step=step, uri=self.store.url(checkpoint_dir(run_id, step)))
            log.warning("checkpoint step %d of run %s is missing files; skipped", step, run_id)
        return None

    def restore(self, ref: CheckpointRef, local_dir: Path, only: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """Download a committed checkpoint into local_dir and verify sizes and hashes; returns its manifest. With
        `only`, just the manifest's files whose path it accepts (the files already here and intact are kept)."""
        manifest = self.manifest(ref.run_id, ref.step)
        if manifest is None:
            raise InfraError(f"checkpoint {ref.uri} has no committed manifest; it cannot be restored")
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        base = checkpoint_dir(ref.run_id, ref.step)
        for entry in manifest["files"]:
            if only is not None and not only(entry["path"]):
                continue
            dest = local_dir / entry["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not (dest.is_file() and dest.stat().st_size == entry["size"] and sha256_file(dest) == entry["sha256"]):
                # Unlink first: a leftover may share its inode (hard link) with a snapshot still to be uploaded.
                dest.unlink(missing_ok=True)
                remote = self.store.path(base, entry["path"])
                self.retrying(f"download {entry['path']}", lambda r=remote, d=dest: self.store.fs.get_file(r, str(d)))
            if dest.stat().st_size != entry["size"] or sha256_file(dest) != entry["sha256"]:
                raise InfraError(
                    f"checkpoint {ref.uri}: {entry['path']} does not match its manifest (size/sha256); "
                    "the store copy is corrupt — delete that global_step dir to fall back to the previous one"
                )
        return manifest

    def prune(self, run_id: str, keep: int, best_step: int | None = None) -> list[int]:
        """Delete all but the newest `keep` complete checkpoints (and `best_step`); torn ones older than the newest
        complete go too."""
        steps = self.steps(run_id)
        complete = [s for s in steps if self.manifest(run_id, s) is not None]
        kept = set(complete[-keep:]) if keep > 0 else set()
        if best_step is not None:
            kept.add(best_step)
        newest = max(complete) if complete else -1
        removed = [s for s in steps if s not in kept and s < newest]
        for step in removed:
            self.discard(run_id, step)
        return removed

    def retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """fn(), retried with exponential backoff on store/network errors within the retry budget.

        Disk-full and permission errors fail at once (ConfigError); a missing file is re-raised as is.
        """
        policy = Backoff(attempts=self.retries, backoff_s=self.backoff_s, retry_on=_worth_retrying,
                         give_up=lambda state: self._give_up(what, state),
                         on_retry=lambda state: _log_retry(what, state))
        return policy.call(self._attempt, what, fn)

    def _attempt(self, what: str, fn: Callable[[], Any]) -> Any:
        """fn(), with errors no retry can cure (disk full, permission denied) turned into a ConfigError."""
        try:
            return fn()
        except _NOT_FOUND:
            raise
        except _TRANSIENT as e:
            permanent = permanent_error(f"checkpoint store {self.store.uri}: {what}", self.store.uri, e)
            if permanent is not None:
                raise permanent from e
            raise

    def _give_up(self, what: str, state: RetryCallState) -> NoReturn:
        """The InfraError that ends a transfer still failing after the budget; it names the knobs that set it."""
        e = last_error(state)
        raise InfraError(
            f"checkpoint store {self.store.uri}: {what} still failing after {state.attempt_number} attempts in "
            f"{state.seconds_since_start or 0:.0f}s, the retry budget (storage.upload_retries={self.retries}, "
            f"storage.upload_backoff_s={self.backoff_s}); last error: {type(e).__name__}: {e}"
        ) from e

    def _put(self, local: Path, *parts: str) -> None:
        if self.store.is_local:
            self.store.put_file(local, *parts)
            return
        # s3fs multipart-uploads above 2 × chunksize; bounded parts keep memory per file small.
        self.store.fs.put_file(str(local), self.store.path(*parts), chunksize=self.part_size,
                               max_concurrency=self.part_concurrency)

    def _files_present(self, run_id: str, step: int, manifest: dict[str, Any]) -> bool:
        sizes = self.listing(run_id, step)
        return all(sizes.get(e["path"]) == e["size"] for e in manifest["files"])

    def _write_manifest(self, run_id: str, step: int, entries: list[dict[str, Any]],
                        state: dict[str, Any] | None) -> None:
        manifest = {"run_id": run_id, "step": step, "files": entries, "state": state or {}, "created_at": time.time()}
        self.retrying("commit manifest",
                      lambda: self.store.write_text(json.dumps(manifest, indent=1), checkpoint_manifest(run_id, step)))

    def _stored_sha256(self, remote: str) -> str:
        h = hashlib.sha256()
        with self.store.fs.open(remote, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return h.hexdigest()


Committer = Callable[[str, int, Path, "dict[str, Any] | None"], CheckpointRef]
"""(run_id, step, checkpoint dir, trainer state) → the committed checkpoint."""


class BackgroundSaver:
    """Uploads checkpoints in a background thread so training does not stall on the store.

    With a `staging_dir`, `submit` first snapshots the checkpoint dir there with hard links (a trainer
    such as HF's deletes its previous checkpoint dir at the next save); without one, the caller keeps
    `local_dir` unchanged until it is committed. Then `submit` waits for the previous upload (at most one checkpoint
    in flight) and hands the snapshot to the upload thread. Errors surface at the next `submit` or at
    `close`. A snapshot stays on disk until its manifest is committed; `commit_pending` uploads the ones a
    crashed process left behind.
    """

    def __init__(self, checkpoints: CheckpointStore, on_committed: Callable[[CheckpointRef], None] | None = None,
                 staging_dir: Path | None = None, commit: Committer | None = None):
        self.checkpoints = checkpoints
        self.commit = commit or checkpoints.save
        """How a checkpoint is committed (default: uploaded by `CheckpointStore.save`)."""
        self.staging_dir = Path(staging_dir) if staging_dir is not None else None
        self.on_committed = on_committed
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-upload")
        self._pending: Future | None = None
        self.waited_s = 0.0
        """Total time training spent blocked on a previous upload."""

    def submit(self, run_id: str, step: int, local_dir: Path, state: dict[str, Any] | None = None) -> None:
        snapshot = self._snapshot(run_id, step, Path(local_dir), state) if self.staging_dir else Path(local_dir)
        start = time.monotonic()
        try:
            self.wait()
        finally:
            self.waited_s += time.monotonic() - start
        self._pending = self._executor.submit(self._commit, run_id, step, snapshot, state)

    def wait(self) -> CheckpointRef | None:
        """Block until the in-flight upload (if any) is committed; re-raises its error."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> CheckpointRef | None:
        """Wait for the last upload and stop the thread; re-raises its error."""
        try:
            return self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def abandon(self) -> None:
        """The failure path: let the in-flight upload finish (it is a valid checkpoint) and log, not raise, its
        error."""
        try:
            self.close()
        except Exception as e:  # noqa: BLE001 - the caller is already propagating the error that matters
            log.warning("checkpoint upload failed while the trainer was stopping: %s", e)

    def commit_pending(self, run_id: str) -> list[CheckpointRef]:
        """Commit snapshots of `run_id` that a previous process staged but did not finish uploading.

        Only snapshots newer than the store's latest complete checkpoint are uploaded (oldest first);
        stale or half-made ones are deleted.
        """
        if self.staging_dir is None or not self.staging_dir.is_dir():
            return []
        latest = self.checkpoints.latest_complete(run_id)
        committed: list[CheckpointRef] = []
        for sidecar in sorted(self.staging_dir.glob(f"{STEP_PREFIX}*.json"), key=_sidecar_step):
            meta = json.loads(sidecar.read_text())
            snapshot = sidecar.with_suffix("")
            if meta.get("run_id") == run_id and snapshot.is_dir() and (latest is None or meta["step"] > latest.step):
                log.info("committing step %d left staged by a previous attempt", meta["step"])
                committed.append(self._commit(run_id, meta["step"], snapshot, meta.get("state")))
            else:
                _discard(snapshot, sidecar)
        for orphan in self.staging_dir.glob(f"{STEP_PREFIX}*"):
            if orphan.is_dir() and not orphan.with_suffix(".json").exists():
                shutil.rmtree(orphan, ignore_errors=True)  # a snapshot cut short before its sidecar was written
        return committed

    def _snapshot(self, run_id: str, step: int, local_dir: Path, state: dict[str, Any] | None) -> Path:
        assert self.staging_dir is not None
        dest = self.staging_dir / step_dir_name(step)
        sidecar = dest.with_suffix(".json")
        _discard(dest, sidecar)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(local_dir, dest, copy_function=_link_or_copy)
        # The sidecar marks the snapshot complete; written atomically, after every file.
        tmp = sidecar.with_suffix(".tmp")
        tmp.write_text(json.dumps({"run_id": run_id, "step": step, "state": state or {}}))
        tmp.replace(sidecar)
        return dest

    def _commit(self, run_id: str, step: int, snapshot: Path, state: dict[str, Any] | None) -> CheckpointRef:
        ref = self.commit(run_id, step, snapshot, state)
        if self.staging_dir is not None:
            _discard(snapshot, snapshot.with_suffix(".json"))
        if self.on_committed is not None:
            self.on_committed(ref)
        return ref


def _sidecar_step(path: Path) -> int:
    digits = path.name[len(STEP_PREFIX) :].split(".", 1)[0]
    return int(digits) if digits.isdigit() else -1


def _discard(snapshot: Path, sidecar: Path) -> None:
    sidecar.unlink(missing_ok=True)  # first: a snapshot without its sidecar is never committed
    shutil.rmtree(snapshot, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem or no hard links: a copy is slower but equivalent
        shutil.copy2(src, dst)
