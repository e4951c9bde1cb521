"""The artifact store: one root URI (`file://` or `s3://`) on fsspec. The layout under it is verl_grpo.store_layout."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import fsspec

from verl_grpo.errors import ConfigError, InfraError


@dataclass(frozen=True)
class Listing:
    """The files under one store path with fsspec's info for each, as one fresh `find` returned them."""

    root: str
    files: dict[str, dict[str, Any]]

    def fingerprint(self) -> str:
        """sha256 of every file's relative path, size and version (S3 ETag, else modification time): it changes
        whenever a file there is written again."""
        digest = hashlib.sha256()
        for remote, info in sorted(self.files.items()):
            version = info.get("ETag") or info.get("LastModified") or info.get("mtime")
            digest.update(f"{remote[len(self.root):]}\0{info.get('size')}\0{version}\0".encode())
        return digest.hexdigest()


class Store:
    """Read/write access to the store root. Credentials come from the environment (AWS_* / profiles)."""

    def __init__(self, uri: str, endpoint_url: str | None = None):
        if not (uri.startswith("file://") or uri.startswith("s3://")):
            raise ConfigError(f"storage.uri {uri!r} must start with file:// or s3://")
        self.uri = uri.rstrip("/")
        self.endpoint_url = endpoint_url

    @classmethod
    def from_config(cls, storage: Any) -> "Store":
        return cls(storage.uri, storage.endpoint_url)

    @property
    def is_local(self) -> bool:
        return self.uri.startswith("file://")

    @cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        return filesystem_for(self.uri, self.endpoint_url)

    def url(self, *parts: str) -> str:
        """Full URI of a path under the root."""
        rel = "/".join(p.strip("/") for p in parts if p)
        return f"{self.uri}/{rel}" if rel else self.uri

    def path(self, *parts: str) -> str:
        """Path of `parts` as the filesystem object expects it (no scheme)."""
        return strip_scheme(self.url(*parts))

    def exists(self, *parts: str) -> bool:
        return self._call(self.fs.exists, self.path(*parts))

    def read_text(self, *parts: str) -> str:
        with self._call(self.fs.open, self.path(*parts), "r") as f:
            return f.read()

    def write_text(self, text: str, *parts: str) -> str:
        """Write a small text object atomically where the backend allows (S3 puts are atomic)."""
        target = self.path(*parts)
        self._ensure_parent(target)
        if self.is_local:
            tmp = f"{target}.tmp-{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        else:
            self._call(self.fs.pipe_file, target, text.encode())
        return self.url(*parts)

    def put_dir(self, local_dir: Path, *parts: str) -> str:
        """Upload a local directory's files under `parts`."""
        for file in sorted(p for p in Path(local_dir).rglob("*") if p.is_file()):
            rel = file.relative_to(local_dir).as_posix()
            self.put_file(file, *parts, rel)
        return self.url(*parts)

    def put_file(self, local: Path, *parts: str) -> str:
        target = self.path(*parts)
        self._ensure_parent(target)
        self._call(self.fs.put_file, str(local), target)
        return self.url(*parts)

    def get_dir(self, local_dir: Path, *parts: str, listing: Listing | None = None) -> Path:
        """Download everything under `parts` into local_dir: the files of `listing` when given (one taken of the
        same path, so what is fetched is what was fingerprinted), else those a listing finds now."""
        src = self.path(*parts)
        if listing is not None and listing.root != src:
            raise ValueError(f"listing of {listing.root!r} given for {src!r}")
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        for remote in listing.files if listing is not None else self._call(self.fs.find, src):
            rel = remote[len(src) :].lstrip("/")
            dest = local_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            self._call(self.fs.get_file, remote, str(dest))
        return local_dir

    def listing(self, *parts: str) -> Listing:
        """The files under `parts` with their info, read fresh from the store (its listing cache dropped first)."""
        src = self.path(*parts)
        self.fs.invalidate_cache(src)
        return Listing(src, self._call(self.fs.find, src, detail=True))

    def listdir(self, *parts: str) -> list[str]:
        """Names directly under `parts` (empty when missing)."""
        base = self.path(*parts)
        if not self._call(self.fs.exists, base):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self._call(self.fs.ls, base, detail=False))

    def rm(self, *parts: str) -> None:
        target = self.path(*parts)
        if self._call(self.fs.exists, target):
            self._call(self.fs.rm, target, recursive=True)

    def _ensure_parent(self, target: str) -> None:
        if self.is_local:
            Path(target).parent.mkdir(parents=True, exist_ok=True)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise
        except PermissionError as e:  # the same on every retry: the user fixes it
            raise ConfigError(f"store {self.uri}: permission denied on {e.filename or args[0]}; fix the access "
                              "rights or the credentials") from e
        except OSError as e:
            raise InfraError(f"store {self.uri}: {type(e).__name__}: {e}") from e


def filesystem_for(uri: str, endpoint_url: str | None = None) -> fsspec.AbstractFileSystem:
    if uri.startswith("s3://"):
        # Other processes and nodes write the store (commits, manifests, mounts): a listing cached by s3fs would make a
        # resume miss a committed step or a file (FileNotFoundError from `_ls_from_cache`), so every call lists anew.
        opts: dict[str, Any] = {"use_listings_cache": False}
        if endpoint_url:
            opts["endpoint_url"] = endpoint_url
        return fsspec.filesystem("s3", **opts)
    return fsspec.filesystem("file")


def strip_scheme(uri: str) -> str:
    for scheme in ("file://", "s3://"):
        if uri.startswith(scheme):
            return uri[len(scheme) :]
    return uri


def local_path(uri: str) -> Path | None:
    """The local path of a `file://` URI (None for remote URIs)."""
    return Path(uri[len("file://") :]) if uri.startswith("file://") else None
