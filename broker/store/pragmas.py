"""The connection's settings and the integrity check, run once when the store opens its file.

Durability. ``journal_mode=WAL`` with ``synchronous=FULL``: the WAL is fsynced at every commit,
so a call that returned survives SIGKILL of the process and a power loss or kernel crash of
the machine. With ``synchronous=NORMAL`` a WAL database fsyncs only at checkpoints: a commit
that returned would still survive SIGKILL (the data is in the OS page cache), but a power loss
or OS crash could roll back the last transactions, i.e. lose messages the broker had already
confirmed to their publishers; the database would stay consistent, just older. The broker
promises publishers more than that, so FULL.

Opening checks the file with ``PRAGMA quick_check`` (reads every page, so about a second per
GB); any problem raises ``StoreError`` with one line naming the file and the problem, never a
sqlite3 traceback.
"""

from __future__ import annotations

import sqlite3

from broker.store.records import open_failure

__all__ = ["configure"]


def configure(conn: sqlite3.Connection, path: str, *, durable: bool) -> None:
    """Switch to WAL, set ``synchronous`` (FULL, or OFF with ``durable=False`` for tests that
    do not crash the machine) and foreign keys, and refuse a damaged file."""
    try:
        (mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
    except sqlite3.OperationalError as exc:
        raise open_failure(path, "SQLite cannot open it", exc) from None
    except sqlite3.DatabaseError as exc:
        raise open_failure(path, "not a SQLite database, or damaged", exc) from None
    if str(mode).lower() != "wal":
        raise open_failure(path, f"cannot switch to WAL mode (journal_mode is {mode})")
    conn.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
    conn.execute("PRAGMA fullfsync=ON")  # macOS: a real flush to the medium; elsewhere no-op
    conn.execute("PRAGMA foreign_keys=ON")
    try:
        problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
    except sqlite3.DatabaseError as exc:
        raise open_failure(path, "the database is damaged", exc) from None
    if problems != ["ok"]:
        first = " ".join(str(problems[0]).split())
        raise open_failure(
            path, f"the database is damaged (quick_check: {len(problems)} problems: {first})"
        )
