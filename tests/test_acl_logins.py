"""Topic ACLs with real logins: user, group and %u rules decided for the identity a client
proved with the users file, through the native client and paho-mqtt."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, connect
from tests.conftest import running_broker
from tests.mqttkit import Paho, broker_in_thread
from tests.test_users import make_users

RULES = """
[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "home/%u/#"
dialect = "mqtt"

[[rule]]
who = "group:ops"
allow = ["subscribe"]
filter = "ops/>"

[[rule]]
who = "user:bob"
allow = ["publish"]
filter = "ops/>"

[[rule]]
who = "user:alice"
deny = ["subscribe"]
filter = "ops/secret/>"
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, object]:
    users = make_users(tmp_path / "users.toml", alice=("wonder", ["ops"]), bob=("b", []))
    acl = tmp_path / "acl.toml"
    acl.write_text(RULES)
    return {"auth_users": str(users), "acl_file": str(acl), "auth_failure_delay": 0.01}


async def test_user_group_and_name_rules_follow_the_login(files: dict[str, object]) -> None:
    with trio.fail_after(15):
        async with running_broker(**files) as server:
            address = server.addresses[0]
            async with (
                connect(address, username="alice", password="wonder") as alice,
                connect(address, username="bob", password="b") as bob,
            ):
                async with alice.subscribe("ops/>") as ops, alice.subscribe("home/alice/>"):
                    with pytest.raises(BrokerError, match="NOT_AUTHORIZED"):
                        await bob.subscribe("ops/>").__aenter__()  # not in group ops
                    with pytest.raises(BrokerError, match="NOT_AUTHORIZED"):
                        await alice.publish("ops/x", b"no", confirm=True)  # bob's rule only
                    with pytest.raises(BrokerError, match="NOT_AUTHORIZED"):
                        await bob.publish("home/alice/x", b"no", confirm=True)  # %u is bob
                    await bob.publish("ops/secret/plan", b"hidden", confirm=True)
                    await bob.publish("ops/news", b"shown", confirm=True)
                    assert (await ops.get()).topic == "ops/news"  # alice's deny, per message


def test_mqtt_user_rules_follow_the_login(files: dict[str, object]) -> None:
    with broker_in_thread(**files) as broker:
        alice = Paho(broker.mqtt_port, "a", username="alice", password="wonder")
        alice.connect()
        codes = alice.subscribe([("home/alice/#", 1), ("home/bob/#", 1), ("ops/+", 1)])
        assert [int(c.value) for c in codes] == [1, 0x87, 1]
        bob = Paho(broker.mqtt_port, "b", username="bob", password="b")
        bob.connect()
        bob.publish("ops/secret", b"shown: only ops/secret/> is denied", qos=1)
        assert alice.receive().topic == "ops/secret"
        alice.disconnect()
        bob.disconnect()
