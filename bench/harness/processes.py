"""Broker subprocesses for the benchmarks: free ports, start, readiness, stop, stats.

Every benchmark measures a real ``python -m broker.cli serve`` in its own process, so
the figures include the wire and the scheduler as an operator would see them.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import trio

from bench.harness import BenchError
from broker.client import connect

ROOT = Path(__file__).resolve().parent.parent.parent
HOST = "127.0.0.1"
BROKER_START_TIMEOUT = 20.0
BROKER_STOP_TIMEOUT = 10.0
SERVE = [sys.executable, "-m", "broker.cli", "serve"]


class BrokerExited(BenchError):
    """A broker's process ended while we waited for it to listen."""

    def __init__(self, name: str, status: int | None) -> None:
        super().__init__(f"broker {name} exited with status {status}")
        self.name = name
        self.status = status


class NotListening(BenchError):
    """Brokers that did not accept a connection in time."""

    def __init__(self, names: list[str], timeout: float) -> None:
        super().__init__(f"brokers {names} did not listen within {timeout:g} s")
        self.names = names


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def wait_listening(brokers: dict[str, tuple[subprocess.Popen, int]], timeout: float) -> None:
    """Poll until every broker (name -> process, port) accepts a TCP connection.

    Raises BrokerExited for the first one whose process ended, NotListening for those
    still silent after ``timeout`` seconds: a broker that never comes up must not hang
    a benchmark.
    """
    deadline = time.monotonic() + timeout
    waiting = set(brokers)
    while waiting:
        for name in sorted(waiting):
            popen, port = brokers[name]
            if popen.poll() is not None:
                raise BrokerExited(name, popen.returncode)
            try:
                with socket.create_connection((HOST, port), timeout=1):
                    waiting.discard(name)
            except OSError:
                pass
        if waiting:
            if time.monotonic() > deadline:
                raise NotListening(sorted(waiting), timeout)
            time.sleep(0.05)


def tail(path: Path, limit: int = 3000) -> str:
    """The end of a log file, for an error message (never raises)."""
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError as exc:
        return f"<{path}: {exc}>"


def spawn_logged(command: list[str], log_path: Path) -> tuple[subprocess.Popen, IO[bytes]]:
    """``command`` from the repository root, stdout and stderr to a new ``log_path``; the
    log stays open for the caller to close when the process is stopped."""
    log_file = open(log_path, "wb")  # noqa: SIM115 (the caller closes it)
    try:
        popen = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file
        )
    except BaseException:
        log_file.close()
        raise
    return popen, log_file


def terminate(popen: subprocess.Popen, grace: float, kill_wait: float | None = None) -> bool:
    """SIGTERM, so that the process can finish cleanly; SIGKILL if it is still there after
    ``grace`` seconds. Whether it had to be killed."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(kill_wait)
            return True
    return False


@dataclass
class BrokerProcess:
    popen: subprocess.Popen
    port: int
    log_path: Path
    log_file: Any
    mqtt_port: int | None = None  # the MQTT listener's, when started with ``mqtt=True``

    @property
    def pid(self) -> int:
        return self.popen.pid


def start_broker(
    log_path: Path,
    profile: Path | None = None,
    data_dir: Path | None = None,
    config: Path | None = None,
    mqtt: bool = False,
) -> BrokerProcess:
    """A broker on a free port, logging JSON to ``log_path``, once it listens; under
    cProfile (stats written at exit) if ``profile``; with its store in ``data_dir`` and
    its settings from ``config`` if given; with ``mqtt``, also serving MQTT on a second
    free port (``--mqtt``), and ready once both listen."""
    port = free_port()
    command = [*SERVE, "--port", str(port), "--host", HOST, "--log-format", "json"]
    mqtt_port = None
    if mqtt:
        mqtt_port = free_port()
        command += ["--mqtt", f"{HOST}:{mqtt_port}"]
    if data_dir is not None:
        command += ["--data-dir", str(data_dir)]
    if config is not None:
        command += ["--config", str(config)]
    if profile is not None:
        command[1:1] = ["-m", "cProfile", "-o", str(profile)]
    popen, log_file = spawn_logged(command, log_path)
    broker = BrokerProcess(popen, port, log_path, log_file, mqtt_port)
    listeners = {"broker": (popen, port)}
    if mqtt_port is not None:
        listeners["broker's MQTT port"] = (popen, mqtt_port)
    try:
        wait_listening(listeners, BROKER_START_TIMEOUT)
    except BrokerExited:
        stop_broker(broker)
        raise BenchError(
            f"the broker exited with status {popen.returncode}:\n{tail(log_path)}"
        ) from None
    except NotListening:
        stop_broker(broker)
        raise BenchError(f"the broker did not listen within {BROKER_START_TIMEOUT:g} s") from None
    return broker


def stop_logged(
    popen: subprocess.Popen, log_file: IO[bytes], grace: float, kill_wait: float | None = None
) -> dict[str, Any]:
    """``terminate`` a process started with ``spawn_logged``, then close its log file: the
    exit status, how long it took and whether it had to be killed."""
    started = time.monotonic()
    try:
        killed = terminate(popen, grace, kill_wait)
    finally:
        log_file.close()
    return {
        "exit_status": popen.returncode,
        "stop_seconds": round(time.monotonic() - started, 3),
        "killed": killed,
    }


def stop_broker(broker: BrokerProcess) -> dict[str, Any]:
    """SIGTERM, then SIGKILL after 10 s; the exit status and how long it took."""
    return stop_logged(broker.popen, broker.log_file, BROKER_STOP_TIMEOUT)


def broker_stats(port: int) -> dict[str, Any]:
    """The broker's ``stats()``, over a connection of its own (blocking: for between phases)."""

    async def fetch() -> dict[str, Any]:
        with trio.fail_after(15):
            async with connect((HOST, port)) as client:
                return await client.stats()

    return trio.run(fetch)
