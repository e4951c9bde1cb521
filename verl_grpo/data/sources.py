"""Raw data in: the local mirror (jsonl files, a tarball read in place) or the Hugging Face hub.

Every reader returns `RawRecord`s that keep the original row text, so a row that fails validation
later can be quarantined verbatim. A source's fingerprint (sha256 of its bytes) feeds the dataset hash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_grpo.config import DatasetConfig
from verl_grpo.data.schema import Problem, RawRecord
from verl_grpo.errors import DataError
from verl_grpo.local_paths import data_mirror_dir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HubSplit:
    """One `datasets.load_dataset(hub_id, config, split=split)` call, relabelled as `as_split`."""

    hub_id: str
    config: str | None
    split: str
    as_split: str


@dataclass(frozen=True)
class DatasetBuilder:
    """What preparation needs to know about one dataset."""

    name: str
    ability: str
    mirror_files: tuple[str, ...]
    """Files (relative to the mirror dir) that must all exist for the mirror to count as present."""
    read_mirror: Callable[[Path], list[RawRecord]]
    hub_splits: Callable[[str | None], list[HubSplit]]
    """Hub loads for an optional `dataset.hub_id` override."""
    to_problem: Callable[[RawRecord], Problem]
    """Validate one raw row (raises RowRejected) and assign its output split."""
    extra_fields: list[tuple[str, pa.DataType]]
    has_validation: bool
    """True when the dataset ships a validation split; otherwise one is carved from train."""
    load: Callable[[DatasetConfig, str | None], RawSource] | None = None
    """A source that is no data mirror (the user's files, a generator): `load(dataset config, S3 endpoint)`, which
    fails in one DataError line naming the setting; None reads the mirror or the hub."""


@dataclass(frozen=True)
class RawSource:
    description: str
    """`mirror:<dir>` or `hub:<id>[,<id>...]`, recorded in the manifest and DatasetVersion.source."""
    fingerprint: str
    """sha256 of the raw bytes (mirror files) or of the canonical JSON rows (hub)."""
    read_records: Callable[[], list[RawRecord]]
    """Parse the rows; the mirror parses only when called, so a cache hit costs just the file hashes."""


def resolve_mirror_dir(dcfg: DatasetConfig) -> Path:
    """`dataset.mirror_dir`, else `<data mirror>/<name>`."""
    if dcfg.mirror_dir:
        return Path(dcfg.mirror_dir).expanduser().resolve()
    return data_mirror_dir() / dcfg.name


def mirror_knob(dcfg: DatasetConfig) -> str | None:
    """The setting that names this dataset's mirror (`dataset.mirror_dir`, `VERL_GRPO_DATA_MIRROR`), None for the
    default place beside the checkout. A mirror the user named must be there, whatever `dataset.source` says."""
    if dcfg.mirror_dir:
        return "dataset.mirror_dir"
    return "VERL_GRPO_DATA_MIRROR" if os.environ.get("VERL_GRPO_DATA_MIRROR") is not None else None


def missing_mirror_message(dcfg: DatasetConfig, mirror: Path, files: tuple[str, ...], missing: list[str]) -> str:
    """One line: which setting named the mirror, what it lacks, and the fix."""
    state = ("lacks " + ", ".join(missing) if mirror.is_dir() else
             "is not a directory" if mirror.exists() else "does not exist")
    knob = mirror_knob(dcfg)
    if knob == "VERL_GRPO_DATA_MIRROR":
        where = f"VERL_GRPO_DATA_MIRROR={os.environ['VERL_GRPO_DATA_MIRROR']}: {mirror}"
        fix = f"point VERL_GRPO_DATA_MIRROR at the directory holding {dcfg.name}/"
    elif knob:
        where, fix = f"dataset.mirror_dir {mirror}", "point dataset.mirror_dir at a copy of the data"
    else:
        where = f"the default data mirror {mirror}"
        fix = f"set VERL_GRPO_DATA_MIRROR to the directory holding {dcfg.name}/ (or dataset.mirror_dir to a copy)"
    return (f"dataset {dcfg.name}: {where} {state} (needs {', '.join(files)}); {fix}, "
            "or set dataset.source=hub on a machine with network access")


def check_mirror(dcfg: DatasetConfig, builder: DatasetBuilder) -> list[str]:
    """The mirror files missing for a source that may fall back to the hub; DataError in one line when the mirror
    must be there (`dataset.source=mirror`, or a mirror the user named). A builder with its own `load` has none."""
    if builder.load is not None:
        return []
    mirror = resolve_mirror_dir(dcfg)
    missing = [f for f in builder.mirror_files if not (mirror / f).is_file()]
    if missing and (dcfg.source == "mirror" or (dcfg.source == "auto" and mirror_knob(dcfg))):
        raise DataError(missing_mirror_message(dcfg, mirror, builder.mirror_files, missing))
    return missing


def load_raw(dcfg: DatasetConfig, builder: DatasetBuilder, endpoint_url: str | None = None) -> RawSource:
    """Read the raw rows from where `dataset.source` says (or the builder's own `load`), or raise DataError with the
    fix; `endpoint_url`: the S3 endpoint of s3:// files a builder reads."""
    if builder.load is not None:
        return builder.load(dcfg, endpoint_url)
    mirror = resolve_mirror_dir(dcfg)
    missing = check_mirror(dcfg, builder)
    if dcfg.source == "mirror" or (dcfg.source == "auto" and not missing):
        return read_mirror_source(mirror, builder)
    try:
        return read_hub_source(builder.hub_splits(dcfg.hub_id))
    except Exception as e:  # the network boundary: any failure of datasets/huggingface_hub lands here
        where = (
            f"the mirror dataset.mirror_dir {str(mirror)!r} is missing {', '.join(missing)}"
            if missing
            else f"a mirror exists at {str(mirror)!r}"
        )
        raise DataError(
            f"dataset {dcfg.name}: loading from the Hugging Face hub failed ({type(e).__name__}: "
            f"{' '.join(str(e).split())}) "
            f"and {where}; "
            f"fix: set dataset.source=mirror with dataset.mirror_dir pointing at a copy holding "
            f"{', '.join(builder.mirror_files)}, or run where the hub is reachable (dataset.source=hub)"
        ) from e


def read_mirror_source(mirror: Path, builder: DatasetBuilder) -> RawSource:
    digest = hashlib.sha256()
    for name in builder.mirror_files:
        digest.update(name.encode() + b"\0")
        digest.update(_file_sha256(mirror / name).encode())

    def read_records() -> list[RawRecord]:
        try:
            return builder.read_mirror(mirror)
        except (OSError, tarfile.TarError, EOFError) as e:
            raise DataError(
                f"dataset {builder.name}: cannot read the mirror at dataset.mirror_dir {str(mirror)!r} "
                f"({type(e).__name__}: {e}); replace the damaged file with a good copy"
            ) from e

    return RawSource(description=f"mirror:{mirror}", fingerprint=digest.hexdigest(), read_records=read_records)


def read_hub_source(splits: list[HubSplit]) -> RawSource:
    import datasets  # heavy import, only on the hub path

    records: list[RawRecord] = []
    digest = hashlib.sha256()
    for hs in splits:
        ds = datasets.load_dataset(hs.hub_id, hs.config, split=hs.split)
        logger.info("loaded %s rows of %s/%s split %s from the hub", len(ds), hs.hub_id, hs.config, hs.split)
        start = sum(1 for r in records if r.split == hs.as_split)
        for record in row_records(ds, hs.as_split, start):
            digest.update(record.raw.encode() + b"\n")
            records.append(record)
    ids = ",".join(dict.fromkeys(f"{hs.hub_id}" + (f"/{hs.config}" if hs.config else "") for hs in splits))
    return RawSource(description=f"hub:{ids}", fingerprint=digest.hexdigest(), read_records=lambda: records)


def row_records(rows: Iterable[dict[str, Any]], split: str, start: int = 0) -> list[RawRecord]:
    """One record per already-parsed row (a hub dataset's, a parquet file's), its raw text the row as sorted JSON."""
    return [RawRecord(split=split, position=pos, uid=f"{split}/{pos}", data=row,
                      raw=json.dumps(row, sort_keys=True, default=str, ensure_ascii=False))
            for pos, row in enumerate(rows, start=start)]


def read_parquet(path: Path, split: str) -> list[RawRecord]:
    """One record per row of a parquet file (a hub dataset's file, downloaded), as the hub reader reads its rows."""
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except pa.ArrowInvalid as e:
        raise OSError(f"{path.name} is not a parquet file: {e}") from e
    return row_records(rows, split)


def read_jsonl(path: Path, split: str) -> list[RawRecord]:
    """One record per non-blank line; a line that is not valid UTF-8 JSON becomes a record with `error` set."""
    records: list[RawRecord] = []
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            pos = len(records)
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            data, error = parse_json(line)
            records.append(RawRecord(split=split, position=pos, uid=f"{split}/{pos}", raw=text, data=data, error=error))
    return records


def read_tar_json(path: Path, split: str) -> list[RawRecord]:
    """One record per `.json` member of a (gzip) tarball, in sorted member order, read without extraction.

    The uid is the member path without the tarball's top directory (`train/algebra/1.json` style
    when the top directory is dropped and `split` prefixed).
    """
    records: list[RawRecord] = []
    with tarfile.open(path, "r:*") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")), key=_member_key)
        for pos, member in enumerate(members):
            fileobj = tar.extractfile(member)
            blob = fileobj.read() if fileobj is not None else b""
            data, error = parse_json(blob)
            rel = member.name.split("/", 1)[1] if "/" in member.name else member.name
            records.append(
                RawRecord(
                    split=split,
                    position=pos,
                    uid=f"{split}/{rel}",
                    raw=blob.decode("utf-8", errors="replace"),
                    data=data,
                    error=error,
                )
            )
    return records


def _member_key(member: tarfile.TarInfo) -> tuple[str, int, str]:
    """Sort `dir/12.json` before `dir/100.json` (numeric stems), so the order is the natural one."""
    head, _, tail = member.name.rpartition("/")
    stem = tail.removesuffix(".json")
    return (head, int(stem) if stem.isdigit() else -1, tail)


def parse_json(blob: bytes) -> tuple[Any, str | None]:
    try:
        return json.loads(blob.decode("utf-8")), None
    except UnicodeDecodeError as e:
        return None, f"not UTF-8: {e}"
    except json.JSONDecodeError as e:
        return None, f"not valid JSON: {e}"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
