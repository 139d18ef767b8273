"""Durable state: messages, sessions, filters and deliveries in SQLite (WAL).

``Store`` (store.py) is the trio API; writes go through one group-commit queue
(group_commit.py) so that a batch of appends and acks is one transaction of the
synchronous SQLite backend (sqlite.py), run in a worker thread. The file's
schema is in schema.py (with its migrations), its settings in pragmas.py, the directory lock in
files.py and the values the store hands out in records.py.
"""

from broker.store.group_commit import Pending
from broker.store.records import (
    NotConfirmed,
    RetainedMessage,
    SessionRecord,
    StoredMessage,
    StoredPrincipal,
    StoreError,
    StoreFull,
    StoreStatistics,
)
from broker.store.schema import DB_FILENAME, SCHEMA_VERSION
from broker.store.store import Store

__all__ = [
    "DB_FILENAME",
    "SCHEMA_VERSION",
    "NotConfirmed",
    "Pending",
    "RetainedMessage",
    "SessionRecord",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreStatistics",
    "StoredMessage",
    "StoredPrincipal",
]
