"""routing.RetainedTrie: topic -> value, found by filter without looking at every topic."""

from hypothesis import given
from hypothesis import strategies as st

from routing import MQTT, NATIVE, RetainedTrie, TopicError, parse_filter


def trie_of(*topics: str) -> RetainedTrie[str]:
    trie: RetainedTrie[str] = RetainedTrie()
    for topic in topics:
        trie.set(topic, f"v:{topic}")
    return trie


def matched(trie: RetainedTrie[str], text: str, dialect: str = NATIVE) -> list[str]:
    return sorted(topic for topic, _value in trie.matching(parse_filter(text, dialect)))


def test_set_replaces_the_value_of_a_topic() -> None:
    trie = trie_of("a/b")
    trie.set("a/b", "new")
    assert (trie.get("a/b"), len(trie)) == ("new", 1)


def test_discard_returns_the_value_and_forgets_the_topic() -> None:
    trie = trie_of("a/b", "a")
    assert trie.discard("a/b") == "v:a/b"
    assert (trie.get("a/b"), trie.get("a"), len(trie)) == (None, "v:a", 1)


def test_discard_of_an_unknown_topic_or_an_inner_level_is_none() -> None:
    trie = trie_of("a/b/c")
    assert trie.discard("a/b") is None
    assert trie.discard("x") is None
    assert len(trie) == 1


def test_discarding_every_topic_prunes_the_trie_to_its_root() -> None:
    trie = trie_of("a/b/c", "a/b/d", "a")
    for topic in ("a/b/c", "a", "a/b/d"):
        trie.discard(topic)
    assert (len(trie), trie._root.children) == (0, None)


def test_a_literal_filter_matches_its_topic_only() -> None:
    assert matched(trie_of("a/b", "a/b/c", "a"), "a/b") == ["a/b"]


def test_native_star_matches_one_level() -> None:
    assert matched(trie_of("a/b", "a/c", "a/b/c", "a"), "a/*") == ["a/b", "a/c"]


def test_native_prefix_matches_levels_starting_with_it() -> None:
    assert matched(trie_of("a/bc", "a/b", "a/cb"), "a/b*") == ["a/b", "a/bc"]


def test_native_rest_matches_one_or_more_levels() -> None:
    assert matched(trie_of("a", "a/b", "a/b/c"), "a/>") == ["a/b", "a/b/c"]


def test_mqtt_hash_matches_zero_or_more_levels() -> None:
    assert matched(trie_of("a", "a/b", "a/b/c", "b"), "a/#", MQTT) == ["a", "a/b", "a/b/c"]


def test_mqtt_plus_matches_one_level() -> None:
    assert matched(trie_of("a/b/c", "a/x/c", "a/b"), "a/+/c", MQTT) == ["a/b/c", "a/x/c"]


def test_first_level_wildcards_do_not_match_system_topics() -> None:
    trie = trie_of("$SYS/x", "a/x")
    assert matched(trie, ">") == ["a/x"]
    assert matched(trie, "*/x") == ["a/x"]
    assert matched(trie, "#", MQTT) == ["a/x"]
    assert matched(trie, "+/x", MQTT) == ["a/x"]


def test_dollar_prefix_and_literal_first_levels_match_system_topics() -> None:
    trie = trie_of("$SYS/x", "a/x")
    assert matched(trie, "$*/x") == ["$SYS/x"]
    assert matched(trie, "$SYS/#", MQTT) == ["$SYS/x"]


def test_a_walk_visits_only_the_branches_the_filter_reaches() -> None:
    """The cost follows the answer: a literal first level never looks at the other 999."""
    trie = trie_of(*(f"t{i}/x" for i in range(1000)), "a/x", "a/y")
    visited = []
    original = dict.get

    class Spy(dict):  # type: ignore[type-arg]
        def get(self, key, default=None):  # type: ignore[no-untyped-def]
            visited.append(key)
            return original(self, key, default)

    root = trie._root
    root.children = Spy(root.children)  # type: ignore[assignment]
    assert matched(trie, "a/>") == ["a/x", "a/y"]
    assert visited == ["a"]


TOPIC_LEVELS = st.sampled_from(["a", "b", "ab", "$", "$a", "ba"])
FILTER_LEVELS = st.sampled_from(["a", "b", "ab", "$a", "*", "a*", "$*", ">", "+", "#", "b*"])


@given(
    st.lists(st.lists(TOPIC_LEVELS, min_size=1, max_size=4), max_size=25),
    st.lists(FILTER_LEVELS, min_size=1, max_size=4),
    st.sampled_from([NATIVE, MQTT]),
    st.data(),
)
def test_matching_equals_brute_force_over_every_topic(
    topics: list[list[str]], flevels: list[str], dialect: str, data: st.DataObject
) -> None:
    try:
        flt = parse_filter("/".join(flevels), dialect)
    except TopicError:
        return
    trie: RetainedTrie[int] = RetainedTrie()
    texts = {"/".join(levels) for levels in topics}
    for i, topic in enumerate(sorted(texts)):
        trie.set(topic, i)
    gone = data.draw(st.sets(st.sampled_from(sorted(texts)))) if texts else set()
    for topic in gone:
        trie.discard(topic)
    kept = texts - gone
    found = sorted(topic for topic, _ in trie.matching(flt))
    assert found == sorted(t for t in kept if flt.matches(t))
    assert len(trie) == len(kept)
    assert all(trie.get(topic) == value for topic, value in trie.matching(flt))
