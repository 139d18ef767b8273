"""Durable state: messages, sessions, filters and deliveries in SQLite (WAL).

``Store`` is the trio API; writes go through one group-commit queue so that a
batch of appends and acks is one transaction.
"""

from broker.store.store import (
    DB_FILENAME,
    SCHEMA_VERSION,
    Pending,
    SessionRecord,
    Store,
    StoredMessage,
    StoreError,
    StoreStatistics,
)

__all__ = [
    "DB_FILENAME",
    "SCHEMA_VERSION",
    "Pending",
    "SessionRecord",
    "Store",
    "StoreError",
    "StoreStatistics",
    "StoredMessage",
]
