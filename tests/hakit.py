"""Real processes for the hot-spare tests: the brokers of a pair (``topiary serve`` with
``[ha]``), the witness, and fault proxies on every link between them.

Every process logs to a file under the test's ``tmp_path``; when a test fails, the tail of
each log is added to its report (tests/conftest.py's ``pytest_runtest_makereport`` calls
``log_sections``), so a CI failure shows what the brokers and the witness said.

Each broker has a replication link port of its own (``[ha] link_port``, from
``free_port()``) and dials its partner's (``partner_link_port``), or a proxy in front of it:
nothing relies on "port + 1", which nobody reserved.
"""

from __future__ import annotations

import json
import resource
import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, Client, ConnectionLost, connect
from tests.faultproxy import FaultProxy
from tests.test_cli import TOPIARY, free_port, run, wait_listening

__all__ = [
    "SECRET",
    "Cluster",
    "Node",
    "Witness",
    "accepting",
    "cluster",
    "ha_status",
    "hold_session",
    "log_sections",
    "missing_from_session",
    "nodes",
    "publish_until",
    "read_session",
    "until",
    "witness",
]

SECRET = "pair-secret"
#: Seconds a process has to listen after it was started (a loaded 2-core CI machine).
START_SECONDS = 15.0
#: Lines of each log shown with a failed test.
LOG_TAIL_LINES = 150

_LOGS = pytest.StashKey[list[Path]]()


def _keep_log(request: pytest.FixtureRequest, path: Path) -> None:
    request.node.stash.setdefault(_LOGS, []).append(path)


def log_sections(item: pytest.Item) -> list[tuple[str, str]]:
    """(title, text) of the last lines of every log the test's processes wrote."""
    sections = []
    for path in item.stash.get(_LOGS, []):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError as exc:
            sections.append((f"log {path.name}", f"(unreadable: {exc})"))
            continue
        tail = lines[-LOG_TAIL_LINES:]
        skipped = (
            f"({len(lines) - len(tail)} earlier lines not shown)\n"
            if len(tail) < len(lines)
            else ""
        )
        sections.append((f"log {path.name}", skipped + "\n".join(tail)))
    return sections


class Witness:
    """``topiary witness`` on a free port, logging to ``witness.log``."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.data_dir = tmp_path / "witness"
        self.log = tmp_path / "witness.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*TOPIARY, "witness", "--port", str(self.port), "--data-dir", str(self.data_dir),
                 "--secret", SECRET, "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_listening(self.port, self.proc, START_SECONDS)

    def stop(self) -> None:
        """kill -9, and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Node:
    """One broker of the pair: its ports (native, MQTT, replication link), data directory
    and log. ``start`` wires it to its partner directly, or through a proxy in front of the
    partner's link (``partner_link``) and one in front of the witness."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name = name
        self.port = free_port()
        self.mqtt_port = free_port()
        self.link_port = free_port()
        self.data_dir = tmp_path / name
        self.data_dir.mkdir()
        self.config = tmp_path / f"{name}.toml"
        self.log = tmp_path / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._start_at = 0  # where this run's lines begin in the log

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(
        self,
        role: str,
        partner: Node,
        witness: str,
        *,
        partner_link: int | None = None,
        failover: str = "witness",
        more_ha: str = "",
    ) -> None:
        """``topiary serve`` with ``[ha]``: ``role`` at first start, ``witness`` as
        HOST:PORT, the partner's link at ``partner_link`` (default: its own port), and
        ``more_ha`` lines after the [ha] keys (more of them, then other tables)."""
        link = partner.link_port if partner_link is None else partner_link
        self.config.write_text(
            f'[server]\nport = {self.port}\nhost = "127.0.0.1"\ndata_dir = "{self.data_dir}"\n'
            f'[mqtt]\nlisten = "127.0.0.1:{self.mqtt_port}"\n'
            f'[ha]\nrole = "{role}"\npartner = "{partner.address}"\nwitness = "{witness}"\n'
            f'secret = "{SECRET}"\nfailover = "{failover}"\n'
            f"link_port = {self.link_port}\npartner_link_port = {link}\n{more_ha}"
        )
        with self.log.open("ab") as log:
            self._start_at = self.log.stat().st_size
            self.proc = subprocess.Popen(
                [*TOPIARY, "serve", "--config", str(self.config), "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_listening(self.port, self.proc, START_SECONDS)  # (a standby's door listens too)

    def logged(self, text: str) -> int:
        """How often ``text`` is in this run's log (since the last start)."""
        return self.log.read_text(errors="replace")[self._start_at :].count(text)

    def stop(self) -> None:
        """kill -9, and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def fill_disk(self, headroom: int = 512 << 10) -> int:
        """Make the running broker's disk "full": no file of its may grow past ``headroom``
        bytes beyond the biggest of its log and its data files now (RLIMIT_FSIZE, set from
        outside with prlimit: no root needed). Python ignores SIGXFSZ, so a write past it
        fails with EFBIG, which SQLite reports as a disk I/O error. The limit in bytes."""
        assert self.proc is not None
        files = [self.log, *(path for path in self.data_dir.iterdir() if path.is_file())]
        limit = max(path.stat().st_size for path in files) + headroom
        resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        return limit

    def free_disk(self) -> None:
        """Lift ``fill_disk``'s limit."""
        assert self.proc is not None
        unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        resource.prlimit(self.proc.pid, resource.RLIMIT_FSIZE, unlimited)


class Cluster:
    """The witness, brokers a (primary at first start) and b, every link through a proxy:
    each broker to the witness, and each standby's dial to its partner's link."""

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.witness = Witness(tmp_path)
        self.a, self.b = Node("a", tmp_path), Node("b", tmp_path)
        for path in (self.witness.log, self.a.log, self.b.log):
            _keep_log(request, path)
        self.witness.start()
        target = ("127.0.0.1", self.witness.port)
        self.a_witness, self.b_witness = FaultProxy(target), FaultProxy(target)
        self.to_a_link = FaultProxy(("127.0.0.1", self.a.link_port))  # b (standby) dials a
        self.to_b_link = FaultProxy(("127.0.0.1", self.b.link_port))  # a (standby) dials b
        self.proxies = [self.a_witness, self.b_witness, self.to_a_link, self.to_b_link]
        for proxy in self.proxies:
            proxy.start()
        self.start("a")
        self.start("b")

    def start(self, name: str) -> None:
        """Start broker ``name`` again (a: primary at first start, b: standby), wired
        through its proxies."""
        if name == "a":
            self.a.start(
                "primary", self.b, self._at(self.a_witness), partner_link=self.to_b_link.port
            )
        else:
            self.b.start(
                "standby", self.a, self._at(self.b_witness), partner_link=self.to_a_link.port
            )

    @staticmethod
    def _at(proxy: FaultProxy) -> str:
        return f"127.0.0.1:{proxy.port}"

    @property
    def servers(self) -> list[str]:
        return [self.a.address, self.b.address]

    def close(self) -> None:
        for node in (self.a, self.b):
            node.stop()
        for proxy in self.proxies:
            proxy.close()
        self.witness.stop()


@pytest.fixture
def witness(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Witness]:
    """A running witness (its log shown if the test fails)."""
    running = Witness(tmp_path)
    _keep_log(request, running.log)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def nodes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Node]]:
    """Brokers a and b, not started (their logs shown if the test fails)."""
    pair = [Node("a", tmp_path), Node("b", tmp_path)]
    for node in pair:
        _keep_log(request, node.log)
    yield pair
    for node in pair:
        node.stop()


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The witness and the pair, started, every link through a fault proxy."""
    pair = Cluster(tmp_path, request)
    yield pair
    pair.close()


async def until(check: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    """Wait (bounded) until ``check()``, polling: it reads another process' log or state."""
    with trio.fail_after(seconds):
        while not check():
            await trio.sleep(0.05)  # polling a log file of another process (bounded)
    assert check(), what


async def accepting(port: int, seconds: float = 20.0) -> None:
    """Wait (bounded) until ``port`` serves clients (a promoted standby's door is gone)."""
    with trio.fail_after(seconds):
        while True:
            try:
                async with connect(("127.0.0.1", port)) as c:
                    await c.ping()
                    return
            except (BrokerError, ConnectionLost, OSError, trio.BrokenResourceError):
                await trio.sleep(0.05)


async def ha_status(servers: list[str]) -> list[dict]:
    """``topiary ha status`` on ``servers``: one JSON object each, in order."""
    done = await trio.to_thread.run_sync(
        partial(run, "ha", "status", "--server", ",".join(servers))
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [answer["server"] for answer in answers] == servers
    return answers


async def read_session(
    servers: list[str], session: str, expected: set[str], seconds: float = 20.0
) -> set[str]:
    """The payloads the durable ``session`` delivers (through the server list) until it has
    delivered all of ``expected`` or ``seconds`` have passed. A session delivers in order,
    so anything stored before the last of ``expected`` is among them."""
    received: set[str] = set()
    async with (
        connect(servers, client_id=session, durable=True) as c,
        c.subscribe("ha/>") as sub,
    ):
        with trio.move_on_after(seconds):
            while not expected <= received:
                received.add((await sub.get()).payload.decode())
    return received


async def missing_from_session(
    servers: list[str], session: str, confirmed: set[str], seconds: float = 20.0
) -> set[str]:
    """The ``confirmed`` payloads the durable ``session`` does not deliver (through the
    server list) within ``seconds``."""
    return confirmed - await read_session(servers, session, confirmed, seconds)


async def hold_session(servers: list[str], session: str) -> None:
    """Create the durable ``session`` subscribed to ``ha/>``: it stores from now on."""
    async with connect(servers, client_id=session, durable=True) as c:
        async with c.subscribe("ha/>"):
            await c.ping()


async def publish_for(client: Client, seconds: float) -> int:
    """Confirmed publishes ``m0``, ``m1``, ... to ``ha/t``, one per 50 ms, for ``seconds``
    (that passage of time, leases going by, is what the callers test); how many."""
    deadline = trio.current_time() + seconds
    count = 0
    while trio.current_time() < deadline:
        await client.publish("ha/t", f"m{count}", confirm=True)
        count += 1
        await trio.sleep(0.05)
    return count


async def publish_until(
    servers: list[str], tag: str, confirmed: set[str], stop: trio.Event
) -> None:
    """Confirmed publishes ``tag-0``, ``tag-1``, ... to ``ha/t`` through the server list
    until ``stop``, each added to ``confirmed`` once confirmed, failing over as needed: one
    a fenced primary refuses (FENCED) is sent again to the next, so every publish is
    confirmed in the end."""
    async with connect(servers, reconnect=True, reconnect_timeout=30) as p:
        i = 0
        while not stop.is_set():
            await p.publish("ha/t", f"{tag}-{i}", confirm=True)
            confirmed.add(f"{tag}-{i}")
            i += 1
