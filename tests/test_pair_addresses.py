"""A hot-spare pair seen from outside: one broker id for both brokers, and peer entries and
the bridge's ``[broker] server`` naming both addresses, dialled in turn until the primary
accepts (a standby's door answers NOT_PRIMARY). The processes are in test_ha_mesh.py;
here the parsing, the id and the dialling against a real standby door, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from bridges.config import bridge_config_from_dict, parse_broker_servers
from bridges.routes import RouteWatcher
from broker.address import format_address, parse_peer_addresses
from broker.config import BrokerConfig, ConfigError, build_config
from broker.core import Broker
from broker.ha.door import StandbyDoor
from broker.ha.pairid import pair_id
from broker.listeners import Listeners
from tests.bridgekit import config_dict
from tests.conftest import running_broker
from tests.test_peering import server_text, wait_for

FAST = {"peer_keepalive": 0.3, "peer_flush": 0.005, "peer_backoff_max": 0.3}
HA = {"ha_role": "primary", "ha_partner": "127.0.0.1:7500", "ha_witness": "127.0.0.1:7480"}

hosts = st.sampled_from(["127.0.0.1", "localhost", "broker-a.example", "::1", "10.0.0.2"])
entries = st.tuples(hosts, st.integers(1, 65535), st.booleans())


@given(st.lists(entries, min_size=1, max_size=4, unique=True))
def test_a_peer_address_list_reads_back_as_written(addresses: list) -> None:  # type: ignore[type-arg]
    text = ",".join(
        ("tls://" if tls else "") + format_address((host, port)) for host, port, tls in addresses
    )
    assert parse_peer_addresses(text) == addresses
    assert parse_peer_addresses(text.replace(",", " , ")) == addresses  # spaces around commas


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:1,", "address 2 of 'a:1,' must be HOST:PORT"),
        ("a:1,a:1", "address 2 of 'a:1,a:1' is listed twice"),
        ("a:1,tls://b", "address 2 of 'a:1,tls://b' must be HOST:PORT"),
        ("nowhere", "'nowhere' must be HOST:PORT"),
    ],
)
def test_a_bad_peer_address_list_is_one_error_naming_the_entry(text: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_peer_addresses(text)
    assert str(error.value).startswith(message)


def test_a_peer_entry_may_list_the_two_brokers_of_a_pair(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[peering]\npeers = ["10.0.0.1:7474,10.0.0.2:7474"]\n'
        '[[peering.observer]]\nid = "bridge"\nsecret = "s"\n'
    )
    assert build_config(path).peers == ("10.0.0.1:7474,10.0.0.2:7474",)
    path.write_text(
        '[[peering.peer]]\nid = "pair"\nsecret = "s"\n'
        'address = "tls://10.0.0.1:7443,tls://10.0.0.2:7443"\n'
    )
    assert build_config(path).trusted_peers[0].address == "tls://10.0.0.1:7443,tls://10.0.0.2:7443"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"peers": ("a:1,a:1",)}, "peers must be HOST:PORT or tls://HOST:PORT strings"),
        ({"peers": ("a:1,",)}, "peers must be HOST:PORT or tls://HOST:PORT strings"),
    ],
)
def test_a_bad_pair_in_peers_stops_start_up_with_one_line(settings: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as error:
        BrokerConfig(**settings)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_the_two_brokers_of_a_pair_present_one_id_derived_from_their_secret(
    tmp_path: Path,
) -> None:
    a = BrokerConfig(data_dir=str(tmp_path), ha_secret="s3cret", **HA)
    b = BrokerConfig(
        data_dir=str(tmp_path), ha_secret="s3cret", **{**HA, "ha_role": "standby"}, port=7500
    )
    assert Broker(a).server_id == Broker(b).server_id == pair_id("s3cret")
    assert pair_id("s3cret").startswith("pair-") and len(pair_id("s3cret")) == 17
    assert pair_id("another") != pair_id("s3cret")
    assert "s3cret" not in pair_id("s3cret")


def test_a_server_id_set_for_the_pair_wins_over_the_derived_one(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=str(tmp_path), ha_secret="s", server_id="pair-eu", **HA)
    assert Broker(config).server_id == "pair-eu"
    assert Broker(BrokerConfig(server_id="single")).server_id == "single"
    assert Broker(BrokerConfig()).server_id.startswith("topiary-")  # no [ha]: as before


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("10.0.0.1:7474,10.0.0.2:7474", "10.0.0.1:7474,10.0.0.2:7474"),
        (["10.0.0.1:7474", "10.0.0.2:7474"], "10.0.0.1:7474,10.0.0.2:7474"),
        ("10.0.0.1:7474", "10.0.0.1:7474"),
    ],
)
def test_the_bridge_takes_a_pair_as_its_server(server: object, expected: str) -> None:
    config = bridge_config_from_dict(
        config_dict("127.0.0.1:9092", "x", "t", broker={"server": server})
    )
    assert config.server == expected
    assert len(parse_broker_servers(config.server)) == expected.count(",") + 1


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ("a:1,a:1", "is listed twice"),
        ("a:1,b", "server 2 of 'a:1,b' must be HOST:PORT"),
        (["a:1", 7], "[broker] server must list HOST:PORT strings"),
        ([], "[broker] server must not be empty"),
    ],
)
def test_a_bad_bridge_server_list_is_one_line(server: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        bridge_config_from_dict(config_dict("127.0.0.1:9092", "x", "t", broker={"server": server}))
    assert message in str(error.value)


async def _door(nursery: trio.Nursery, primary: str) -> tuple[StandbyDoor, str]:
    """A standby's door (what a standby listens with) on a free port, naming ``primary``."""
    door = StandbyDoor(primary, hello_timeout=5)
    native = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(door.serve, Listeners(native=native))
    return door, format_address(native[0].socket.getsockname()[:2])


async def test_a_peer_entry_naming_a_standby_first_links_to_the_primary() -> None:
    async with (
        running_broker(server_id="pair", **FAST) as primary,
        trio.open_nursery() as nursery,
    ):
        door, standby = await _door(nursery, server_text(primary))
        entry = f"{standby},{server_text(primary)}"  # the standby first: refused, then next
        async with running_broker(server_id="c", peers=(entry,), **FAST) as c:
            await wait_for(lambda: "pair" in c.broker.peering.links)
            assert c.broker.peering.counters.dials_not_primary == 1
            assert door.counters.refused_native == 1  # PEER_HELLO refused as HELLO is
            assert c.broker.peering.links["pair"].address == server_text(primary)
        nursery.cancel_scope.cancel()


async def test_the_route_watcher_given_a_pair_attaches_to_the_primary() -> None:
    async with (
        running_broker(server_id="pair", **FAST) as primary,
        trio.open_nursery() as nursery,
    ):
        _, standby = await _door(nursery, server_text(primary))
        watcher = RouteWatcher(f"{standby},{server_text(primary)}", observer_id="bridge-1")
        nursery.start_soon(watcher.run)
        with trio.fail_after(5):
            await watcher.ready.wait()
        assert watcher.counters.not_primary == 1 and watcher.counters.refused == 0
        assert watcher.describe()["broker"] == "pair"
        nursery.cancel_scope.cancel()
