"""A mesh of real ``topiary serve`` processes on 127.0.0.1, for end-to-end peering tests.

    async with Mesh(*RING4, tmp_path) as mesh:       # started and fully converged
        async with connect(mesh.address("r2")) as client:
            ...
        mesh.kill("r1")
        seconds = await mesh.wait_converged(mesh.expected_reachable(), timeout=10)

Each broker is a subprocess started by bench/harness/mesh.py (as for bench/peers.py)
with ``--broker-id ID``, a ``[peering]`` config with short timers (keepalive 0.3 s, so a
silent link closes after ~1 s), and one ``--peer`` flag per edge it dials: for an edge
``(a, b)`` only ``a`` dials. A broker keeps its port across ``restart``. ``stop``/``cont``
freeze a broker (SIGSTOP/SIGCONT): its sockets stay open but nothing answers, so its
neighbours only notice by keepalive. Every wait is bounded, and a timeout's message
carries the tail of each broker's log (kept in ``tmp_path``).
"""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path
from typing import IO, Any

import trio

from bench.harness import BenchError
from bench.harness.mesh import BrokerMesh, Node, write_config
from broker.client import BrokerError, ConnectionLost, connect
from tests.topologies import GRID3, LINE, RING4, STAR5, TOPOLOGIES, Edges, grid

PEERING = {"keepalive": 0.3, "flush": 0.005, "backoff_max": 0.3, "sync_timeout": 5.0}

QUERY_TIMEOUT = 2.0  # one stats/routes request to one broker


class BrokerDied(AssertionError):
    """A broker process exited that the test did not kill; ``log`` is its stderr."""

    def __init__(self, node: str, code: int, log: str) -> None:
        tail = "".join(log.splitlines(keepends=True)[-30:])
        super().__init__(f"broker {node} exited with status {code}; its stderr ends:\n{tail}")
        self.node = node
        self.code = code
        self.log = log


def components(ids: set[str], edges: Edges) -> dict[str, set[str]]:
    """Each id -> the other ids it can reach over ``edges`` restricted to ``ids``."""
    adjacency: dict[str, set[str]] = {node: set() for node in ids}
    for a, b in edges:
        if a in ids and b in ids:
            adjacency[a].add(b)
            adjacency[b].add(a)
    result = {}
    for node in ids:
        seen = {node}
        todo = [node]
        while todo:
            for other in adjacency[todo.pop()]:
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        result[node] = seen - {node}
    return result


def reachable_in(routes: dict[str, Any]) -> set[str]:
    """The other brokers a ``routes()`` reply lists as reachable."""
    me = routes["broker_id"]
    return {o for o, entry in routes["origins"].items() if entry["reachable"] and o != me}


class Mesh(BrokerMesh):
    """bench/harness/mesh.py's brokers with what a test needs on top: failures as
    AssertionError with the brokers' logs, which brokers are down, and route queries."""

    def __init__(self, ids: list[str], edges: Edges, tmp_path: Path) -> None:
        self.ids = list(ids)
        self.edges = list(edges)
        self.dir = Path(tmp_path)
        self.dir.mkdir(parents=True, exist_ok=True)
        links = {node: [b for a, b in self.edges if a == node] for node in self.ids}
        super().__init__("mesh", links, write_config(self.dir / "mesh.toml", PEERING), self.dir)
        self.down: set[str] = set()  # killed and not restarted

    # -- processes ------------------------------------------------------------------------

    def log_path(self, node: str) -> Path:
        return self.dir / f"{node}.stderr"

    def open_log(self, node: Node) -> tuple[Path, IO[bytes]]:
        """One log per broker across restarts, each launch marked, so that a failure
        shows the whole story."""
        path = self.log_path(node.name)
        log = open(path, "ab")  # noqa: SIM115 (closed once the child has it)
        log.write(f"--- start {time.strftime('%H:%M:%S')} ---\n".encode())
        log.flush()
        return path, log

    def launch(self, name: str) -> None:
        super().launch(name)
        self.down.discard(name)

    def wait_listening(self, names: list[str], timeout: float = 20.0) -> None:
        try:
            super().wait_listening(names, timeout)
        except BenchError as exc:
            raise AssertionError(f"{exc}\n{self.logs(names)}") from None

    async def ready(self, timeout: float = 20.0) -> float:
        """Wait until every broker lists every other one as reachable."""
        return await self.wait_converged(self.expected_reachable(), timeout, edges=self.edges)

    def kill(self, node: str) -> None:
        """SIGKILL: no goodbye; the kernel closes its sockets, so neighbours see EOF."""
        super().kill(node)
        self.reap(node)
        self.nodes[node].stopped = False
        self.down.add(node)

    def restart(self, node: str) -> None:
        """Start ``node`` again, same port and arguments (a new incarnation)."""
        popen = self.nodes[node].popen
        if popen is not None and popen.poll() is None:
            self.kill(node)
        self.launch(node)
        self.wait_listening([node])

    def stop(self, node: str) -> None:
        """SIGSTOP: frozen with its sockets open; links die by keepalive."""
        self.pause(node)

    def cont(self, node: str) -> None:
        self.resume(node)

    def alive(self) -> set[str]:
        """Brokers running and not frozen."""
        return {
            name
            for name, node in self.nodes.items()
            if not node.stopped and name not in self.down
            and node.popen is not None and node.popen.poll() is None
        }  # fmt: skip

    def check_running(self) -> None:
        """Raise BrokerDied if a broker exited that was not killed on purpose."""
        for name, node in self.nodes.items():
            popen = node.popen
            if popen is not None and name not in self.down and popen.poll() is not None:
                raise BrokerDied(name, popen.returncode, self.log_path(name).read_text("utf-8"))

    def healthy(self) -> bool:
        return self.alive() == set(self.ids)

    def __enter__(self) -> Mesh:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
        if exc_info[0] is not None:
            print(self.logs())

    async def __aenter__(self) -> Mesh:
        self.start()
        try:
            await self.ready()
        except BaseException:
            self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__(*exc_info)

    def logs(self, nodes: list[str] | None = None, lines: int = 30) -> str:
        parts = []
        for node in nodes or self.ids:
            path = self.log_path(node)
            tail: deque[str] = deque(maxlen=lines)
            if path.exists():
                with open(path, errors="replace") as f:
                    tail.extend(f)
            parts.append(f"== {node} stderr ({path}) ==\n{''.join(tail)}")
        return "\n".join(parts)

    # -- asking the brokers ----------------------------------------------------------------

    async def _ask(self, node: str, what: str) -> dict[str, Any]:
        if self.nodes[node].stopped or node in self.down:
            raise AssertionError(f"{node} is not running")
        with trio.fail_after(QUERY_TIMEOUT):
            async with connect(self.address(node)) as client:
                return await (client.stats() if what == "stats" else client.routes())

    async def stats(self, node: str) -> dict[str, Any]:
        return await self._ask(node, "stats")

    async def routes(self, node: str) -> dict[str, Any]:
        return await self._ask(node, "routes")

    async def fwd_out(self) -> dict[tuple[str, str], int]:
        """FWD frames sent per directed link ``(from, to)``, from every running broker."""
        return await self._per_link("fwd_out")

    async def fwd_in(self) -> dict[tuple[str, str], int]:
        """FWD frames received per directed link ``(from, to)``."""
        received = await self._per_link("fwd_in")
        return {(peer, node): count for (node, peer), count in received.items()}

    async def _per_link(self, counter: str) -> dict[tuple[str, str], int]:
        """Each running broker's ``counter`` for each of its links, keyed ``(broker, peer)``."""
        counts = {}
        for node in sorted(self.alive()):
            for peer, link in (await self.stats(node)).get("peering", {}).get("links", {}).items():
                counts[node, peer] = link[counter]
        return counts

    def expected_reachable(self) -> dict[str, set[str]]:
        """What each running broker should list as reachable: the others of its connected
        component in the graph of running brokers."""
        return components(self.alive(), self.edges)

    async def wait_converged(
        self,
        expected: dict[str, set[str]],
        timeout: float = 10.0,
        *,
        edges: Edges | None = None,
        poll: float = 0.05,
    ) -> float:
        """Poll ``routes()`` until each broker in ``expected`` lists exactly the given others
        as reachable (and, with ``edges``, has the distance and next hop of a shortest path
        on that graph, lowest id first); return the seconds it took."""
        from tests.test_linkstate import distances, reference_next_hop

        started = trio.current_time()
        want_paths: dict[str, dict[str, tuple[str, int]]] = {}
        if edges is not None:
            live = [(a, b) for a, b in edges if a in expected and b in expected]
            for node, others in expected.items():
                dist = distances(live, node)
                want_paths[node] = {o: (reference_next_hop(live, node, o), dist[o]) for o in others}
        last: dict[str, object] = {}
        with trio.move_on_after(timeout):
            while True:
                self.check_running()
                ok = True
                for node, others in expected.items():
                    try:
                        routes = await self.routes(node)
                    except (
                        OSError,
                        trio.TooSlowError,
                        trio.BrokenResourceError,
                        ConnectionLost,
                        BrokerError,
                    ) as exc:
                        last[node] = repr(exc)
                        ok = False
                        break
                    got = reachable_in(routes)
                    last[node] = got
                    if got != others:
                        ok = False
                        break
                    if node in want_paths:
                        paths = {
                            o: (e["next_hop"], e["distance"])
                            for o, e in routes["origins"].items()
                            if o in others
                        }
                        last[node] = paths
                        if paths != want_paths[node]:
                            ok = False
                            break
                if ok:
                    return trio.current_time() - started
                await trio.sleep(poll)
        raise AssertionError(
            f"not converged after {timeout} s: expected {expected}, last seen {last}\n"
            f"{self.logs(sorted(expected))}"
        )


class MeshPool:
    """One running mesh at a time, by topology name, shared by the tests of a module: a
    test asks for ``await pool.get("ring4")`` and gets the running mesh if it is whole,
    else a fresh one (any other mesh is closed first)."""

    def __init__(self, tmp_dir: Path) -> None:
        self.dir = tmp_dir
        self.name: str | None = None
        self.mesh: Mesh | None = None
        self.generation = 0

    async def get(self, name: str, timeout: float = 20.0) -> Mesh:
        mesh = self.mesh
        if mesh is not None and (self.name != name or not mesh.healthy()):
            self.close()
            mesh = None
        if mesh is None:
            ids, edges = TOPOLOGIES[name]
            self.generation += 1
            mesh = Mesh(ids, edges, self.dir / f"{name}-{self.generation}")
            self.mesh, self.name = mesh, name
            mesh.start()
        await mesh.wait_converged(mesh.expected_reachable(), timeout, edges=mesh.edges)
        return mesh

    def close(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        self.mesh = self.name = None


__all__ = [
    "GRID3",
    "LINE",
    "RING4",
    "STAR5",
    "TOPOLOGIES",
    "BrokerDied",
    "Mesh",
    "MeshPool",
    "components",
    "grid",
    "reachable_in",
]
