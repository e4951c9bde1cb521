"""Search-R1's NQ + HotpotQA (`PeterJinGo/nq_hotpotqa_train`): open-domain questions about Wikipedia, exact match.

The rows verl's Search-R1 recipe trains on (examples/data_preprocess/preprocess_search_r1_dataset.py of
volcengine/verl): the hub repo's `train.parquet` and `test.parquet`, whose rows hold `question`, `golden_answers`,
`data_source` (`nq` or `hotpotqa`) and `reward_model.ground_truth.target`. A mirror is those two files, downloaded, in
the data mirror's `nq_hotpotqa/` directory; without them `source=auto` reads the hub. Val is carved from train.

The ground truth is Search-R1's `{"target": [gold answers]}` (JSON in the string column): reward_model's target as
verl keeps it, else golden_answers; every distinct answer the QA reward can match (one that normalizes to nothing,
such as `the`, is left out; a row left with none is quarantined).

`data_source` is verl's tag, `searchR1_<source>` (`searchR1_nq`, `searchR1_hotpotqa`), not the dataset's name: our
reward dispatcher scores every `searchR1_*` name as QA (the run's reward, verl's custom_reward_function included),
verl's validation metrics, keyed by data_source, report NQ and HotpotQA apart, and the rows keep the names verl's own
`default_compute_score` routes to `search_r1_like_qa_em`. That scorer reads `ground_truth["target"]` from a dict,
while the rows hold the ground truth as JSON text (one string column for every dataset): to score with it, decode
the JSON first. A row without a source is tagged `nq_hotpotqa`.

The questions are about all of Wikipedia (Search-R1's wiki-18 corpus), which no retrieval-server index of ours holds:
with the search tool the run asks a Search-R1 retriever (services.retrieval.url).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_grpo.data.schema import Problem, RawRecord, Reason, RowRejected, non_empty_str, require_object
from verl_grpo.data.sources import DatasetBuilder, HubSplit, read_parquet

NAME = "nq_hotpotqa"
HUB_ID = "PeterJinGo/nq_hotpotqa_train"
SPLITS = ("train", "test")
MIRROR_FILES = tuple(f"{split}.parquet" for split in SPLITS)


def read_mirror(mirror: Path) -> list[RawRecord]:
    return [record for split in SPLITS for record in read_parquet(mirror / f"{split}.parquet", split)]


def hub_splits(hub_id: str | None) -> list[HubSplit]:
    hub = hub_id or HUB_ID
    return [HubSplit(hub, None, split, split) for split in SPLITS]


def gold_answers(data: dict[str, Any]) -> list[str]:
    """The distinct answers of reward_model.ground_truth.target, else of golden_answers (the first that has one)."""
    from verl_grpo.rewards.qa import normalize_answer  # the reward's own; at call time: rewards import math-verify

    reward_model = data.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    for answers in (truth.get("target") if isinstance(truth, dict) else None, data.get("golden_answers")):
        texts = [answers] if isinstance(answers, str) else answers if isinstance(answers, list) else []
        golds = list(dict.fromkeys(t.strip() for t in texts if isinstance(t, str) and normalize_answer(t)))
        if golds:
            return golds
    raise RowRejected(Reason.MISSING_ANSWER, "neither reward_model.ground_truth.target nor golden_answers holds a "
                                             "non-blank answer")


def data_source(source: str) -> str:
    """verl's tag of a row's source (`nq` → `searchR1_nq`); the dataset's name for a row without one."""
    from verl_grpo.rewards.scoring import SEARCH_R1_PREFIX

    return SEARCH_R1_PREFIX + source if source else NAME


def to_problem(record: RawRecord) -> Problem:
    data = require_object(record)
    question = non_empty_str(data, "question", Reason.MISSING_QUESTION)
    golds = gold_answers(data)
    source = str(data.get("data_source") or "").strip()
    return Problem(
        uid=record.uid,
        split=record.split,
        question=question.strip(),
        ground_truth=json.dumps({"target": golds}, ensure_ascii=False),
        extra={"question": question, "answers": golds, "source": source, "id": str(data.get("id") or "")},
        position=record.position,
        data_source=data_source(source),
    )


BUILDER = DatasetBuilder(
    name=NAME,
    ability="qa",
    mirror_files=MIRROR_FILES,
    read_mirror=read_mirror,
    hub_splits=hub_splits,
    to_problem=to_problem,
    extra_fields=[("question", pa.string()), ("answers", pa.list_(pa.string())), ("source", pa.string()),
                  ("id", pa.string())],
    has_validation=False,
)
