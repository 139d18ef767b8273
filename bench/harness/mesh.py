"""A mesh of peered broker subprocesses on 127.0.0.1, for bench/peers.py and tests/mesh.py.

Each broker runs ``python -m broker.cli serve --broker-id ID`` on a port of its own, with
one config file for all and a ``--peer`` flag per broker it dials. A broker keeps its
port across launches, so that its neighbours can redial it after a kill or a crash.
Everything a broker did is kept: one log file per launch, every pid, and how each
process ended (``stops``), because a benchmark reports them and a test explains a
failure with them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.harness import BenchError
from bench.harness.processes import (
    BROKER_START_TIMEOUT,
    BROKER_STOP_TIMEOUT,
    HOST,
    ROOT,
    SERVE,
    BrokerExited,
    NotListening,
    free_port,
    tail,
    wait_listening,
)


def write_config(path: Path, peering: dict[str, float]) -> Path:
    """A config file holding only a ``[peering]`` table (the mesh's timers)."""
    path.write_text("[peering]\n" + "".join(f"{k} = {v}\n" for k, v in peering.items()))
    return path


@dataclass
class Node:
    name: str
    port: int
    peers: list[str]
    popen: subprocess.Popen | None = None
    log_paths: list[Path] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # every process started for it
    stopped: bool = False  # SIGSTOPped

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid


class BrokerMesh:
    """Brokers named by their ids, each dialling the ones ``links`` lists."""

    def __init__(self, label: str, links: dict[str, list[str]], config: Path, log_dir: Path):
        self.label = label
        self.config = config
        self.log_dir = log_dir
        self.ports = {name: free_port() for name in links}
        self.nodes = {name: Node(name, self.ports[name], peers) for name, peers in links.items()}
        self.stops: dict[str, list[dict[str, Any]]] = {name: [] for name in links}

    def address(self, name: str) -> str:
        return f"{HOST}:{self.ports[name]}"

    def command(self, node: Node) -> list[str]:
        command = [
            *SERVE,
            "--host", HOST, "--port", str(node.port), "--broker-id", node.name,
            "--config", str(self.config), "--log-format", "json",
        ]  # fmt: skip
        for peer in node.peers:
            command += ["--peer", self.address(peer)]
        return command

    def open_log(self, node: Node) -> tuple[Path, IO[bytes]]:
        """Where a new launch of ``node`` logs: a fresh file per launch."""
        path = self.log_dir / f"{self.label}-{node.name}-{len(node.log_paths) + 1}.log"
        return path, open(path, "wb")

    def launch(self, name: str) -> None:
        """Start a broker's process (again); does not wait for it to listen."""
        node = self.nodes[name]
        self._reap(node)
        path, log_file = self.open_log(node)
        node.log_paths.append(path)
        node.stopped = False
        with log_file:
            node.popen = subprocess.Popen(
                self.command(node), cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=log_file,
            )  # fmt: skip
        node.pids.append(node.popen.pid)

    def wait_listening(self, names: list[str], timeout: float = BROKER_START_TIMEOUT) -> None:
        """Wait until each of ``names`` accepts connections; BenchError if one exited or
        is still silent after ``timeout`` seconds."""
        brokers = {}
        for name in names:
            node = self.nodes[name]
            assert node.popen is not None
            brokers[name] = (node.popen, node.port)
        try:
            wait_listening(brokers, timeout)
        except BrokerExited as exc:
            node = self.nodes[exc.name]
            raise BenchError(
                f"broker {self.label}/{exc.name} exited with status {exc.status}:\n"
                f"{tail(node.log_paths[-1], 2000)}"
            ) from None
        except NotListening as exc:
            raise BenchError(f"brokers {exc.names} did not listen within {timeout:g} s") from None

    def start(self) -> None:
        """Every broker, in parallel; returns once all listen."""
        for name in self.nodes:
            self.launch(name)
        self.wait_listening(list(self.nodes))

    def kill(self, name: str) -> None:
        """SIGKILL, without waiting (the caller's event loop goes on at once); the process
        is reaped when the broker is launched again, or closed."""
        node = self.nodes[name]
        assert node.popen is not None
        node.popen.kill()
        self.stops[name].append({"exit_status": None, "how": "SIGKILL"})

    def reap(self, name: str) -> None:
        """Wait for a killed broker's process to be gone."""
        self._reap(self.nodes[name])

    def _reap(self, node: Node) -> None:
        if node.popen is not None and node.popen.returncode is None:
            entries = self.stops[node.name]
            if entries and entries[-1]["how"] == "SIGKILL" and entries[-1]["exit_status"] is None:
                entries[-1]["exit_status"] = node.popen.wait(BROKER_STOP_TIMEOUT)

    def pause(self, name: str) -> None:
        """SIGSTOP: frozen with its sockets open, so only keepalives can tell."""
        node = self.nodes[name]
        os.kill(node.pid, signal.SIGSTOP)
        node.stopped = True

    def resume(self, name: str) -> None:
        node = self.nodes[name]
        os.kill(node.pid, signal.SIGCONT)
        node.stopped = False

    def close(self) -> None:
        """SIGCONT (if stopped) and SIGTERM to all, then wait; SIGKILL whoever lingers."""
        started = time.monotonic()
        running = []
        for node in self.nodes.values():
            popen = node.popen
            if popen is None:
                continue
            self._reap(node)
            if popen.poll() is not None:
                if not self.stops[node.name] or self.stops[node.name][-1]["how"] != "SIGKILL":
                    self.stops[node.name].append(
                        {"exit_status": popen.returncode, "how": "exited by itself"}
                    )
                continue
            with contextlib.suppress(ProcessLookupError):
                if node.stopped:
                    os.kill(popen.pid, signal.SIGCONT)
                    node.stopped = False
                popen.send_signal(signal.SIGTERM)
            running.append(node)
        for node in running:
            assert node.popen is not None
            killed = False
            remaining = max(0.1, started + BROKER_STOP_TIMEOUT - time.monotonic())
            try:
                node.popen.wait(remaining)
            except subprocess.TimeoutExpired:
                killed = True
                node.popen.kill()
                node.popen.wait()
            self.stops[node.name].append(
                {
                    "exit_status": node.popen.returncode,
                    "how": "SIGTERM",
                    "killed": killed,
                    "stop_seconds": round(time.monotonic() - started, 3),
                }
            )

    def pids(self) -> dict[str, int]:
        return {name: node.pid for name, node in self.nodes.items() if node.popen is not None}
