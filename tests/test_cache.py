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


def test_wildcard_first_filter_clears_the_whole_cache() -> None:
    cache = filled(TOPICS)
    cache.invalidate(parse_filter("*/b"))
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


def test_default_sweep_empties_the_cache_in_one_step() -> None:
    cache = MatchCache(max_entries=4)
    for i in range(5):
        cache.put(f"t/{i}", ["t", str(i)], frozenset())
    assert len(cache) == 0
    assert cache.statistics().evictions == 5
    cache.put("t/9", ["t", "9"], frozenset())
    cache.invalidate(parse_filter("t/>"))
    assert len(cache) == 0
