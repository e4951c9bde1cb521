"""SQuAD v1.1 as a search QA task: questions about Wikipedia articles, scored by exact match.

The mirror holds the dev file (`squad/dev-v1.1.json`, 48 articles, 10,570 questions). It is split by article: every
fifth article (file order, positions 4, 9, 14, ...) is held out as `test`, the rest is `train` (val carved from it),
so no question about a test article's passages is ever trained on. The retrieval corpus (the retrieval-server's
index) is every paragraph of the same file; a row's `passage_id` is the id the index gives its paragraph.

The ground truth is Search-R1's: `{"target": [gold answers]}` (JSON in the string column), every distinct answer
text the annotators gave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from verl_grpo.data.schema import Problem, RawRecord, Reason, RowRejected, non_empty_str, require_object
from verl_grpo.data.sources import DatasetBuilder, HubSplit
from verl_grpo.errors import DataError

MIRROR_FILE = "dev-v1.1.json"
TEST_EVERY = 5
"""Every TEST_EVERY-th article (the last of each group of five) is a test article."""


def article_split(position: int) -> str:
    return "test" if position % TEST_EVERY == TEST_EVERY - 1 else "train"


def read_mirror(mirror: Path) -> list[RawRecord]:
    """One record per question, its split its article's; a file that is not SQuAD JSON is one bad record."""
    path = mirror / MIRROR_FILE
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return [RawRecord("all", 0, "file", raw[:2000].decode("utf-8", errors="replace"), error=f"not JSON: {e}")]
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        return [RawRecord("all", 0, "file", raw[:2000].decode("utf-8", errors="replace"),
                          error="not SQuAD format: no top-level 'data' list of articles")]
    records: list[RawRecord] = []
    positions = {"train": 0, "test": 0}
    for a, article in enumerate(articles):
        split = article_split(a)
        title = str(article.get("title", "")).replace("_", " ") if isinstance(article, dict) else ""
        paragraphs = article.get("paragraphs", []) if isinstance(article, dict) else []
        for p, paragraph in enumerate(paragraphs):
            for qa in paragraph.get("qas", []) if isinstance(paragraph, dict) else []:
                row = {"title": title, "passage_id": f"{a}-{p}", **(qa if isinstance(qa, dict) else {"qa": qa})}
                uid = str(row.get("id") or f"{a}-{p}-{positions[split]}")
                records.append(RawRecord(split, positions[split], uid, json.dumps(row, ensure_ascii=False), data=row))
                positions[split] += 1
    return records


def gold_answers(data: dict[str, Any]) -> list[str]:
    """Every distinct non-blank answer text, in the annotators' order."""
    answers = data.get("answers")
    if not isinstance(answers, list):
        raise RowRejected(Reason.MISSING_ANSWER, "field 'answers' must be a list of {text, answer_start}")
    texts = [a.get("text").strip() for a in answers if isinstance(a, dict) and isinstance(a.get("text"), str)]
    golds = list(dict.fromkeys(t for t in texts if t))
    if not golds:
        raise RowRejected(Reason.MISSING_ANSWER, "no answer has a non-empty 'text'")
    return golds


def to_problem(record: RawRecord) -> Problem:
    data = require_object(record)
    question = non_empty_str(data, "question", Reason.MISSING_QUESTION)
    golds = gold_answers(data)
    return Problem(
        uid=record.uid,
        split=record.split,
        question=question.strip(),
        ground_truth=json.dumps({"target": golds}, ensure_ascii=False),
        extra={"question": question, "title": str(data.get("title", "")), "passage_id": str(data.get("passage_id", "")),
               "answers": golds},
        position=record.position,
    )


def hub_splits(hub_id: str | None) -> list[HubSplit]:
    """None: the article split needs the file's article order, which the hub's flattened rows do not keep."""
    raise DataError("dataset squad is prepared from the SQuAD v1.1 dev file (split by article); put "
                    f"{MIRROR_FILE} in the data mirror's squad/ directory")


BUILDER = DatasetBuilder(
    name="squad",
    ability="qa",
    mirror_files=(MIRROR_FILE,),
    read_mirror=read_mirror,
    hub_splits=hub_splits,
    to_problem=to_problem,
    extra_fields=[("question", pa.string()), ("title", pa.string()), ("passage_id", pa.string()),
                  ("answers", pa.list_(pa.string()))],
    has_validation=False,
)
