"""A small HTTP/1.1 server on the broker's own trio loop, for operators: h11 does the
parsing (sans-IO), this module only moves bytes and enforces the limits.

Only GET and HEAD are served; every request is bounded in size (h11's
``max_incomplete_event_size`` for the head, no request bodies accepted) and in time (a
whole request must arrive within ``request_timeout``, and an idle keep-alive connection is
closed after it too), so a slowloris or a huge header costs one connection and nothing
else. A handler's answer is computed synchronously from the broker's state, between two
reads, so a scrape never sees a half-updated broker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11
import trio

from broker.log import get_logger

log = get_logger("topiary.http")

RECEIVE_SIZE = 64 * 1024
MAX_REQUEST_HEAD = 16 * 1024
REQUEST_TIMEOUT = 10.0
SERVER_NAME = b"topiary"
LINGER_SECONDS = 1.0  # after an error answer: time to send it and drain the client's rest
LINGER_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str


@dataclass(slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


#: Path -> handler. A handler answers a GET (HEAD gets the same headers, no body).
Routes = dict[str, Callable[[Request], Response]]


@dataclass(slots=True)
class HttpCounters:
    requests: int = 0
    bad_requests: int = 0  # unparseable, too large, or too slow
    not_found: int = 0
    not_allowed: int = 0
    connections: int = 0


def text(status: int, body: str) -> Response:
    return Response(status, body.encode())


class HttpServer:
    """Serves ``routes`` on any number of listeners until cancelled."""

    def __init__(
        self,
        routes: Routes,
        *,
        max_request_head: int = MAX_REQUEST_HEAD,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.routes = routes
        self.max_request_head = max_request_head
        self.request_timeout = request_timeout
        self.counters = HttpCounters()
        self.addresses: list[tuple[str, int]] = []

    async def serve(
        self,
        listeners: list[Any],
        *,
        task_status: trio.TaskStatus[list[tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        for listener in listeners:
            sock = getattr(listener, "socket", None)
            if sock is not None:
                self.addresses.append(sock.getsockname()[:2])
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept_loop, listener, nursery)
            log.info("http listening", addresses=self.addresses)
            task_status.started(self.addresses)

    async def _accept_loop(self, listener: Any, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # out of descriptors, for instance: later
                    log.error("http accept failed", error=str(exc))
                    await trio.sleep(0.1)
                    continue
                nursery.start_soon(self._connection, stream, getattr(listener, "tls", None))

    async def _connection(self, stream: trio.abc.Stream, tls: Any = None) -> None:
        """One client, over TLS when ``tls`` (a ``ServerTls``) made the stream: its
        handshake is done here, within ``request_timeout``, not in the accept loop."""
        self.counters.connections += 1
        if tls is not None and not await tls.handshake(stream, self.request_timeout):
            await trio.aclose_forcefully(stream)
            return
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_request_head)
        try:
            async with stream:
                while await self._one_request(stream, conn):
                    conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away; nothing to tell anyone

    async def _one_request(self, stream: trio.abc.Stream, conn: h11.Connection) -> bool:
        """Serve one request; whether the connection may carry another."""
        request = None
        with trio.move_on_after(self.request_timeout):
            try:
                request = await self._read_request(stream, conn)
            except h11.RemoteProtocolError as exc:
                self.counters.bad_requests += 1
                await self._send_if_possible(
                    stream, conn, text(exc.error_status_hint, f"bad request: {exc}\n")
                )
                return False
        if request is None:  # EOF, or too slow
            if _started(conn):
                self.counters.bad_requests += 1
                await self._send_if_possible(stream, conn, text(408, "request timeout\n"))
            return False
        await self._send(stream, conn, request, self._answer(request))
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _read_request(self, stream: trio.abc.Stream, conn: h11.Connection) -> Any:
        head = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(RECEIVE_SIZE)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                raise h11.RemoteProtocolError("request bodies are not accepted", 413)
            elif isinstance(event, h11.EndOfMessage):
                return head

    def _answer(self, head: h11.Request) -> Response:
        self.counters.requests += 1
        method = head.method.decode("ascii", "replace")
        target = head.target.decode("ascii", "replace")
        path, _, query = target.partition("?")
        handler = self.routes.get(path)
        if handler is None:
            self.counters.not_found += 1
            return text(404, f"not found: {path}\n")
        if method not in ("GET", "HEAD"):
            self.counters.not_allowed += 1
            response = text(405, f"method {method} not allowed\n")
            response.headers.append(("Allow", "GET, HEAD"))
            return response
        return handler(Request(method, path, query))

    async def _send(
        self, stream: trio.abc.Stream, conn: h11.Connection, head: h11.Request, response: Response
    ) -> None:
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Cache-Control", "no-store"),
            ("Server", SERVER_NAME.decode()),
            *response.headers,
        ]
        data = conn.send(
            h11.Response(status_code=response.status, headers=headers, reason=_reason(response))
        )
        if head.method != b"HEAD" and response.body:
            data += conn.send(h11.Data(data=response.body))
        data += conn.send(h11.EndOfMessage())
        await stream.send_all(data)

    async def _send_if_possible(
        self, stream: trio.abc.Stream, conn: h11.Connection, response: Response
    ) -> None:
        """An error answer, when h11 still allows one (not after a response began)."""
        if conn.our_state is not h11.SEND_RESPONSE and conn.our_state is not h11.IDLE:
            return
        try:
            data = conn.send(
                h11.Response(
                    status_code=response.status,
                    reason=_reason(response),
                    headers=[
                        ("Content-Type", response.content_type),
                        ("Content-Length", str(len(response.body))),
                        ("Connection", "close"),
                    ],
                )
            )
            data += conn.send(h11.Data(data=response.body)) + conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            return
        with trio.move_on_after(LINGER_SECONDS):
            await stream.send_all(data)
            await _linger(stream)


async def _linger(stream: trio.abc.Stream) -> None:
    """Half-close, then read and drop what the client still sends (bounded by the caller's
    deadline and LINGER_BYTES): closing with unread input makes the kernel send a reset,
    which can destroy the error answer before the client has read it."""
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()
    drained = 0
    while drained < LINGER_BYTES:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return
        drained += len(data)


def _started(conn: h11.Connection) -> bool:
    """Whether the client began a request it has not finished: h11 stays IDLE until the
    whole head is in, so bytes waiting in its buffer count too (a slowloris)."""
    if conn.their_state is not h11.DONE and conn.their_state is not h11.IDLE:
        return True
    return bool(conn.trailing_data[0])


def _reason(response: Response) -> bytes:
    try:
        return HTTPStatus(response.status).phrase.encode()
    except ValueError:
        return b""
