"""TLS for every listener and every peer dial: contexts built from files, a listener that
wraps what it accepts, and the handshake done in the connection's own task.

Why the handshake is not done in the accept loop: a client that never finishes it (a slow
one, or one speaking plain text to the TLS port) would hold the loop and so everyone behind
it. ``TlsListener.accept`` only wraps the socket (no I/O); the task that serves the
connection calls ``ServerTls.handshake`` first, bounded by ``hello_timeout``, and a failure
costs that one connection, is counted (``tls_handshake_failures``) and logged without a
traceback.

Contexts are stdlib ``ssl`` with TLS 1.2 as the minimum. A certificate renewed on disk is
picked up at SIGHUP (``ServerTls`` and ``ClientTls`` are ``Reloadable``): connections
accepted after the reload use the new context, those already open keep theirs, and bad new
files keep the old context with one log line naming the file.

Every stream is wrapped with ``https_compatible=True``: no close_notify is required at EOF.
Each protocol served here frames its own messages (length prefixes, WebSocket frames, HTTP
lengths), so a truncated stream shows as a partial message, and many clients (browsers, MQTT
libraries) just close the TCP connection.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from broker.address import PEER_TLS_SCHEME, parse_host_port, parse_peer_addresses
from broker.config import BrokerConfig, ConfigError
from broker.log import get_logger

log = get_logger("topiary.tls")

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


class FailureCounters(Protocol):
    tls_handshake_failures: int


def _no_password() -> bytes:
    # Without a callback, OpenSSL would prompt on the terminal for an encrypted key.
    raise ConfigError("encrypted private keys are not supported")


def _readable(path: str, what: str) -> None:
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None


def _load_chain(context: ssl.SSLContext, cert: str, key: str, what: str) -> None:
    """``load_cert_chain`` with an error that names the file at fault."""
    _readable(cert, f"{what} cert")
    _readable(key, f"{what} key")
    try:
        context.load_cert_chain(cert, key, password=_no_password)
    except ConfigError as exc:
        raise ConfigError(f"{what} key {key}: {exc}") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise ConfigError(f"{what} key {key} does not match cert {cert}") from None
        try:
            ssl.create_default_context(cafile=cert)
        except ssl.SSLError:
            raise ConfigError(f"{what} cert {cert}: not a PEM certificate") from None
        raise ConfigError(f"{what} key {key}: not a PEM private key ({exc.reason})") from None


def _load_ca(context: ssl.SSLContext, path: str, what: str) -> None:
    _readable(path, what)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise ConfigError(f"{what} {path}: no PEM certificate in it ({exc.reason})") from None


def server_context(
    cert: str,
    key: str,
    client_ca: str | None = None,
    require_client_cert: bool = False,
    *,
    what: str = "tls",
    ca_key: str = "client_ca",
) -> ssl.SSLContext:
    """A listener's context: TLS 1.2 or later, our certificate, and with ``client_ca`` the
    client certificates verified against it (required, or optional but checked when one is
    offered). Raises ``ConfigError`` naming the file and the problem (``what`` and ``ca_key``:
    the table and key it was configured with)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_VERSION
    _load_chain(context, cert, key, what)
    if client_ca is not None:
        _load_ca(context, client_ca, f"{what} {ca_key}")
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(
    ca: str | None = None, cert: str | None = None, key: str | None = None, *, what: str = "tls"
) -> ssl.SSLContext:
    """A dialler's context: TLS 1.2 or later, the server's certificate verified against
    ``ca`` (else the system's CAs) and its name or IP checked; ``cert``/``key`` for mutual
    TLS. Raises ``ConfigError`` naming the file and the problem."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = MINIMUM_VERSION
    if ca is not None:
        _load_ca(context, ca, f"{what} ca")
    if cert is not None and key is not None:
        _load_chain(context, cert, key, what)
    return context


class ServerTls:
    """The listeners' context, re-read at SIGHUP; counts and logs failed handshakes."""

    name = "tls"

    def __init__(self, config: BrokerConfig, counters: FailureCounters) -> None:
        self.config = config
        self.counters = counters
        self.context = self._load()

    def _load(self) -> ssl.SSLContext:
        config = self.config
        assert config.tls_cert is not None and config.tls_key is not None  # checked with it
        return server_context(
            config.tls_cert, config.tls_key, config.tls_client_ca, config.tls_require_client_cert
        )

    def reload(self) -> None:
        self.context = self._load()  # raises before replacing: bad files keep the old one

    def wrap(self, stream: trio.abc.Stream) -> trio.SSLStream[Any]:
        """``stream`` as the server side of TLS under the current context; no I/O yet."""
        return trio.SSLStream(stream, self.context, server_side=True, https_compatible=True)

    async def handshake(self, stream: trio.SSLStream[Any], timeout: float) -> bool:
        """Do ``stream``'s handshake within ``timeout`` seconds; False (counted, logged) if
        it failed: not TLS, an old version, no or a bad client certificate, too slow."""
        reason = f"no TLS handshake within {timeout:g} s"
        peer = peer_address(stream.transport_stream)  # now: a client that gave up has none later
        with trio.move_on_after(timeout):
            try:
                await stream.do_handshake()
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                reason = _reason(exc)
        self.counters.tls_handshake_failures += 1
        log.info("tls handshake failed", peer=peer, error=reason)
        return False


def peer_address(stream: trio.abc.Stream) -> str:
    """``HOST:PORT`` of an accepted TCP connection, for the log ("?" when it has gone)."""
    try:
        host, port = stream.socket.getpeername()[:2]  # type: ignore[attr-defined]
    except (AttributeError, OSError, TypeError, ValueError):
        return "?"
    return f"{host}:{port}"


def _reason(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLError):
        return cause.reason or str(cause)
    if cause is not None:
        return str(cause) or type(cause).__name__
    return str(exc) or "connection closed during the handshake"


class TlsListener(trio.abc.Listener[trio.SSLStream[Any]]):
    """A TCP listener whose streams come wrapped in TLS, not yet handshaken: the
    connection's own task does that (``ServerTls.handshake``)."""

    def __init__(self, inner: trio.SocketListener, tls: ServerTls) -> None:
        self.inner = inner
        self.tls = tls
        self.socket = inner.socket  # where it listens, for the server's address list

    async def accept(self) -> trio.SSLStream[Any]:
        return self.tls.wrap(await self.inner.accept())

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass(frozen=True, slots=True)
class PeerAddress:
    """A configured peer: where to dial, and whether over TLS."""

    host: str
    port: int
    tls: bool


def parse_peer(text: str) -> PeerAddress | None:
    """``HOST:PORT`` or ``tls://HOST:PORT``, or None when ``text`` is neither."""
    secure = text.startswith(PEER_TLS_SCHEME)
    parsed = parse_host_port(text.removeprefix(PEER_TLS_SCHEME) if secure else text)
    if parsed is None:
        return None
    return PeerAddress(parsed[0], parsed[1], secure)


def parse_peers(text: str) -> tuple[PeerAddress, ...]:
    """A peer's addresses, dialled in turn until one accepts: one address or several
    separated by commas (``broker.address.parse_peer_addresses``). Raises ValueError naming
    the entry at fault."""
    return tuple(PeerAddress(*entry) for entry in parse_peer_addresses(text))


class ClientTls:
    """The context peer links dial with (``[peering] ca``, ``cert``, ``key``), re-read at
    SIGHUP like the listeners' one."""

    name = "peering tls"

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.context = self._load()

    def _load(self) -> ssl.SSLContext:
        config = self.config
        return client_context(config.peer_ca, config.peer_cert, config.peer_key, what="peering")

    def reload(self) -> None:
        self.context = self._load()

    async def connect(
        self, stream: trio.abc.Stream, host: str, timeout: float
    ) -> trio.SSLStream[Any]:
        """The client side of TLS over ``stream``, handshaken, ``host`` verified (a name or
        an IP address). Raises ``trio.BrokenResourceError`` (its cause says why) or
        ``trio.TooSlowError``."""
        secure = trio.SSLStream(stream, self.context, server_hostname=host, https_compatible=True)
        with trio.fail_after(timeout):
            await secure.do_handshake()
        return secure


def describe_failure(exc: BaseException) -> str:
    """One line for a failed TLS handshake (a certificate that does not verify, say)."""
    if isinstance(exc, trio.TooSlowError):
        return "no TLS handshake within hello_timeout"
    return _reason(exc)
