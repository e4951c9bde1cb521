"""Which model files an evaluation runs: store URIs, local dirs and base-model names → a local directory + key."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from verl_grpo.errors import ConfigError, InfraError
from verl_grpo.local_paths import model_cache_dir
from verl_grpo.models import cached_build, model_short_name, resolve_model
from verl_grpo.store import Store, local_path


def resolve_model_dir(model: str, store: Store) -> Path:
    """A local HF model directory for `model`: a `file://`/`s3://` URI, a local dir, or a `model.name`."""
    if model.startswith("file://"):
        path = local_path(model)
        assert path is not None
        return _checked(path, model)
    if model.startswith("s3://"):
        return _download(model, store.endpoint_url)
    resolved = resolve_model(model)
    if isinstance(resolved, Path):
        return _checked(resolved, model)
    return _hub_snapshot(resolved)


def model_key(model: str, model_dir: Path) -> str:
    """`{short-name}-{content hash}`: the same files give the same key wherever they live."""
    label = model_short_name(model)
    if label == "model":  # `runs/{run_id}/model`: the run id says more
        label = model_short_name(model.rstrip("/").rsplit("/", 2)[-2]) if "/" in model.rstrip("/") else label
    return f"{re.sub(r'[^a-z0-9._-]+', '-', label.lower())}-{content_hash(model_dir)[:12]}"


def content_hash(model_dir: Path) -> str:
    """sha256 over every file's relative path, size and bytes (bookkeeping dotfiles excluded)."""
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        rel = file.relative_to(model_dir).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        digest.update(f"{rel}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _checked(path: Path, given: str) -> Path:
    if not (path / "config.json").is_file():
        raise ConfigError(f"model {given!r}: {path} is not a saved Hugging Face model (no config.json); "
                          "pass the run's model directory (runs/<run_id>/model) or a model.name")
    return path


def _download(uri: str, endpoint_url: str | None) -> Path:
    """Copy a remote model directory into the local model cache once per version of its files: the same URI on
    another endpoint, or a model published there again (a store reset, a run id reused), is another entry."""
    store = Store(uri, endpoint_url)
    listing = store.listing()
    version = listing.fingerprint()
    key = hashlib.sha256(f"{endpoint_url or ''}\0{uri}\0{version}".encode()).hexdigest()[:16]

    def download(tmp: Path) -> None:
        store.get_dir(tmp, listing=listing)
        _checked(tmp, uri)

    return cached_build(model_cache_dir() / "store" / key, {"uri": uri, "endpoint_url": endpoint_url,
                                                            "version": version}, download)


def _hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id))
    except Exception as e:  # noqa: BLE001 - hub errors come in many types; all mean "cannot get the files"
        raise InfraError(f"model {repo_id!r}: could not fetch it from the Hugging Face hub ({type(e).__name__}: {e}); "
                         "check network access or use a local model directory") from e

