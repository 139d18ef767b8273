"""``Broker.publish_run`` (a native publisher's plain PUBs routed many per call) routes
exactly as one ``publish`` per PUB: the same messages and message ids, subscriptions and seqs in
every session's queue, the same drops (and the counts the next MSG carries), the same
latency samples and counters, whatever the PUBs, the subscriptions and the queue limits."""

from __future__ import annotations

import random
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import routing
from broker.config import BrokerConfig
from broker.core import Broker, Session

FILTERS = ["a/b", "a/*", "a/>", "b/>", "*/c", "a/b/c"]
TOPICS = ["a/b", "a/c", "a/b/c", "b/c", "c/c", "x/y"]
MAX_PAYLOAD = 8

#: A PUB as ``Connection.next_events`` passes it on: a plain map (perhaps with a msg_id,
#: perhaps over the payload limit), or anything else (a frame: None stands for it here).
PUB = st.one_of(
    st.tuples(
        st.sampled_from(TOPICS),
        st.integers(0, MAX_PAYLOAD + 2),
        st.one_of(st.none(), st.sampled_from(["m1", "m2", "m3"])),
    ),
    st.none(),
)


def _broker(subscriptions: list[list[str]], queue: int) -> Broker:
    broker = Broker(BrokerConfig(outbound_messages=queue, slow_consumer_drops=1_000))
    broker._id_prefix = "run-"  # (the same message ids in both brokers)
    broker.latency_sample_every = broker._until_sample = 3
    for k, filters in enumerate(subscriptions):
        session = broker.open_session(f"s{k}")
        for text in filters:
            broker.subscribe(session, routing.parse_filter(text))
    return broker


def _named(session: Session, sub_id: int) -> str:
    """The filter a MSG's sub id names (of a session's filters that match a topic, which
    one names the MSG depends on the order of a set: not this test's subject)."""
    return "one of the session's" if sub_id in session.subs else f"unknown sub {sub_id}"


def _route(broker: Broker, pubs: list[Any], in_runs: bool) -> list[Any]:
    """Each PUB as ``Requests._publish_run`` handles it (in runs, or one ``publish`` each);
    what the sessions hold and the counters then."""
    random.seed(7)  # (the hot-spot sampler's draws)
    events = [
        None if pub is None else {"type": "PUB", "topic": pub[0], "payload": bytes(pub[1])}
        for pub in pubs
    ]
    for event, pub in zip(events, pubs, strict=True):
        if event is not None and pub[2] is not None:
            event["msg_id"] = pub[2]
    events.append(None)
    i = 0
    while i < len(pubs):
        if in_runs:
            i = broker.publish_run(events, i, MAX_PAYLOAD)
            if i == len(pubs):
                break
        event = events[i]
        i += 1
        if event is not None and len(event["payload"]) <= MAX_PAYLOAD:  # (else refused)
            broker.publish(event["topic"], event["payload"], None, event.get("msg_id"))
    queues = {
        session.client_id: (
            [
                (m.topic, m.payload, m.msg_id, bool(m.routed_at), _named(session, sub), seq)
                for m, sub, seq in session._outbox  # type: ignore[misc]
            ],
            session.dropped,
            session._discards,
            session._untold_drops,
        )
        for session in broker.sessions.values()
    }
    return [queues, broker.counters.snapshot(), broker._until_sample]


@settings(max_examples=300, deadline=None)
@given(
    subscriptions=st.lists(st.lists(st.sampled_from(FILTERS), max_size=3), min_size=1, max_size=3),
    pubs=st.lists(PUB, max_size=30),
    queue=st.sampled_from([2, 5, 1_000]),
)
def test_publish_run_routes_as_one_publish_per_pub(
    subscriptions: list[list[str]], pubs: list[Any], queue: int
) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        one_by_one = _route(_broker(subscriptions, queue), pubs, in_runs=False)
        in_runs = _route(_broker(subscriptions, queue), pubs, in_runs=True)
        return one_by_one, in_runs

    one_by_one, in_runs = trio.run(both)
    assert in_runs == one_by_one
