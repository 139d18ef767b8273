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

# CI runs the same examples every time (derandomize): a red build then means the change,
# not the dice; local runs explore new examples.
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@contextlib.asynccontextmanager
async def running_broker(**overrides: object) -> AsyncIterator[Server]:
    """A broker on a free 127.0.0.1 port, shut down gracefully at the end."""
    config = BrokerConfig(port=0, **overrides)  # type: ignore[arg-type]
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
def spark(linked_spark_home: Path | None) -> Iterator[object]:
    """One local SparkSession (local[2]) for the whole test session; skipped only when
    pyspark, pyarrow or Java is genuinely missing here. No class cache: nothing in the
    test session writes an archive a driver could map (test_spark_classcache.py)."""
    from bridges.spark.session import SparkUnavailable, build_session, check_spark

    try:
        check_spark()
        session = build_session("local[2]", app_name="topiary-tests", fast_start=True)
    except SparkUnavailable as exc:
        pytest.skip(f"Spark not available: {exc}")
    yield session
    session.stop()
