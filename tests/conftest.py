import contextlib
import os
from collections.abc import AsyncIterator

import pytest
import trio
from hypothesis import settings

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
