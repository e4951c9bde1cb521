"""reasoning-gym's procedural tasks (dataset.name=reasoning_gym), generated offline by the library.

One generator is reasoning-gym's dataset of that name; several are its `composite` dataset, which draws each row's
generator by weight. Train rows come from `dataset.reasoning_gym.seed`, held-out rows from `test_seed`, a seed range
disjoint from the train rows' (reasoning-gym seeds row i with seed + i); a held-out row whose question also occurs in
train is quarantined (`in_train`), as is one repeating an earlier held-out question (`duplicate_question`), so the
held-out split is distinct problems none of which is trained on.

A row's ground truth is the library's entry, `{"answer", "metadata"}` as JSON: what its `score_answer` reads
(verl_grpo.rewards.reasoning_gym). Its data_source is `reasoning_gym/<generator>`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_grpo.config import DatasetConfig
from verl_grpo.config.schema import ReasoningGymConfig
from verl_grpo.data.schema import Problem, RawRecord, Reason, RowRejected, non_empty_str, require_object
from verl_grpo.data.sources import DatasetBuilder, RawSource
from verl_grpo.errors import DataError
from verl_grpo.rewards.reasoning_gym import LIBRARY, library

DATA_SOURCE_PREFIX = "reasoning_gym/"
"""A row's data_source: this prefix and its generator's name."""


def generator_dataset(rg: ReasoningGymConfig, size: int, seed: int):
    """reasoning-gym's dataset of `size` rows from `seed`: the one generator, or the weighted composite of several.
    A generator name or knob the library rejects fails in one DataError line naming it."""
    lib = library()
    from reasoning_gym.factory import DATASETS

    for i, task in enumerate(rg.tasks):
        if task.name not in DATASETS:
            close = sorted(n for n in DATASETS if task.name.split("_")[0] in n)[:6]
            hint = f" (close: {', '.join(close)})" if close else ""
            raise DataError(f"dataset.reasoning_gym.tasks[{i}].name={task.name!r} is no reasoning-gym generator"
                            f"{hint}; see reasoning_gym.factory.DATASETS for the {len(DATASETS)} names")
        _check_knobs(i, task.name, task.config, DATASETS[task.name][1])
    try:
        if len(rg.tasks) == 1:
            return lib.create_dataset(rg.tasks[0].name, size=size, seed=seed, **rg.tasks[0].config)
        from reasoning_gym.composite import DatasetSpec

        specs = [DatasetSpec(name=t.name, weight=t.weight, config=dict(t.config)) for t in rg.tasks]
        return lib.create_dataset("composite", size=size, seed=seed, datasets=specs)
    except (AssertionError, ValueError, TypeError) as e:
        names = ", ".join(t.name for t in rg.tasks)
        raise DataError(f"dataset.reasoning_gym.tasks ({names}): reasoning-gym rejects the config "
                        f"({type(e).__name__}: {e or 'a check failed'}); fix the generator's knobs") from None


def _check_knobs(index: int, name: str, config: dict[str, Any], config_cls: type) -> None:
    import dataclasses

    knobs = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("size", "seed")]
    unknown = sorted(set(config) - set(knobs))
    if unknown:
        raise DataError(f"dataset.reasoning_gym.tasks[{index}].config: {name} has no knob {', '.join(unknown)} "
                        f"(its knobs: {', '.join(knobs)})")


def entry_json(entry: dict[str, Any]) -> str:
    return json.dumps(entry, ensure_ascii=False, sort_keys=True, default=_plain)


def _plain(value: Any) -> Any:
    """JSON for what reasoning-gym's metadata holds besides JSON types (sets, tuples are lists already)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def generate(rg: ReasoningGymConfig) -> list[RawRecord]:
    """Train rows from seed, held-out rows from the held-out seed, each as the library's entry."""
    records: list[RawRecord] = []
    for split, size, seed in (("train", rg.train_size, rg.seed), ("test", rg.test_size, rg.held_out_seed)):
        dataset = generator_dataset(rg, size, seed)
        for i in range(size):
            entry = dataset[i]
            row = {"question": entry.get("question"), "answer": entry.get("answer"),
                   "metadata": entry.get("metadata") or {}}
            raw = entry_json(row)
            records.append(RawRecord(split, i, f"{split}/{seed + i}", raw, json.loads(raw)))
    return records


def load_source(dcfg: DatasetConfig, endpoint_url: str | None = None) -> RawSource:
    """The generated rows; their fingerprint is the generator settings and the library's version (the rows are a
    function of both)."""
    rg = dcfg.reasoning_gym
    generator_dataset(rg, 1, rg.seed)  # an unknown generator or knob fails here, before any generation
    from importlib.metadata import version

    settings = {"library": version(LIBRARY), **rg.model_dump(mode="json")}
    fingerprint = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    names = "+".join(t.name for t in rg.tasks)
    return RawSource(description=f"{LIBRARY}:{names}", fingerprint=fingerprint,
                     read_records=lambda: _without_train_questions(generate(rg)))


def _without_train_questions(records: list[RawRecord]) -> list[RawRecord]:
    """Held-out rows asking a train question, or a question an earlier held-out row asks, are marked, to be
    quarantined by to_problem (`in_train`, `duplicate_question`): the held-out split is distinct unseen problems."""
    train = {r.data["question"] for r in records if r.split == "train"}
    held_out: set[str] = set()
    out = []
    for r in records:
        if r.split == "test":
            question = r.data["question"]
            reason = Reason.IN_TRAIN if question in train else Reason.DUPLICATE_QUESTION if question in held_out \
                else None
            held_out.add(question)
            if reason is not None:
                r = RawRecord(r.split, r.position, r.uid, r.raw, {**r.data, SEEN: str(reason)})
        out.append(r)
    return out


SEEN = "_seen"
"""Marks (in the parsed row, not its raw text) a held-out row whose question was asked before, with the reason."""
_SEEN_DETAIL = {
    Reason.IN_TRAIN: "a train row asks the same question; the held-out split never does",
    Reason.DUPLICATE_QUESTION: "an earlier held-out row asks the same question",
}


def to_problem(record: RawRecord) -> Problem:
    data = require_object(record)
    if seen := data.get(SEEN):
        raise RowRejected(Reason(seen), _SEEN_DETAIL[Reason(seen)])
    question = non_empty_str(data, "question", Reason.MISSING_QUESTION)
    answer = data.get("answer")
    if answer is None or not str(answer).strip():
        raise RowRejected(Reason.MISSING_ANSWER, "the generator gave no answer")
    metadata = data.get("metadata") or {}
    generator = str(metadata.get("source_dataset") or "unknown")
    return Problem(uid=record.uid, split=record.split, question=question.strip(),
                   ground_truth=entry_json({"answer": str(answer), "metadata": metadata}),
                   extra={"question": question, "answer": str(answer), "generator": generator},
                   position=record.position, data_source=DATA_SOURCE_PREFIX + generator)


def builder(dcfg: DatasetConfig) -> DatasetBuilder:
    return DatasetBuilder(
        name=dcfg.task_name,
        ability="reasoning",
        mirror_files=(),
        read_mirror=_no_mirror,
        hub_splits=_no_hub,
        to_problem=to_problem,
        extra_fields=[("question", pa.string()), ("answer", pa.string()), ("generator", pa.string())],
        has_validation=False,
        load=load_source,
    )


def _no_mirror(mirror: Path) -> list[RawRecord]:
    raise DataError("dataset.name=reasoning_gym generates its rows; it reads no data mirror")


def _no_hub(hub_id: str | None) -> list:
    raise DataError("dataset.name=reasoning_gym generates its rows; it reads nothing from the Hugging Face hub")
