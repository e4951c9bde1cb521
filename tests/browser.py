"""Pages as a person sees them: Debian's headless Chromium (`make test` installs it) renders a URL, JavaScript
included, and the tests read the rendered DOM: the tables a UI drew, the chart sections in their order.

Chromium runs with a profile of its own in a temporary directory and its background networking off (no update
checks, no sync, no metrics), so a test's page loads reach only the loopback servers they name."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps"]
WINDOW = (1600, 1300)
RENDER_BUDGET_MS = 20_000
"""Virtual time a page gets to fetch its data and draw (Chromium ends earlier once the page is idle)."""


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("headless Chromium is missing: `make test` installs Debian's `chromium` (apt-get install chromium)")
    return path


def _chromium(url: str, *args: str, window: tuple[int, int] = WINDOW, timeout_s: float = 120) -> str:
    with tempfile.TemporaryDirectory(prefix="verl-grpo-chromium-") as profile:
        done = subprocess.run([chromium(), *FLAGS, f"--window-size={window[0]},{window[1]}", f"--user-data-dir={profile}",
                               f"--virtual-time-budget={RENDER_BUDGET_MS}", *args, url],
                              capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"chromium failed on {url}: {done.stderr[-2000:]}"
    return done.stdout


def rendered_dom(url: str, window: tuple[int, int] = WINDOW) -> str:
    """The page's DOM once its scripts have run (`--dump-dom`), drawn in a window of `window` pixels."""
    return _chromium(url, "--dump-dom", window=window)


def screenshot(url: str, path: Path, window: tuple[int, int] = WINDOW) -> Path:
    _chromium(url, f"--screenshot={path}", window=window)
    assert path.is_file() and path.stat().st_size > 0, f"no screenshot of {url}"
    return path


@dataclass
class Table:
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)

    def column(self, name: str) -> list[str]:
        i = self.headers.index(name)
        return [row[i] for row in self.rows if i < len(row)]


class _Tables(HTMLParser):
    """Tables drawn as HTML tables (`th`/`td`, Prefect's UI) or as ARIA grids (`role=columnheader|cell`, MLflow's)."""

    def __init__(self):
        super().__init__()
        self.tables: list[Table] = []
        self._cell: list[str] | None = None
        self._cell_is_header = False
        self._depth = 0
        self._cell_depth = 0

    def handle_starttag(self, tag, attrs):
        self._depth += 1
        role = dict(attrs).get("role")
        if tag == "table" or role in ("table", "grid"):
            self.tables.append(Table())
        elif self.tables and (tag == "tr" or role == "row"):
            self.tables[-1].rows.append([])
        elif self.tables and self._cell is None and (tag in ("th", "td") or role in ("columnheader", "cell")):
            self._cell, self._cell_depth = [], self._depth
            self._cell_is_header = tag == "th" or role == "columnheader"

    def handle_endtag(self, tag):
        if self._cell is not None and self._depth == self._cell_depth:
            text = " ".join("".join(self._cell).split())
            table = self.tables[-1]
            if self._cell_is_header:
                table.headers.append(text)
            elif table.rows:
                table.rows[-1].append(text)
            self._cell = None
        self._depth -= 1

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


_VOID = re.compile(r"<(area|base|br|col|embed|hr|img|input|link|meta|source|track|wbr)\b([^>]*?)/?>", re.I)


def tables(dom: str) -> list[Table]:
    """Every table of a rendered page with its header texts and its data rows (rows without cells dropped)."""
    parser = _Tables()
    parser.feed(_VOID.sub("", dom))  # void elements have no end tag: they would unbalance the depth count
    for table in parser.tables:
        table.rows = [row for row in table.rows if row]
    return [table for table in parser.tables if table.headers or table.rows]


def chart_sections(dom: str) -> list[tuple[str, int]]:
    """The chart sections of an MLflow run page's metric tab, in page order: (name, number of charts); MLflow draws
    each section's header as its name followed by `(N)`."""
    return [(name, int(n)) for name, n in re.findall(r">([^<>]+)</div><div[^>]*>\((\d+)\)</div>", dom)]


class _GridRows(HTMLParser):
    """ag-Grid's rows (MLflow's runs table): `role=row` elements with a `row-id`, cells with a `col-id`. A row's
    pinned and scrolling parts are separate elements with the same row-id; their cells are merged."""

    def __init__(self):
        super().__init__()
        self.rows: dict[str, dict[str, str]] = {}
        self._stack: list[tuple[str | None, str | None]] = []  # (row-id, col-id) each open element starts
        self._text: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        row = attrs.get("row-id") if attrs.get("role") == "row" else None
        col = attrs.get("col-id") if attrs.get("role") == "gridcell" else None
        if col is not None and self._text is None:
            self._text = []
        else:
            col = None
        self._stack.append((row, col))

    def handle_endtag(self, tag):
        if not self._stack:
            return
        _, col = self._stack.pop()
        if col is not None:
            row = next((r for r, _ in reversed(self._stack) if r is not None), None)
            if row is not None:
                self.rows.setdefault(row, {})[col] = " ".join("".join(self._text or []).split())
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text.append(data)


def grid_rows(dom: str) -> dict[str, dict[str, str]]:
    """MLflow's runs table as drawn: {row id (the MLflow run id): {column id (`metrics.\\`eval.accuracy\\``): text}}.
    ag-Grid draws only the columns in view: render it in a window wide enough for those a test reads."""
    parser = _GridRows()
    parser.feed(_VOID.sub("", dom))
    return parser.rows


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[dict[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append({k: v or "" for k, v in attrs})


def links(dom: str) -> list[dict[str, str]]:
    """Every link of a rendered page, as its attributes (`href`, `title`, ...), in page order."""
    parser = _Links()
    parser.feed(dom)
    return parser.links
