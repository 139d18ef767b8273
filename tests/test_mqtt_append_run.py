"""The MQTT writer's run encoder (``Outbound._append_run``, ``Session.take_batch``'s
``append_run``) sends exactly what ``Outbound.append`` sends one delivery at a time: the same
bytes, message counts, packet ids in flight and counters, whatever the queue holds (replies,
QoS 1/2, RETAIN, retained copies, expiring, sampled and own messages, properties, packets too
large for the client) and whatever options the session's subscriptions have."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import routing
from broker.core import Counters, Message, OutboundLimits, Session
from broker.mqtt.connect import Accepted
from broker.mqtt.outbound import Outbound
from broker.mqtt.publish import plain_head
from broker.mqtt.state import ClientState, FrontEndCounters
from broker.mqtt.subscriptions import Options

options = st.builds(
    Options,
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.none() | st.integers(1, 300),
)
#: Mostly what runs are for (every subscription with the same options, no identifier),
#: sometimes what they are not for.
SUBSCRIBED = st.one_of(
    st.builds(Options, st.integers(0, 2), st.booleans(), st.booleans()).flatmap(
        lambda o: st.lists(st.just(o), min_size=1, max_size=3)
    ),
    st.lists(options, min_size=1, max_size=3),
)

#: Mostly False: each thing that keeps a delivery out of a run comes now and then.
rarely = st.sampled_from([False, False, False, True])

#: One message: topic, payload size, QoS, RETAIN, from the retained store, expiry (none, to
#: come, past), own, sampled, v5 properties, its plain head made by a reader (3.1.1 / 5.0).
MESSAGE = st.tuples(
    st.sampled_from(["a", "a/b", "x" * 130]),
    st.sampled_from([0, 5, 300, 20_000]),
    st.sampled_from([0, 0, 0, 1, 2]),
    rarely,
    rarely,
    st.sampled_from([0.0, 0.0, 0.0, 1e9, -1.0]),
    rarely,
    rarely,
    st.sampled_from([None, None, b"", b"\x01\x01"]),
    st.sampled_from([None, 0, 1]),
)

STEP = st.one_of(
    st.tuples(st.just("deliver"), MESSAGE),
    st.tuples(st.just("reply"), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("take"), st.sampled_from([1, 400, 256 * 1024]), st.integers(1, 6)),
)


def _outbound(level: int, subscribed: list[Options], maximum: int) -> Outbound:
    session = Session("s", OutboundLimits(), Counters())
    state = ClientState()
    for k, opts in enumerate(subscribed):
        state.subscriptions.add(routing.parse_filter(f"f{k}/#", routing.MQTT), k + 1, opts)
    accepted = Accepted(
        session=session,
        client_id="s",
        state=state,
        protocol_level=level,
        keepalive=0,
        will=None,
        will_delay=0.0,
        receive_maximum=4,
        maximum_packet=maximum,
        topic_alias_maximum=0,
        problem_information=False,
    )
    conn = SimpleNamespace(
        broker=SimpleNamespace(counters=Counters()),
        mqtt=SimpleNamespace(counters=FrontEndCounters()),
        requests_nursery=None,
    )
    return Outbound(conn, accepted)  # type: ignore[arg-type]


def _message(spec: tuple[Any, ...], own: Session, now: float) -> Message:
    topic, size, qos, retain, from_retained, expiry, mine, sampled, props, head = spec
    message = Message(topic, bytes(size), None, "m", qos, retain, from_retained)
    message.expires_at = now + expiry if expiry else 0.0
    message.origin = own if mine else None
    message.routed_at = 1.0 if sampled else 0.0
    message.mqtt_props = props
    if head is not None and not props:  # what a reader's plain PUBLISH leaves on it
        message.mqtt_heads = [b"", b""]
        message.mqtt_heads[head] = plain_head(Message(topic, bytes(size), None, "m"), head == 1)
    return message


def _seen(outbound: Outbound) -> tuple[Any, ...]:
    session = outbound.session
    return (
        dict(outbound.inflight),
        outbound.conn.mqtt.counters.snapshot(),
        session.queued,
        session._queued_bytes,
        session.delivered,
        list(session.sampled),
    )


@settings(max_examples=300, deadline=None)
@given(
    level=st.sampled_from([4, 5]),
    subscribed=SUBSCRIBED,
    maximum=st.sampled_from([1 << 28, 200, 20_030]),
    steps=st.lists(STEP, max_size=30),
)
def test_runs_send_what_append_sends(
    level: int, subscribed: list[Options], maximum: int, steps: list[Any]
) -> None:
    one = _outbound(level, subscribed, maximum)  # one delivery at a time
    runs = _outbound(level, subscribed, maximum)

    async def check() -> None:
        now = trio.current_time()
        for step in steps:
            if step[0] == "deliver":
                one.session.deliver(_message(step[1], one.session, now), 1)
                runs.session.deliver(_message(step[1], runs.session, now), 1)
            elif step[0] == "reply":
                one.session.send_control(step[1])
                runs.session.send_control(step[1])
            else:
                take(step[1], step[2])
        for _ in range(len(steps)):  # then the rest, as a writer with room would
            take(256 * 1024, 1 << 62)

    def take(max_bytes: int, room: int) -> None:
        one._now = runs._now = 0.0
        expected = one.session.take_batch(one.append, max_bytes, None, room)
        got = runs.session.take_batch(runs.append, max_bytes, None, room, runs._runs())
        assert got == expected
        assert _seen(runs) == _seen(one)

    trio.run(check)
