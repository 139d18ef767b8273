"""A primary store and a standby following it over a real TCP link, for the replication tests,
and a dump of everything a store holds (to compare two stores row by row)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from broker.ha.follower import Follower
from broker.ha.shipping import Shipper
from broker.store import Store
from broker.store.schema import DB_FILENAME

SECRET = b"pair-secret"
_TABLES = {
    "sessions": "client_id",
    "filters": "client_id, filter, dialect",
    "deliveries": "client_id, seq",
    "messages": "rowid",
    "published": "rowid",  # rowids decide what pruning removes: they must agree too
    "retained": "topic",
    "meta": "key",
}

_COLUMNS = {"published": "rowid, *"}  # deliveries and the rest are keyed by their columns


def dump(data_dir: Path) -> dict[str, list[Any]]:
    """Every row of every table of the store in ``data_dir`` (read-only, beside its owner)."""
    conn = sqlite3.connect(f"file:{data_dir / DB_FILENAME}?mode=ro", uri=True)
    try:
        return {
            table: conn.execute(
                f"SELECT {_COLUMNS.get(table, '*')} FROM {table} ORDER BY {order}"
            ).fetchall()
            for table, order in _TABLES.items()
        }
    finally:
        conn.close()


@dataclass
class Pair:
    store: Store
    shipper: Shipper
    port: int
    primary_dir: Path
    standby_dir: Path
    nursery: trio.Nursery
    follower: Follower | None = None
    _scope: trio.CancelScope | None = None
    _stopped: trio.Event | None = None

    async def start_standby(self, secret: bytes = SECRET) -> Follower:
        follower = Follower(self.standby_dir, secret)
        scope, stopped = trio.CancelScope(), trio.Event()
        self._scope, self._stopped = scope, stopped

        async def run(task_status: trio.TaskStatus[None]) -> None:
            try:
                with scope:
                    await follower.run("127.0.0.1", self.port, task_status=task_status)
            finally:
                stopped.set()  # its store is closed and its directory unlocked

        await self.nursery.start(run)
        self.follower = follower
        return follower

    async def stop_standby(self) -> None:
        assert self._scope is not None and self._stopped is not None
        self._scope.cancel()
        with trio.fail_after(10):
            await self._stopped.wait()
            while self.shipper.in_sync:
                await trio.sleep(0.01)  # bounded by fail_after: the shipper notices the EOF

    async def in_sync(self) -> None:
        """Wait (bounded) until the standby is caught up and waited for. The primary says
        "in sync" once it has *sent* everything (a snapshot included); the follower's own
        position says when it has installed it."""
        with trio.fail_after(20):
            while not self.shipper.in_sync:
                await trio.sleep(0.01)
        if self.follower is not None:
            await self.caught_up()

    async def caught_up(self) -> None:
        assert self.follower is not None
        with trio.fail_after(20):
            await self.follower.wait_for(self.shipper.position.seq)
            while self.follower.position.digest != self.shipper.position.digest:
                await trio.sleep(0.01)  # a snapshot over a store already at that seq (bounded)


@asynccontextmanager
async def pair(tmp_path: Path, *, sync: bool = True, **shipper: Any) -> AsyncIterator[Pair]:
    primary_dir, standby_dir = tmp_path / "primary", tmp_path / "standby"
    primary_dir.mkdir(exist_ok=True)
    standby_dir.mkdir()
    async with Store.open(primary_dir) as store, trio.open_nursery() as nursery:
        ship = Shipper(term=1, secret=SECRET, sync=sync, **shipper)
        await ship.attach(store)
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        await nursery.start(ship.serve, listeners)
        yield Pair(store, ship, port, primary_dir, standby_dir, nursery)
        nursery.cancel_scope.cancel()
