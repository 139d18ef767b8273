"""Peer brokers for comparisons: topiary, Mosquitto and nats-server on a free 127.0.0.1 port.

"Peer" as in "a broker we compare with", not as in bench/peers.py (topiary brokers peered
in a mesh: that is bench/harness/mesh.py).

Each broker is a subprocess with its stdout and stderr in a log file of its own, reached
only on 127.0.0.1. ``installed(kind)`` says whether its program is on this machine (the peers
come from ``apt-get install mosquitto nats-server``; a benchmark says "not installed" and
skips a missing one). Each kind is spoken to with the lean clients of
bench/harness/clients in its own protocol (``PROTOCOL``).

- ``topiary``: ``python -m broker.cli serve`` through bench/harness/processes.py (JSON log)
  with ``--config FILE``::

      [limits]
      outbound_messages = 1000000     # per connection (default 10,000), then drops, counted
      outbound_bytes = 268435456      # 256 MiB queued per connection, as NATS' max_pending
      slow_consumer_drops = 1000000

  so that a subscriber slower than the publisher is queued for, not dropped, as the peers
  below are (a broker that dropped is "not comparable" in the tables).
- ``topiary-mqtt``: the same broker and config, also serving MQTT (``--mqtt
  127.0.0.1:PORT``), spoken to on that port with the MQTT client Mosquitto gets (issue 17:
  topiary's MQTT front end against Mosquitto). Its native port stays open for ``stats()``
  (``RunningBroker.stats_port``). Like Mosquitto below, one copy per connection however
  many of its filters match.
- ``mosquitto`` (2.0.x): ``mosquitto -c FILE`` with a config written into a temporary
  directory::

      listener PORT 127.0.0.1
      allow_anonymous true
      persistence false
      max_queued_messages 0      # 2.0 counts a connected client's queued QoS 0 messages
                                 # against this limit (default 1,000) and drops past it
      max_queued_bytes 0
      max_inflight_messages 0    # QoS 1/2 only; unlimited, in case
      allow_duplicate_messages false   # one copy per client however many filters match,
                                       # as topiary does (deprecated, still honoured in 2.0)
      set_tcp_nodelay true       # topiary (trio) and nats-server (Go) set TCP_NODELAY too
      log_dest stdout
      log_type error
      log_type warning
      log_type notice
      connection_messages false

- ``nats`` (2.9.x): ``nats-server -c FILE`` with::

      listen: 127.0.0.1:PORT
      max_pending: 268435456     # 256 MiB per client before "slow consumer" (default 64 MiB)
      write_deadline: "30s"      # a blocked write to a client closes it after this (10 s)
      max_payload: 1048576

  NATS sends one MSG per matching subscription: a connection whose filters overlap gets a
  message more than once (``DELIVERY["nats"]``); there is no setting for it.
- ``relay-trio``, ``relay-epoll``: not brokers, the reference relays of
  bench/harness/relay.py (``python -m bench.harness.relay trio|epoll PORT``), spoken to with
  the native client: the least a Python process does per message, to know the floor of
  the latency figures (one copy per connection, as topiary).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from bench.harness import BenchError
from bench.harness.logs import scan_log
from bench.harness.processes import (
    BROKER_START_TIMEOUT,
    BROKER_STOP_TIMEOUT,
    HOST,
    BrokerExited,
    NotListening,
    free_port,
    spawn_logged,
    start_broker,
    stop_logged,
    tail,
    wait_listening,
)

#: The comparison of issue 18 (bench/storm.py, bench/sidebyside.py by default).
KINDS: Final = ("topiary", "mosquitto", "nats")
#: topiary's two front ends: this repository, always "installed".
TOPIARY_KINDS: Final = ("topiary", "topiary-mqtt")
#: The reference relays of bench/harness/relay.py (this repository, always "installed"):
#: the least a Python process does per message, on trio and on a bare epoll loop.
RELAY_KINDS: Final = ("relay-trio", "relay-epoll")
#: Every kind ``start`` knows, in table order.
ALL_KINDS: Final = ("topiary", "topiary-mqtt", "mosquitto", "nats", *RELAY_KINDS)
PROTOCOL: Final = {
    "topiary": "native",
    "topiary-mqtt": "mqtt",
    "mosquitto": "mqtt",
    "nats": "nats",
    "relay-trio": "native",
    "relay-epoll": "native",
}
#: How many MSGs a connection gets for one message: "connection" (once, however many of its
#: filters match) or "subscription" (once per matching filter).
DELIVERY: Final = {
    "topiary": "connection",
    "topiary-mqtt": "connection",
    "mosquitto": "connection",
    "nats": "subscription",
    "relay-trio": "connection",
    "relay-epoll": "connection",
}
PROGRAMS: Final = {"mosquitto": "mosquitto", "nats": "nats-server"}
INSTALL_HINT: Final = "apt-get install mosquitto nats-server"
INSTALL_HINTS: Final = {
    "mosquitto": "apt-get install mosquitto",
    "nats": "apt-get install nats-server",
}
_SBIN: Final = ("/usr/sbin", "/usr/local/sbin", "/sbin")

MOSQUITTO_CONFIG: Final = """\
listener {port} {host}
allow_anonymous true
persistence false
max_queued_messages 0
max_queued_bytes 0
max_inflight_messages 0
allow_duplicate_messages false
set_tcp_nodelay true
log_dest stdout
log_type error
log_type warning
log_type notice
connection_messages false
"""
TOPIARY_CONFIG: Final = """\
[limits]
outbound_messages = 1000000
outbound_bytes = 268435456
slow_consumer_drops = 1000000
"""
NATS_CONFIG: Final = """\
listen: {host}:{port}
max_pending: 268435456
write_deadline: "30s"
max_payload: 1048576
"""


def program(kind: str) -> str | None:
    """The path of the peer broker's program, or None if it is not installed (topiary and
    the relays: None, they are this repository)."""
    name = PROGRAMS.get(kind)
    if name is None:
        if kind not in ALL_KINDS:
            raise ValueError(f"unknown broker kind {kind!r}; known: {', '.join(ALL_KINDS)}")
        return None
    found = shutil.which(name)
    if found:
        return found
    for directory in _SBIN:  # not on every user's PATH
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    return None


def installed(kind: str) -> bool:
    """Whether a broker of ``kind`` can be started here."""
    return kind in TOPIARY_KINDS or kind in RELAY_KINDS or program(kind) is not None


def install_hint(kind: str) -> str:
    """How to get a peer broker of ``kind`` (for a "not installed" row)."""
    return INSTALL_HINTS.get(kind, INSTALL_HINT)


def version(kind: str) -> str | None:
    """The broker's version as it reports it (None if unknown)."""
    if kind in TOPIARY_KINDS or kind in RELAY_KINDS:
        return "this checkout"
    path = program(kind)
    if path is None:
        return None
    flag = "-h" if kind == "mosquitto" else "--version"
    try:
        proc = subprocess.run([path, flag], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\d+\.\d+\.\d+", proc.stdout + proc.stderr)
    return match.group(0) if match else None


@dataclass
class RunningBroker:
    kind: str
    port: int
    popen: subprocess.Popen
    log_path: Path
    log_file: IO[bytes]
    config_dir: Path | None = None  # removed at stop
    extra: dict[str, Any] = field(default_factory=dict)
    stats_port: int | None = None  # topiary's native port, for ``stats()`` (None: a peer)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def protocol(self) -> str:
        return PROTOCOL[self.kind]


def start(kind: str, log_dir: Path, label: str) -> RunningBroker:
    """A broker of ``kind`` listening on a free 127.0.0.1 port, logging to
    ``log_dir/label.log``; BenchError if it is not installed, exits or stays silent."""
    log_path = log_dir / f"{label}.log"
    if kind in TOPIARY_KINDS:
        config_dir = Path(tempfile.mkdtemp(prefix=f"topiary-bench-{kind}-"))
        config = config_dir / "topiary.toml"
        config.write_text(TOPIARY_CONFIG)
        try:
            broker = start_broker(log_path, config=config, mqtt=kind == "topiary-mqtt")
        except BaseException:
            shutil.rmtree(config_dir, ignore_errors=True)
            raise
        port = broker.mqtt_port if broker.mqtt_port is not None else broker.port
        return RunningBroker(
            kind,
            port,
            broker.popen,
            log_path,
            broker.log_file,
            config_dir,
            stats_port=broker.port,
        )
    if kind in RELAY_KINDS:
        port = free_port()
        command = [sys.executable, "-m", "bench.harness.relay", kind.split("-")[1], str(port)]
        popen, log_file = spawn_logged(command, log_path)
        broker = RunningBroker(kind, port, popen, log_path, log_file)
        _wait_listening(broker)
        return broker
    path = program(kind)
    if path is None:
        raise BenchError(f"{kind} is not installed ({install_hint(kind)})")
    config_dir = Path(tempfile.mkdtemp(prefix=f"topiary-bench-{kind}-"))
    port = free_port()
    if kind == "mosquitto":
        config = config_dir / "mosquitto.conf"
        config.write_text(MOSQUITTO_CONFIG.format(port=port, host=HOST))
        command = [path, "-c", str(config)]
    else:
        config = config_dir / "nats.conf"
        config.write_text(NATS_CONFIG.format(port=port, host=HOST))
        command = [path, "-c", str(config)]
    try:
        popen, log_file = spawn_logged(command, log_path)
    except BaseException:
        shutil.rmtree(config_dir, ignore_errors=True)
        raise
    broker = RunningBroker(kind, port, popen, log_path, log_file, config_dir)
    _wait_listening(broker)
    return broker


def _wait_listening(broker: RunningBroker) -> None:
    """Until ``broker`` accepts a connection; stopped, and BenchError, if it does not."""
    kind, popen = broker.kind, broker.popen
    try:
        wait_listening({kind: (popen, broker.port)}, BROKER_START_TIMEOUT)
    except BrokerExited:
        stop(broker)
        raise BenchError(
            f"{kind} exited with status {popen.returncode}:\n{tail(broker.log_path)}"
        ) from None
    except NotListening:
        stop(broker)
        raise BenchError(f"{kind} did not listen within {BROKER_START_TIMEOUT:g} s") from None


def stop(broker: RunningBroker) -> dict[str, Any]:
    """SIGTERM, SIGKILL after 10 s; the exit status, how long it took, whether killed."""
    try:
        return stop_logged(broker.popen, broker.log_file, BROKER_STOP_TIMEOUT)
    finally:
        if broker.config_dir is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(broker.config_dir)


_PROBLEM = re.compile(r"\b(error|warning|fatal|panic|slow consumer)\b", re.IGNORECASE)


def log_summary(broker: RunningBroker) -> dict[str, Any]:
    """What the broker's log says went wrong: topiary's JSON log through ``scan_log``, the
    peers' text logs by the lines that name an error, a warning or a slow consumer."""
    if broker.kind in TOPIARY_KINDS:
        return scan_log(broker.log_path)
    try:
        lines = broker.log_path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return {"error": str(exc)}
    problems = [line for line in lines if _PROBLEM.search(line)]
    return {
        "lines": len(lines),
        "problem_count": len(problems),
        "problems": [line[:400] for line in problems[:12]],
    }
