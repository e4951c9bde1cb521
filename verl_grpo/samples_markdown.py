"""The training samples as a page a person reads in Prefect: one section per prompt group, the question once, then
each response with its numbers.

Prefect's UI renders markdown artifacts through a sanitizer that drops unknown HTML tags and joins lines, which
would eat `<think>`/`<answer>` and a response's line breaks; inside a fenced code block the text is shown as is
(`<pre><code>`), so every text goes in one. Long lines are wrapped, since a code block does not wrap them and a
response would run off the page's edge.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Sequence
from itertools import groupby
from typing import Any

from verl_grpo.formats import question_of

WRAP_COLUMNS = 100
"""Lines longer than this are wrapped (at spaces where possible) in the page's code blocks."""


def samples_markdown(record: dict[str, Any], run_id: str, full_text: str = "") -> str:
    """A samples.jsonl record (`{"step": N, "samples": [...]}`) as markdown: a heading, where the full text is
    (`full_text`, a markdown line), then one section per prompt group in the record's order."""
    samples = record.get("samples") or []
    groups = [list(group) for _, group in groupby(samples, key=lambda s: s.get("prompt", ""))]
    sizes = sorted({len(g) for g in groups})
    per_group = f"{sizes[0]} to {sizes[-1]}" if len(sizes) > 1 else str(sizes[0]) if sizes else "0"
    lines = [f"# Rollouts of training step {record.get('step')}", "",
             f"Run `{run_id}`: {len(groups)} prompts, {per_group} responses each. `reward` is the weighted total the "
             "policy was trained on, `advantage` GRPO's (reward − group mean) / group std. Long texts are cut and long "
             "lines wrapped.", ""]
    if full_text:
        lines += [full_text, ""]
    for i, group in enumerate(groups, 1):
        lines += _group(i, len(groups), group)
    return "\n".join(lines).rstrip() + "\n"


def full_text_line(mlflow_url: str | None, samples_location: str) -> str:
    """Where the uncut text of every sampled step is: the MLflow run's `train/samples.json` (a link when a UI
    serves the run) and the run's samples.jsonl in the store."""
    run = f"[the MLflow run]({mlflow_url})" if mlflow_url else "the MLflow run"
    return (f"**Full text** of every sampled step: {run}, artifact `train/samples.json`; "
            f"in the store: `{samples_location}`.")


def number(value: Any) -> str:
    """A score as a reader wants it: rounded to 3 decimals (`0.4`, not `0.4000000096857548`); `-` for none."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return str(round(float(value), 3))
    return str(value)


def fenced(text: str, info: str = "text") -> str:
    """`text` in a fenced code block whose fence is longer than any backtick run inside it (a response's own
    ```python block cannot close it), its long lines wrapped."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{wrapped(text)}\n{fence}"


def wrapped(text: str, width: int = WRAP_COLUMNS) -> str:
    """Each line of `text` wrapped to `width` columns; line breaks and indentation kept."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.extend(textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=True,
                                 break_on_hyphens=False, drop_whitespace=True, replace_whitespace=False) or [""])
    return "\n".join(out)


def _group(i: int, n: int, group: Sequence[dict[str, Any]]) -> list[str]:
    names = _component_names(group)
    header = ["response", "reward", "advantage", "truncated", *names]
    lines = [f"## Prompt {i} of {n}", "", fenced(question_of(group[0].get("prompt", ""))), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for j, sample in enumerate(group, 1):
        components = sample.get("components") or {}
        cells = [str(j), number(sample.get("reward")), number(sample.get("advantage")),
                 number(sample.get("truncated")), *(number(components.get(c)) for c in names)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for j, sample in enumerate(group, 1):
        extra = [f"policy v{sample['policy_version']}"] if sample.get("policy_version") is not None else []
        extra += [sample["source"]] if sample.get("source") else []
        title = " · ".join([f"**Response {j}**", f"reward {number(sample.get('reward'))}",
                            f"advantage {number(sample.get('advantage'))}", *extra])
        lines += [title, "", fenced(sample.get("response", "")), ""]
    return lines


def _component_names(group: Iterable[dict[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for sample in group:
        names.update(dict.fromkeys(sample.get("components") or {}))
    return list(names)
