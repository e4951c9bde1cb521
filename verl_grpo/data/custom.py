"""A task from the user's own files (dataset.name=custom): JSONL or parquet rows holding a prompt and an answer.

`dataset.train_files` and `dataset.test_files` name local paths, `file://` or `s3://` URIs (the store's S3
settings, storage.endpoint_url and the environment's credentials, reach them). A row's `dataset.prompt_key` field is
the problem text, its `dataset.answer_key` field the ground truth handed to the user's reward (text as it is, any
other JSON value as its JSON text); the whole row travels in `extra_info.row` (JSON). Rows without a prompt or an
answer are quarantined with the reason; a missing file, a file that is no JSONL or parquet, or a key no row has fails
before anything trains, in one line naming the setting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_grpo.config import DatasetConfig
from verl_grpo.data.schema import Problem, RawRecord, Reason, RowRejected, require_object
from verl_grpo.data.sources import DatasetBuilder, RawSource, parse_json, row_records
from verl_grpo.errors import DataError
from verl_grpo.store import filesystem_for, strip_scheme

SPLIT_FILES = {"train": "train_files", "test": "test_files"}
"""Output split → the setting naming its files (val is carved from train)."""
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def file_format(setting: str, uri: str) -> str:
    """`jsonl` or `parquet`, by the file's suffix; DataError naming the setting otherwise."""
    suffix = Path(strip_scheme(uri) if "://" in uri else uri).suffix.lower()
    if suffix not in FORMATS:
        raise DataError(f"dataset.{setting}: {uri} is neither JSONL (.jsonl, one JSON object a line) nor parquet "
                        "(.parquet); convert it to one of them or rename it to its format's suffix")
    return FORMATS[suffix]


def _location(uri: str) -> str:
    """A local path or a `file://`/`s3://` URI as fsspec's URI."""
    if uri.startswith(("file://", "s3://")):
        return uri
    if "://" in uri:
        raise DataError(f"dataset files must be local paths, file:// or s3:// URIs; {uri} is none of them")
    return f"file://{Path(uri).expanduser().resolve()}"


def read_bytes(setting: str, uri: str, endpoint_url: str | None) -> bytes:
    """The file's bytes; DataError naming the setting when it is not there or cannot be read."""
    location = _location(uri)
    fs = filesystem_for(location, endpoint_url)
    try:
        with fs.open(strip_scheme(location), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"dataset.{setting}: {uri} does not exist; give the path or URI of an existing JSONL or "
                        "parquet file") from None
    except IsADirectoryError:
        raise DataError(f"dataset.{setting}: {uri} is a directory; list its JSONL or parquet files one by "
                        "one") from None
    except Exception as e:  # noqa: BLE001 - fsspec/s3fs raise botocore and OS errors alike: one line naming the file
        raise DataError(f"dataset.{setting}: cannot read {uri} ({type(e).__name__}: {e}); check the path, "
                        "storage.endpoint_url and the AWS credentials in the environment") from None


def parse_file(setting: str, uri: str, blob: bytes, split: str, file_index: int) -> list[RawRecord]:
    """The file's rows as raw records (uid `<split>/<file>:<row>`); a file that is not its format fails in one line."""
    if file_format(setting, uri) == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(pa.BufferReader(blob)).to_pylist()
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"dataset.{setting}: {uri} is not a readable parquet file ({e}); write it with "
                            "pandas.DataFrame.to_parquet or pyarrow") from None
        records = row_records(rows, split)
    else:
        records = []
        for line in blob.splitlines():
            if line.strip():
                data, error = parse_json(line)
                records.append(RawRecord(split, len(records), "", line.decode("utf-8", "replace"), data, error))
        if records and not any(isinstance(r.data, dict) for r in records):
            first = records[0].error or f"a JSON {type(records[0].data).__name__}"
            raise DataError(f"dataset.{setting}: {uri} holds no JSON object on any line (line 1: {first}); give JSON "
                            "Lines, one object per line such as {\"question\": ..., \"answer\": ...}")
    return [RawRecord(r.split, r.position, f"{split}/{file_index}:{r.position}", r.raw, r.data, r.error)
            for r in records]


def read_split(dcfg: DatasetConfig, split: str, endpoint_url: str | None) -> tuple[list[RawRecord], str]:
    """Every row of the split's files, and the sha256 of their bytes (in order)."""
    setting = SPLIT_FILES[split]
    digest = hashlib.sha256()
    records: list[RawRecord] = []
    for index, uri in enumerate(getattr(dcfg, setting)):
        blob = read_bytes(setting, uri, endpoint_url)
        digest.update(f"{split}\0{index}\0".encode() + hashlib.sha256(blob).digest())
        records += parse_file(setting, uri, blob, split, index)
    check_keys(dcfg, setting, records)
    return records, digest.hexdigest()


def check_keys(dcfg: DatasetConfig, setting: str, records: Sequence[RawRecord]) -> None:
    """The prompt and answer keys must each be in some row of the split; one line naming the key otherwise."""
    rows = [r.data for r in records if isinstance(r.data, dict)]
    if not rows:
        raise DataError(f"dataset.{setting}: the files hold no rows; give files with one JSON object (or parquet "
                        "row) per problem")
    fields = sorted({key for row in rows for key in row})
    for knob in ("prompt_key", "answer_key"):
        key = getattr(dcfg, knob)
        if not any(key in row for row in rows):
            shown = ", ".join(fields[:12]) + (", ..." if len(fields) > 12 else "")
            raise DataError(f"dataset.{knob}={key!r}: no row of dataset.{setting} has that field (fields: {shown}); "
                            f"set dataset.{knob} to the field holding the {knob.removesuffix('_key')}")


def load_source(dcfg: DatasetConfig, endpoint_url: str | None = None) -> RawSource:
    """Read both splits' files now (they are small next to a training run): a bad file fails before any training."""
    train, train_sha = read_split(dcfg, "train", endpoint_url)
    test, test_sha = read_split(dcfg, "test", endpoint_url)
    keys = json.dumps([dcfg.prompt_key, dcfg.answer_key])
    fingerprint = hashlib.sha256(f"{train_sha}\0{test_sha}\0{keys}".encode()).hexdigest()
    files = ", ".join([*dcfg.train_files, *dcfg.test_files])
    return RawSource(description=f"files:{files}", fingerprint=fingerprint, read_records=lambda: train + test)


def ground_truth_text(value: Any) -> str:
    """The answer as the reward receives it: a text as it is, any other JSON value (number, list) as its JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def problem_maker(dcfg: DatasetConfig):
    """`to_problem` for the configured keys."""

    def to_problem(record: RawRecord) -> Problem:
        data = require_object(record)
        prompt, answer = data.get(dcfg.prompt_key), data.get(dcfg.answer_key)
        if not isinstance(prompt, str) or not prompt.strip():
            got = "missing" if prompt is None else f"{type(prompt).__name__} {str(prompt)[:40]!r}"
            raise RowRejected(Reason.MISSING_QUESTION,
                              f"field {dcfg.prompt_key!r} (dataset.prompt_key) must be a non-empty text (got {got})")
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            raise RowRejected(Reason.MISSING_ANSWER,
                              f"field {dcfg.answer_key!r} (dataset.answer_key) is missing or empty")
        return Problem(uid=record.uid, split=record.split, question=prompt.strip(),
                       ground_truth=ground_truth_text(answer),
                       extra={"row": json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)},
                       position=record.position, data_source=dcfg.task_name)

    return to_problem


def builder(dcfg: DatasetConfig) -> DatasetBuilder:
    return DatasetBuilder(
        name=dcfg.task_name,
        ability="custom",
        mirror_files=(),
        read_mirror=_no_mirror,
        hub_splits=_no_hub,
        to_problem=problem_maker(dcfg),
        extra_fields=[("row", pa.string())],
        has_validation=False,
        load=load_source,
    )


def _no_mirror(mirror: Path) -> list[RawRecord]:
    raise DataError("dataset.name=custom reads dataset.train_files and dataset.test_files, not a data mirror")


def _no_hub(hub_id: str | None) -> list:
    raise DataError("dataset.name=custom reads dataset.train_files and dataset.test_files, not the Hugging Face hub")
