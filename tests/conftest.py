import contextlib
import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import settings

from bridges.tansu import Tansu, TansuUnavailable, start_tansu
from broker.config import BrokerConfig
from broker.server import Server, run_broker
from tests.benchrun import ROOT, QuickRun
from tests.certs import Issued, Pki

# CI runs the same examples every time (derandomize): a red build then means the change,
# not the dice; local runs explore new examples.
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@contextlib.asynccontextmanager
async def running_broker(**overrides: object) -> AsyncIterator[Server]:
    """A broker on a free 127.0.0.1 port, shut down gracefully at the end."""
    config = BrokerConfig(**{"port": 0, **overrides})  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        server: Server = await nursery.start(run_broker, config)
        try:
            yield server
        finally:
            server.shutdown()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with running_broker() as running:
        yield running


@pytest.fixture
def address(server: Server) -> tuple[str, int]:
    return server.addresses[0]


# -- TLS (tests/certs.py) ------------------------------------------------------------------


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """One test CA for the session."""
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def server_cert(pki: Pki) -> Issued:
    """A server certificate for 127.0.0.1 and localhost."""
    return pki.server()


@pytest.fixture(scope="session")
def alice(pki: Pki) -> Issued:
    """A client certificate: ``CN=alice,O=example``."""
    return pki.client("alice", "example")


# -- Kafka (Tansu) -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tansu() -> Iterator[Tansu]:
    """One in-memory Tansu broker for the whole session; skipped only if it cannot run here."""
    try:
        broker = start_tansu()
    except TansuUnavailable as exc:
        pytest.skip(f"Tansu not available: {exc}")
    with broker:
        yield broker


_topic_ids = itertools.count()


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test uses, so tests can share the session broker."""
    return f"{prefix}-{os.getpid()}-{next(_topic_ids)}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A fresh topic name derived from the test's name (not yet created)."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return unique_topic(base)


# -- Spark ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def linked_spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The linked SPARK_HOME (bridges/spark/sparkhome.py) made in the test session's
    directory rather than the user's cache; every Spark driver of the session, in process or
    a subprocess, inherits it."""
    from bridges.spark.sparkhome import use_compiled_pyspark

    return use_compiled_pyspark(tmp_path_factory.getbasetemp() / "spark-home")


@pytest.fixture(scope="session")
def spark(linked_spark_home: Path | None, request: pytest.FixtureRequest) -> Iterator[object]:
    """One local SparkSession (local[2]) for the whole test session; skipped only when
    pyspark, pyarrow or Java is genuinely missing here. No class cache: nothing in the
    test session writes an archive a driver could map (test_spark_classcache.py)."""
    from bridges.spark.session import SparkUnavailable, build_session, check_spark

    if request.config.stash.get(SPARK_BENCH_EARLY, False):
        request.getfixturevalue("spark_bench_quick_run")  # it starts with this session
    try:
        check_spark()
        session = build_session("local[2]", app_name="topiary-tests", fast_start=True)
    except SparkUnavailable as exc:
        pytest.skip(f"Spark not available: {exc}")
    yield session
    session.stop()


# -- the Spark benchmark's smoke run, alongside the in-process Spark tests ------------------

SPARK_BENCH_MODULE = "test_bench_spark_bridge.py"
SPARK_BENCH_EARLY = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """When the Spark benchmark's smoke tests run together with tests of the in-process
    SparkSession, they go right after the last of those, and their quick run (its own
    process, ~1 core for ~25 s, mostly a driver JVM starting) starts with that session:
    on 2 cores the two then share the machine instead of taking turns, ~12 s sooner."""

    def uses(item: pytest.Item, fixture: str) -> bool:
        return fixture in getattr(item, "fixturenames", ())

    bench = [item for item in items if item.path.name == SPARK_BENCH_MODULE]
    rest = [item for item in items if item.path.name != SPARK_BENCH_MODULE]
    users = [n for n, item in enumerate(rest) if uses(item, "spark")]
    if users and any(uses(item, "spark_bench_quick_run") for item in bench):
        items[:] = [*rest[: users[-1] + 1], *bench, *rest[users[-1] + 1 :]]
        config.stash[SPARK_BENCH_EARLY] = True


@pytest.fixture(scope="session")
def spark_bench_quick_run(
    tmp_path_factory: pytest.TempPathFactory, linked_spark_home: Path | None
) -> Iterator[QuickRun | str]:
    """bench/spark_bridge.py --quick, started (once) by whoever asks first; or why it
    cannot run here. A run nobody waited for is interrupted at the end of the session."""
    from bridges.spark.session import SparkUnavailable, check_spark
    from bridges.tansu import tansu_binary

    try:
        tansu_binary()
        check_spark()
    except (TansuUnavailable, SparkUnavailable) as exc:
        yield f"{type(exc).__name__}: {exc}"
        return
    json_path = tmp_path_factory.mktemp("bench") / "spark_bridge.json"
    run = QuickRun(ROOT / "bench" / "spark_bridge.py", json_path).start()
    try:
        yield run
    finally:
        run.abort()


# -- the logs of a failed test's broker processes (tests/hakit.py) ----------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test that ran brokers as processes (tests/hakit.py) shows the end of each
    one's log in its report: on CI that is all there is to see of what they said."""
    report = yield
    if report.failed:
        from tests.hakit import log_sections

        for title, text in log_sections(item):
            report.sections.append((title, text))
    return report
