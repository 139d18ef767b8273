"""The database file's schema: its tables, version and name, created or checked at opening.

What is stored (``<data_dir>/topiary.db``, schema version ``SCHEMA_VERSION``):

- ``messages``: each message once, however many sessions need it. ``refs`` counts the delivery
  rows that point at it; when it reaches 0 the message is deleted at once, or, with
  ``retention_seconds`` > 0, by a periodic sweep once ``stored_at`` is that old. ``retained``
  is 1 for a copy of a retained message stored for a durable session that subscribed (so
  its redeliveries still say they come from the retained store).
- ``sessions``: one row per durable session: its shared group, ``last_ack`` (every seq at or
  below it is done), ``next_seq`` (the next seq the broker may assign) and ``owner``: the
  identity that created it (``Identity.owner``: ``user:NAME``, ``cert:SUBJECT`` or
  ``anonymous``), the only one that may open or drop it; NULL for a shared group (shared by
  design) and for a session stored before owners existed (the first identity to open it
  takes it); ``cert``: the certificate subject the owner's latest connection presented,
  ``''`` for none, NULL when not known (a shared group; a session stored before version 5).
  With ``owner`` it says whose topic ACL rules the session has while its owner is away
  (``SessionRecord.principal``).
- ``filters``: the session's (filter, dialect) pairs, each with ``options``: opaque bytes a
  front end keeps with it (MQTT's subscription options), NULL for a native filter.
- ``deliveries``: the pending queue, one row (client_id, seq, message) per delivery not yet
  acknowledged, trimmed or dropped with its session.
- ``published``: the newest ``dedup_window`` publisher message ids, for duplicate filtering.
- ``retained``: the retained message of each topic (the last one published with the retain
  flag; an empty payload deleted it), loaded into memory at start-up.

``messages.extra`` and ``retained.extra`` hold what a message carries beyond topic, payload,
headers and id (the publisher's QoS, MQTT 5 properties, expiry: ``broker.core.extra``), as an
opaque blob; NULL (the common, native case) when there is nothing to keep.

Versions: 1 had no ``retained`` table and no ``messages.retained``; 2 adds them; 3 adds
``messages.extra``, ``retained.extra`` and ``filters.options`` (NULL in migrated rows); 4 adds
``sessions.owner`` (NULL in migrated rows); 5 adds ``sessions.cert`` (NULL in migrated
rows). A file of an older version is migrated when it is opened (``MIGRATIONS``, in one
transaction); a newer one, or a file that is not a topiary database at all, is refused with
a ``StoreError`` that says so.
"""

from __future__ import annotations

import sqlite3

from broker.store.records import open_failure

__all__ = [
    "DB_FILENAME",
    "MIGRATIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "TABLES",
    "check_or_create_schema",
]

SCHEMA_VERSION = 5
DB_FILENAME = "topiary.db"

_RETAINED = """CREATE TABLE retained (
        topic TEXT PRIMARY KEY,
        msg_id TEXT NOT NULL,
        payload BLOB NOT NULL,
        headers BLOB NULL,
        extra BLOB NULL
    )"""

SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)",
    """CREATE TABLE messages (
        rowid INTEGER PRIMARY KEY,
        msg_id TEXT NOT NULL,
        topic TEXT NOT NULL,
        payload BLOB NOT NULL,
        headers BLOB NULL,
        stored_at REAL NOT NULL,
        refs INTEGER NOT NULL,
        retained INTEGER NOT NULL DEFAULT 0,
        extra BLOB NULL
    )""",
    # Only unreferenced messages (kept for retention_seconds) are in this index.
    "CREATE INDEX messages_unreferenced ON messages (stored_at) WHERE refs <= 0",
    """CREATE TABLE sessions (
        client_id TEXT PRIMARY KEY,
        grp TEXT NULL,
        last_ack INTEGER NOT NULL,
        next_seq INTEGER NOT NULL,
        created_at REAL NOT NULL,
        owner TEXT NULL,
        cert TEXT NULL
    )""",
    """CREATE TABLE filters (
        client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE CASCADE,
        filter TEXT NOT NULL,
        dialect TEXT NOT NULL,
        options BLOB NULL,
        PRIMARY KEY (client_id, filter, dialect)
    )""",
    # No foreign key on `message`: refs keeps that link, and a foreign key would need an index
    # on deliveries(message) to check every message delete.
    """CREATE TABLE deliveries (
        client_id TEXT NOT NULL REFERENCES sessions (client_id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        message INTEGER NOT NULL,
        PRIMARY KEY (client_id, seq)
    ) WITHOUT ROWID""",
    "CREATE TABLE published (msg_id TEXT PRIMARY KEY, at REAL NOT NULL)",
    _RETAINED,
)
TABLES = frozenset(
    {"meta", "messages", "sessions", "filters", "deliveries", "published", "retained"}
)
#: version -> the statements that take a file of that version to the next one.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        # version 2's retained table (3 adds a column to it, below)
        "CREATE TABLE retained (topic TEXT PRIMARY KEY, msg_id TEXT NOT NULL,"
        " payload BLOB NOT NULL, headers BLOB NULL)",
        "ALTER TABLE messages ADD COLUMN retained INTEGER NOT NULL DEFAULT 0",
    ),
    2: (
        "ALTER TABLE messages ADD COLUMN extra BLOB NULL",
        "ALTER TABLE retained ADD COLUMN extra BLOB NULL",
        "ALTER TABLE filters ADD COLUMN options BLOB NULL",
    ),
    3: ("ALTER TABLE sessions ADD COLUMN owner TEXT NULL",),
    4: ("ALTER TABLE sessions ADD COLUMN cert TEXT NULL",),
}


def check_or_create_schema(conn: sqlite3.Connection, path: str) -> None:
    """Create the tables in an empty file (in one transaction, so two openers cannot both
    do it); then check that this is a topiary database of exactly ``SCHEMA_VERSION``."""

    def tables() -> set[str]:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}

    if not tables():
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not tables():  # another process may have won the race
                for statement in SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (SCHEMA_VERSION,),
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    present = tables()
    if "meta" not in present:
        raise open_failure(path, "not a topiary database (no meta table)")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    version = row[0] if row is not None else None
    if not isinstance(version, int):
        raise open_failure(path, f"not a topiary database (schema_version {version!r})")
    if version > SCHEMA_VERSION:
        raise open_failure(
            path,
            f"schema version {version} is newer than this topiary supports "
            f"({SCHEMA_VERSION}); use a newer topiary",
        )
    if version < SCHEMA_VERSION:
        _migrate(conn, path)
        present = tables()
    missing = TABLES - present
    if missing:
        raise open_failure(path, f"tables missing: {', '.join(sorted(missing))}")


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    """Take an older file to ``SCHEMA_VERSION``, one version at a time, in one transaction
    (the version is read again inside it: another opener may have migrated it already)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        while version < SCHEMA_VERSION:
            steps = MIGRATIONS.get(version)
            if steps is None:
                raise open_failure(path, f"unknown older schema version {version}")
            for statement in steps:
                conn.execute(statement)
            version += 1
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
