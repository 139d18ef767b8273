"""Topic ACLs through the native protocol and client, end to end on 127.0.0.1 (anonymous
clients: ``*`` and ``%c`` rules), and in the core with hand-made identities (user, group and
certificate rules; tests/test_acl_logins.py has them with real logins)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from broker.client import BrokerError, connect
from broker.core import Broker, Group
from broker.security import Identity
from broker.server import Server
from broker.store import Store
from routing import parse_filter
from routing.acl import PUBLISH, SUBSCRIBE, Policy, Rule
from tests.conftest import running_broker

WAIT = 15.0  # seconds a whole test may take on a loaded machine

RULES = """
[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "open/>"

[[rule]]
who = "*"
deny = ["publish"]
filter = "open/locked/>"

[[rule]]
who = "*"
deny = ["subscribe"]
filter = "open/secret/>"

[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "dev/%c/#"
dialect = "mqtt"

[[rule]]
who = "*"
deny = ["subscribe"]
filter = "jobs/%c/>"

[[rule]]
who = "*"
allow = ["publish", "subscribe"]
filter = "jobs/>"
"""


@asynccontextmanager
async def acl_broker(
    tmp_path: Path, rules: str = RULES, **overrides: object
) -> AsyncIterator[Server]:
    path = tmp_path / "acl.toml"
    path.write_text(rules)
    with trio.fail_after(WAIT):  # every test's waits, bounded
        async with running_broker(acl_file=str(path), **overrides) as server:
            yield server


async def refused(awaitable: object) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        await awaitable  # type: ignore[misc]
    assert caught.value.code == "NOT_AUTHORIZED"
    return caught.value


async def test_a_publish_no_rule_allows_is_refused_and_the_connection_stays(
    tmp_path: Path,
) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        async with client.subscribe("open/>") as sub:
            error = await refused(client.publish("closed/x", b"no", confirm=True))
            assert "closed/x" in error.text
            await client.publish("open/x", b"yes", confirm=True)  # still connected
            assert (await sub.get()).topic == "open/x"
        stats = await client.stats()
    assert stats["acl_denied_publish"] == 1
    assert stats["errors"]["NOT_AUTHORIZED"] == 1


async def test_a_deny_publish_rule_wins_over_an_allow_rule(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        async with client.subscribe("open/>") as sub:
            await refused(client.publish("open/locked/door", b"no", confirm=True))
            await client.publish("open/unlocked", b"yes", confirm=True)
            assert (await sub.get()).topic == "open/unlocked"  # the refused one came not


async def test_a_subscription_no_rule_covers_is_refused_and_nothing_is_subscribed(
    tmp_path: Path,
) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        await refused(client.subscribe("closed/>").__aenter__())
        await refused(client.subscribe(">").__aenter__())  # wider than open/>
        await refused(client.subscribe("*/x").__aenter__())  # open/x and closed/x
        async with client.subscribe("open/a/*"):  # covered by open/>
            stats = await client.stats()
    assert stats["acl_denied_subscribe"] == 3
    assert stats["subscriptions"] == 1


async def test_a_run_of_pipelined_subs_refuses_only_the_uncovered_ones_in_order(
    tmp_path: Path,
) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        async with trio.open_nursery() as nursery:
            outcomes: dict[str, str] = {}

            async def sub(flt: str) -> None:
                try:
                    async with client.subscribe(flt):
                        outcomes[flt] = "granted"
                        await trio.sleep_forever()
                except BrokerError as exc:
                    outcomes[flt] = exc.code

            for flt in ("open/1", "closed/1", "open/2", "closed/2"):
                nursery.start_soon(sub, flt)
            with trio.fail_after(10):
                while len(outcomes) < 4:
                    await client.ping()  # a barrier: every SUB before it is answered
            nursery.cancel_scope.cancel()
    assert outcomes == {
        "open/1": "granted",
        "closed/1": "NOT_AUTHORIZED",
        "open/2": "granted",
        "closed/2": "NOT_AUTHORIZED",
    }


async def test_client_id_substitution_gives_each_client_its_own_tree(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as server:
        async with (
            connect(server.addresses[0], client_id="c1") as c1,
            connect(server.addresses[0], client_id="c2") as c2,
        ):
            async with c1.subscribe("dev/c1/>") as mine:
                await refused(c1.subscribe("dev/c2/>").__aenter__())
                await refused(c2.publish("dev/c1/x", b"no", confirm=True))
                await c1.publish("dev/c1/x", b"yes", confirm=True)
                assert (await mine.get()).payload == b"yes"


async def test_an_unsafe_client_id_gets_nothing_from_a_client_id_rule(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as server:
        async with connect(server.addresses[0], client_id="c1/x") as client:
            await refused(client.subscribe("dev/c1/x/>").__aenter__())
            await refused(client.publish("dev/c1/x/y", b"no", confirm=True))


async def test_a_deny_subscribe_rule_drops_matching_messages_of_a_granted_subscription(
    tmp_path: Path,
) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        async with client.subscribe("open/>") as sub:
            await client.publish("open/secret/plan", b"hidden", confirm=True)
            await client.publish("open/news", b"shown", confirm=True)
            # one publisher's messages come in order: had the first come, it would be first
            assert (await sub.get()).topic == "open/news"
        stats = await client.stats()
    assert stats["acl_denied_deliveries"] == 1


async def test_deny_subscribe_rules_leave_other_subscribers_of_the_same_topic_alone(
    tmp_path: Path,
) -> None:
    # jobs/%c/> is denied to each client: c1 never gets jobs/c1/..., c2 does
    async with acl_broker(tmp_path) as server:
        async with (
            connect(server.addresses[0], client_id="c1") as c1,
            connect(server.addresses[0], client_id="c2") as c2,
        ):
            async with c1.subscribe("jobs/>") as s1, c2.subscribe("jobs/>") as s2:
                await c2.publish("jobs/c1/a", b"1", confirm=True)
                await c2.publish("jobs/c2/a", b"2", confirm=True)
                assert (await s1.get()).topic == "jobs/c2/a"
                assert [(await s2.get()).topic for _ in range(1)] == ["jobs/c1/a"]


async def test_retained_messages_obey_deny_subscribe_rules(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        await client.publish("open/secret/s", b"hidden", retain=True, confirm=True)
        await client.publish("open/plain", b"shown", retain=True, confirm=True)
        async with client.subscribe("open/>") as sub:
            await client.publish("open/live", b"after", confirm=True)
            got = [(await sub.get()).topic for _ in range(2)]
    assert got == ["open/plain", "open/live"]  # retained first, then live: none denied


async def test_a_shared_group_hands_a_message_only_to_members_its_rules_allow(
    tmp_path: Path,
) -> None:
    async with acl_broker(tmp_path, data_dir=str(tmp_path / "data")) as server:
        address = server.addresses[0]
        async with (
            connect(address, client_id="c1", group="workers") as c1,
            connect(address, client_id="c2", group="workers") as c2,
            connect(address, client_id="p") as publisher,
        ):
            async with c1.subscribe("jobs/>") as s1, c2.subscribe("jobs/>") as s2:
                for _ in range(3):  # each time only c2 may have it (jobs/c1/> is c1's deny)
                    await publisher.publish("jobs/c1/x", b"for c2", confirm=True)
                for _ in range(3):
                    message = await s2.get()
                    assert message.topic == "jobs/c1/x"
                    await c2.ack(message.seq, single=True)
                await publisher.publish("jobs/c2/x", b"for c1", confirm=True)
                assert (await s1.get()).topic == "jobs/c2/x"


async def test_a_reload_removes_subscriptions_the_new_rules_do_not_grant_and_tells_the_client(
    tmp_path: Path,
) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        async with client.subscribe("open/a/>") as lost, client.subscribe("jobs/>") as kept:
            (tmp_path / "acl.toml").write_text(RULES.replace('filter = "open/>"', 'filter = "x/>"'))
            assert server.reload() == {"acl": None}
            with pytest.raises(BrokerError, match="NOT_AUTHORIZED"):
                await lost.get()
            await client.publish("jobs/z", b"still here", confirm=True)
            assert (await kept.get()).topic == "jobs/z"
            await refused(client.publish("open/a/b", b"no", confirm=True))  # the new rules
        stats = await client.stats()
    assert stats["acl_denied_subscribe"] == 1
    assert stats["subscriptions"] == 0


async def test_a_bad_file_at_reload_keeps_the_rules_in_force(tmp_path: Path) -> None:
    async with acl_broker(tmp_path) as server, connect(server.addresses[0]) as client:
        async with client.subscribe("open/>") as sub:
            (tmp_path / "acl.toml").write_text('[[rule]]\nwho = "nobody"\n')
            outcome = server.reload()
            assert outcome["acl"] is not None and "rule 1" in outcome["acl"]
            await refused(client.publish("closed/x", b"no", confirm=True))
            await client.publish("open/x", b"yes", confirm=True)
            assert (await sub.get()).topic == "open/x"


async def test_a_restored_durable_session_loses_filters_its_rules_no_longer_grant_at_start(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    async with acl_broker(tmp_path, data_dir=data) as server:
        async with connect(server.addresses[0], client_id="d", durable=True) as client:
            async with client.subscribe("open/a/>"), client.subscribe("jobs/>"):
                pass  # (a durable session keeps them)
    narrower = RULES.replace('filter = "open/>"', 'filter = "x/>"')
    async with acl_broker(tmp_path, narrower, data_dir=data) as server:
        (mine,) = [s for s in server.broker.sessions_info() if s["client_id"] == "d"]
        assert mine["filters"] == [["jobs/>", "native"]]  # before its owner is back
        assert server.broker.counters.acl_denied_subscribe == 1
        async with connect(server.addresses[0], client_id="d", durable=True) as client:
            await client.ping()
            assert client.errors == []  # nothing left to remove when it comes back
    async with Store.open(data) as store:  # and from the store
        record = await store.session("d")
        assert record is not None and record.filters == (("jobs/>", "native"),)


async def test_no_acl_file_allows_everything(tmp_path: Path) -> None:
    with trio.fail_after(WAIT):
        async with running_broker() as server, connect(server.addresses[0]) as client:
            async with client.subscribe(">") as sub:
                await client.publish("anything/at/all", b"x", confirm=True)
                assert (await sub.get()).topic == "anything/at/all"


# -- the core, with identities made by hand -------------------------------------------------


def core_broker() -> Broker:
    broker = Broker()
    broker.set_policy(
        Policy(
            [
                Rule("user:ann", "ann/>", allow=frozenset({PUBLISH, SUBSCRIBE})),
                Rule("group:ops", "ops/>", allow=frozenset({PUBLISH, SUBSCRIBE})),
                Rule("cert:CN=dev1,O=Acme", "dev/dev1/>", allow=frozenset({PUBLISH})),
                Rule("*", "public/>", allow=frozenset({SUBSCRIBE})),
                Rule("*", "home/%u/>", allow=frozenset({SUBSCRIBE})),
                Rule("group:auditors", "public/hr/>", deny=frozenset({SUBSCRIBE})),
            ]
        )
    )
    return broker


ANN = Identity(user="ann", groups=frozenset({"ops"}))
BOB = Identity(user="bob", groups=frozenset({"auditors"}))
DEVICE = Identity(cert="CN=dev1,O=Acme")


def test_user_group_and_certificate_rules_decide_for_their_identities() -> None:
    broker = core_broker()
    ann, bob, device = (broker.open_session(name) for name in ("a", "b", "d"))
    broker.authorize(ann, ANN, "a")
    broker.authorize(bob, BOB, "b")
    broker.authorize(device, DEVICE, "d")
    assert ann.acl is not None and bob.acl is not None and device.acl is not None
    assert ann.acl.may_publish("ann/x") and ann.acl.may_publish("ops/x")
    assert not bob.acl.may_publish("ann/x") and not bob.acl.may_publish("ops/x")
    assert device.acl.may_publish("dev/dev1/t") and not device.acl.may_publish("dev/dev2/t")
    assert ann.acl.may_subscribe(parse_filter("home/ann/+/#", "mqtt"))
    assert not bob.acl.may_subscribe(parse_filter("home/ann/#", "mqtt"))
    assert not device.acl.may_subscribe(parse_filter("home/+/x", "mqtt"))  # no user: no %u


def test_the_router_skips_only_the_sessions_whose_deny_rules_match() -> None:
    broker = core_broker()
    ann, bob = broker.open_session("a"), broker.open_session("b")
    broker.authorize(ann, ANN, "a")
    broker.authorize(bob, BOB, "b")
    for session in (ann, bob):
        broker.subscribe(session, parse_filter("public/>"))
    for _ in range(2):  # the second time through the kept (checked) delivery plan
        broker.publish("public/hr/salaries", b"x")
        broker.publish("public/news", b"y")
    assert (ann.seq, bob.seq) == (4, 2)
    assert broker.counters.acl_denied_deliveries == 2


def test_sessions_without_deny_rules_keep_the_plain_delivery_plan() -> None:
    broker = core_broker()
    ann = broker.open_session("a")
    broker.authorize(ann, ANN, "a")
    broker.subscribe(ann, parse_filter("public/>"))
    broker.publish("public/news", b"y")
    (plan,) = broker._plans.values()
    assert plan.__class__ is tuple and plan[0][0] is ann


def test_a_new_policy_removes_what_it_no_longer_grants_and_tells_the_session() -> None:
    broker = core_broker()
    ann = broker.open_session("a")
    broker.authorize(ann, ANN, "a")
    kept = broker.subscribe(ann, parse_filter("public/>"))
    lost = broker.subscribe(ann, parse_filter("ops/>"))
    told: list[list] = []
    ann.on_revoked = told.append
    changed = broker.set_policy(Policy([Rule("*", "public/>", allow=frozenset({SUBSCRIBE}))]))
    assert [(s, [i for i, _f in r]) for s, r in changed] == [(ann, [lost])]
    assert [[(i, f.text) for i, f in r] for r in told] == [[(lost, "ops/>")]]
    assert list(ann.subs) == [kept]


async def test_a_group_message_no_member_may_have_is_settled_without_delivery() -> None:
    broker = core_broker()
    group = Group("g", broker.limits, broker.counters, prefetch=8)
    settled: list[int] = []
    group.on_denied = settled.append
    broker.subscribe(group, parse_filter("public/>"))
    bob, ann = broker.open_session("b"), broker.open_session("a")
    broker.authorize(bob, BOB, "b")  # bob's deny-subscribe rules match public/hr/...
    broker.authorize(ann, ANN, "a")
    group.join(bob)
    for topic in ("public/hr/pay", "public/news"):
        broker.publish(topic, b"x")
    assert (settled, bob.seq, group.pending_messages) == ([1], 0, 1)  # news: bob holds it
    assert [message.topic for _seq, (message, _sub) in group.members[0].inflight.items()] == [
        "public/news"
    ]
    group.join(ann)  # ann may have what bob may not
    broker.publish("public/hr/pay", b"y")
    assert settled == [1] and group.members[1].inflight
    assert broker.counters.acl_denied_deliveries == 1
