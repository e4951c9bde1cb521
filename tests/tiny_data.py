"""Small verl-format datasets written straight into a store, for trainer tests that skip preparation."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from verl_grpo.contracts import DatasetVersion
from verl_grpo.data import gsm8k
from verl_grpo.data.schema import Problem, row_schema, verl_row
from verl_grpo.formats import default_system_prompt
from verl_grpo.store import Store


def write_gsm8k_split(store: Store, mirror: Path, n: int, tag: str) -> DatasetVersion:
    """A prepared-format (verl) gsm8k train split of the first n mirror rows, at datasets/gsm8k/{tag}."""
    rows = []
    with open(mirror / "gsm8k" / "train.jsonl") as f:
        for index, line in zip(range(n), f):
            raw = json.loads(line)
            problem = Problem(uid=f"train/{index}", split="train", question=raw["question"],
                              ground_truth=gsm8k.extract_final_answer(raw["answer"]), extra=raw, position=index)
            messages = [{"role": "system", "content": default_system_prompt("gsm8k")},
                        {"role": "user", "content": raw["question"]}]
            rows.append(verl_row("gsm8k", "math", messages, problem, "train", index))
    table = pa.Table.from_pylist(rows, schema=row_schema(gsm8k.BUILDER.extra_fields))
    rel = f"datasets/gsm8k/{tag}"
    store.fs.makedirs(store.path(rel), exist_ok=True)
    with store.fs.open(store.path(rel, "train.parquet"), "wb") as f:
        pq.write_table(table, f)
    return DatasetVersion(name="gsm8k", hash=tag, uri=store.url(rel),
                          splits={"train": store.url(rel, "train.parquet")}, counts={"train": n})
