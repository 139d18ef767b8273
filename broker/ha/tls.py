"""Mutual TLS for the pair's own links: the replication link and the calls to the witness.

One set of files (``[ha] ca``, ``cert``, ``key``; ``topiary witness --ca --cert --key``)
gives both contexts a broker needs: it accepts its standby as a server and dials its
primary and the witness as a client. Each side checks the other's certificate against
``ca`` (the pair's own CA: a certificate any public CA signed proves nothing here), and
the dialler checks that the certificate names the host it dialled (a name or an IP
address), so a machine that took over an address cannot pose as the partner. The HMAC
of each frame (``broker.ha.link``, ``broker.ha.codec``) stays underneath: TLS hides the
stream and proves the machine, the secret proves the pair.

A handshake is done in the connection's own task and bounded by the caller's timeout; a
failure (not TLS, a certificate the CA did not sign, a name that does not match, too
slow) raises ``TlsHandshakeFailed`` with one line that says why, which callers count and
log. ``PairTls`` is ``Reloadable``: at SIGHUP new files are read and checked, then used
for the connections opened after it; bad files keep the old contexts.
"""

from __future__ import annotations

import contextlib
import ssl
from typing import Any

import trio

from broker.config import BrokerConfig
from broker.security.tls import client_context, server_context

__all__ = ["PairTls", "TlsHandshakeFailed", "tls_reason"]


class TlsHandshakeFailed(Exception):
    """A TLS handshake on a pair link failed; the text says why, in one line."""


def tls_reason(exc: BaseException) -> str | None:
    """The TLS reason behind a broken stream (an alert, a certificate refused), or None
    when ``exc`` was not caused by TLS."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLError):
            return cause.reason or str(cause)
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class PairTls:
    """The server and client contexts of one set of ``ca``/``cert``/``key`` files."""

    def __init__(self, ca: str, cert: str, key: str, *, what: str = "ha") -> None:
        self.ca, self.cert, self.key = ca, cert, key
        self.what = what
        self.name = f"{what} tls"  # for the reload log
        self.server, self.client = self._load()

    @classmethod
    def from_config(cls, config: BrokerConfig) -> PairTls | None:
        """The contexts ``[ha] ca``/``cert``/``key`` name, or None without them. Raises
        ``ConfigError`` naming the key, the file and the problem."""
        if config.ha_ca is None or config.ha_cert is None or config.ha_key is None:
            return None
        return cls(config.ha_ca, config.ha_cert, config.ha_key)

    def _load(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        server = server_context(self.cert, self.key, self.ca, True, what=self.what, ca_key="ca")
        client = client_context(self.ca, self.cert, self.key, what=self.what)
        return server, client

    def reload(self) -> None:
        self.server, self.client = self._load()  # raises before replacing: old ones stay

    async def accept(self, stream: trio.abc.Stream, timeout: float) -> trio.SSLStream[Any]:
        """The server side of TLS over an accepted ``stream``, handshaken within
        ``timeout`` seconds, the client's certificate verified. On failure ``stream`` is
        closed and ``TlsHandshakeFailed`` raised."""
        secure = trio.SSLStream(stream, self.server, server_side=True, https_compatible=True)
        await _handshake(secure, timeout)
        return secure

    async def dial(self, stream: trio.abc.Stream, host: str, timeout: float) -> trio.SSLStream[Any]:
        """The client side of TLS over a connected ``stream`` to ``host``, handshaken within
        ``timeout`` seconds, the server's certificate verified and naming ``host``. On
        failure ``stream`` is closed and ``TlsHandshakeFailed`` raised."""
        secure = trio.SSLStream(stream, self.client, server_hostname=host, https_compatible=True)
        await _handshake(secure, timeout)
        return secure


#: Seconds spent telling the other side why its handshake failed (the TLS alert).
ALERT_TIMEOUT = 0.5


async def _handshake(secure: trio.SSLStream[Any], timeout: float) -> None:
    reason = f"no TLS handshake within {timeout:g} s"
    with trio.move_on_after(timeout):
        try:
            await secure.do_handshake()
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            reason = tls_reason(exc) or _plain_reason(exc)
            await _send_alert(secure)
    await trio.aclose_forcefully(secure)
    raise TlsHandshakeFailed(reason)


async def _send_alert(secure: trio.SSLStream[Any]) -> None:
    """Send the alert OpenSSL queued when the handshake failed ("unknown ca", "certificate
    required"). trio's ``SSLStream`` marks itself broken and leaves it in its outgoing
    buffer, so without this a standby whose certificate we refuse sees a bare EOF (TLS 1.3
    ends the client's handshake before the server has checked its certificate) and cannot
    log why. Best effort: nothing is sent if trio keeps that buffer elsewhere."""
    outgoing = getattr(secure, "_outgoing", None)
    if not isinstance(outgoing, ssl.MemoryBIO) or not outgoing.pending:
        return
    gone = (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError)
    with trio.move_on_after(ALERT_TIMEOUT), contextlib.suppress(*gone):
        await secure.transport_stream.send_all(outgoing.read())


def _plain_reason(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        return str(cause) or type(cause).__name__
    return str(exc) or "connection closed during the TLS handshake"
