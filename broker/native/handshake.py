"""The start of a native connection: HELLO in, a session opened, WELCOME out.

Its own module because it is the one part of a connection that may refuse a client
outright: a bad HELLO, a credential, a missing store or a durable session that will not
let go end the connection with ERROR before any session exists. Everything after
WELCOME is ``broker.native.requests``' job.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from broker.core import GROUP_PREFIX, Broker, Group, Holder, NotOwner, Session
from broker.errors import ErrorCode, RemoteProtocolError
from broker.log import get_logger
from broker.net import receive_frame, send_error
from broker.security import ANONYMOUS, Identity, certificate_subject
from broker.security.floods import MAX_CONNECTIONS, REFUSED_HELLO_TIMEOUT, Refusal
from broker.security.logins import LoginRefused
from broker.store import StoreError
from broker.wire.connection import Connection
from broker.wire.frames import PROTOCOL_VERSION, Frame, Hello, PeerHello, Welcome

MIN_KEEPALIVE = 0.5
MAX_KEEPALIVE = 3600.0

log = get_logger("topiary.connection")


@dataclass(frozen=True, slots=True)
class Opened:
    """A client's session, open and WELCOMEd."""

    session: Session
    keepalive: float  # the interval this client asked for (clamped), or the broker's
    heard: float  # when the client was last heard (trio time): the keepalive starts there
    joining: Group | None  # the shared group it joins once its first request is answered
    identity: Identity = ANONYMOUS  # who the client proved to be (broker/security)
    client_id: str = ""  # the id the client gave (else the one assigned): the ACLs' %c


async def handshake(
    broker: Broker,
    stream: trio.abc.Stream,
    proto: Connection,
    holder: Holder,
    peer: str = "?",
    *,
    refusal: Refusal | None = None,
) -> Opened | PeerHello | None:
    """Read the first frame and answer it: ``Opened`` for a client, the ``PeerHello`` of a
    broker or observer (the mesh takes the stream), or None when the connection is over
    (EOF, or refused with ERROR). ``holder`` is what a durable session is attached to.
    ``refusal``: a limit against floods refused the connection (``FloodGuard.admit``); a
    client's HELLO is answered with ERROR LIMIT_EXCEEDED or RATE_LIMITED, before its
    credentials are looked at; a peer's PEER_HELLO is not subject to client limits."""
    config = broker.config
    hello_timeout = config.hello_timeout
    if refusal is not None:
        hello_timeout = min(hello_timeout, REFUSED_HELLO_TIMEOUT)
    heard = trio.current_time()

    async def receive(size: int) -> bytes:
        nonlocal heard
        try:
            data = await stream.receive_some(size)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""  # a dead socket ends the handshake like EOF
        heard = trio.current_time()
        return data

    frame: Frame | None = None
    with trio.move_on_after(hello_timeout) as waiting:
        try:
            frame = await receive_frame(proto, receive)
        except RemoteProtocolError as exc:
            await _refuse(broker, stream, proto, exc)
            return None
    if waiting.cancelled_caught:
        await _refuse(
            broker,
            stream,
            proto,
            RemoteProtocolError(ErrorCode.IDLE_TIMEOUT, f"no HELLO within {hello_timeout} s"),
        )
        return None
    if frame is None:
        return None  # EOF before HELLO
    if isinstance(frame, PeerHello):
        return frame
    assert isinstance(frame, Hello)
    if refusal is not None:
        code = (
            ErrorCode.LIMIT_EXCEEDED if refusal.limit == MAX_CONNECTIONS else ErrorCode.RATE_LIMITED
        )
        await _refuse(broker, stream, proto, RemoteProtocolError(code, refusal.text))
        return None
    problem = check_hello(broker, frame)
    if problem is not None:
        await _refuse(broker, stream, proto, problem)
        return None
    try:
        identity = await login(broker, stream, frame, peer)
    except LoginRefused as refused:
        await _refuse(
            broker, stream, proto, RemoteProtocolError(ErrorCode.AUTH_FAILED, refused.text)
        )
        return None
    keepalive = config.keepalive
    if frame.keepalive:
        keepalive = min(max(frame.keepalive, MIN_KEEPALIVE), MAX_KEEPALIVE)
    present = False
    try:
        if frame.group is not None:
            group, present = await broker.open_group(frame.group)
        elif frame.durable:
            assert frame.client_id is not None
            durable, present = await broker.open_durable(
                frame.client_id, identity.owner, identity.cert
            )
    except NotOwner as exc:
        await _refuse(
            broker, stream, proto, RemoteProtocolError(ErrorCode.NOT_AUTHORIZED, str(exc))
        )
        return None
    except StoreError as exc:
        broker.counters.store_errors += 1
        await _refuse(
            broker, stream, proto, RemoteProtocolError(ErrorCode.INTERNAL, f"storage failed: {exc}")
        )
        return None
    joining = None
    if frame.group is not None:
        session = broker.open_session(frame.client_id)
        joining = group  # joins once its first request is answered, like a backlog
        session.ready = False
    elif frame.durable:
        session = durable
        previous = session.connection
        if previous is not None:
            previous.take_over()
            with trio.move_on_after(config.shutdown_timeout):
                while session.connection is previous:
                    await trio.sleep(0.01)
            if session.connection is not None:
                await _refuse(
                    broker,
                    stream,
                    proto,
                    RemoteProtocolError(
                        ErrorCode.SESSION_TAKEN, "the session's connection did not let go"
                    ),
                )
                return None
        session.attach(holder)
    else:
        session = broker.open_session(frame.client_id)
    welcome = Welcome(
        version=PROTOCOL_VERSION,
        client_id=session.client_id,
        server_id=broker.server_id,
        session_present=present,
        max_frame=config.max_frame,
        keepalive=keepalive * 1.5,
    )
    session.send_control(proto.send(welcome))
    log.debug("hello", peer=peer, client=session.client_id, owner=identity.owner)
    client_id = frame.client_id or session.client_id
    return Opened(session, keepalive, heard, joining, identity, client_id=client_id)


async def login(broker: Broker, stream: trio.abc.Stream, hello: Hello, peer: str) -> Identity:
    """Who HELLO's credentials ``{"username": ..., "password": ...}`` and the stream's TLS
    client certificate prove the client to be; raises ``LoginRefused``."""
    credentials = hello.credentials or {}
    username = credentials.get("username")
    password = credentials.get("password")
    logins = broker.logins
    if not isinstance(username, str | None) or not isinstance(password, str | None):
        await logins.refuse(
            "username and password must be strings", client_id=hello.client_id, peer=peer
        )
    return await logins.login(
        username=username,
        password=None if password is None else password.encode(),
        cert=certificate_subject(stream),
        client_id=hello.client_id,
        peer=peer,
    )


def check_hello(broker: Broker, hello: Hello) -> RemoteProtocolError | None:
    """Why ``broker`` cannot take this HELLO, or None when it can."""
    config = broker.config
    if hello.version != PROTOCOL_VERSION:
        return RemoteProtocolError(
            ErrorCode.VERSION_MISMATCH,
            f"this broker speaks protocol version {PROTOCOL_VERSION}, not {hello.version}",
        )
    if config.auth_token is not None:
        token = (hello.credentials or {}).get("token")
        if token != config.auth_token:
            return RemoteProtocolError(ErrorCode.AUTH_FAILED, "bad or missing token")
    if hello.client_id is not None and not 0 < len(hello.client_id.encode()) <= 256:
        return RemoteProtocolError(
            ErrorCode.INVALID_CLIENT_ID, "client_id must be 1..256 bytes of UTF-8"
        )
    if hello.group is not None:
        if not 0 < len(hello.group.encode()) <= 256:
            return RemoteProtocolError(
                ErrorCode.INVALID_CLIENT_ID, "group must be 1..256 bytes of UTF-8"
            )
        if broker.store is None:
            return RemoteProtocolError(
                ErrorCode.UNSUPPORTED, "shared groups need a broker started with --data-dir"
            )
    elif hello.durable:
        if hello.client_id is not None and hello.client_id.startswith(GROUP_PREFIX):
            return RemoteProtocolError(
                ErrorCode.INVALID_CLIENT_ID,
                f"client ids starting with {GROUP_PREFIX!r} name shared groups",
            )
        if hello.client_id is None:
            return RemoteProtocolError(
                ErrorCode.INVALID_CLIENT_ID, "a durable session needs a client_id"
            )
        if broker.store is None:
            return RemoteProtocolError(
                ErrorCode.UNSUPPORTED,
                "durable sessions need a broker started with --data-dir",
            )
    return None


async def _refuse(
    broker: Broker, stream: trio.abc.Stream, proto: Connection, exc: RemoteProtocolError
) -> None:
    """Count the refusal, then ERROR and linger: the connection is over."""
    counters = broker.counters
    counters.errors[str(exc.code)] += 1
    if exc.code == ErrorCode.AUTH_FAILED:
        counters.connections_refused += 1
    await send_error(stream, proto, exc)
