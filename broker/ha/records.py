"""Replication records: a committed store batch as data, and the chain that checks them.

The store's works are callables on ``SqliteBackend`` (partials of its methods, ``Append``
objects, ``SqliteBackend.sweep``). ``describe`` turns each into (operation name, arguments)
and ``rebuild`` turns that back into the same work, so the standby runs a batch through the
same backend methods, in the same order, in one transaction, with the same outcomes (a work
that failed on the primary fails the same way on the standby and is rolled back alone).

Timestamps. The backend stamps rows with its ``clock``; a ``BatchClock`` gives every work of
a batch the time the batch started, and the record carries that time, so both stores hold
the same values.

A record is ``msgpack([term, seq, time, ops])``; ``seq`` counts committed batches from 1.
An append (nearly every operation) is ``["append", [the 9 arguments of Append, in its
constructor's order]]``, read straight off the object and rebuilt positionally: the record
path costs the primary and the standby a few attribute reads per message, not a dict.
The **chain** digest after record n is ``SHA-256(digest(n-1) + record n)`` cut to 16 bytes
(SHA-256 has CPU instructions where BLAKE2b has none: twice as fast here): two stores at
the same seq with the same digest went through the same records. Each store keeps its
position (term, seq, digest) in its ``meta`` table, written by the last work of every
batch, in the batch's transaction, so the position never disagrees with the data.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any

import msgpack

from broker.store.sqlite import Append, SqliteBackend, Work

__all__ = [
    "GENESIS",
    "BatchClock",
    "Position",
    "chain",
    "decode_record",
    "describe",
    "describe_all",
    "encode_record",
    "read_position",
    "rebuild",
    "write_position",
]

#: The digest before the first record.
GENESIS = bytes(16)

#: Backend methods a record may name: every mutation the store queues, nothing else.
_OPERATIONS = frozenset(
    {
        "create_session",
        "set_principal",
        "claim_session",
        "drop_session",
        "set_filters",
        "add_filter",
        "remove_filter",
        "ack",
        "ack_one",
        "trim",
        "trim_through",
        "sweep",
    }
)
#: An Append's arguments in its constructor's order (``Append(*fields)`` rebuilds it).
_APPEND_FIELDS = (
    "msg_id",
    "topic",
    "payload",
    "headers",
    "deliveries",
    "publisher_msg_id",
    "retain",
    "from_retained",
    "extra",
)
_append_fields = attrgetter(*_APPEND_FIELDS)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a store is in the stream: the term and seq of its last record, and the chain."""

    term: int = 0
    seq: int = 0
    digest: bytes = GENESIS


class BatchClock:
    """The backend's clock during replication: one time per batch (``now``), set by the
    owner before each batch (the primary: ``time.time()``; the standby: the record's)."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def describe(work: Work) -> list[Any]:
    """(name, arguments) of a store work; ValueError for a work we cannot ship."""
    if work.__class__ is Append:
        return ["append", _append_fields(work)]
    if isinstance(work, partial) and not work.args:
        name = getattr(work.func, "__name__", "")
        if name in _OPERATIONS and getattr(SqliteBackend, name) is work.func:
            return [name, dict(work.keywords)]
    name = getattr(work, "__name__", "")
    if name in _OPERATIONS and getattr(SqliteBackend, name) is work:
        return [name, {}]
    raise ValueError(f"cannot replicate store work {work!r}")


def describe_all(works: list[Work]) -> list[Any]:
    """``describe`` of each work (appends, nearly all of them, without a call each)."""
    return [
        ["append", _append_fields(work)] if work.__class__ is Append else describe(work)
        for work in works
    ]


def rebuild(op: Any) -> Work:
    """The work that ``describe`` described, from a decoded record (its arrays are tuples:
    ``decode_record``); ValueError for anything else."""
    if op.__class__ is not tuple or len(op) != 2 or op[0].__class__ is not str:
        raise ValueError(f"not an operation: {op!r:.80}")
    name, args = op
    if name == "append":
        if args.__class__ is not tuple or len(args) != len(_APPEND_FIELDS):
            raise ValueError("append needs its 9 fields")
        return Append(*args)
    if name not in _OPERATIONS or not isinstance(args, dict):
        raise ValueError(f"unknown operation {name!r:.80}")
    if name == "set_filters":
        args = {**args, "filters": tuple((f, d) for f, d in args.get("filters", ()))}
    return partial(getattr(SqliteBackend, name), **args)


def encode_record(term: int, seq: int, at: float, ops: list[Any]) -> bytes:
    body: bytes = msgpack.packb([term, seq, at, ops], use_bin_type=True)
    return body


def decode_record(body: bytes) -> tuple[int, int, float, tuple[Any, ...]]:
    """(term, seq, time, ops) of a record, its arrays as tuples (what ``Append`` and the
    backend take as they are); ValueError when it is not one."""
    try:
        term, seq, at, ops = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=False)
    except Exception as exc:  # msgpack raises several types for bad data
        raise ValueError(f"not a replication record ({type(exc).__name__})") from None
    if not (isinstance(term, int) and isinstance(seq, int) and isinstance(ops, tuple)):
        raise ValueError("a replication record is [term, seq, time, ops]")
    return term, seq, float(at), ops


def chain(digest: bytes, record: bytes) -> bytes:
    """The digest after ``record``: SHA-256 of the previous digest and the record, 16 bytes."""
    hasher = hashlib.sha256(digest)
    hasher.update(record)
    return hasher.digest()[:16]


_KEYS = ("ha_term", "ha_seq", "ha_digest")


def read_position(conn: sqlite3.Connection) -> Position:
    """The position stored in a database (all zero for one that never replicated)."""
    rows = dict(
        conn.execute("SELECT key, value FROM meta WHERE key IN (?, ?, ?)", _KEYS).fetchall()
    )
    if not rows:
        return Position()
    return Position(int(rows["ha_term"]), int(rows["ha_seq"]), bytes(rows["ha_digest"]))


def write_position(position: Position, backend: SqliteBackend) -> None:
    """A work (bind ``position`` with partial): the batch's last, in its transaction."""
    backend.conn.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        list(zip(_KEYS, (position.term, position.seq, position.digest), strict=True)),
    )
