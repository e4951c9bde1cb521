"""MLflow's evaluation view as a person sees it: the rows of a run's traces tab in compare mode
(`verl_grpo.registry.eval_records.evaluation_compare_url`), read from a page `browser.rendered_dom` rendered.

The DOM markers relied on (MLflow 3.17's GenAI traces table):
- a row is an element with `role="row"`, its cells `role="cell"`; a cell's column is named by the CSS variable in its
  inline style, `flex: ... var(--col-<column>-size)`: `request`, `trace_id`, `response`,
  `<name>_assessment_column` (a feedback), `<name>_expectation_column` (an expectation);
- the request cell's text is the link `data-component-id="mlflow.evaluations_review.table_ui.evaluation_id_link"`
  (the trace's request preview: our `{"question": ..., "problem_id": ...}`);
- in compare mode a cell holds one value per run, current run first: the response cell one `<div title=...>` per
  run (the title is the whole response), the trace id cell one `role="status"` tag per run (title: the trace id),
  an assessment cell one value per run ("True"/"False" for a boolean feedback).
The table is virtualized: only the rows drawn in the window (about twenty at 1600x1300) are in the DOM.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

_COLUMN = re.compile(r"var\(--col-(.+?)-size\)")
_REQUEST_LINK = "mlflow.evaluations_review.table_ui.evaluation_id_link"
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class ComparedRow:
    """One row of the evaluation table: the request (question) and, per run shown, its trace, response, verdicts."""

    request: str = ""
    trace_ids: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    assessments: dict[str, list[str]] = field(default_factory=dict)
    expectations: dict[str, list[str]] = field(default_factory=dict)

    @property
    def question(self) -> str:
        """The `question` of a request as eval_records writes it (the request text when it is not that JSON)."""
        try:
            inputs = json.loads(self.request)
        except ValueError:
            return self.request
        return str(inputs.get("question", self.request)) if isinstance(inputs, dict) else self.request

    @property
    def answers(self) -> list[str]:
        """The responses as the model wrote them (the response cells show each as its JSON preview)."""
        out = []
        for text in self.responses:
            try:
                value = json.loads(text)
            except ValueError:
                value = text
            out.append(value if isinstance(value, str) else text)
        return out

    @property
    def compared(self) -> bool:
        """Both runs' answers are on this row."""
        return len(self.trace_ids) >= 2 and len(self.responses) >= 2


class _Rows(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows: list[ComparedRow] = []
        self._stack: list[tuple[str, dict]] = []  # (tag, attrs) of open elements
        self._cell: str | None = None
        self._cell_depth = 0
        self._values: list[str] = []  # the cell's value texts (assessment/expectation cells)
        self._leaf: list[str] | None = None
        self._leaf_depth = 0
        self._in_link = False
        self._link_depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in _VOID:
            return
        self._stack.append((tag, a))
        depth = len(self._stack)
        if a.get("role") == "row":
            self.rows.append(ComparedRow())
        elif a.get("role") == "cell" and self.rows and self._cell is None:
            found = _COLUMN.search(a.get("style", ""))
            self._cell, self._cell_depth, self._values = (found.group(1) if found else ""), depth, []
        elif self._cell is not None:
            row = self.rows[-1]
            if self._cell == "request" and a.get("data-component-id") == _REQUEST_LINK:
                self._in_link, self._link_depth = True, depth
            elif self._cell == "trace_id" and a.get("role") == "status" and a.get("title"):
                row.trace_ids.append(a["title"])
            elif self._cell == "response" and tag == "div" and "title" in a:
                row.responses.append(a["title"] or "")
            elif self._cell.endswith(("_assessment_column", "_expectation_column")) and tag == "span":
                self._leaf, self._leaf_depth = [], depth

    def handle_endtag(self, tag):
        if tag in _VOID or not self._stack:
            return
        depth = len(self._stack)
        if self._leaf is not None and depth == self._leaf_depth:
            text = " ".join("".join(self._leaf).split())
            if text:
                self._values.append(text)
            self._leaf = None
        if self._in_link and depth == self._link_depth:
            self._in_link = False
        if self._cell is not None and depth == self._cell_depth:
            row, name = self.rows[-1], self._cell
            for suffix, into in (("_assessment_column", row.assessments), ("_expectation_column", row.expectations)):
                if name.endswith(suffix):
                    into[name.removesuffix(suffix)] = self._values
            self._cell = None
        self._stack.pop()

    def handle_data(self, data):
        if self._in_link:
            self.rows[-1].request += data
        if self._leaf is not None:
            self._leaf.append(data)


def comparison_rows(dom: str) -> list[ComparedRow]:
    """The data rows of an evaluation table (rows with a request), in page order."""
    parser = _Rows()
    parser.feed(dom)
    rows = [row for row in parser.rows if row.request.strip()]
    for row in rows:
        row.request = row.request.strip()
    return rows
