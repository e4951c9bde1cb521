"""A local MLflow store that moved with its state dir: its artifact paths rewritten to where it is now.

MLflow keeps every artifact location as an absolute URI in its database (experiments, runs, logged models, model
versions, traces). A state dir copied or moved elsewhere would still point there, so a server started over the copy
would read, and write, the original's files. The SQLite store's artifacts live beside it (`mlartifacts/`,
tracking.artifact_location); whatever root the database names for them is rewritten to that one, before anything
reads the store (`verl-grpo home`, which `make serve` runs, and each registration).
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

log = logging.getLogger(__name__)

ARTIFACTS_DIR = "mlartifacts"


def artifacts_root(db: Path) -> str:
    """The URI of the artifact root beside a SQLite store: `file:///<dir of the db>/mlartifacts`."""
    return (db.parent.resolve() / ARTIFACTS_DIR).as_uri()


def relocate_artifacts(tracking_uri: str) -> str | None:
    """Rewrite the artifact root a moved SQLite store still names to the one beside it; returns the old root when
    it rewrote one, None when nothing had moved (or the store is a server, or does not exist yet)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri.removeprefix("sqlite:///")).expanduser()
    if not db.is_file():
        return None
    new = artifacts_root(db)
    with closing(sqlite3.connect(db, timeout=30)) as conn:
        if not _has_table(conn, "experiments"):
            return None
        old = _recorded_root(conn)
        if old is None or old == new:
            return None
        with conn:  # one transaction: every table moves, or none
            for table, column in _text_columns(conn):
                conn.execute(f'UPDATE "{table}" SET "{column}" = ? || substr("{column}", ?) '
                             f'WHERE substr("{column}", 1, ?) = ?', (new, len(old) + 1, len(old), old))
    log.info("MLflow store %s moved: artifact paths %s rewritten to %s", db, old, new)
    return old


def _recorded_root(conn: sqlite3.Connection) -> str | None:
    """The `.../mlartifacts` root the experiments' locations name (the first one that names such a root)."""
    marker = f"/{ARTIFACTS_DIR}/"
    for (location,) in conn.execute("SELECT artifact_location FROM experiments ORDER BY experiment_id"):
        if location and location.startswith("file://") and marker in location:
            return location[: location.index(marker) + len(marker) - 1]
    return None


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _text_columns(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """Every text column of the store's tables (locations sit in several: artifact_location, artifact_uri, source,
    storage_location, trace tags)."""
    tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return [(table, column) for table in tables
            for _, column, kind, *_ in conn.execute(f'PRAGMA table_info("{table}")')
            if any(word in kind.upper() for word in ("CHAR", "TEXT", "CLOB"))]
