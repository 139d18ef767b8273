"""How one message goes to one MQTT session: the options of every subscription it matches.

``Subscriptions.delivery`` takes shortcuts (one subscription, uniform options, a table of
the session's own filters past a few); whatever the shortcut, the answer is the brute-force
one over every subscription.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import routing
from broker.mqtt.subscriptions import SKIP, Options, Subscriptions

LEVELS = st.sampled_from(["a", "b", "c"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
FILTER_LEVELS = st.sampled_from(["a", "b", "+"])
FILTERS = st.builds(
    lambda levels, hash_: "/".join(levels + (["#"] if hash_ else [])),
    st.lists(FILTER_LEVELS, min_size=0, max_size=3),
    st.booleans(),
).filter(bool)
OPTIONS = st.builds(
    Options,
    qos=st.integers(0, 2),
    no_local=st.booleans(),
    retain_as_published=st.booleans(),
    identifier=st.none() | st.integers(1, 5),
)


@given(st.dictionaries(FILTERS, OPTIONS, min_size=1, max_size=20), TOPICS, st.booleans())
def test_a_delivery_takes_the_highest_qos_and_every_identifier_of_what_matches(
    subs: dict[str, Options], topic: str, own: bool
) -> None:
    table = Subscriptions()
    for i, (text, options) in enumerate(subs.items()):
        table.add(routing.parse_filter(text, routing.MQTT), i + 1, options)
    matching = [
        o
        for text, o in subs.items()
        if routing.parse_filter(text, routing.MQTT).matches(topic) and not (own and o.no_local)
    ]
    uniform = len(set(subs.values())) == 1
    if not any(routing.parse_filter(t, routing.MQTT).matches(topic) for t in subs) and not uniform:
        assert table.delivery(topic, own) is SKIP
        return
    if uniform:  # the core delivered it, so some subscription matches: the options tell
        matching = [] if own and next(iter(subs.values())).no_local else list(subs.values())[:1]
    got = table.delivery(topic, own)
    if not matching:
        assert got is SKIP
        return
    assert got.qos == max(o.qos for o in matching)
    assert got.retain_as_published == any(o.retain_as_published for o in matching)
    assert sorted(set(got.identifiers)) == sorted(
        {o.identifier for o in matching if o.identifier is not None}
    )
