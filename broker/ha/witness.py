"""``topiary witness``: the tiny server that breaks ties between the pair (docs/ha.md).

One task per connection, all in one nursery owned by ``serve_witness``. Each request is
decided by ``WitnessState`` and, when it changed the term, written to the term file (in a
thread) before the answer leaves; one lock around decide-and-persist, so no answer ever
rests on a state that is not on disk yet. A term file that cannot be written stops the
witness (the error propagates): answering without persisting could grant a term twice.
A bad handshake, MAC or frame costs only that connection: WITNESS_ERROR, counted, closed.
With ``tls`` (``--ca --cert --key``) every connection is first a mutual TLS handshake, in
its own task within ``HELLO_TIMEOUT``; one that fails (plain text, a certificate the CA did
not sign) is counted (``tls_failures``), logged and closed. SIGHUP reads the files again.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import asdict, dataclass
from typing import Any

import trio

from broker.ha.codec import (
    NONCE_BYTES,
    WitnessAuthError,
    WitnessConnectionClosed,
    WitnessProtocolError,
    decode_hello,
    decode_request,
    encode_answer,
    encode_error,
    encode_welcome,
    session_key,
)
from broker.ha.messages import OK, Renew
from broker.ha.stream import FrameStream
from broker.ha.termfile import TermFile
from broker.ha.tls import PairTls, TlsHandshakeFailed
from broker.ha.witness_state import WitnessState
from broker.log import get_logger
from broker.security.reload import reload_all
from broker.security.tls import peer_address

__all__ = ["Witness", "WitnessCounters", "run_witness"]

log = get_logger("topiary.witness")

#: Seconds a connection may take to say WITNESS_HELLO.
HELLO_TIMEOUT = 5.0


@dataclass(slots=True)
class WitnessCounters:
    """What an operator graphs about a witness (logged at every term change and at exit)."""

    connections: int = 0
    auth_failures: int = 0
    protocol_errors: int = 0
    tls_failures: int = 0
    renewals_granted: int = 0
    renewals_stale: int = 0
    votes_granted: int = 0
    votes_refused: int = 0

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


class Witness:
    """The witness: its state machine, its term file and its counters."""

    def __init__(
        self, termfile: TermFile, secret: bytes, *, lease: float, tls: PairTls | None = None
    ) -> None:
        self.termfile = termfile
        self.secret = secret
        self.tls = tls
        self.counters = WitnessCounters()
        # Loaded (and so checked) before any listener opens; the clock starts the lease wait.
        self.state = WitnessState(termfile.load(), lease=lease, now=trio.current_time())
        self._decide = trio.Lock()
        self.port = 0  # the bound port, once serving

    async def serve(
        self, host: str, port: int, *, task_status: Any = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept connections on ``host:port`` until cancelled; ``started`` gives the port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        self.port = bound
        state = self.state.state
        log.info("witness listening", host=host, port=bound, term=state.term,
                 primary=state.primary, lease=self.state.lease,
                 tls=self.tls is not None)  # fmt: skip
        task_status.started(bound)
        await trio.serve_listeners(self.handle, listeners)

    async def handle(self, stream: trio.abc.Stream) -> None:
        self.counters.connections += 1
        if self.tls is not None:
            peer = peer_address(stream)
            try:
                stream = await self.tls.accept(stream, HELLO_TIMEOUT)
            except TlsHandshakeFailed as exc:
                self.counters.tls_failures += 1
                log.warning("witness connection refused: TLS handshake failed", peer=peer,
                            reason=str(exc), tls_failures=self.counters.tls_failures)  # fmt: skip
                return
        frames = FrameStream(stream)
        async with stream:
            try:
                key = await self._handshake(frames)
                await self._requests(frames, key)
            except WitnessConnectionClosed:
                pass
            except WitnessAuthError as exc:
                self.counters.auth_failures += 1
                await self._refuse(frames, exc)
            except WitnessProtocolError as exc:
                self.counters.protocol_errors += 1
                await self._refuse(frames, exc)
            except trio.BrokenResourceError:
                pass

    async def _refuse(self, frames: FrameStream, exc: Exception) -> None:
        log.warning("witness connection refused", error=str(exc))
        with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError):
            await frames.send(encode_error(str(exc)))

    async def _handshake(self, frames: FrameStream) -> bytes:
        with trio.move_on_after(HELLO_TIMEOUT):
            broker_nonce = decode_hello(await frames.receive())
            nonce = os.urandom(NONCE_BYTES)
            await frames.send(encode_welcome(nonce))
            return session_key(self.secret, broker_nonce, nonce)
        raise WitnessProtocolError(f"no WITNESS_HELLO within {HELLO_TIMEOUT} s")

    async def _requests(self, frames: FrameStream, key: bytes) -> None:
        last_seq = 0
        while True:
            seq, request = decode_request(key, await frames.receive(), last_seq)
            last_seq = seq
            async with self._decide:
                decision = self.state.handle(request, trio.current_time())
                if decision.persist is not None:
                    await trio.to_thread.run_sync(self.termfile.save, decision.persist)
            answer = decision.answer
            self._count(request, answer.verdict == OK)
            if decision.persist is not None:
                log.info("vote granted", term=answer.term, primary=answer.primary,
                         **self.counters.snapshot())  # fmt: skip
            elif answer.verdict != OK:
                log.info("request refused", request=type(request).__name__.upper(),
                         term=request.term, broker=request.broker_id, verdict=answer.verdict,
                         why=answer.why)  # fmt: skip
            await frames.send(encode_answer(key, seq, answer))

    def _count(self, request: object, granted: bool) -> None:
        c = self.counters
        if isinstance(request, Renew):
            if granted:
                c.renewals_granted += 1
            else:
                c.renewals_stale += 1
        elif granted:
            c.votes_granted += 1
        else:
            c.votes_refused += 1


async def run_witness(
    host: str,
    port: int,
    data_dir: str,
    secret: bytes,
    *,
    lease: float,
    tls: PairTls | None = None,
    handle_signals: bool = False,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a witness until cancelled (or SIGTERM/SIGINT with ``handle_signals``; SIGHUP
    then reloads ``tls``'s files).

    A bad term file or data dir raises ``TermFileError`` before anything listens.
    """
    termfile = TermFile(data_dir)
    try:
        witness = Witness(termfile, secret, lease=lease, tls=tls)
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
                if tls is not None:
                    nursery.start_soon(_reload_on_signal, tls)
            await nursery.start(witness.serve, host, port)
            task_status.started(witness)
        log.info("witness stopped", term=witness.state.state.term, **witness.counters.snapshot())
    finally:
        termfile.close()


async def _reload_on_signal(tls: PairTls) -> None:
    """SIGHUP: read the certificate files again (bad files keep the old ones, logged)."""
    with trio.open_signal_receiver(signal.SIGHUP) as received:
        async for _signum in received:
            log.info("signal", signal="SIGHUP")
            reload_all([tls])


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for signum in received:
            log.info("signal", signal=signal.Signals(signum).name)
            scope.cancel()
            return
