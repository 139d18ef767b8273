"""A TCP forwarder on 127.0.0.1 that tests can cut and restore to make Kafka "go away".

Plain threads, not trio: the Kafka clients under test (confluent-kafka) block, and the proxy
must keep forwarding while a test thread sits in ``poll()``.

``cut()`` looks to clients like a dead broker host: the listening socket closes (new
connects are refused) and every forwarded connection is closed both ways. ``restore()``
listens again on the same port, so clients that remember the advertised address come back.
``hold_replies()`` stops forwarding what the target sends (requests still reach it): the
replies to what it has done are in flight when a ``cut()`` drops them; ``holding`` is set
once some are held.

Kafka clients connect to the broker's *advertised* address after bootstrapping, so start
the broker advertising ``proxy.port`` and bootstrap every client through the proxy too.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

HOST = "127.0.0.1"
CHUNK = 64 * 1024  # at most one chunk per direction in flight: sendall() gives backpressure
_ACCEPT_POLL = 0.05  # how often the accept loop notices cut()/close()


class FaultProxy:
    """Forward ``127.0.0.1:port`` to ``target``; :meth:`cut` and :meth:`restore` on demand."""

    def __init__(self, target: tuple[str, int], listen_port: int | None = None) -> None:
        self.target = target
        self.port = listen_port or 0  # real port known after start()
        self.connections = 0  # accepted in total, across cuts
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # forwarded sockets, both sides
        self._listener: socket.socket | None = None
        self._accepting = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._replies = threading.Event()  # clear: target-to-client data is held
        self._replies.set()
        self.holding = threading.Event()  # set once target-to-client data is being held

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Listen and forward; the first call fixes :attr:`port` if none was given."""
        if self._accept_thread is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Same port after cut(): old connections may linger in TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((HOST, self.port))
            listener.listen(64)
        except OSError:
            listener.close()
            raise
        listener.settimeout(_ACCEPT_POLL)
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        self._accepting.set()
        self._accept_thread = threading.Thread(
            target=self._accept_loop, args=(listener,), name=f"faultproxy-{self.port}", daemon=True
        )
        self._accept_thread.start()

    def cut(self) -> None:
        """Stop listening and drop every connection: the service is gone (connect refused)."""
        self._stop_accepting()
        with self._lock:
            doomed = list(self._open)
            self._open.clear()
        for sock in doomed:
            _close(sock)
        self._replies.set()  # held replies go nowhere now: their sockets are closed
        self._reap()

    def hold_replies(self) -> None:
        """Hold everything the target sends until :meth:`cut` (which drops it)."""
        self._replies.clear()

    def restore(self) -> None:
        """Listen again on the same port and forward new connections."""
        self.start()

    def close(self) -> None:
        """Cut for good and wait for the forwarding threads."""
        self.cut()
        for thread in self._threads:
            thread.join(timeout=1)
        self._threads.clear()

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------

    def _stop_accepting(self) -> None:
        # Join the accept thread *before* closing connections, so none slips in afterwards.
        self._accepting.clear()
        if self._accept_thread is not None:
            self._accept_thread.join()
            self._accept_thread = None
        if self._listener is not None:
            self._listener.close()  # refuses new connects; pending ones are reset
            self._listener = None

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._accepting.is_set():
            try:
                client, _addr = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self.connections += 1
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)  # target down: behave like it, close at once
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for src, dst, gate in ((client, upstream, None), (upstream, client, self._replies)):
                thread = threading.Thread(target=self._pump, args=(src, dst, gate), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        """Copy one direction until either side ends, then close the whole pair; data
        waits while ``gate`` is clear."""
        try:
            while data := src.recv(CHUNK):
                if gate is not None and not gate.is_set():
                    self.holding.set()
                    gate.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            _close(src)
            _close(dst)

    def _reap(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]


def _close(sock: socket.socket) -> None:
    # shutdown() first: it wakes a thread blocked in recv() on this socket, close() may not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
