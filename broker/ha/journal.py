"""The standby's journal: records made durable before they are applied to its store.

The standby acknowledges a record once it is durable on its disk. Writing it to a journal
file (one write, then one ``fdatasync`` for every record that arrived together) makes it
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
chained digest), so a frame torn by a crash in the middle of a write, or one left from an
older chain, ends the replay there; none of those was acknowledged. A frame the primary
withdrew (its commit failed there) has its length written over with 0: a replay stops there.

The file is written over, not truncated: once the store holds everything in it, the next
records are written from its start again, over the old ones (the store's commits are
fsynced, ``synchronous=FULL``, before that). Writing over blocks the file already has lets
``fdatasync`` flush only data, no size or block map (half the time of an append here:
~0.14 against ~0.33 ms). What lies past the newest frames is older frames, or part of one:
their seqs go back (or they do not decode, or do not follow the chain), so a replay stops
there. The file keeps the size of the most that was ever waiting to be applied.
"""

from __future__ import annotations

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
    """The journal file, written from its start again once its records are applied; its
    methods block (run them in a thread)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / JOURNAL_FILENAME
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        if created:
            fsync_directory(str(directory))
        #: Where the next frame goes: the bytes before it hold the records not yet known to
        #: be in the store. The owner opens the journal with everything in it applied.
        self.size = 0

    def append(self, records: list[tuple[bytes, bytes]], *, empty_first: bool) -> list[int]:
        """Write ``records`` ((record, digest) pairs) after the last ones and make them
        durable; with ``empty_first`` (the store holds everything written so far) from the
        start of the file instead. A write the disk refuses raises ``OSError``: what it
        took of it lies past ``size``, so the next append writes over it, and a replay
        stops there (a torn frame). The offset of each record's frame (for ``withdraw``)."""
        if empty_first:
            self.size = 0
        offsets, at = [], self.size
        for body, _ in records:
            offsets.append(at)
            at += _LENGTH + len(body) + _DIGEST
        data = b"".join(
            part
            for body, digest in records
            for part in (len(body).to_bytes(_LENGTH, "big"), body, digest)
        )
        fd, view, written = self._fd, memoryview(data), 0
        while written < len(data):
            written += os.pwrite(fd, view[written:], self.size + written)
        os.fdatasync(fd)
        self.size += len(data)
        return offsets

    def withdraw(self, offset: int) -> None:
        """Take back the frames from ``offset`` on (records the primary did not commit):
        the frame there gets a length of 0 (a record that does not decode, so a replay
        stops before it), made durable, and the next append writes from there."""
        if os.pwrite(self._fd, bytes(_LENGTH), offset) != _LENGTH:
            raise OSError("short write of a journal withdrawal")
        os.fdatasync(self._fd)
        self.size = offset

    def close(self) -> None:
        os.close(self._fd)


def read_journal(path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The (record, digest) pairs in the journal at ``path``, up to a frame cut short by
    the file's end (a replay stops earlier, at the first one that does not follow)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    at = 0
    while at + _LENGTH <= len(data):
        length = int.from_bytes(data[at : at + _LENGTH], "big")
        end = at + _LENGTH + length + _DIGEST
        if end > len(data):
            return  # torn by a crash during the write: never acknowledged
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
    transactions of ``group_size`` records); the store's new position, which then holds
    everything the journal does. A record that does not follow (torn, of an older chain,
    or older than the one before it) ends the replay."""
    position = read_position(backend.conn)
    path = directory / JOURNAL_FILENAME
    clock, backend.clock = backend.clock, BatchClock()  # rows stamped with each record's time
    try:
        group: list[tuple[Position, list[Work]]] = []
        last = -1
        for body, digest in read_journal(path):
            try:
                seq = decode_record(body)[1]
                if seq <= last:
                    break  # older frames, written over in part: past the newest ones
                last = seq
                if seq <= position.seq:
                    continue  # in the store already
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
    return position


class RecordMismatch(Exception):
    """A record does not follow the store's position (``diverged``: same seq, other chain)."""

    def __init__(self, message: str, *, diverged: bool = False) -> None:
        super().__init__(message)
        self.diverged = diverged


def _set_time(at: float, backend: SqliteBackend) -> None:
    backend.clock.now = at  # type: ignore[attr-defined]
