"""Listening and shutting down: the outermost nurseries of a broker.

``Server.serve`` owns two nurseries: one for the accept loops and one for
connections. Shutdown (``Server.shutdown()``, called on SIGINT/SIGTERM) goes in
order: stop accepting (the accept nursery is cancelled and the listeners
close), tell every connection to stop reading, let each flush what it has
queued (bounded by ``shutdown_timeout``) and say SHUTTING_DOWN, then return.
Every PUB the broker acknowledged was routed before its PUBACK was queued, and
queues are flushed in order, so what was acknowledged reaches the subscribers
connected at the time.
"""

from __future__ import annotations

import errno
import signal
import tempfile
from contextlib import AsyncExitStack
from functools import partial
from typing import Any

import trio

from broker.address import parse_peer_addresses
from broker.config import BrokerConfig
from broker.core import Broker
from broker.core.counters import Counters
from broker.ha.elector import Elector
from broker.ha.pair import standby_until_promoted, start_shipping
from broker.ha.timing import Timing
from broker.ha.tls import PairTls
from broker.http import HttpServer, broker_routes
from broker.listeners import TLS_KINDS, Listeners, open_listeners
from broker.log import get_logger
from broker.mesh import Peering
from broker.mqtt.connection import MqttConnection
from broker.mqtt.state import MqttFrontEnd
from broker.native import ClientConnection, KeepaliveSweeper
from broker.security import Reloadable, reload_all
from broker.security.acl_file import AclFile
from broker.security.tls import ClientTls, ServerTls, TlsListener
from broker.store import Store

log = get_logger("topiary.server")

# accept() errors that mean "out of resources for now", as trio's serve_listeners treats them
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
ACCEPT_BACKOFF = 0.1
#: The name of every client connection's task (trio's debugging and instrumentation see it).
CONNECTION_TASK = "topiary.connection"


def _peer_name(stream: trio.abc.Stream) -> str:
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    socket = getattr(stream, "socket", None)
    try:
        host, port = socket.getpeername()[:2]  # type: ignore[union-attr]
    except (AttributeError, OSError, TypeError, ValueError):
        return "?"
    return f"{host}:{port}"


class Server:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._shutdown = trio.Event()
        self.stopped = trio.Event()
        self.addresses: list[tuple[str, int]] = []
        self.mqtt_addresses: list[tuple[str, int]] = []  # MQTT over TCP, when served
        self.mqtt_ws_addresses: list[tuple[str, int]] = []  # MQTT over WebSocket
        self.mqtt: MqttFrontEnd | None = None
        self.http: HttpServer | None = None  # the operators' port, when configured
        self._sweeper = KeepaliveSweeper(broker.connections)
        # What SIGHUP re-reads (certificates, users, ACL rules): see broker/security/reload.py
        self.reloadables: list[Reloadable] = []
        self.tls: ServerTls | None = None  # the TLS listeners' context, when any
        # Where each protocol listens over TLS: "native", "mqtt", "websocket", "http"
        self.tls_addresses: dict[str, list[tuple[str, int]]] = {}
        self._handshaking: set[trio.CancelScope] = set()  # TLS handshakes in progress

    def reload(self) -> dict[str, str | None]:
        """Re-read what may change without a restart (SIGHUP); part name -> error or None."""
        return reload_all(self.reloadables)

    def shutdown(self) -> None:
        self._shutdown.set()

    async def serve(
        self,
        listeners: list[trio.SocketListener] | list[Any],
        *,
        mqtt_listeners: list[Any] | None = None,
        mqtt_ws_listeners: list[Any] | None = None,
        task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept native clients on ``listeners`` and, given an ``MqttFrontEnd`` in
        ``self.mqtt``, MQTT clients on the MQTT (TCP and WebSocket) listeners."""
        broker = self.broker
        kinds = [(listeners, self._native, self.addresses)]
        if self.mqtt is not None:
            kinds.append((mqtt_listeners or [], self._mqtt_tcp, self.mqtt_addresses))
            kinds.append((mqtt_ws_listeners or [], self._mqtt_ws, self.mqtt_ws_addresses))
        for group, _make, addresses in kinds:
            for listener in group:
                sock = getattr(listener, "socket", None)
                if sock is not None and not isinstance(listener, TlsListener):
                    addresses.append(sock.getsockname()[:2])
        everything = [listener for group, _make, _a in kinds for listener in group]
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(self._sweeper.run)
                for group, make, _addresses in kinds:
                    for listener in group:
                        accepting.start_soon(self._accept_loop, listener, connections, make)
                log.info(
                    "listening",
                    server_id=broker.server_id,
                    addresses=self.addresses,
                    **({"mqtt": self.mqtt_addresses} if self.mqtt_addresses else {}),
                    **({"mqtt_ws": self.mqtt_ws_addresses} if self.mqtt_ws_addresses else {}),
                )
                task_status.started(self.addresses)
                await self._shutdown.wait()
                accepting.cancel_scope.cancel()
                for handshaking in self._handshaking:
                    handshaking.cancel()
            for listener in everything:
                await listener.aclose()
            log.info("shutting down", connections=len(broker.connections))
            broker.peering.shutdown()
            for connection in list(broker.connections):
                connection.begin_shutdown()
        counters = broker.counters
        log.info("stopped", messages_in=counters.messages_in, messages_out=counters.messages_out)
        self.stopped.set()

    def _native(self, stream: trio.abc.Stream) -> Any:
        return ClientConnection(self.broker, stream, _peer_name(stream), self._sweeper)

    def _mqtt_tcp(self, stream: trio.abc.Stream) -> Any:
        assert self.mqtt is not None
        return MqttConnection(self.broker, self.mqtt, stream, _peer_name(stream), self._sweeper)

    def _mqtt_ws(self, stream: trio.abc.Stream) -> Any:
        assert self.mqtt is not None
        return MqttConnection(
            self.broker, self.mqtt, stream, _peer_name(stream), self._sweeper, websocket=True
        )

    async def _accept_loop(self, listener: Any, connections: trio.Nursery, make: Any) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    log.error("accept failed, backing off", error=str(exc))
                    await trio.sleep(ACCEPT_BACKOFF)
                    continue
                raise
            if isinstance(stream, trio.SSLStream):  # from a TlsListener
                connections.start_soon(
                    self._secure, listener.tls, stream, make, name=CONNECTION_TASK
                )
                continue
            connection = make(stream)
            # A name of our own, shared: trio would format one string per task (~100 bytes)
            connections.start_soon(connection.run, name=CONNECTION_TASK)

    async def _secure(self, tls: ServerTls, stream: trio.SSLStream[Any], make: Any) -> None:
        """TLS handshake in the connection's own task (bounded by hello_timeout), then
        the connection, as on a plain listener."""
        secured = False
        scope = trio.CancelScope()
        self._handshaking.add(scope)
        try:
            with scope:
                secured = await tls.handshake(stream, self.broker.config.hello_timeout)
        finally:
            self._handshaking.discard(scope)
        if not secured:
            await trio.aclose_forcefully(stream)
            return
        await make(stream).run()


async def run_broker(
    config: BrokerConfig,
    *,
    broker: Broker | None = None,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[Server] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``config.host:config.port`` and serve until shut down (or a signal).

    With ``config.data_dir`` the broker opens its store there first and restores the
    durable sessions in it; the store is closed (its last batch flushed) after the last
    connection has gone. A broker serving MQTT without a data dir keeps its store in a
    temporary directory for the run (MQTT clients expect persistent sessions).
    With [ha] a standby follows its primary and refuses clients until promoted, and a
    primary ships its store to its standby (broker/ha/pair.py, docs/ha.md). With
    ``failover = "witness"`` one ``Elector`` task lives as long as the process and decides
    the role: a primary that steps down (a newer term) stops serving and follows the new
    primary, and is promoted again by a later vote; with ``"manual"`` SIGUSR1 promotes.
    """
    if not config.ha_configured:
        await _serve(config, broker, handle_signals, None, None, task_status)
        return
    # A broker of the pair binds every port once and holds them whatever its role.
    tls = ServerTls(config, Counters()) if config.tls_cert is not None else None
    pair_tls = PairTls.from_config(config)  # bad files stop start-up here (ConfigError)
    elector = None
    if config.ha_failover == "witness":  # (reads DATA_DIR/ha-term: a bad one stops here)
        assert config.data_dir is not None and config.ha_witness is not None
        assert config.ha_secret is not None and config.ha_role is not None
        elector = Elector(
            config.data_dir,
            witness=config.ha_witness,
            secret=config.ha_secret.encode(),
            timing=Timing(config.ha_lease, config.ha_failure_timeout),
            role_at_first_start=config.ha_role,
            tls=pair_tls,
        )
    held = await open_listeners(config, tls, link=True)
    try:
        await _run_pair(config, broker, handle_signals, held, tls, pair_tls, elector, task_status)
    finally:
        with trio.CancelScope(shield=True):
            await held.aclose()


async def _run_pair(
    config: BrokerConfig,
    broker: Broker | None,
    handle_signals: bool,
    held: Listeners,
    tls: ServerTls | None,
    pair_tls: PairTls | None,
    elector: Elector | None,
    task_status: trio.TaskStatus[Server],
) -> None:
    """The role loop of a pair's broker, on the sockets it ``held`` since its start: the
    ``elector`` decides the role (None: manual failover, SIGUSR1 promotes)."""
    serve = partial(_serve, held=held, tls=tls, pair_tls=pair_tls)
    wait = partial(standby_until_promoted, held=held, tls=pair_tls)
    if elector is None:
        term: int | None = None
        if config.ha_role == "standby":
            term = await wait(config, handle_signals=handle_signals)
            if term is None:
                return
        await serve(config, broker, handle_signals, term, None, task_status)
        return
    async with trio.open_nursery() as nursery:
        await nursery.start(elector.run)
        status: trio.TaskStatus[Server] = task_status
        while True:
            if not elector.is_primary:
                promoted = await wait(config, handle_signals=handle_signals, elector=elector)
                if promoted is None:
                    break
            term = elector.term
            stepped_down = await serve(config, broker, handle_signals, term, elector, status)
            status, broker = trio.TASK_STATUS_IGNORED, None  # the next phase has its own
            if not stepped_down:
                break
            log.warning("stepped down: following the new primary", term=elector.term)
        nursery.cancel_scope.cancel()


async def _serve(
    config: BrokerConfig,
    broker: Broker | None,
    handle_signals: bool,
    term: int | None,
    elector: Elector | None,
    task_status: trio.TaskStatus[Server],
    held: Listeners | None = None,
    tls: ServerTls | None = None,
    pair_tls: PairTls | None = None,
) -> bool:
    """Serve clients as a single broker or a primary (of ``term``); True when it stopped
    because ``elector`` stepped down (then the caller follows the new primary).

    A pair's broker passes the sockets (and TLS contexts) it ``held`` since its start; a
    single broker binds its own here, and they close when it stops. ``pair_tls``: mutual
    TLS for the replication link (reloaded at SIGHUP with the rest)."""
    stepped_down = False
    async with AsyncExitStack() as stack:
        stops = hups = None
        if handle_signals:  # first: a signal that comes while the broker starts is kept
            stops = stack.enter_context(trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM))
            hups = stack.enter_context(trio.open_signal_receiver(signal.SIGHUP))
        store = None
        data_dir = config.data_dir
        mqtt = _serves_mqtt(config)
        if data_dir is None and mqtt:
            # MQTT clients expect sessions that outlive a connection (3.1.1 without Clean
            # Session): without a data dir they are kept in a store that lives as long as
            # this process, in a temporary directory removed when the broker stops.
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="topiary-"))
            log.info("sessions kept for this run only", store=data_dir)
        if data_dir is not None:
            store = await stack.enter_async_context(
                Store.open(data_dir, dedup_window=config.dedup_window)
            )
        shipper = None
        if config.ha_configured and store is not None:  # before anything is written
            shipper = await start_shipping(config, store, term, elector, pair_tls)
        broker = broker or Broker(config, store=store)
        if elector is not None:
            broker.write_refusal = elector.refusal
            broker.ha_statistics = elector.statistics
        if not isinstance(broker.peering, Peering):
            broker.peering = Peering(broker)
        acl = None
        if config.acl_file is not None:  # a bad file stops start-up here (ConfigError)
            acl = AclFile(broker, config.acl_file)
            acl.load()  # before the restore, which checks each session's filters against it
        if store is not None:
            restored = await broker.load()
            log.info("store opened", data_dir=config.data_dir, durable_sessions=restored)
        server = Server(broker)
        if broker.logins.users is not None:  # SIGHUP re-reads the users file
            server.reloadables.append(broker.logins.users)
        if acl is not None:
            # (after the users: away durable sessions get their owners' groups from the
            # users file a SIGHUP has just read)
            server.reloadables.append(acl)
        if tls is not None:
            server.tls = tls
            tls.counters = broker.counters  # this phase's handshake failures
            server.reloadables.append(tls)
        elif config.tls_cert is not None:  # bad files stop start-up here (ConfigError)
            server.tls = ServerTls(config, broker.counters)
            server.reloadables.append(server.tls)
        if pair_tls is not None:
            server.reloadables.append(pair_tls)
        if isinstance(broker.peering, Peering) and _dials_tls(config):
            broker.peering.tls = ClientTls(config)
            server.reloadables.append(broker.peering.tls)
        if held is not None:
            listeners = held.lend()
        else:
            listeners = await open_listeners(config, server.tls, link=shipper is not None)
            stack.push_async_callback(listeners.aclose)  # when start-up fails half way
        secure = {kind: listeners.secure(kind) for kind in TLS_KINDS}
        for kind, opened in secure.items():
            if opened:
                server.tls_addresses[kind] = [tl.socket.getsockname()[:2] for tl in opened]
                log.info("listening over tls", protocol=kind, addresses=server.tls_addresses[kind])
        async with trio.open_nursery() as nursery:
            timers = trio.CancelScope()  # the MQTT front end's (delayed wills, expiries)
            if mqtt:
                server.mqtt = MqttFrontEnd(broker)
                broker.frontends["mqtt"] = server.mqtt
                await nursery.start(_run_in_scope, server.mqtt.run, timers)
            signals = trio.CancelScope()
            reloads = trio.CancelScope()
            if stops is not None and hups is not None:
                nursery.start_soon(_shutdown_on_signal, server, stops, signals)
                nursery.start_soon(_reload_on_signal, server, hups, reloads)
            await nursery.start(broker.peering.run)
            link = trio.CancelScope()
            if shipper is not None:
                await nursery.start(_run_in_scope, partial(shipper.serve, listeners.link), link)
                log.info("primary", term=shipper.term, link=config.ha_link, sync=config.ha_sync)
            if acl is not None:  # the ACL file's store removals
                await nursery.start(acl.run)
            operators = trio.CancelScope()
            if listeners.http or secure["http"]:
                server.http = HttpServer(
                    broker_routes(broker), request_timeout=config.http_request_timeout
                )
                http_listeners = [*listeners.http, *secure["http"]]
                await nursery.start(_serve_http, server.http, http_listeners, operators)
            await nursery.start(
                partial(
                    server.serve,
                    [*listeners.native, *secure["native"]],
                    mqtt_listeners=[*listeners.mqtt, *secure["mqtt"]],
                    mqtt_ws_listeners=[*listeners.mqtt_ws, *secure["websocket"]],
                )
            )
            task_status.started(server)
            watch = trio.CancelScope()
            if elector is not None:

                async def step_down_watch() -> None:
                    nonlocal stepped_down
                    with watch:
                        while elector.is_primary:
                            await elector.wait_changed()
                        stepped_down = True
                        server.shutdown()

                nursery.start_soon(step_down_watch)
            await server._shutdown.wait()
            signals.cancel()
            reloads.cancel()
            # serve() drains connections within shutdown_timeout; this is the backstop
            nursery.cancel_scope.deadline = trio.current_time() + config.shutdown_timeout + 5
            await server.stopped.wait()
            operators.cancel()  # the HTTP port answers until the last client has gone
            timers.cancel()
            link.cancel()
            watch.cancel()
            if acl is not None:
                acl.close()  # its queued store removals are written, then its task ends
    return stepped_down


def _serves_mqtt(config: BrokerConfig) -> bool:
    return any(
        listen is not None
        for listen in (
            config.mqtt_listen,
            config.mqtt_websocket,
            config.tls_listen_mqtt,
            config.tls_listen_websocket,
        )
    )


def _dials_tls(config: BrokerConfig) -> bool:
    """Whether peer links dial over TLS (a ``tls://`` peer), so need a client context."""
    addresses = [*config.peers, *(entry.address for entry in config.trusted_peers)]
    # (an entry may list a pair's two brokers, "A,B", each with its own scheme)
    return any(
        secure for text in addresses if text for _h, _p, secure in parse_peer_addresses(text)
    )


async def _run_in_scope(
    fn: Any,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await fn(task_status=task_status)


async def _serve_http(
    http: HttpServer,
    listeners: list[Any],
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await http.serve(listeners, task_status=task_status)


async def _reload_on_signal(server: Server, received: Any, scope: trio.CancelScope) -> None:
    """SIGHUP re-reads certificates, users and ACL rules; a bad file keeps the old state."""
    with scope:
        async for _signum in received:
            log.info("signal", signal="SIGHUP")
            server.reload()


async def _shutdown_on_signal(server: Server, received: Any, scope: trio.CancelScope) -> None:
    with scope:
        async for signum in received:
            log.info("signal", signal=signal.Signals(signum).name)
            server.shutdown()
            return
