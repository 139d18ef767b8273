"""MQTT over WebSocket (MQTT 5.0 and 3.1.1, section 6): a trio stream of MQTT bytes.

The MQTT front end reads and writes a byte stream; this module makes one out of a WebSocket.
wsproto does the protocol sans-IO (the HTTP upgrade through h11, frame parsing, unmasking,
fragments, control frames, the close handshake); this module is the thin trio shell around it,
plus the MQTT rules of section 6:

- the client asks for path ``/mqtt`` and offers the subprotocol ``mqtt`` (clients of MQTT 3.1
  offer ``mqttv3.1``); anything else is refused with an HTTP error before any WebSocket exists;
- MQTT travels in binary messages only, and message boundaries mean nothing: a packet may span
  messages and a message may hold several packets, so received payloads are simply
  concatenated; a text message is a protocol error (close code 1003);
- each ``send_all`` is one binary message.

Limits, so one client cannot cost more than its connection: the request head is bounded by h11
(16 KiB, plus the 4 KiB read that completes it), the whole handshake by ``timeout``, and one
received message by ``max_message`` (close code 1009). Payload bytes are handed on as frames
arrive, never buffered whole.
"""

from __future__ import annotations

import contextlib
import struct
from typing import Final, NoReturn

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

__all__ = ["WebSocketRefused", "WebSocketStream", "accept_websocket", "binary_frame_header"]

RECEIVE_SIZE: Final = 64 * 1024
# h11 refuses a request head once more than 16 KiB wait without forming one; reading the
# handshake in small steps keeps that the limit (a 64 KiB read could hold a whole 60 KiB head).
HANDSHAKE_RECEIVE_SIZE: Final = 4 * 1024
MQTT_PATH: Final = "/mqtt"
MQTT_SUBPROTOCOLS: Final = ("mqtt", "mqttv3.1")
HANDSHAKE_TIMEOUT: Final = 10.0
MAX_MESSAGE: Final = 1 << 20
CLOSE_TIMEOUT: Final = 1.0  # aclose: time to get the close frame out to a slow reader

_BINARY_FIN: Final = 0x82  # FIN + opcode 2 (binary); RSV bits clear: no extension is agreed


class WebSocketRefused(Exception):
    """No WebSocket came out of the connection; the transport has been closed.

    ``status`` is the HTTP status sent to the client, or None when nothing was sent (the client
    went away or was too slow).
    """

    def __init__(self, reason: str, *, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def binary_frame_header(length: int) -> bytes:
    """The header of an unfragmented, unmasked binary frame of ``length`` payload bytes.

    A server's frames are never masked (RFC 6455 section 5.1) and no extension is negotiated,
    so a data frame is this header followed by the payload, byte for byte what wsproto would
    produce: ``send_all`` writes it directly because wsproto copies the payload three times
    and builds several objects per frame, and ``send_all`` carries the fan-out.
    """
    if length < 126:
        return bytes((_BINARY_FIN, length))
    if length < 1 << 16:
        return struct.pack("!BBH", _BINARY_FIN, 126, length)
    return struct.pack("!BBQ", _BINARY_FIN, 127, length)


class WebSocketStream(trio.abc.Stream):
    """The MQTT byte stream carried by a server-side WebSocket; made by ``accept_websocket``.

    ``receive_some`` returns the payload of binary messages as one stream and ``b""`` once the
    client closed (with a close frame, answered, or by ending the TCP connection). It answers
    pings itself. When the client breaks the protocol (a text message: 1003; a message over
    ``max_message``: 1009; a malformed frame: wsproto's code, usually 1002), it sends the close
    frame, returns the bytes that came before, then raises ``trio.BrokenResourceError``; the
    caller then ``aclose``\\ s as after any broken stream.

    ``send_all`` may run in one task while ``receive_some`` runs in another, as with any trio
    stream; the control frames ``receive_some`` sends wait for a ``send_all`` in progress.
    """

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        connection: WSConnection,
        *,
        subprotocol: str,
        max_message: int = MAX_MESSAGE,
    ) -> None:
        #: The stream underneath (TCP, or TLS over TCP), as in ``trio.SSLStream``.
        self.transport_stream = transport_stream
        #: The subprotocol agreed in the handshake: ``mqtt``, or ``mqttv3.1`` for MQTT 3.1.
        self.subprotocol = subprotocol
        self._ws = connection
        self._max_message = max_message
        self._message_size = 0  # bytes so far of the binary message being received
        self._incoming = bytearray()  # payload received, not yet returned
        self._eof = False  # the client closed: b"" once _incoming is empty
        self._error: str | None = None  # the client broke the protocol: raise once it's empty
        self._broken = False  # a write failed or was cancelled halfway: framing is lost
        self._closed = False  # aclose was called
        self._receiving = False
        self._sending = False
        self._send_lock = trio.Lock()  # one writer on the transport: ours and receive_some's

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """At most ``max_bytes`` (default: all buffered) bytes of MQTT data; b"" at the end."""
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving")
        self._receiving = True
        try:
            # Each pass returns, raises, or reads the transport: as long as the client sends.
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("the WebSocket stream was closed")
                if self._incoming:
                    await trio.lowlevel.checkpoint()
                    return self._take(max_bytes)
                if self._error is not None:
                    await trio.lowlevel.checkpoint()
                    raise trio.BrokenResourceError(self._error)
                if self._eof:
                    await trio.lowlevel.checkpoint()
                    return b""
                data = await self.transport_stream.receive_some(RECEIVE_SIZE)
                if not data:  # TCP ended without a close frame: the end all the same
                    self._eof = True
                    continue
                try:
                    self._ws.receive_data(data)
                except LocalProtocolError:  # wsproto was told the connection is closed
                    self._eof = True
                    continue
                await self._handle(list(self._ws.events()))
        finally:
            self._receiving = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` as one binary message (no message is sent for empty ``data``)."""
        if self._sending:
            raise trio.BusyResourceError("another task is already sending")
        self._sending = True
        try:
            async with self._send_lock:
                if self._closed:
                    raise trio.ClosedResourceError("the WebSocket stream was closed")
                if self._broken:
                    raise trio.BrokenResourceError("an earlier send failed halfway")
                if self._ws.state is not ConnectionState.OPEN:
                    why = self._error or f"the WebSocket is {self._ws.state.name}"
                    raise trio.BrokenResourceError(why)
                if data:
                    await self._write(binary_frame_header(len(data)) + data)
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Send a close frame (1000) if the WebSocket is still open, then close the transport.

        The close frame gets ``CLOSE_TIMEOUT`` seconds, shielded, so a client that stopped
        reading cannot hold the closing task. The client's answering close frame is not
        awaited: the server closes the TCP connection first (RFC 6455 section 7.1.1).
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        try:
            with trio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await self._send_control(CloseConnection(code=CloseReason.NORMAL_CLOSURE))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client is gone: nothing to say goodbye to
        finally:
            self._closed = True
            await self.transport_stream.aclose()

    def _take(self, max_bytes: int | None) -> bytes:
        if max_bytes is None or max_bytes >= len(self._incoming):
            data = bytes(self._incoming)
            self._incoming.clear()
        else:
            data = bytes(self._incoming[:max_bytes])
            del self._incoming[:max_bytes]
        return data

    async def _handle(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, BytesMessage):
                self._message_size += len(event.data)
                if self._message_size > self._max_message:
                    limit = self._max_message
                    await self._fail(CloseReason.MESSAGE_TOO_BIG, f"message over {limit} bytes")
                    return
                self._incoming += event.data
                if event.message_finished:
                    self._message_size = 0
            elif isinstance(event, TextMessage):
                await self._fail(CloseReason.UNSUPPORTED_DATA, "MQTT needs binary messages")
                return
            elif isinstance(event, Ping):
                await self._send_control(event.response())
            elif isinstance(event, CloseConnection):
                if self._ws.state is ConnectionState.REMOTE_CLOSING:  # the client's close frame
                    self._eof = True
                    # A client that did not wait for the answer has ended all the same.
                    with contextlib.suppress(trio.BrokenResourceError):
                        await self._send_control(event.response())
                else:  # wsproto could not parse a frame and names the code to close with
                    await self._fail(event.code, event.reason or "malformed frame")
                return
            # Pong: an answer to nothing we asked (we send no pings); ignored as RFC 6455 allows.

    async def _fail(self, code: int, reason: str) -> None:
        """The client broke the protocol: say so in a close frame, then stop reading."""
        self._error = f"WebSocket closed with {int(code)}: {reason}"
        with contextlib.suppress(trio.BrokenResourceError):  # if it cannot be told: still ended
            await self._send_control(CloseConnection(code=code, reason=reason[:100]))

    async def _send_control(self, event: Event) -> None:
        """Send a control frame made by wsproto, if the connection's state still allows it."""
        async with self._send_lock:
            if self._broken:
                raise trio.BrokenResourceError("an earlier send failed halfway")
            state = self._ws.state
            if state is ConnectionState.OPEN or (
                isinstance(event, CloseConnection) and state is ConnectionState.REMOTE_CLOSING
            ):
                await self._write(self._ws.send(event))

    async def _write(self, data: bytes | bytearray) -> None:
        """The transport's send_all; once it fails or is cancelled, frames may be cut."""
        try:
            await self.transport_stream.send_all(data)
        except BaseException:
            self._broken = True
            raise


async def accept_websocket(
    stream: trio.abc.Stream,
    *,
    path: str = MQTT_PATH,
    subprotocols: tuple[str, ...] = MQTT_SUBPROTOCOLS,
    timeout: float = HANDSHAKE_TIMEOUT,
    max_message: int = MAX_MESSAGE,
) -> WebSocketStream:
    """Read the client's HTTP upgrade request on ``stream`` and accept it as MQTT over WebSocket.

    The request must be a WebSocket upgrade (else 400, or 426 for a wrong WebSocket version)
    for ``path`` (else 404; the query string is ignored) offering one of ``subprotocols``
    (else 400); the first of ``subprotocols`` the client offers is chosen. A refusal sends the
    HTTP answer, closes ``stream`` and raises ``WebSocketRefused``. So does a client that ends
    the connection, or that has not finished the handshake within ``timeout`` seconds: that is
    the server's limit on a remote peer (as ``HttpServer.request_timeout``), not a deadline of
    the caller's, who can still add a cancel scope. ``stream`` is closed on any failure,
    cancellation included; on success the returned stream owns it.
    """
    if max_message < 1:
        raise ValueError("max_message must be >= 1")
    ws = WSConnection(ConnectionType.SERVER)
    try:
        with trio.move_on_after(timeout):
            return await _handshake(stream, ws, path, subprotocols, max_message)
        raise WebSocketRefused(f"no WebSocket handshake within {timeout} s")
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def _handshake(
    stream: trio.abc.Stream,
    ws: WSConnection,
    path: str,
    subprotocols: tuple[str, ...],
    max_message: int,
) -> WebSocketStream:
    try:
        request = await _read_request(stream, ws)
    except RemoteProtocolError as exc:
        hint = exc.event_hint
        if isinstance(hint, RejectConnection):
            await _refuse(stream, ws, hint.status_code, str(exc), list(hint.headers))
        raise WebSocketRefused(str(exc)) from exc
    except trio.BrokenResourceError as exc:
        raise WebSocketRefused(f"connection lost during the handshake: {exc}") from exc
    target = request.target.partition("?")[0]
    if target != path:
        await _refuse(stream, ws, 404, f"no WebSocket at {target!r}; MQTT is at {path!r}")
    offered = list(request.subprotocols)
    chosen = next((name for name in subprotocols if name in offered), None)
    if chosen is None:
        wanted = " or ".join(subprotocols)
        await _refuse(stream, ws, 400, f"subprotocol {wanted} required; offered: {offered}")
    try:
        await stream.send_all(ws.send(AcceptConnection(subprotocol=chosen)))
    except trio.BrokenResourceError as exc:
        raise WebSocketRefused(f"connection lost during the handshake: {exc}") from exc
    return WebSocketStream(stream, ws, subprotocol=chosen, max_message=max_message)


async def _read_request(stream: trio.abc.Stream, ws: WSConnection) -> Request:
    """The upgrade request; h11 bounds its size (16 KiB + one read), the caller's timeout its
    duration."""
    while True:
        for event in ws.events():
            if isinstance(event, Request):
                return event
        data = await stream.receive_some(HANDSHAKE_RECEIVE_SIZE)
        if not data:
            raise WebSocketRefused("connection closed during the handshake")
        ws.receive_data(data)


async def _refuse(
    stream: trio.abc.Stream,
    ws: WSConnection,
    status: int,
    reason: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> NoReturn:
    """Answer ``status`` with ``reason`` as a text body (when the client can still get it),
    then raise WebSocketRefused."""
    body = f"{reason}\n".encode()
    head = [
        (b"Content-Type", b"text/plain; charset=utf-8"),
        (b"Content-Length", str(len(body)).encode()),
        (b"Connection", b"close"),
        *(headers or []),
    ]
    try:
        data = ws.send(RejectConnection(status_code=status, headers=head, has_body=True))
        data += ws.send(RejectData(data=body))
        await stream.send_all(data)
    except (LocalProtocolError, trio.BrokenResourceError):
        raise WebSocketRefused(reason) from None  # no answer (whole) reached the client
    raise WebSocketRefused(reason, status=status)
