"""``Session.take_batch`` with a front end's ``append_run`` (the native writer's
``append_msg_run``: runs of plain deliveries encoded in one call) sends exactly what it
sends without: the same bytes, counts, sampled times and queue accounting, whatever the
queue holds (replies in either lane, drops to tell, sampled messages, durable order)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import Counters, Message, OutboundLimits, Session
from broker.wire.codec import append_msg, append_msg_run


def _append_discarded(parts: list, message: Message, sub: int, seq: int, n: int) -> int:
    return append_msg(parts, message, sub, seq, discarded=n)


#: One step on the session: deliver (topic, payload size, sub id, sampled), a reply (its
#: bytes, ordered or not), or take a batch (max bytes, max messages).
STEP = st.one_of(
    st.tuples(
        st.just("deliver"),
        st.sampled_from(["a", "a/b", "x" * 40]),
        st.sampled_from([0, 1, 300, 70_000]),
        st.sampled_from([1, 127, 128, 255, 256, 65_535, 65_536, 2**32, 2**40]),
        st.booleans(),
    ),
    st.tuples(st.just("reply"), st.binary(min_size=1, max_size=6), st.booleans()),
    st.tuples(
        st.just("take"),
        st.sampled_from([1, 400, 5_000, 256 * 1024]),
        st.sampled_from([1, 2, 7, 1 << 62]),
    ),
)


def _session(durable: bool, first_seq: int, queue: int) -> Session:
    session = Session("s", OutboundLimits(messages=queue), Counters(), durable=durable)
    session.seq = session.sent_upto = first_seq
    if durable:
        session.connection = object()  # type: ignore[assignment]  (attached: it queues)
    return session


def _state(session: Session) -> tuple[Any, ...]:
    return (
        session.queued,
        session._queued_messages,
        session._queued_bytes,
        session._control_bytes,
        session.delivered,
        session.sent_upto,
        list(session.sampled),
    )


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(STEP, max_size=40),
    durable=st.booleans(),
    first_seq=st.sampled_from([0, 120, 250, 65_530, 2**32 - 3]),
    queue=st.sampled_from([2, 5, 10_000]),
)
def test_runs_encode_exactly_what_one_call_per_delivery_does(
    steps: list[tuple[Any, ...]], durable: bool, first_seq: int, queue: int
) -> None:
    one_by_one = _session(durable, first_seq, queue)
    in_runs = _session(durable, first_seq, queue)
    for n, step in enumerate([*steps, ("take", 1 << 30, 1 << 62)]):
        if step[0] == "deliver":
            _, topic, size, sub, sampled = step
            message = Message(topic, bytes(size), None, f"m{n}")
            message.routed_at = 1.5 + n if sampled else 0.0
            for session in (one_by_one, in_runs):
                session.deliver(message, sub)
        elif step[0] == "reply":
            _, data, ordered = step
            for session in (one_by_one, in_runs):
                session.send_control(data, ordered=ordered)
        else:
            _, max_bytes, max_messages = step
            expected = one_by_one.take_batch(append_msg, max_bytes, _append_discarded, max_messages)
            got = in_runs.take_batch(
                append_msg, max_bytes, _append_discarded, max_messages, append_run=append_msg_run
            )
            assert got == expected
        assert _state(in_runs) == _state(one_by_one)
