"""Mutual TLS on the pair's links (broker/ha/tls.py), in-process with real TLS on 127.0.0.1:
the replication link (a real primary store, a real standby store) and the witness (the real
witness server and the broker's real election task). Certificates are made for the run
(tests/certs.py), a second CA plays the attacker's."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.config import ConfigError, build_config
from broker.ha.client import WitnessTlsError, connect_witness
from broker.ha.codec import WitnessProtocolError
from broker.ha.elector import Elector
from broker.ha.messages import STALE, Renew
from broker.ha.timing import Timing
from broker.ha.tls import PairTls
from broker.ha.witness import Witness, run_witness
from tests.certs import Pki
from tests.hapair import SECRET, Pair, dump, pair

WITNESS_LEASE = 0.2


@dataclass
class Certs:
    primary: PairTls  # names 127.0.0.1, signed by the pair's CA
    standby: PairTls
    rogue: PairTls  # signed by another CA; trusts the pair's CA (so only its own cert fails)
    pki: Pki


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    base = tmp_path_factory.mktemp("pki")
    pki, other = Pki(base / "pair"), Pki(base / "rogue", name="rogue CA")
    a, b, rogue = pki.both("a"), pki.both("b"), other.both("b")
    return Certs(
        PairTls(pki.ca, a.cert, a.key),
        PairTls(pki.ca, b.cert, b.key),
        PairTls(pki.ca, rogue.cert, rogue.key),
        pki,
    )


async def _until(check, what: str, seconds: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Wait (bounded) for a counter another task moves; polled, as its owner is a loop."""
    with trio.fail_after(seconds):
        while not check():
            await trio.sleep(0.01)
    assert check(), what


async def _append(p: Pair, count: int, tag: str = "m") -> None:
    await p.store.create_session(f"{tag}-c", None)
    for i in range(count):
        await p.store.append(
            msg_id=f"{tag}{i}",
            topic="t",
            payload=b"p",
            headers=None,
            deliveries=[(f"{tag}-c", i + 1)],
        )


# -- the replication link ------------------------------------------------------------------


async def test_over_tls_the_standby_stays_in_sync_and_has_each_confirmed_append(
    tmp_path: Path, certs: Certs
) -> None:
    async with pair(tmp_path, tls=certs.primary) as p:
        follower = await p.start_standby(tls=certs.standby)
        await p.in_sync()
        await p.store.create_session("c", None)
        for i in range(20):
            await p.store.append(
                msg_id=f"m{i}", topic="t", payload=b"p", headers=None, deliveries=[("c", i + 1)]
            )
            assert follower.position == p.shipper.position  # confirmed: on the standby too
        await p.caught_up()
        primary, standby = dump(p.primary_dir), dump(p.standby_dir)
        assert len(primary["deliveries"]) == 20
        assert standby == primary
        assert p.shipper.counters.confirms_alone == 0
        assert p.shipper.counters.tls_failures == 0 and follower.counters.tls_failures == 0


async def test_a_standby_whose_certificate_the_ca_did_not_sign_is_refused_and_gets_no_record(
    tmp_path: Path, certs: Certs
) -> None:
    async with pair(tmp_path, tls=certs.primary) as p:
        await _append(p, 5)  # there is something to take
        follower = await p.start_standby(tls=certs.rogue)
        # Two refusals: the standby dials again (with its backoff) after the first.
        await _until(lambda: p.shipper.counters.tls_failures >= 2, "refused twice")
        assert follower.counters.tls_failures >= 1
        assert p.shipper.counters.standby_connections == 0
        assert p.shipper.counters.records_sent == 0 and p.shipper.counters.bytes_sent == 0
        assert follower.counters.records_applied == 0
        assert follower.counters.snapshots_installed == 0
        assert follower.position.seq == 0
        assert not p.shipper.in_sync


async def test_a_plain_text_standby_is_refused_by_a_tls_primary_which_goes_on_serving(
    tmp_path: Path, certs: Certs
) -> None:
    async with pair(tmp_path, tls=certs.primary) as p:
        await _append(p, 3)
        plain = await p.start_standby()  # no TLS: its HELLO is not a ClientHello
        await _until(lambda: p.shipper.counters.tls_failures >= 2, "refused twice")
        assert plain.counters.connections == 0 and plain.position.seq == 0
        assert p.shipper.counters.standby_connections == 0
        await p.stop_standby()
        await p.start_standby(tls=certs.standby)  # the same standby, now over TLS
        await p.in_sync()
        await p.caught_up()
        assert dump(p.standby_dir) == dump(p.primary_dir)


async def test_a_tls_standby_refuses_a_primary_whose_certificate_does_not_name_the_address(
    tmp_path: Path, certs: Certs
) -> None:
    elsewhere = certs.pki.both("a", hosts=("10.0.0.9",))  # the dialled 127.0.0.1 is not in it
    primary = PairTls(certs.pki.ca, elsewhere.cert, elsewhere.key)
    async with pair(tmp_path, tls=primary) as p:
        await _append(p, 3)
        follower = await p.start_standby(tls=certs.standby)
        await _until(lambda: follower.counters.tls_failures >= 2, "refused twice")
        assert follower.counters.connections == 0 and follower.position.seq == 0
        assert p.shipper.counters.standby_connections == 0


async def test_new_files_that_are_bad_keep_the_old_contexts_and_the_link_keeps_working(
    tmp_path: Path, certs: Certs
) -> None:
    issued = certs.pki.both("a")
    tls = PairTls(certs.pki.ca, issued.cert, issued.key)
    old = tls.server
    Path(issued.cert).write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="ha cert"):
        tls.reload()
    assert tls.server is old
    async with pair(tmp_path, tls=tls) as p:  # the old context still serves
        await p.start_standby(tls=certs.standby)
        await p.in_sync()


async def test_renewed_files_are_used_for_the_next_connections_after_a_reload(
    tmp_path: Path, certs: Certs
) -> None:
    issued = certs.pki.both("a")
    tls = PairTls(certs.pki.ca, issued.cert, issued.key)
    other = Pki(tmp_path / "next", name="next CA")  # the pair moves to a new CA
    renewed = other.both("a")
    for source, target in ((renewed.cert, issued.cert), (renewed.key, issued.key)):
        Path(target).write_bytes(Path(source).read_bytes())
    tls.reload()
    async with pair(tmp_path, tls=tls) as p:
        follower = await p.start_standby(tls=certs.standby)  # still trusts the old CA only
        await _until(lambda: follower.counters.tls_failures >= 1, "new certificate refused")
        assert follower.counters.connections == 0


# -- the witness ---------------------------------------------------------------------------


async def _witness(nursery: trio.Nursery, data_dir: Path, tls: PairTls | None) -> Witness:
    witness: Witness = await nursery.start(
        lambda task_status: run_witness(
            "127.0.0.1", 0, str(data_dir), SECRET, lease=WITNESS_LEASE, tls=tls,
            task_status=task_status,
        )
    )  # fmt: skip
    return witness


def _elector(data_dir: Path, port: int, tls: PairTls | None) -> Elector:
    data_dir.mkdir()
    return Elector(
        str(data_dir),
        witness=f"127.0.0.1:{port}",
        secret=SECRET,
        timing=Timing(WITNESS_LEASE, 0.1),
        role_at_first_start="primary",
        tls=tls,
    )


async def test_over_tls_the_witness_votes_and_the_broker_becomes_primary(
    tmp_path: Path, certs: Certs
) -> None:
    async with trio.open_nursery() as nursery:
        witness = await _witness(nursery, tmp_path / "w", certs.standby)
        elector = _elector(tmp_path / "a", witness.port, certs.primary)
        await nursery.start(elector.run)
        with trio.fail_after(20):
            while not elector.is_primary:
                await elector.wait_changed()
        assert witness.counters.votes_granted == 1 and witness.counters.tls_failures == 0
        assert elector.counters.witness_tls_failures == 0
        nursery.cancel_scope.cancel()


async def test_the_witness_refuses_a_broker_whose_certificate_the_ca_did_not_sign(
    tmp_path: Path, certs: Certs
) -> None:
    async with trio.open_nursery() as nursery:
        witness = await _witness(nursery, tmp_path / "w", certs.standby)
        elector = _elector(tmp_path / "a", witness.port, certs.rogue)
        await nursery.start(elector.run)
        await _until(lambda: elector.counters.witness_tls_failures >= 2, "refused twice")
        assert witness.counters.tls_failures >= 1
        assert witness.counters.votes_granted == 0 and witness.counters.votes_refused == 0
        assert not elector.is_primary
        nursery.cancel_scope.cancel()


async def test_a_plain_text_broker_is_refused_by_a_tls_witness_cleanly(
    tmp_path: Path, certs: Certs
) -> None:
    async with trio.open_nursery() as nursery:
        witness = await _witness(nursery, tmp_path / "w", certs.standby)
        with trio.fail_after(10), pytest.raises(WitnessProtocolError):
            await connect_witness("127.0.0.1", witness.port, SECRET)
        assert witness.counters.tls_failures == 1
        client = await connect_witness("127.0.0.1", witness.port, SECRET, certs.primary)
        with trio.fail_after(10):  # it goes on serving the others
            answer = await client.ask(Renew(1, "a"))
        assert answer.verdict == STALE and witness.counters.tls_failures == 1
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_tls_broker_refuses_a_plain_text_witness(tmp_path: Path, certs: Certs) -> None:
    async with trio.open_nursery() as nursery:
        witness = await _witness(nursery, tmp_path / "w", None)
        with trio.fail_after(10), pytest.raises(WitnessTlsError):
            await connect_witness("127.0.0.1", witness.port, SECRET, certs.primary)
        nursery.cancel_scope.cancel()


async def test_sighup_reloads_the_witness_certificate_and_bad_files_keep_the_old(
    tmp_path: Path, certs: Certs
) -> None:
    issued = certs.pki.server()
    tls = PairTls(certs.pki.ca, issued.cert, issued.key, what="witness")
    async with trio.open_nursery() as nursery:
        witness: Witness = await nursery.start(
            lambda task_status: run_witness(
                "127.0.0.1", 0, str(tmp_path / "w"), SECRET, lease=WITNESS_LEASE, tls=tls,
                handle_signals=True, task_status=task_status,
            )
        )  # fmt: skip
        old = tls.server
        Path(issued.key).write_text("garbage\n")
        await trio.testing.wait_all_tasks_blocked()  # the signal task is listening
        os.kill(os.getpid(), signal.SIGHUP)
        await trio.testing.wait_all_tasks_blocked()  # ... and has handled it
        assert tls.server is old  # the bad key was refused (logged) and the old one kept
        client = await connect_witness("127.0.0.1", witness.port, SECRET, certs.primary)
        await client.aclose()
        renewed = certs.pki.server()
        for source, target in ((renewed.cert, issued.cert), (renewed.key, issued.key)):
            Path(target).write_bytes(Path(source).read_bytes())
        os.kill(os.getpid(), signal.SIGHUP)
        await trio.testing.wait_all_tasks_blocked()
        assert tls.server is not old
        client = await connect_witness("127.0.0.1", witness.port, SECRET, certs.primary)
        await client.aclose()
        assert witness.counters.tls_failures == 0
        nursery.cancel_scope.cancel()


# -- configuration -------------------------------------------------------------------------


def _config(tmp_path: Path, **ha: str) -> Path:
    lines = "".join(f'{key} = "{value}"\n' for key, value in ha.items())
    path = tmp_path / "broker.toml"
    path.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\n[ha]\nrole = "primary"\n'
        f'partner = "127.0.0.1:7000"\nwitness = "127.0.0.1:7480"\nsecret = "s"\n{lines}'
    )
    return path


@pytest.mark.parametrize("given", [("cert",), ("cert", "key"), ("ca",), ("ca", "key")])
def test_ha_ca_cert_and_key_go_together(tmp_path: Path, given: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="ha ca, cert and key go together") as raised:
        build_config(_config(tmp_path, **{name: "/x" for name in given}))
    assert "\n" not in str(raised.value)


def test_a_missing_ha_file_stops_start_up_naming_the_key_and_file(
    tmp_path: Path, certs: Certs
) -> None:
    config = build_config(
        _config(tmp_path, ca=certs.pki.ca, cert=str(tmp_path / "nope.crt"), key="/x.key")
    )
    with pytest.raises(ConfigError, match=r"ha cert .*nope\.crt: cannot read"):
        PairTls.from_config(config)


def test_a_ca_file_without_a_certificate_stops_start_up_naming_it(
    tmp_path: Path, certs: Certs
) -> None:
    issued = certs.pki.both("a")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    config = build_config(_config(tmp_path, ca=str(empty), cert=issued.cert, key=issued.key))
    with pytest.raises(ConfigError, match=r"ha ca .*empty\.pem"):
        PairTls.from_config(config)
