"""The live route table for a Spark driver: which filters some reachable broker wants.

The Spark pipeline filters each micro-batch with the filters wanted *now*. The driver is a
plain Python process that Spark calls back from its own threads, so ``RouteFeed`` runs the
bridge's ``RouteWatcher`` (a read-only peer of the broker, see bridges/routes.py) in a
daemon thread with a trio loop of its own, and hands out immutable snapshots: the list of
wanted filters and a version that changes whenever it does. The snapshot is taken inside
the trio thread, so it never sees a table half-updated.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
from dataclasses import dataclass

import trio

from bridges.config import BridgeConfig
from bridges.routes import RouteWatcher
from routing.filters import Filter


@dataclass(frozen=True, slots=True)
class WantedFilters:
    """Every filter of every broker reachable from the attached one, at one moment."""

    filters: tuple[Filter, ...]
    version: int  # changes whenever the set does (a cache key for compiled forms)


class RouteFeed:
    def __init__(
        self,
        server: str,
        *,
        observer_id: str,
        secret: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.watcher = RouteWatcher(server, observer_id=observer_id, secret=secret, tls=tls)
        self._token: trio.lowlevel.TrioToken | None = None
        self._started = threading.Event()
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="topiary-routes", daemon=True)
        self._last: WantedFilters = WantedFilters((), 0)
        self._failure: BaseException | None = None

    @classmethod
    def of(cls, config: BridgeConfig) -> RouteFeed:
        """The feed a bridge config asks for: its broker, observer id and secret, and TLS."""
        return cls(
            config.server,
            observer_id=config.observer_id,
            secret=config.peer_secret,
            tls=config.tls_context(),
        )

    def start(self) -> RouteFeed:
        self._thread.start()
        self._started.wait(10)
        return self

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as exc:  # surfaced to the caller by snapshot()
            self._failure = exc
            self._started.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.watcher.run)
            self._started.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def wait_ready(self, timeout: float) -> bool:
        """Block until the first complete table arrived; False on timeout."""
        if self._token is None:
            return False

        async def ready() -> bool:
            with trio.move_on_after(timeout):
                await self.watcher.ready.wait()
                return True
            return False

        return trio.from_thread.run(ready, trio_token=self._token)

    def snapshot(self) -> WantedFilters:
        """The wanted filters now (the same object while nothing changed)."""
        if self._failure is not None:
            raise RuntimeError(f"the route feed stopped: {self._failure!r}")
        assert self._token is not None, "start() first"
        filters = trio.from_thread.run_sync(self._collect, trio_token=self._token)
        if filters != self._last.filters:
            self._last = WantedFilters(filters, self._last.version + 1)
        return self._last

    def _collect(self) -> tuple[Filter, ...]:
        table = self.watcher.table
        if table is None:
            return ()
        paths = table.paths()
        wanted: set[Filter] = set()
        for origin, state in table.origins.items():
            if origin == table.self_id:
                continue
            if origin == table.root or origin in paths:
                wanted |= state.filters
        return tuple(sorted(wanted, key=lambda f: (f.text, f.dialect)))

    def stop(self) -> None:
        if self._token is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(10)
