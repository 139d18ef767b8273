"""What the store hands out: its error and the frozen values it returns."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

__all__ = [
    "RetainedMessage",
    "SessionRecord",
    "StoreError",
    "StoreFull",
    "StoreStatistics",
    "StoredMessage",
    "StoredPrincipal",
    "open_failure",
    "stored_principal",
]


class StoreError(Exception):
    """The store cannot do what was asked: unknown session, damaged file, store closed, ..."""


class NotConfirmed(StoreError):
    """Committed here, but not to be confirmed: this broker may not accept writes now (a
    fenced hot-spare primary). The publisher should send it again to the broker that may."""


class StoreFull(StoreError):
    """Nothing of the batch was stored: the disk refused the write (full, a quota or a file
    size limit reached, or a failing device). Not confirmed to anyone; the same request may
    succeed once space is freed, and the store serves reads meanwhile."""


#: SQLite's (extended) result codes of a write the disk refused: SQLITE_FULL (ENOSPC), and
#: the I/O errors of writing, syncing and resizing files (EFBIG past RLIMIT_FSIZE, EDQUOT).
_WRITE_REFUSED = frozenset(
    {
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_IOERR_WRITE,
        sqlite3.SQLITE_IOERR_FSYNC,
        sqlite3.SQLITE_IOERR_DIR_FSYNC,
        sqlite3.SQLITE_IOERR_TRUNCATE,
    }
)


def write_refused(exc: BaseException | None) -> bool:
    """Whether ``exc`` (a ``sqlite3.Error``, or one it caused) is the disk refusing a write."""
    while exc is not None:
        if getattr(exc, "sqlite_errorcode", None) in _WRITE_REFUSED:
            return True
        exc = exc.__cause__
    return False


def open_failure(path: str, problem: str, exc: BaseException | None = None) -> StoreError:
    """One line naming the file and the problem, never a sqlite3 traceback."""
    detail = f" ({exc})" if exc is not None else ""
    return StoreError(f"cannot open {path}: {problem}{detail}")


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One pending delivery of a session, with its message (``retained``: a copy of a
    retained message, sent because the session subscribed; ``extra``: the blob stored with
    it, for ``broker.core.extra.apply_extra``, None when there was none)."""

    seq: int
    msg_id: str
    topic: str
    payload: bytes
    headers: dict[str, str] | None
    retained: bool = False
    extra: bytes | None = None


@dataclass(frozen=True, slots=True)
class RetainedMessage:
    """The retained message of one topic, as stored (``extra`` as in ``StoredMessage``)."""

    topic: str
    msg_id: str
    payload: bytes
    headers: dict[str, str] | None
    extra: bytes | None = None


@dataclass(frozen=True, slots=True)
class StoredPrincipal:
    """Who owns a durable session, as far as its topic ACL rules go while the owner is away:
    the user name (None: a certificate or anonymous owner) and the certificate subject the
    owner's latest connection presented (None: none). The groups are not stored: they come
    from the users file in force (``broker.security.principals``)."""

    user: str | None
    cert: str | None


def stored_principal(owner: str | None, cert: str | None) -> StoredPrincipal | None:
    """The principal of a session from its ``owner`` and ``cert`` columns (schema.py), or
    None when they do not say: no owner (a shared group, a session stored before owners),
    or a user's session stored before version 5 (whether it had a certificate is not
    known). A certificate owner and ``anonymous`` say it all by themselves."""
    if owner is None:
        return None
    if owner == "anonymous":
        return StoredPrincipal(None, None)
    kind, _, name = owner.partition(":")
    if kind == "cert":
        return StoredPrincipal(None, name)
    if kind != "user" or cert is None:
        return None
    return StoredPrincipal(name, cert or None)


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A durable session as stored.

    ``pending`` counts its delivery rows and ``pending_bytes`` sums their payload sizes (a
    message shared with other sessions counts for each of them). ``filter_options`` maps a
    (filter, dialect) of ``filters`` to the options stored with it (``Store.add_filter``);
    only filters that have some are in it. ``owner`` is the identity that owns the session
    (``Identity.owner``), None for a shared group or a session stored before owners existed;
    ``principal`` is whose topic ACL rules it has while away (``stored_principal``).
    """

    client_id: str
    group: str | None
    last_ack: int
    next_seq: int
    filters: tuple[tuple[str, str], ...]  # (filter, dialect), sorted
    pending: int
    pending_bytes: int
    filter_options: dict[tuple[str, str], bytes] = field(default_factory=dict, hash=False)
    owner: str | None = None
    principal: StoredPrincipal | None = None


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """Counters for operators; ``operations`` counts those of committed batches, failed or not."""

    batches_committed: int
    operations: int
    operations_failed: int
    mean_batch_size: float
    max_batch_size: int
    last_commit_ms: float
    queued_operations: int  # waiting in the queue for the writer
    callers_waiting_for_room: int  # backpressure: callers blocked because the queue is full
    db_size_bytes: int  # the database file plus its WAL
    sessions: int
    messages: int
    deliveries: int
    dedup_ids: int
    duplicates: int  # appends refused as duplicates since the store was opened
