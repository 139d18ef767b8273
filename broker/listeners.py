"""Every socket a broker listens on, bound in one place.

A single broker binds them when it starts serving and closes them when it stops. A broker
of an [ha] pair binds them all once, at process start, and holds them across its role
changes (standby, primary, standby again): a port another program took while this broker
was a standby would otherwise stop the promotion with "Address already in use" (CI saw
exactly that with the replication link's port). The standby's door answers on them
(broker/ha/door.py); the primary serves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from broker.address import parse_listen
from broker.config import BrokerConfig
from broker.security.tls import ServerTls, TlsListener

__all__ = ["Borrowed", "ListenError", "Listeners", "open_listeners"]

#: The TLS listener kinds, as the ``[tls] listen_*`` keys name them.
TLS_KINDS = ("native", "mqtt", "websocket", "http")


class ListenError(OSError):
    """A port that could not be bound, with the key that asked for it (one line for the
    operator: "cannot listen on 127.0.0.1:7475 ([ha] link_port): Address already in use")."""

    def __init__(self, errno: int, strerror: str, where: str) -> None:
        super().__init__(errno, strerror)
        self.where = where

    def __str__(self) -> str:
        return f"cannot listen on {self.where}: {self.strerror}"


async def _bind(port: int, host: str | None, key: str) -> list[trio.SocketListener]:
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        where = f"{host or '*'}:{port} ({key})"
        raise ListenError(exc.errno or 0, exc.strerror or str(exc), where) from exc


class Borrowed(trio.abc.Listener[trio.SocketStream]):
    """A listener lent to one phase of a broker's life: it accepts as the one it wraps,
    and closing it does nothing (the owner, ``Listeners``, closes the socket)."""

    def __init__(self, inner: trio.SocketListener) -> None:
        self.inner = inner
        self.socket = inner.socket  # where it listens, for the server's address list

    async def accept(self) -> trio.SocketStream:
        return await self.inner.accept()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


def _lend(listener: Any) -> Any:
    if isinstance(listener, TlsListener):
        return TlsListener(Borrowed(listener.inner), listener.tls)
    return Borrowed(listener)


@dataclass(slots=True)
class Listeners:
    """The bound sockets, by what is served on them."""

    native: list[trio.SocketListener]
    mqtt: list[trio.SocketListener] = field(default_factory=list)
    mqtt_ws: list[trio.SocketListener] = field(default_factory=list)
    http: list[trio.SocketListener] = field(default_factory=list)
    #: TLS listeners by kind (``TLS_KINDS``); empty lists for kinds not configured.
    tls: dict[str, list[TlsListener]] = field(default_factory=dict)
    #: The replication link's ([ha] only; served by the primary's shipper).
    link: list[trio.SocketListener] = field(default_factory=list)

    def secure(self, kind: str) -> list[TlsListener]:
        return self.tls.get(kind, [])

    def every(self) -> list[Any]:
        return [
            *self.native,
            *self.mqtt,
            *self.mqtt_ws,
            *self.http,
            *(listener for kind in TLS_KINDS for listener in self.secure(kind)),
            *self.link,
        ]

    def lend(self) -> Listeners:
        """The same sockets, for code that closes what it serves when it stops: a held
        socket outlives the phase that served it."""
        return Listeners(
            native=[_lend(item) for item in self.native],
            mqtt=[_lend(item) for item in self.mqtt],
            mqtt_ws=[_lend(item) for item in self.mqtt_ws],
            http=[_lend(item) for item in self.http],
            tls={kind: [_lend(item) for item in items] for kind, items in self.tls.items()},
            link=[_lend(item) for item in self.link],
        )

    async def aclose(self) -> None:
        for listener in self.every():
            await listener.aclose()


async def open_listeners(
    config: BrokerConfig, tls: ServerTls | None, *, link: bool = False
) -> Listeners:
    """Bind every port ``config`` asks for (and the replication link's with ``link``); a
    port in use raises OSError before anything is served, and what was bound is closed."""
    listeners = Listeners(native=[])
    try:
        listeners.native = await _bind(config.port, config.host, "[server] port")
        listeners.mqtt = await _listen(config.mqtt_listen, "[mqtt] listen")
        listeners.mqtt_ws = await _listen(config.mqtt_websocket, "[mqtt] websocket")
        listeners.http = await _listen(config.http_listen, "[http] listen")
        for kind in TLS_KINDS:
            opened = await _listen(getattr(config, f"tls_listen_{kind}"), f"[tls] listen_{kind}")
            if opened:
                assert tls is not None  # the config requires cert and key with a TLS listener
                listeners.tls[kind] = [TlsListener(inner, tls) for inner in opened]
        if link:
            listeners.link = await _bind(config.ha_link, config.host, "[ha] link_port")
    except BaseException:
        await listeners.aclose()
        raise
    return listeners


async def _listen(listen: str | None, key: str) -> list[trio.SocketListener]:
    """Listeners for ``HOST:PORT`` (checked with the config), or none."""
    if listen is None:
        return []
    parsed = parse_listen(listen)
    assert parsed is not None
    host, port = parsed
    return await _bind(port, host, key)
