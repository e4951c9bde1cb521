"""Raw rows → validated verl rows → content-hashed parquet under `{store}/datasets/{name}/{hash}/`.

Layout of one dataset version: `train.parquet`, `val.parquet`, `test.parquet` (MBPP also
`prompt.parquet`, its few-shot split), `rejected.parquet` (every quarantined raw row with its reason)
and `manifest.json`, written last: a version exists only once its manifest does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import string
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from verl_grpo.config import DatasetConfig, RunConfig
from verl_grpo.contracts import DatasetVersion
from verl_grpo.data import custom, gsm8k, math_, mbpp, nq_hotpotqa, reasoning_gym, squad
from verl_grpo.data.schema import (
    BUILDER_VERSION,
    OUTPUT_SPLITS,
    REJECTED_SCHEMA,
    TOOL_AGENT,
    Problem,
    RawRecord,
    Reason,
    RowRejected,
    rejection_row,
    row_schema,
    verl_row,
)
from verl_grpo.data.sources import DatasetBuilder, RawSource, load_raw
from verl_grpo.errors import ConfigError, DataError
from verl_grpo.formats import default_system_prompt
from verl_grpo.store import Store, strip_scheme
from verl_grpo.store_layout import DATASET_MANIFEST as MANIFEST, DATASET_REJECTED, dataset_dir

logger = logging.getLogger(__name__)

BUILDERS: dict[str, DatasetBuilder] = {
    b.name: b for b in (gsm8k.BUILDER, math_.BUILDER, mbpp.BUILDER, squad.BUILDER, nq_hotpotqa.BUILDER)
}
"""The shipped datasets' builders; `builder_for` adds the user's own task and reasoning-gym's."""
CONFIGURED_BUILDERS = {"custom": custom.builder, "reasoning_gym": reasoning_gym.builder}
"""Builders made from the dataset config (its files or generators), named after dataset.task."""


def builder_for(dcfg: DatasetConfig) -> DatasetBuilder:
    """The builder of the configured dataset."""
    make = CONFIGURED_BUILDERS.get(dcfg.name)
    return make(dcfg) if make else BUILDERS[dcfg.name]
HASH_CHARS = 16
AGENT_SETTING = "agent_name"
"""The settings key naming the rows' agent loop; present only for a dataset prepared for the tool agent."""


def prepare_dataset(cfg: RunConfig, store: Store, tokenizer: Any = None) -> DatasetVersion:
    """Prepare `cfg.dataset` into the store (or find it there already) and describe the version.

    With a Hugging Face `tokenizer`, prompts longer than `algorithm.max_prompt_length` tokens (chat
    template applied, generation prompt included) are quarantined; without one the length check is
    skipped and the manifest says so.
    """
    started = time.perf_counter()
    dcfg = cfg.dataset
    builder = builder_for(dcfg)
    system_prompt = default_system_prompt(dcfg.name) if dcfg.system_prompt is None else dcfg.system_prompt
    check_user_template(dcfg.user_template)
    source = load_raw(dcfg, builder, cfg.storage.endpoint_url)
    settings = {
        "builder_version": BUILDER_VERSION,
        "name": dcfg.name,
        "system_prompt": system_prompt,
        "user_template": dcfg.user_template,
        "val_size": dcfg.val_size,
        "seed": dcfg.seed,
        "max_prompt_length": cfg.algorithm.max_prompt_length,
        "tokenizer": tokenizer_name(tokenizer),
        "chat_template_sha256": _chat_template_sha(tokenizer),
    }
    if uses_tool_agent(cfg):
        settings[AGENT_SETTING] = TOOL_AGENT  # only then: the hashes of tool-free datasets stay as they were
    if dcfg.name in CONFIGURED_BUILDERS:  # a task of its own: its name and keys shape the rows
        settings.update(task=builder.name, prompt_key=dcfg.prompt_key, answer_key=dcfg.answer_key)
    full_hash = dataset_hash(source.fingerprint, settings)
    digest = full_hash[:HASH_CHARS]
    rel = dataset_dir(builder.name, digest)

    if store.exists(rel, MANIFEST):
        manifest = json.loads(store.read_text(rel, MANIFEST))
        logger.info(
            "cache hit: dataset %s %s at %s (%.2fs)", builder.name, digest, store.url(rel),
            time.perf_counter() - started,
        )
        return version_from_manifest(store, rel, manifest)

    built = build_rows(builder, source.read_records(), system_prompt, dcfg.user_template, cfg, tokenizer)
    manifest = _write_version(store, builder, built, source, settings, full_hash, started)
    return version_from_manifest(store, rel, manifest)


def _write_version(
    store: Store,
    builder: DatasetBuilder,
    built: BuiltRows,
    source: RawSource,
    settings: dict[str, Any],
    full_hash: str,
    started: float,
) -> dict[str, Any]:
    """Upload every parquet file, then the manifest (last: its presence marks the version complete), into the
    version's directory (`dataset_dir(name, hash)`); rows carry the tool agent's fields when `settings` name it."""
    digest = full_hash[:HASH_CHARS]
    rel = dataset_dir(builder.name, digest)
    schema = row_schema(builder.extra_fields, tool_agent=AGENT_SETTING in settings)
    with tempfile.TemporaryDirectory(prefix="verl-grpo-data-") as tmp:
        for split, rows in built.splits.items():
            _write_parquet(store, Path(tmp), rel, f"{split}.parquet", pa.Table.from_pylist(rows, schema=schema))
        rejected = pa.Table.from_pylist(built.rejected, schema=REJECTED_SCHEMA)
        _write_parquet(store, Path(tmp), rel, DATASET_REJECTED, rejected)
    by_reason = dict(Counter(r["reason"] for r in built.rejected))
    manifest = {
        "name": builder.name,
        "hash": digest,
        "hash_sha256": full_hash,
        "source": source.description,
        "source_sha256": source.fingerprint,
        "counts": {split: len(rows) for split, rows in built.splits.items()},
        "files": {split: f"{split}.parquet" for split in built.splits} | {"rejected": DATASET_REJECTED},
        "rejected": {
            "total": len(built.rejected),
            "by_reason": by_reason,
            "by_split": dict(Counter(r["split"] for r in built.rejected)),
        },
        "settings": settings,
        "length_check": built.length_check,
        "created_at": datetime.now(UTC).isoformat(),
        "prepare_seconds": round(time.perf_counter() - started, 3),
    }
    store.write_text(json.dumps(manifest, indent=2, sort_keys=True), rel, MANIFEST)
    if built.rejected:
        logger.warning(
            "dataset %s %s: %d rows quarantined in %s (by reason: %s)",
            builder.name, digest, len(built.rejected), store.url(rel, DATASET_REJECTED), by_reason,
        )
    logger.info(
        "prepared dataset %s %s at %s: %s in %.2fs",
        builder.name, digest, store.url(rel), manifest["counts"], manifest["prepare_seconds"],
    )
    return manifest


def load_split(dataset: DatasetVersion, split: str, store: Store) -> pd.DataFrame:
    """One prepared split as a DataFrame (verl columns: data_source, prompt, ability, reward_model, extra_info).

    Cells hold plain Python values: `prompt` is a list of {role, content} dicts, `extra_info` a dict
    whose missing values are None (not NaN).
    """
    if split not in dataset.splits:
        raise DataError(
            f"dataset {dataset.name} {dataset.hash} has no split {split!r}; available: {', '.join(dataset.splits)}"
        )
    uri = dataset.splits[split]
    try:
        with store.fs.open(strip_scheme(uri), "rb") as f:
            table = pq.read_table(f)
    except FileNotFoundError:
        raise DataError(
            f"dataset file {uri} is missing; delete {dataset.uri}/{MANIFEST} and prepare the dataset again"
        ) from None
    return pd.DataFrame(table.to_pylist(), columns=table.column_names)


@dataclass(frozen=True)
class BuiltRows:
    """Output of `build_rows`: verl rows per output split, quarantined rows, and the length-check summary."""

    splits: dict[str, list[dict[str, Any]]]
    rejected: list[dict[str, Any]]
    length_check: dict[str, Any]


def build_rows(
    builder: DatasetBuilder,
    records: list[RawRecord],
    system_prompt: str,
    user_template: str,
    cfg: RunConfig,
    tokenizer: Any = None,
) -> BuiltRows:
    """Validate every raw record, check prompt lengths, assign splits (carving val when needed)."""
    rejected: list[dict[str, Any]] = []
    accepted: list[tuple[RawRecord, Problem, list[dict[str, str]]]] = []
    seen: set[str] = set()
    for record in records:
        try:
            problem = builder.to_problem(record)
        except RowRejected as e:
            rejected.append(rejection_row(record, e.reason, e.detail))
            continue
        if problem.uid in seen:
            rejected.append(rejection_row(record, Reason.DUPLICATE_ID, f"id {problem.uid!r} occurs earlier"))
            continue
        seen.add(problem.uid)
        accepted.append((record, problem, chat_messages(system_prompt, user_template, problem.question)))

    max_len = cfg.algorithm.max_prompt_length
    length_check: dict[str, Any] = {"checked": False, "max_prompt_length": max_len, "tokenizer": None}
    if tokenizer is None:
        length_check["note"] = "skipped: no tokenizer given"
    else:
        lengths = prompt_token_counts(tokenizer, [messages for _, _, messages in accepted])
        kept = []
        for (record, problem, messages), n in zip(accepted, lengths, strict=True):
            if n > max_len:
                detail = f"prompt is {n} tokens, over algorithm.max_prompt_length={max_len}"
                rejected.append(rejection_row(record, Reason.PROMPT_TOO_LONG, detail))
            else:
                kept.append((record, problem, messages))
        accepted = kept
        length_check.update(
            checked=True, tokenizer=tokenizer_name(tokenizer), max_prompt_tokens=max(lengths, default=0)
        )

    grouped: dict[str, list[tuple[Problem, list[dict[str, str]]]]] = {s: [] for s in OUTPUT_SPLITS}
    for _, problem, messages in accepted:
        grouped.setdefault(problem.split, []).append((problem, messages))
    if not builder.has_validation:
        grouped["train"], grouped["val"] = carve_validation(grouped["train"], cfg.dataset.val_size, cfg.dataset.seed)

    splits = {
        split: [verl_row(p.data_source or builder.name, builder.ability, m, p, split, i, uses_tool_agent(cfg))
                for i, (p, m) in enumerate(items)]
        for split, items in grouped.items()
    }
    return BuiltRows(splits, rejected, length_check)


def uses_tool_agent(cfg: RunConfig) -> bool:
    """Rows name verl's tool loop (and the search tool's kwargs) when the run has the retrieval-server."""
    return "retrieval" in cfg.services.enabled


def carve_validation(train: list, val_size: int, seed: int) -> tuple[list, list]:
    """Move `val_size` seeded-random rows of train into val; both keep their source order."""
    if val_size >= len(train) and train:
        raise DataError(
            f"dataset.val_size={val_size} leaves no training rows ({len(train)} valid train rows); "
            f"lower dataset.val_size"
        )
    chosen = set(random.Random(seed).sample(range(len(train)), val_size)) if val_size else set()
    return [r for i, r in enumerate(train) if i not in chosen], [r for i, r in enumerate(train) if i in chosen]


def chat_messages(system_prompt: str, user_template: str, question: str) -> list[dict[str, str]]:
    """System message (omitted when the prompt is empty) + the user message rendered from the template."""
    user = {"role": "user", "content": user_template.format(question=question)}
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [user]


def check_user_template(template: str) -> None:
    """`dataset.user_template` must be a str.format template whose only field is `{question}`."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as e:
        raise ConfigError(
            f"dataset.user_template {template!r} is not a valid template ({e}); write literal braces as {{{{ }}}}"
        ) from None
    if fields != {"question"}:
        raise ConfigError(
            f"dataset.user_template {template!r} must contain {{question}} and no other field (found "
            f"{sorted(fields) or 'none'}); write literal braces as {{{{ }}}}"
        )


def prompt_token_counts(tokenizer: Any, conversations: list[list[dict[str, str]]]) -> list[int]:
    """Tokens of each prompt as the model sees it: chat template applied with the generation prompt."""
    if not conversations:
        return []
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"tokenizer {tokenizer_name(tokenizer)!r} has no chat template, but prompts are chat messages; "
            f"use a chat model (model.name) or give its tokenizer a chat_template"
        )
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
    # verbose=False: long prompts are expected here (that is what is measured), not a warning.
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]


def tokenizer_name(tokenizer: Any) -> str | None:
    if tokenizer is None:
        return None
    return getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__


def _chat_template_sha(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    return hashlib.sha256(str(template).encode()).hexdigest() if template else None


def dataset_hash(source_fingerprint: str, settings: dict[str, Any]) -> str:
    """sha256 over the raw source's sha256 and every setting that changes the output rows."""
    blob = json.dumps({"source": source_fingerprint, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def version_from_manifest(store: Store, rel: str, manifest: dict[str, Any]) -> DatasetVersion:
    files = manifest["files"]
    return DatasetVersion(
        name=manifest["name"],
        hash=manifest["hash"],
        uri=store.url(rel),
        splits={split: store.url(rel, files[split]) for split in manifest["counts"]},
        counts=manifest["counts"],
        rejected=manifest["rejected"]["total"],
        rejected_by_reason=manifest["rejected"].get("by_reason", {}),
        source=manifest["source"],
    )


def _write_parquet(store: Store, tmp: Path, rel: str, filename: str, table: pa.Table) -> None:
    local = tmp / filename
    pq.write_table(table, local)
    store.put_file(local, rel, filename)
