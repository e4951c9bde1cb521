"""The held-out eval rows of a run as MLflow 3 GenAI evaluation records: one trace per problem, linked to the run.

MLflow's run page "Traces" tab (route `.../runs/<run>/evaluations`) lists the traces whose metadata
`mlflow.sourceRun` is the run (what `mlflow.genai.evaluate` writes), with their assessments as columns; with
`?compareToRunUuid=<other run>` it puts the other run's trace for the same request beside each row. The UI pairs
the two runs' rows on the trace's request preview (`request_preview`, the JSON of the root span's inputs), so each
trace's inputs are exactly `{"question": ..., "problem_id": ...}`: the question is what a row shows first, and two
runs evaluated on the same problem get the same request and line up.

The UI lists a run's traces newest first, so rows get falling start times in `flips_first`'s order: the problems
whose verdict flipped against the base model (fixed, then broke) lead, tagged `verl_grpo.flip_vs_base`.

Each trace has one root span (inputs: the question, outputs: the model's response), an expectation
(`expected_response`, the ground truth) and two feedbacks from code (`correct`, a bool, and `score`).

Written through the tracing store of an explicit tracking URI (no global tracer, no fluent state): spans are built
on a private OpenTelemetry tracer provider that exports nothing, and the traces go to the store with
`TracingClient.start_trace` (assessments included) and one `log_spans` batch. Trace ids are derived from the MLflow
run, split and problem id, and problems already recorded for the run are skipped, so a retried registration adds
no row twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any
from urllib.parse import quote

import pandas as pd
from mlflow.entities import AssessmentSource, AssessmentSourceType, Expectation, Feedback, SpanType
from mlflow.entities.span import LiveSpan, Span
from mlflow.entities.span_status import SpanStatus, SpanStatusCode
from mlflow.entities.trace_info import TraceInfo
from mlflow.entities.trace_location import TraceLocation
from mlflow.entities.trace_state import TraceState
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import TraceMetadataKey, TraceTagKey
from mlflow.tracking import MlflowClient
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

from verl_grpo import formats

log = logging.getLogger(__name__)

TRACE_NAME = "held_out_eval"
PROBLEM_ID_KEY, SPLIT_KEY = "verl_grpo.problem_id", "verl_grpo.eval_split"
"""Trace metadata: which problem of which split a trace records (what a retry checks before logging)."""
FLIP_TAG = "verl_grpo.flip_vs_base"
"""Trace tag of a problem whose verdict flipped against the base model: `fixed` or `broke`."""
QUESTION, PROBLEM_ID = "question", "problem_id"
"""The keys of a trace's inputs, in this order: the question first (the row's text), then the problem id."""
EXPECTATION, CORRECT, SCORE = "expected_response", "correct", "score"
SOURCE_ID = "verl-grpo"
_PREVIEW_CHARS = 1000
"""The request/response preview MLflow stores (and the UI matches rows on) is cut at this length."""



def question_of(prompt: Any) -> str:
    """The user's question in a prompt: the last user message of a chat message list, else the templated prompt's
    last user turn (verl_grpo.formats.question_of), else the prompt itself, stripped."""
    if isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):
        messages = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        users = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]).strip() if users else ""
    return formats.question_of("" if prompt is None else str(prompt))


def evaluation_compare_url(ui_base: str, experiment_id: str, run_a: str, run_b: str) -> str:
    """The MLflow UI page that shows run `run_a`'s eval rows with run `run_b`'s answer to the same question beside
    each: the run page's Traces (evaluations) tab in compare mode, e.g.
    `http://127.0.0.1:5000/#/experiments/1/runs/<a>/evaluations?compareToRunUuid=<b>`."""
    return (f"{ui_base.rstrip('/')}/#/experiments/{quote(str(experiment_id))}/runs/{quote(run_a)}/evaluations"
            f"?compareToRunUuid={quote(run_b)}")


def request_of(question: str, problem_id: str) -> dict[str, str]:
    """A trace's inputs: the question first, then the problem id (so two runs' rows of one problem match)."""
    return {QUESTION: question, PROBLEM_ID: problem_id}


def recorded_problems(client: MlflowClient, experiment_id: str, mlflow_run_id: str, split: str) -> set[str]:
    """Problem ids of `split` already recorded as traces of the run."""
    store = TracingClient(client.tracking_uri).store  # trace infos only: no spans read
    found, token = set(), None
    while True:
        infos, token = store.search_traces(
            locations=[experiment_id], max_results=500, page_token=token,
            filter_string=f"metadata.`{TraceMetadataKey.SOURCE_RUN}` = '{mlflow_run_id}' "
                          f"AND metadata.`{SPLIT_KEY}` = '{_quoted(split)}'")
        found.update(info.trace_metadata.get(PROBLEM_ID_KEY, "") for info in infos)
        if not token:
            return found - {""}


def flips_first(table: pd.DataFrame, base: pd.DataFrame | None) -> pd.DataFrame:
    """`table` with a `flip` column against the base model's table of the same problems ("fixed": base wrong, this
    model right; "broke": the other way; "" otherwise or without a base), flipped problems first, else in order."""
    out = table.copy()
    if base is None or "correct" not in table or "correct" not in base:
        return out.assign(flip="")
    before = out["id"].map(base.drop_duplicates("id").set_index("id")["correct"])
    now = out["correct"].fillna(False).astype(bool)
    known, was = before.notna(), before.fillna(False).astype(bool)
    out["flip"] = ["fixed" if k and n and not w else "broke" if k and w and not n else ""
                   for k, n, w in zip(known, now, was)]
    order = out["flip"].map({"fixed": 0, "broke": 1, "": 2})
    return out.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def log_eval_records(client: MlflowClient, experiment_id: str, mlflow_run_id: str, table: pd.DataFrame,
                     split: str, base: pd.DataFrame | None = None) -> int:
    """One trace per row of an eval table (columns id, prompt, response, ground_truth, correct, score) in the run's
    experiment, linked to MLflow run `mlflow_run_id`; rows recorded before are skipped. With the base model's table
    `base`, the problems whose verdict flipped against it come first in the UI (fixed, then broke) and carry the
    trace tag `verl_grpo.flip_vs_base`. Returns how many traces it logged."""
    done = recorded_problems(client, experiment_id, mlflow_run_id, split)
    rows = [row for row in flips_first(table, base).to_dict("records") if str(row["id"]) not in done]
    if not rows:
        return 0
    tracing = TracingClient(client.tracking_uri)
    ids = _FixedIds()
    # A private provider: it exports nowhere and touches no global tracer.
    tracer = TracerProvider(resource=Resource({"service.name": SOURCE_ID}), id_generator=ids).get_tracer(__name__)
    now_ns = time.time_ns()
    spans = []
    for n, row in enumerate(rows):
        problem_id = str(row["id"])
        ids.next_trace_id = _trace_number(mlflow_run_id, split, problem_id)
        start_ns = now_ns - (n + 1) * 1_000_000  # the UI lists the newest first: the rows in flips_first's order
        info, span = _trace(tracer, experiment_id, mlflow_run_id, split, row, problem_id, start_ns)
        tracing.start_trace(info)
        spans.append(span)
    for start in range(0, len(spans), 100):
        tracing.log_spans(experiment_id, spans[start : start + 100])
    log.info("MLflow run %s: %d eval records of split %s logged (%d already there)", mlflow_run_id, len(rows),
             split, len(done))
    return len(rows)


def _trace(tracer, experiment_id: str, mlflow_run_id: str, split: str, row: dict, problem_id: str,
           start_ns: int) -> tuple[TraceInfo, Span]:
    inputs = request_of(question_of(row.get("prompt")), problem_id)
    response = _text(row.get("response"))
    otel_span = tracer.start_span(TRACE_NAME, start_time=start_ns)
    trace_id = f"tr-{otel_span.get_span_context().trace_id:032x}"
    live = LiveSpan(otel_span, trace_id, SpanType.CHAIN)
    live.set_inputs(inputs)
    live.set_outputs(response)
    live.set_attributes({"ground_truth": _text(row.get("ground_truth")), "split": split})
    live.set_status(SpanStatus(SpanStatusCode.OK))
    otel_span.end(end_time=start_ns + 1_000_000)
    span = live.to_immutable_span()
    code = AssessmentSource(AssessmentSourceType.CODE, SOURCE_ID)
    assessments = [Expectation(EXPECTATION, _text(row.get("ground_truth")),
                               source=AssessmentSource(AssessmentSourceType.HUMAN, SOURCE_ID))]
    if "correct" in row and not _missing(row["correct"]):
        assessments.append(Feedback(CORRECT, bool(row["correct"]), source=code))
    if "score" in row and not _missing(row["score"]):
        assessments.append(Feedback(SCORE, float(row["score"]), source=code))
    for assessment in assessments:
        assessment.trace_id = trace_id
    info = TraceInfo(
        trace_id=trace_id, trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ns // 1_000_000, execution_duration=1, state=TraceState.OK,
        request_preview=json.dumps(inputs, ensure_ascii=False)[:_PREVIEW_CHARS],
        response_preview=json.dumps(response, ensure_ascii=False)[:_PREVIEW_CHARS],
        client_request_id=f"{split}/{problem_id}",
        trace_metadata={TraceMetadataKey.SOURCE_RUN: mlflow_run_id, PROBLEM_ID_KEY: problem_id, SPLIT_KEY: split},
        tags={TraceTagKey.TRACE_NAME: TRACE_NAME, **({FLIP_TAG: row["flip"]} if row.get("flip") else {})},
        assessments=assessments)
    return info, span


class _FixedIds(IdGenerator):
    """Trace ids chosen by the caller (one per problem and run: a retry writes the same trace), span ids random."""

    def __init__(self):
        self._random = RandomIdGenerator()
        self.next_trace_id = 0

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self.next_trace_id or self._random.generate_trace_id()


def _trace_number(mlflow_run_id: str, split: str, problem_id: str) -> int:
    digest = hashlib.sha256(f"{mlflow_run_id}\0{split}\0{problem_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def _text(value: Any) -> str:
    return "" if _missing(value) else str(value)


def _missing(value: Any) -> bool:
    try:
        return value is None or bool(pd.isna(value))
    except (TypeError, ValueError):  # arrays: not missing
        return False


def _quoted(value: str) -> str:
    return value.replace("'", "\\'")

