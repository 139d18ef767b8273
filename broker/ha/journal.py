"""The standby's journal: records made durable before they are applied to its store.

The standby acknowledges a record once it is durable on its disk. Writing it to a journal
file (appended, then one ``fdatasync`` for every record that arrived together) makes it
durable in a fraction of the time that running its works through SQLite takes, so the
acknowledgement (and the primary's PUBACKs) no longer waits for that; the store applies the
journal's records behind, in bigger transactions (``broker.ha.follower``). Whatever the
journal holds beyond the store's position is applied before the store is used for anything
else: when the standby opens it, before each new connection to the primary, when it stops
(promoted or shut down), and when a broker opens the store as a primary
(``Shipper.attach``): a standby killed, or promoted and killed, with records in its
journal loses none of them.

A frame is ``length (4 bytes, big-endian) || record || digest (16 bytes)``. Replaying
checks each record as the link did (it follows the store's position: the next seq, the
chained digest), so a frame torn by a crash in the middle of an append, or one left from an
older chain, ends the replay there; none of those was acknowledged. The journal is emptied
(truncated) when everything in it is in the store, and the store's commits are fsynced
(``synchronous=FULL``) before that.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from broker.ha.records import (
    BatchClock,
    Position,
    chain,
    decode_record,
    read_position,
    rebuild,
    write_position,
)
from broker.store.files import fsync_directory
from broker.store.records import StoreError, StoreFull
from broker.store.sqlite import SqliteBackend, Work

__all__ = [
    "JOURNAL_FILENAME",
    "Journal",
    "RecordMismatch",
    "apply_records",
    "check_record",
    "read_journal",
    "replay",
]

JOURNAL_FILENAME = "ha-journal"
_LENGTH = 4
_DIGEST = 16


class Journal:
    """The journal file, open for appending; its methods block (run them in a thread)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / JOURNAL_FILENAME
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if created:
            fsync_directory(str(directory))
        self.size = os.fstat(self._fd).st_size

    def append(self, records: list[tuple[bytes, bytes]], *, empty_first: bool) -> None:
        """Append ``records`` ((record, digest) pairs) and make them durable; with
        ``empty_first`` the journal is emptied first (everything in it is in the store)."""
        fd = self._fd
        if empty_first and self.size:
            os.ftruncate(fd, 0)
            self.size = 0
        data = b"".join(
            part
            for body, digest in records
            for part in (len(body).to_bytes(_LENGTH, "big"), body, digest)
        )
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
        except OSError:
            # (the disk refused: take back what it took, so that no torn frame sits before
            # the next append, and nothing of these records is acknowledged)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.size)
            raise
        self.size += len(data)

    def empty(self) -> None:
        """Truncate the journal (durably): the store holds everything in it."""
        if self.size:
            os.ftruncate(self._fd, 0)
            os.fdatasync(self._fd)
            self.size = 0

    def close(self) -> None:
        os.close(self._fd)


def read_journal(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The (record, digest) pairs in the journal at ``path``, up to a torn frame."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    at = 0
    while at + _LENGTH <= len(data):
        length = int.from_bytes(data[at : at + _LENGTH], "big")
        end = at + _LENGTH + length + _DIGEST
        if end > len(data):
            return  # torn by a crash during the append: never acknowledged
        yield data[at + _LENGTH : end - _DIGEST], data[end - _DIGEST : end]
        at = end


def check_record(position: Position, body: bytes, digest: bytes) -> tuple[Position, list[Work]]:
    """The position after ``body`` and the works it holds, if it follows ``position`` (the
    next seq, a term not older, the chained digest); else ``RecordMismatch``, or
    ``ValueError`` for a record we cannot read."""
    term, seq, at, ops = decode_record(body)
    if seq != position.seq + 1 or term < position.term:
        raise RecordMismatch(f"record {term}/{seq} does not follow {position.seq}")
    if chain(position.digest, body) != digest:
        raise RecordMismatch(
            f"diverged at seq {seq}: our store differs from the primary's", diverged=True
        )
    works: list[Work] = [partial(_set_time, at)]
    works.extend(rebuild(op) for op in ops)
    works.append(SqliteBackend._prune_published)
    return Position(term, seq, digest), works


def apply_records(backend: SqliteBackend, group: list[tuple[Position, list[Work]]]) -> Position:
    """Run checked records' works in ONE transaction, ending with their new position;
    ``StoreError`` when it does not commit."""
    position = group[-1][0]
    works = [work for _, record in group for work in record]
    works.append(partial(write_position, position))
    committed, outcomes = backend.run_batch(works)
    if not committed:
        why = f"cannot commit records up to {position.seq} on the standby"
        full = next((v for ok, v in outcomes if not ok and isinstance(v, StoreFull)), None)
        if full is not None:
            raise StoreFull(f"{why}: {full}")
        raise StoreError(why)
    return position


def replay(backend: SqliteBackend, directory: Path, group_size: int = 256) -> Position:
    """Apply what the journal in ``directory`` holds beyond the store's position (in
    transactions of ``group_size`` records), then empty it; the store's new position. A
    record that does not follow (torn, or of an older chain) ends the replay."""
    position = read_position(backend.conn)
    path = directory / JOURNAL_FILENAME
    clock, backend.clock = backend.clock, BatchClock()  # rows stamped with each record's time
    try:
        group: list[tuple[Position, list[Work]]] = []
        for body, digest in read_journal(path):
            try:
                if decode_record(body)[1] <= position.seq:
                    continue  # applied before the journal was last emptied
                position, works = check_record(position, body, digest)
            except (RecordMismatch, ValueError):
                break
            group.append((position, works))
            if len(group) >= group_size:
                apply_records(backend, group)
                group = []
        if group:
            apply_records(backend, group)
    finally:
        backend.clock = clock
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as file:
            file.truncate(0)
            os.fdatasync(file.fileno())
    return position


class RecordMismatch(Exception):
    """A record does not follow the store's position (``diverged``: same seq, other chain)."""

    def __init__(self, message: str, *, diverged: bool = False) -> None:
        super().__init__(message)
        self.diverged = diverged


def _set_time(at: float, backend: SqliteBackend) -> None:
    backend.clock.now = at  # type: ignore[attr-defined]
