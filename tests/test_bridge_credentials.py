"""The Kafka bridge proves who it is: user name and password in its publisher's HELLO, its
observer secret on its route link (checked by the broker: tests/test_trusted_peers.py)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio

from bridges.config import bridge_config_from_dict, hello_credentials
from bridges.kafka import Bridge
from bridges.spark.pipeline import sink_options
from broker.config import ConfigError
from broker.wire.frames import PROTOCOL_VERSION
from tests.test_bridge_config import minimal
from tests.wire import RawClient, frame


def with_broker(**keys: str) -> dict[str, Any]:
    document = minimal()
    document["broker"] |= keys
    return document


def test_user_name_and_password_become_hello_credentials_beside_the_token() -> None:
    config = bridge_config_from_dict(with_broker(username="bridge", password="pw", token="t"))
    assert config.credentials() == {"token": "t", "username": "bridge", "password": "pw"}
    assert bridge_config_from_dict(minimal()).credentials() is None


def test_a_user_name_without_a_password_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="username and password go together"):
        bridge_config_from_dict(with_broker(username="bridge"))
    with pytest.raises(ConfigError, match="username and password go together"):
        bridge_config_from_dict(with_broker(password="pw"))


def test_the_spark_sink_gets_the_same_credentials_as_options() -> None:
    config = bridge_config_from_dict(with_broker(username="bridge", password="pw"))
    options = sink_options(config)
    assert hello_credentials(
        options.get("token"), options.get("username"), options.get("password")
    ) == {"username": "bridge", "password": "pw"}


async def test_the_bridges_publisher_says_its_user_name_and_password_in_hello() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    config = bridge_config_from_dict(
        with_broker(server=f"127.0.0.1:{port}", username="bridge", password="pw")
    )
    bridge = Bridge(config)
    hellos: list[dict[str, Any]] = []
    done = trio.Event()

    async def fake_broker() -> None:
        stream = await listeners[0].accept()
        client = RawClient(stream)  # a broker's side: read HELLO, answer WELCOME
        hellos.append(await client.read_frame())
        welcome = {
            "type": "WELCOME",
            "version": PROTOCOL_VERSION,
            "client_id": "bridge-publisher",
            "server_id": "fake",
            "max_frame": 1 << 20,
            "keepalive": 30.0,
        }
        await client.send(frame(welcome))
        await done.wait()  # the connection stays up until the bridge has what it needs
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fake_broker)
        with trio.fail_after(10):
            async with AsyncExitStack() as stack:
                client = await bridge._connect(stack)
                assert client is not None
        done.set()
        await listeners[0].aclose()
    assert hellos[0]["type"] == "HELLO"
    assert hellos[0]["credentials"] == {"username": "bridge", "password": "pw"}
