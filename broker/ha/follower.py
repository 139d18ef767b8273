"""The standby's side of replication: dial the primary, apply its records, acknowledge them.

The standby holds its store's backend itself (no clients use it: it serves nobody until it
is promoted, ``docs/ha.md``). It tells the primary its position (term, seq, chain digest);
the primary continues from there or sends a snapshot first. Each arrival of records is
applied in ONE transaction through the same ``SqliteBackend`` methods the primary ran
(``broker.ha.records``), with each record's time, its dedupe-table pruning and, last, the
new position; the commit is fsynced (``synchronous=FULL``) before ``ACK(seq)`` goes back, so
an acknowledged record survives a power loss of the standby. Every record's digest is
checked before it is applied: a mismatch means this store diverged from the primary's; the
standby disconnects without applying it, and the primary, finding a different digest at
the standby's seq, sends a snapshot.

A snapshot is written beside the database, fsynced, checked (the position it holds must
be the one announced), and only then swapped in: until then the old store is intact. A
database that fails to open (damaged: SQLite's ``quick_check``) is moved aside to
``topiary.db.damaged-<time>`` and the standby starts empty, so it is rebuilt from a
snapshot, never served.

With ``tls`` (``[ha] ca``, ``cert``, ``key``) each connection is mutual TLS, the primary's
certificate checked against the pair's CA and for the host dialled. A handshake the
primary refuses (or that finds a certificate we refuse) is counted (``tls_failures``),
logged, and tried again with the backoff: only a connection that got past the
handshakes resets it, so a standby the primary keeps refusing dials at most once per
``RETRY_MAX``.

A standby whose disk refuses the records (full, a quota or file size limit) acknowledges
none of them: it tells the primary (``FAULT``), which drops it as a lost standby and
confirms alone under its lease (docs/ha.md, "Disk full"), and dials again after
``RETRY_MAX``, catching up once the disk takes the records again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio

from broker.ha.link import LinkError, LinkStream, LinkTlsError, dial_link, single_link_error
from broker.ha.records import (
    BatchClock,
    Position,
    chain,
    decode_record,
    read_position,
    rebuild,
    write_position,
)
from broker.ha.tls import PairTls, TlsHandshakeFailed
from broker.log import get_logger
from broker.store.files import fsync_directory, lock_directory
from broker.store.records import StoreError, StoreFull
from broker.store.schema import DB_FILENAME
from broker.store.sqlite import SqliteBackend, Work

__all__ = ["Follower", "FollowerCounters", "StandbyFull"]

#: Seconds between the standby's ACKs when nothing new arrives (the primary's sign of life).
ACK_INTERVAL = 0.25
#: Most records applied in one transaction.
MAX_RECORDS_PER_COMMIT = 256
RETRY_MIN, RETRY_MAX = 0.05, 1.0
#: Seconds a TLS handshake with the primary may take.
TLS_HANDSHAKE_TIMEOUT = 10.0

log = get_logger("topiary.ha.follower")
#: What a write refused by the disk fails with (full, quota, past RLIMIT_FSIZE).
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class StandbyFull(LinkError):
    """The standby's disk refused what the primary sent: nothing of it is acknowledged."""


class FollowGate(Protocol):
    """The election's side of a standby (``broker.ha.elector.Elector``)."""

    @property
    def term(self) -> int: ...
    def on_primary_contact(self, term: int) -> bool: ...
    def may_acknowledge(self) -> bool: ...


@dataclass(slots=True)
class FollowerCounters:
    connections: int = 0  # sessions with the primary that got past the handshake
    link_failures: int = 0  # connections that failed or ended (the standby dials again)
    tls_failures: int = 0  # TLS handshakes that failed, or TLS refusals right after one
    records_applied: int = 0
    commits: int = 0
    bytes_received: int = 0
    snapshots_installed: int = 0
    divergences: int = 0  # records whose digest did not follow ours: a snapshot follows
    damaged_rebuilt: int = 0  # a store that failed to open, moved aside and rebuilt
    store_full: int = 0  # records or snapshots the disk refused (none acknowledged)

    def snapshot(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


def _set_time(at: float, backend: SqliteBackend) -> None:
    backend.clock.now = at  # type: ignore[attr-defined]


class Follower:
    """The standby's replication; ``run`` follows the primary at ``host:port`` until cancelled."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        secret: bytes,
        *,
        retention_seconds: float = 0.0,
        dedup_window: int = 100_000,
        tls: PairTls | None = None,
    ) -> None:
        # Both shape what a record does (pruning, keeping messages): the primary's values.
        self._options = {"retention_seconds": retention_seconds, "dedup_window": dedup_window}
        self.directory = Path(data_dir)
        self.path = self.directory / DB_FILENAME
        self.secret = secret
        self.tls = tls
        self.counters = FollowerCounters()
        self.position = Position()
        self.connected = False
        self.last_contact: float | None = None
        self._backend: SqliteBackend | None = None
        self._limiter = trio.CapacityLimiter(1)
        self._changed = trio.Event()
        #: The election (witness failover): told of the primary's frames, asked before ACKs.
        self.gate: FollowGate | None = None
        self._beat = 0  # the last BEAT number heard on this connection

    async def wait_for(self, seq: int) -> None:
        """Return once records up to ``seq`` are applied (for tests and ``ha status``)."""
        while self.position.seq < seq:
            await self._changed.wait()

    async def run(
        self, host: str, port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Open the store (rebuilding a damaged one), then follow the primary, dialling again
        after every failure (backoff up to ``RETRY_MAX``). The store closes on the way out."""
        lock = lock_directory(self.directory)
        try:
            await self._thread(self._open)
            task_status.started()
            delay = RETRY_MIN
            while True:
                stream = await self._connect(host, port)
                if stream is not None:
                    linked = self.counters.connections
                    full = False
                    try:
                        await self._follow(stream)
                    except LinkTlsError as exc:
                        self._tls_failed(host, port, str(exc))
                    except StandbyFull as exc:
                        self.counters.store_full += 1
                        log.error("standby store full: nothing acknowledged, dialling again",
                                  reason=str(exc), retry=RETRY_MAX)  # fmt: skip
                        full = True  # the primary goes on alone meanwhile
                    except LinkError as exc:
                        log.warning("replication link lost", reason=str(exc))
                    finally:
                        self.connected = False
                        await trio.aclose_forcefully(stream)
                    self.counters.link_failures += 1
                    if full:
                        delay = RETRY_MAX
                    elif self.counters.connections > linked:  # it got past the handshakes
                        delay = RETRY_MIN
                await trio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
        finally:
            with trio.CancelScope(shield=True):
                await self._thread(self._close)
            lock.close()

    async def _connect(self, host: str, port: int) -> trio.abc.Stream | None:
        """A connection to the primary (over TLS with ``tls``), or None (logged, counted)."""
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            log.debug("primary unreachable", address=f"{host}:{port}", reason=str(exc))
            return None
        if self.tls is None:
            return stream
        try:
            return await self.tls.dial(stream, host, TLS_HANDSHAKE_TIMEOUT)
        except TlsHandshakeFailed as exc:
            self._tls_failed(host, port, str(exc))
            return None

    def _tls_failed(self, host: str, port: int, reason: str) -> None:
        self.counters.tls_failures += 1
        log.warning("replication link: TLS handshake failed", address=f"{host}:{port}",
                    reason=reason, tls_failures=self.counters.tls_failures)  # fmt: skip

    # -- the store, in the worker thread -------------------------------------------------------

    async def _thread(self, fn: Any, *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _open(self) -> None:
        try:
            backend = SqliteBackend.open(self.path, **self._options)
        except StoreError as exc:
            aside = self.path.with_name(f"{DB_FILENAME}.damaged-{int(time.time())}")
            log.error("standby store damaged: moved aside, rebuilding", reason=str(exc))
            for suffix in ("", "-wal", "-shm"):
                source = Path(f"{self.path}{suffix}")
                if source.exists():
                    os.replace(source, f"{aside}{suffix}")
            self.counters.damaged_rebuilt += 1
            backend = SqliteBackend.open(self.path, **self._options)
        backend.clock = BatchClock()
        self._backend = backend
        self.position = read_position(backend.conn)

    def _close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    def _apply(self, records: list[tuple[bytes, bytes]]) -> Position:
        """Apply ``records`` ((body, digest) pairs) in one transaction; the new position."""
        backend = self._backend
        assert backend is not None
        position = self.position
        works: list[Work] = []
        for body, digest in records:
            term, seq, at, ops = decode_record(body)
            if seq != position.seq + 1 or term < position.term:
                raise LinkError(f"record {term}/{seq} does not follow {position.seq}")
            if chain(position.digest, body) != digest:
                self.counters.divergences += 1
                raise LinkError(f"diverged at seq {seq}: our store differs from the primary's")
            works.append(partial(_set_time, at))
            works.extend(rebuild(op) for op in ops)
            works.append(SqliteBackend._prune_published)
            position = Position(term, seq, digest)
        works.append(partial(write_position, position))
        committed, outcomes = backend.run_batch(works)
        if not committed:
            why = f"cannot commit records up to {position.seq} on the standby"
            full = next((v for ok, v in outcomes if not ok and isinstance(v, StoreFull)), None)
            if full is not None:
                raise StandbyFull(f"{why}: {full}")
            raise LinkError(why)
        return position

    def _install(self, snapshot: Path, expected: Position) -> Position:
        """Swap the received snapshot in for the store (closing and reopening it)."""
        with snapshot.open("rb+") as file:
            os.fsync(file.fileno())
        conn = sqlite3.connect(f"file:{snapshot}?mode=ro", uri=True)
        try:
            found = read_position(conn)
        finally:
            conn.close()
        if found != expected:
            raise LinkError(f"snapshot holds seq {found.seq}, announced {expected.seq}")
        self._close()
        for suffix in ("-wal", "-shm"):  # never let an old WAL meet the new file
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        os.replace(snapshot, self.path)
        fsync_directory(str(self.directory))
        self._open()
        return self.position

    # -- the link ------------------------------------------------------------------------------

    async def _follow(self, stream: trio.abc.Stream) -> None:
        link = await dial_link(stream, self.secret)
        p = self.position
        await link.send(["POSITION", p.term, p.seq, p.digest])
        self.counters.connections += 1
        self.connected = True
        self._beat = 0
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat, link)
                await self._receive(link)
        except BaseExceptionGroup as group:
            raise single_link_error(group) from None

    async def _heartbeat(self, link: LinkStream) -> None:
        while True:
            await trio.sleep(ACK_INTERVAL)
            await self._ack(link)

    async def _ack(self, link: LinkStream) -> None:
        """``ACK seq`` (with the election: ``ACK seq term beat``, and none while this
        standby is a candidate: the old primary must stop counting on it)."""
        gate = self.gate
        if gate is None:
            await link.send(["ACK", self.position.seq])
        elif gate.may_acknowledge():
            await link.send(["ACK", self.position.seq, gate.term, self._beat])

    def _contact(self, term: int) -> None:
        gate = self.gate
        if gate is not None and not gate.on_primary_contact(term) and term < gate.term:
            raise LinkError(f"the primary is of term {term}, older than ours ({gate.term})")

    async def _receive(self, link: LinkStream) -> None:
        while True:
            message = await link.receive()
            self.last_contact = trio.current_time()
            kind = message[0]
            if kind == "BEAT":
                self._heard_beat(message)
                if self.gate is not None:  # answered at once: the primary's trust in us
                    await self._ack(link)  # lasts failure_timeout from the BEAT's sending
                continue
            if kind == "RECORD":
                records = [_record(message)]
                while len(records) < MAX_RECORDS_PER_COMMIT:
                    more = link.receive_buffered()
                    if more is None:
                        break
                    if more[0] == "BEAT":  # (the ACK after the commit names it)
                        self._heard_beat(more)
                        continue
                    if more[0] != "RECORD":
                        await self._commit(link, records)
                        records = []
                        await self._other(link, more)
                        break
                    records.append(_record(more))
                if records:
                    await self._commit(link, records)
            else:
                await self._other(link, message)

    def _heard_beat(self, message: list[Any]) -> None:
        if len(message) != 3 or not all(isinstance(v, int) for v in message[1:]):
            raise LinkError("BEAT is [term, n]")
        self._beat = message[2]
        self._contact(message[1])

    async def _commit(self, link: LinkStream, records: list[tuple[bytes, bytes]]) -> None:
        self.counters.bytes_received += sum(len(body) for body, _ in records)
        try:
            self.position = await self._thread(self._apply, records)
        except StandbyFull as exc:
            await _tell_fault(link, str(exc))
            raise
        self.counters.records_applied += len(records)
        self.counters.commits += 1
        self._changed.set()
        self._changed = trio.Event()
        await self._ack(link)

    async def _other(self, link: LinkStream, message: list[Any]) -> None:
        if message[0] != "SNAPSHOT" or len(message) != 2 or not isinstance(message[1], int):
            raise LinkError(f"unexpected {message[0]!r:.40} from the primary")
        size = message[1]
        target = self.path.with_name(f"{DB_FILENAME}.incoming")
        try:
            expected = await self._receive_snapshot(link, target, size)
            self.position = await self._thread(self._install, target, expected)
        except OSError as exc:
            target.unlink(missing_ok=True)  # (what the disk took of it, back)
            if exc.errno not in _FULL_ERRNOS:
                raise LinkError(f"cannot write the snapshot: {exc}") from exc
            failure = StandbyFull(f"cannot write the snapshot: {exc}")
            await _tell_fault(link, str(failure))
            raise failure from exc
        self.counters.snapshots_installed += 1
        log.info("snapshot installed", seq=self.position.seq, size=size)
        self._changed.set()
        self._changed = trio.Event()
        await self._ack(link)

    async def _receive_snapshot(self, link: LinkStream, target: Path, size: int) -> Position:
        """The snapshot's chunks into ``target``; the position it announces."""
        received = 0
        with target.open("wb") as file:
            while True:
                part = await link.receive()
                if part[0] == "CHUNK" and len(part) == 2 and isinstance(part[1], bytes):
                    received += len(part[1])
                    if received > size:
                        raise LinkError("snapshot longer than announced")
                    await trio.to_thread.run_sync(file.write, part[1])
                    continue
                if part[0] == "SNAPSHOT_END" and len(part) == 4 and received == size:
                    expected = Position(int(part[1]), int(part[2]), bytes(part[3]))
                    break
                raise LinkError(f"bad snapshot frame {part[0]!r:.40} at byte {received}")
        self.counters.bytes_received += received
        return expected


async def _tell_fault(link: LinkStream, why: str) -> None:
    """``["FAULT", why]``: the primary drops this standby for that reason (bounded: the
    link is being closed anyway)."""
    with trio.move_on_after(1.0), contextlib.suppress(LinkError):
        await link.send(["FAULT", why[:500]])


def _record(message: list[Any]) -> tuple[bytes, bytes]:
    if len(message) != 3 or not isinstance(message[1], bytes) or not isinstance(message[2], bytes):
        raise LinkError("RECORD is [body, digest]")
    return message[1], message[2]
