"""MatchCache: bounded, and invalidated by exactly the topics a filter matches."""

import pytest

from routing import MatchCache, parse_filter


def filled(topics: list[str], size: int = 100) -> MatchCache:
    cache = MatchCache(size)
    for topic in topics:
        cache.put(topic, topic.split("/"), frozenset({topic}))
    return cache


TOPICS = ["a/b/c", "a/b/d", "a/x/c", "a/bc/c", "b/b/c", "a", "a/b", "$s/b", "$s", "$t/b"]


@pytest.mark.parametrize(
    ("flt", "dialect", "dropped"),
    [
        ("a/b/c", "native", {"a/b/c"}),
        ("a/*/c", "native", {"a/b/c", "a/x/c", "a/bc/c"}),
        ("a/b*/c", "native", {"a/b/c", "a/bc/c"}),
        ("a/>", "native", {"a/b/c", "a/b/d", "a/x/c", "a/bc/c", "a/b"}),
        ("a/#", "mqtt", {"a/b/c", "a/b/d", "a/x/c", "a/bc/c", "a/b", "a"}),
        ("a/b/+", "mqtt", {"a/b/c", "a/b/d"}),
        ("z/>", "native", set()),
        ("$s/*", "native", {"$s/b"}),
        ("$*", "native", {"$s"}),  # a `$` prefix first level names system topics
        ("$*/b", "native", {"$s/b", "$t/b"}),
        ("$s*/>", "native", {"$s/b"}),
        ("$*/b", "mqtt", set()),  # mqtt `$*` is a literal no topic holds
    ],
)
def test_invalidate_drops_exactly_the_matching_topics(
    flt: str, dialect: str, dropped: set[str]
) -> None:
    cache = filled(TOPICS)
    cache.invalidate(parse_filter(flt, dialect))
    assert set(cache.results) == set(TOPICS) - dropped


def test_wildcard_first_filter_with_a_literal_level_drops_only_what_it_matches() -> None:
    cache = filled(TOPICS)
    cache.invalidate(parse_filter("*/b"))
    assert set(cache.results) == set(TOPICS) - {"a/b"}  # `$s/b`, `$t/b`: the `$` rule
    assert cache.statistics().clears == 0


@pytest.mark.parametrize(("flt", "dialect"), [(">", "native"), ("*/*", "native"), ("#", "mqtt")])
def test_filter_with_nothing_to_look_up_clears_the_whole_cache(flt: str, dialect: str) -> None:
    cache = filled(TOPICS)
    cache.invalidate(parse_filter(flt, dialect))
    assert len(cache) == 0
    assert cache.statistics().clears == 1


def test_dollar_prefix_first_filter_walks_instead_of_clearing() -> None:
    cache = filled(TOPICS)
    cache.invalidate(parse_filter("$*/>"))
    assert cache.statistics().clears == 0


def test_sweep_keeps_the_newest_entries() -> None:
    cache = MatchCache(max_entries=10, sweep_to=5)
    for i in range(11):
        cache.put(f"t/{i}", ["t", str(i)], frozenset())
    assert sorted(cache.results) == sorted(f"t/{i}" for i in range(6, 11))
    assert cache.statistics().evictions == 6


def test_invalidation_after_sweep_still_finds_survivors() -> None:
    cache = MatchCache(max_entries=10, sweep_to=5)
    for i in range(30):
        cache.put(f"t/{i}", ["t", str(i)], frozenset())
    cache.invalidate(parse_filter("t/>"))
    assert len(cache) == 0


def test_get_counts_hits_and_misses() -> None:
    cache = filled(["a"])
    assert cache.get("a") == {"a"}
    assert cache.get("b") is None
    stats = cache.statistics()
    assert (stats.hits, stats.misses) == (1, 1)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        MatchCache(0)
    with pytest.raises(ValueError):
        MatchCache(10, sweep_to=10)


def test_sweep_to_zero_empties_the_cache_in_one_step() -> None:
    cache = MatchCache(max_entries=4, sweep_to=0)
    for i in range(5):
        cache.put(f"t/{i}", ["t", str(i)], frozenset())
    assert len(cache) == 0
    assert cache.statistics().evictions == 5
    cache.put("t/9", ["t", "9"], frozenset())
    cache.invalidate(parse_filter("t/>"))
    assert len(cache) == 0


def test_filter_naming_a_level_no_cached_topic_holds_changes_nothing() -> None:
    cache = filled(TOPICS)
    cache.invalidate(parse_filter("a/*/zz"))
    cache.add_subscriber(parse_filter("*/*/zz"), "new")
    assert set(cache.results) == set(TOPICS)
    assert all(cache.results[t] == {t} for t in TOPICS)
    assert cache.statistics().invalidated == 0


def test_add_subscriber_patches_exactly_the_answers_the_filter_matches() -> None:
    cache = filled(TOPICS)
    cache.add_subscriber(parse_filter("a/*/c"), "new")
    patched = {"a/b/c", "a/x/c", "a/bc/c"}
    for topic in TOPICS:
        expected = {topic, "new"} if topic in patched else {topic}
        assert cache.results[topic] == expected, topic
    assert len(cache) == len(TOPICS)  # nothing dropped: the cache stays warm
    assert cache.statistics().invalidated == len(patched)


def test_add_subscriber_leaves_an_answer_that_already_names_it() -> None:
    cache = filled(TOPICS)
    cache.add_subscriber(parse_filter("a/b/c"), "a/b/c")  # the answer is {"a/b/c"} already
    assert cache.results["a/b/c"] == {"a/b/c"}
    assert cache.statistics().invalidated == 0


def test_remove_subscriber_takes_it_out_of_the_answers_the_filter_matches() -> None:
    cache = filled(TOPICS)
    cache.add_subscriber(parse_filter("a/>"), "new")
    cache.remove_subscriber(parse_filter("a/>"), "new")
    assert all(cache.results[t] == {t} for t in TOPICS)


def test_remove_subscriber_keeps_it_where_it_still_wants_the_topic() -> None:
    cache = filled(TOPICS)
    cache.add_subscriber(parse_filter("a/>"), "new")
    held = parse_filter("a/b/*")  # what "new" still holds
    cache.remove_subscriber(
        parse_filter("a/>"), "new", lambda subscriber, levels: held.matches_levels(levels)
    )
    assert cache.results["a/b/c"] == {"a/b/c", "new"}
    assert cache.results["a/b/d"] == {"a/b/d", "new"}
    assert cache.results["a/x/c"] == {"a/x/c"}


def test_literal_filter_reaches_its_own_topic_only() -> None:
    cache = filled(TOPICS)
    cache.add_subscriber(parse_filter("a/b"), "new")
    cache.add_subscriber(parse_filter("a/b", "mqtt"), "mqtt-new")
    assert {t for t in TOPICS if "new" in cache.results[t]} == {"a/b"}
    assert cache.results["a/b"] == {"a/b", "new", "mqtt-new"}


def test_dollar_literal_filter_reaches_its_system_topic() -> None:
    cache = filled(TOPICS)
    cache.add_subscriber(parse_filter("$s/b"), "sys")
    assert cache.results["$s/b"] == {"$s/b", "sys"}


def test_only_the_positions_filters_need_are_indexed() -> None:
    cache = filled([f"beacon/r{i % 3}/site{i}/view" for i in range(40)])
    cache.add_subscriber(parse_filter("beacon/*/site7/>"), "s")
    # the site level narrows the search on its own: neither `beacon` nor the region
    # (held by every or a third of the cached topics) is indexed
    assert [position for position, _ in cache._indexed] == [2]
    assert cache.results["beacon/r1/site7/view"] == {"beacon/r1/site7/view", "s"}


def test_topics_cached_after_a_change_are_indexed_at_the_next() -> None:
    cache = filled(TOPICS)
    cache.invalidate(parse_filter("a/*/c"))
    cache.put("a/y/c", ["a", "y", "c"], frozenset())
    cache.add_subscriber(parse_filter("a/*/c"), "new")
    assert cache.results["a/y/c"] == {"new"}


def test_positions_stay_indexed_after_the_cache_is_emptied() -> None:
    cache = MatchCache(max_entries=4, sweep_to=0)
    for i in range(4):
        cache.put(f"t/{i}", ["t", str(i)], frozenset())
    cache.invalidate(parse_filter("*/2"))  # indexes position 1
    for i in range(4, 6):
        cache.put(f"t/{i}", ["t", str(i)], frozenset())  # the fifth: over the bound, emptied
    assert len(cache) == 0
    assert [position for position, _ in cache._indexed] == [1]
    cache.put("u/2", ["u", "2"], frozenset())
    cache.put("u/3", ["u", "3"], frozenset())
    cache.invalidate(parse_filter("*/2"))
    assert set(cache.results) == {"u/3"}


def test_one_by_one_sweep_leaves_the_index_consistent() -> None:
    cache = MatchCache(max_entries=10, sweep_to=5)
    for i in range(8):
        cache.put(f"t/{i}/x", ["t", str(i), "x"], frozenset())
    cache.add_subscriber(parse_filter("t/*/x"), "s")  # indexes position 2
    for i in range(8, 20):
        cache.put(f"t/{i}/x", ["t", str(i), "x"], frozenset())
    cache.add_subscriber(parse_filter("*/*/x"), "s2")
    assert sorted(cache.results) == sorted(f"t/{i}/x" for i in range(12, 20))
    assert all(cache.results[t] == {"s2"} for t in cache.results)


# -- two generations (the default) ------------------------------------------------------------


def put(cache: MatchCache, topic: str, result: frozenset = frozenset()) -> None:
    cache.put(topic, topic.split("/"), result)


def test_a_full_young_generation_becomes_the_old_one() -> None:
    cache = MatchCache(max_entries=4)  # two generations of two
    for i in range(3):
        put(cache, f"t/{i}")
    assert (set(cache.results), set(cache.old)) == ({"t/2"}, {"t/0", "t/1"})
    put(cache, "t/3")
    put(cache, "t/4")  # the young one is full again: t/0 and t/1 are dropped
    assert (set(cache.results), set(cache.old)) == ({"t/4"}, {"t/2", "t/3"})
    assert len(cache) == 3
    assert cache.statistics().evictions == 2


def test_a_topic_asked_for_again_moves_back_to_the_young_generation() -> None:
    cache = MatchCache(max_entries=4)
    for i in range(3):
        put(cache, f"t/{i}", frozenset({i}))
    assert cache.get("t/0") == {0}  # a hit in the old generation
    assert (set(cache.results), set(cache.old)) == ({"t/2", "t/0"}, {"t/1"})
    put(cache, "t/3")  # the young one was full: t/1 goes, t/2 and t/0 are old now
    assert (set(cache.results), set(cache.old)) == ({"t/3"}, {"t/2", "t/0"})
    assert cache.get("t/1") is None
    stats = cache.statistics()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 3)


def test_a_revived_topic_that_starts_a_generation_is_indexed_again() -> None:
    cache = MatchCache(max_entries=4)
    for i in range(4):
        put(cache, f"t/{i}/x")
    cache.add_subscriber(parse_filter("t/*/x"), "s")  # indexes both generations
    assert cache._indexed
    assert cache.get("t/0/x") == {"s"}  # from the old generation into a full young one
    assert set(cache.results) == {"t/0/x"}
    cache.add_subscriber(parse_filter("t/*/x"), "s2")  # through the positions built
    assert cache.results["t/0/x"] == {"s", "s2"}
    cache.invalidate(parse_filter("t/*/x"))
    assert len(cache) == 0


def test_changes_reach_both_generations() -> None:
    cache = MatchCache(max_entries=8)
    for topic in TOPICS[:6]:
        put(cache, topic, frozenset({topic}))
    assert cache.old and cache.results
    cache.add_subscriber(parse_filter("a/*/c"), "new")
    patched = {"a/b/c", "a/x/c", "a/bc/c"}
    for topic in TOPICS[:6]:
        answer = cache.results.get(topic) or cache.old[topic]
        assert answer == ({topic, "new"} if topic in patched else {topic}), topic
    cache.remove_subscriber(parse_filter("a/*/c"), "new")
    cache.invalidate(parse_filter("a/>"))
    assert set(cache.results) | set(cache.old) == {"a", "b/b/c"}


def test_equal_answers_are_one_object() -> None:
    cache = MatchCache(max_entries=8)
    put(cache, "a/b", frozenset({"s"}))
    put(cache, "a/c", frozenset({"s"}))
    assert cache.results["a/b"] is cache.results["a/c"]
    cache.add_subscriber(parse_filter("a/*"), "t")
    assert cache.results["a/b"] is cache.results["a/c"] == {"s", "t"}


def test_a_cache_of_one_entry_is_emptied_when_full() -> None:
    cache = MatchCache(max_entries=1)
    put(cache, "a")
    put(cache, "b")
    assert len(cache) == 0 and cache.sweep_to == 0


def test_a_put_of_an_old_topic_that_starts_a_generation_is_indexed_again() -> None:
    cache = MatchCache(max_entries=4)
    for i in range(4):
        put(cache, f"t/{i}/x")
    cache.add_subscriber(parse_filter("t/*/x"), "s")  # indexes both generations
    put(cache, "t/0/x", frozenset({"s0"}))  # an old topic, put into a full young generation
    assert (set(cache.results), set(cache.old)) == ({"t/0/x"}, {"t/2/x", "t/3/x"})
    cache.add_subscriber(parse_filter("t/*/x"), "s2")  # through the positions built
    assert cache.results["t/0/x"] == {"s0", "s2"}
