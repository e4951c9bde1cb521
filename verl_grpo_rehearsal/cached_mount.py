"""SkyPilot's MOUNT_CACHED bucket mount on a rehearsal node, as rclone's `--vfs-cache-mode full` mount behaves.

The node sees a local dir. Its writes are uploaded to the bucket asynchronously, file by file, once a file has been
left alone for WRITE_BACK_S (rclone's --vfs-write-back); its deletions are deleted from the bucket. Objects other
nodes (or the store) put in the bucket show up in the dir at the next listing refresh (rclone's --dir-cache-time),
and objects deleted from the bucket disappear from it. A node that is killed (a preempted VM) loses what it had not
uploaded yet; a run that ends waits for its uploads first (SkyPilot's task epilogue waits for MOUNT_CACHED flushes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WRITE_BACK_S = 0.5
"""How long a file must be left unchanged before it is uploaded (rclone's default --vfs-write-back is 5 s; shorter
here so a rehearsal stays quick)."""
REFRESH_S = 0.3
"""Period of the upload scan and of the bucket listing refresh (SkyPilot sets --dir-cache-time 10s)."""


def bucket_fs(env_value: Callable[[str], str | None]) -> Any:
    """An fsspec S3 filesystem with the credentials and endpoint the node has."""
    import fsspec

    return fsspec.filesystem(
        "s3", key=env_value("AWS_ACCESS_KEY_ID"), secret=env_value("AWS_SECRET_ACCESS_KEY"),
        token=env_value("AWS_SESSION_TOKEN") or None, client_kwargs={"endpoint_url": env_value("AWS_ENDPOINT_URL")},
        use_listings_cache=False)


class CachedMount:
    """One node's MOUNT_CACHED view of `source` (s3://bucket/prefix) at `local`; a thread keeps the two in step."""

    def __init__(self, source: str, local: Path, fs: Any):
        if not source.startswith("s3://"):
            raise ValueError(f"MOUNT_CACHED source {source}: the rehearsal mounts s3:// buckets only")
        self.root = source[len("s3://"):].rstrip("/")
        self.local = Path(local)
        self.fs = fs
        self.synced: dict[str, tuple[int, int]] = {}
        """rel path → (size, mtime_ns) of the local file when it last matched the bucket."""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Mount: the bucket's current files appear in the dir, and the write-back thread starts."""
        self.local.mkdir(parents=True, exist_ok=True)
        self._pull()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"mount-cached:{self.local}")
        self._thread.start()

    def flush(self) -> None:
        """Upload every pending write now, then stop (the run ended; SkyPilot waits for this)."""
        self._halt()
        with self._lock:
            self._push(flush=True)

    def drop(self) -> None:
        """Stop without uploading: the node is gone, and what was not uploaded yet is lost."""
        self._halt()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._push(flush=False)
                    self._pull()
                except Exception as e:  # noqa: BLE001 - rclone retries; so does the next round
                    log.warning("cached mount %s: %s", self.local, e)

    def _local_files(self) -> dict[str, tuple[int, int]]:
        out = {}
        for path in self.local.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink():
                    st = path.stat()
                    out[path.relative_to(self.local).as_posix()] = (st.st_size, st.st_mtime_ns)
            except FileNotFoundError:  # deleted while listed
                continue
        return out

    def _push(self, flush: bool) -> None:
        now_ns = time.time_ns()
        local = self._local_files()
        for rel, sig in sorted(local.items()):
            if self.synced.get(rel) == sig:
                continue
            if not flush and now_ns - sig[1] < WRITE_BACK_S * 1e9:
                continue  # still being written (or just closed): rclone waits for --vfs-write-back
            try:
                self.fs.put_file(str(self.local / rel), f"{self.root}/{rel}")
            except FileNotFoundError:
                continue
            self.synced[rel] = sig
        for rel in [r for r in self.synced if r not in local]:
            try:
                self.fs.rm_file(f"{self.root}/{rel}")
            except FileNotFoundError:
                pass
            del self.synced[rel]

    def _pull(self) -> None:
        try:
            remote = {p[len(self.root):].lstrip("/"): info for p, info in
                      self.fs.find(self.root, detail=True).items() if info.get("type") != "directory"}
        except FileNotFoundError:
            remote = {}
        local = self._local_files()
        for rel, sig in list(self.synced.items()):
            if rel not in remote and local.get(rel) == sig:  # deleted in the bucket, unchanged here
                (self.local / rel).unlink(missing_ok=True)
                del self.synced[rel]
        for rel in sorted(set(remote) - set(local) - set(self.synced)):
            dest = self.local / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.mount-fetch")
            self.fs.get_file(f"{self.root}/{rel}", str(tmp))
            tmp.replace(dest)
            st = dest.stat()
            self.synced[rel] = (st.st_size, st.st_mtime_ns)
