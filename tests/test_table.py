"""SubscriptionTable behaviour; every test runs with the match cache on and off."""

import pytest

from routing import SubscriptionTable, TopicError, parse_filter


@pytest.fixture(params=["cache", "no-cache"])
def table(request: pytest.FixtureRequest) -> SubscriptionTable:
    return SubscriptionTable(cache_size=4096 if request.param == "cache" else 0)


def test_add_returns_true_only_for_a_new_pair(table: SubscriptionTable) -> None:
    assert table.add("a/>", "s1") is True
    assert table.add("a/>", "s1") is False
    assert table.add("a/>", "s2") is True
    assert len(table) == 2


def test_same_text_in_both_dialects_counts_as_two_entries(table: SubscriptionTable) -> None:
    assert table.add("a/b", "s1")
    assert table.add("a/b", "s1", dialect="mqtt")
    assert len(table) == 2
    assert table.remove("a/b", "s1")
    assert table.match("a/b") == {"s1"}  # still held through the mqtt entry
    assert table.remove("a/b", "s1", dialect="mqtt")
    assert table.match("a/b") == set()


def test_equivalent_filters_in_two_dialects_are_independent(table: SubscriptionTable) -> None:
    table.add("a/*", "s1")
    table.add("a/+", "s1", dialect="mqtt")
    table.remove("a/*", "s1")
    assert table.match("a/x") == {"s1"}


def test_invalid_filter_raises_and_changes_nothing(table: SubscriptionTable) -> None:
    table.add("a/>", "s1")
    generation = table.generation
    with pytest.raises(TopicError):
        table.add("a/>/b", "s1")
    with pytest.raises(TopicError):
        table.add("a+", "s2", dialect="mqtt")
    assert len(table) == 1
    assert table.generation == generation
    assert table.filters_of("s2") == set()


def test_unknown_dialect_raises_value_error(table: SubscriptionTable) -> None:
    with pytest.raises(ValueError, match="dialect"):
        table.add("a", "s1", dialect="MQTT")
    with pytest.raises(ValueError, match="dialect"):
        table.remove("a", "s1", dialect="nats")


def test_remove_returns_whether_the_pair_was_present(table: SubscriptionTable) -> None:
    table.add("a/>", "s1")
    assert table.remove("a/>", "s2") is False
    assert table.remove("a/b", "s1") is False
    assert table.remove("a/>", "s1") is True
    assert table.remove("a/>", "s1") is False
    assert len(table) == 0


def test_remove_of_an_invalid_filter_raises(table: SubscriptionTable) -> None:
    with pytest.raises(TopicError):
        table.remove("a//b", "s1")


def test_match_returns_each_subscriber_once(table: SubscriptionTable) -> None:
    for flt in ["a/b/c", "a/*/c", "a/>", ">", "a/b*/c"]:
        table.add(flt, "s1")
    table.add("a/#", "s1", dialect="mqtt")
    result = table.match("a/b/c")
    assert result == {"s1"}
    assert len(result) == 1


def test_match_of_an_invalid_topic_raises(table: SubscriptionTable) -> None:
    table.add(">", "s1")
    for topic in ["", "a/*", "a/>", "a\x00", None, ["a"]]:
        with pytest.raises(TopicError):
            table.match(topic)  # type: ignore[arg-type]


def test_match_result_is_set_like_and_immutable(table: SubscriptionTable) -> None:
    table.add("a", "s1")
    result = table.match("a")
    assert "s1" in result and len(result) == 1 and set(result) == {"s1"}
    assert not hasattr(result, "add")


def test_unmatched_topic_gets_an_empty_result(table: SubscriptionTable) -> None:
    table.add("a/b", "s1")
    assert table.match("a/c") == set()
    assert table.match("b") == set()


def test_wildcard_routing_across_dialects(table: SubscriptionTable) -> None:
    table.add("beacon/eu/>", "eu")
    table.add("beacon/*/*/site4*/checkout/*", "site4x")
    table.add("beacon/+/+/+/+/purchase", "purchases", dialect="mqtt")
    table.add("beacon/eu/de/#", "de", dialect="mqtt")
    assert table.match("beacon/eu/de/site42/checkout/purchase") == {
        "eu",
        "site4x",
        "purchases",
        "de",
    }
    assert table.match("beacon/na/us/site42/checkout/view") == {"site4x"}
    assert table.match("beacon/eu/de") == {"eu", "de"}  # "#" matches its parent level
    assert table.match("beacon/eu") == set()  # '>' needs at least one more level


def test_system_topics_are_hidden_from_wildcard_first_filters(table: SubscriptionTable) -> None:
    table.add(">", "all")
    table.add("#", "all-mqtt", dialect="mqtt")
    table.add("*/stats", "stats")
    table.add("S*/>", "s-prefix")
    table.add("$SYS/>", "sys")
    assert table.match("$SYS/stats") == {"sys"}
    assert table.match("app/stats") == {"all", "all-mqtt", "stats"}


def test_a_dollar_prefix_first_level_matches_one_level_system_topics(
    table: SubscriptionTable,
) -> None:
    table.add("$*", "dollar")
    assert table.match("$SYS") == {"dollar"}
    assert table.match("$x") == {"dollar"}


def test_a_dollar_prefix_first_level_matches_only_its_own_level_count(
    table: SubscriptionTable,
) -> None:
    table.add("$*", "dollar")
    assert table.match("$SYS/x") == set()


def test_a_dollar_prefix_then_rest_matches_system_topics_starting_with_it(
    table: SubscriptionTable,
) -> None:
    table.add("$SYS*/>", "sys")
    assert table.match("$SYS/broker/load") == {"sys"}
    assert table.match("$SYSX/a") == {"sys"}
    assert table.match("$OTHER/a") == set()
    assert table.match("SYS/a") == set()


def test_system_topics_match_dollar_prefixes_and_literals_together(
    table: SubscriptionTable,
) -> None:
    table.add("$*/>", "any-system")
    table.add("$SYS*/>", "sys-prefix")
    table.add("$SYS/>", "sys")
    table.add("*/>", "wildcard")
    assert table.match("$SYS/a") == {"any-system", "sys-prefix", "sys"}


def test_removing_a_dollar_prefix_filter_stops_its_matches(table: SubscriptionTable) -> None:
    table.add("$SYS*/>", "sys")
    assert table.match("$SYS/a") == {"sys"}  # warms the cache when there is one
    table.remove("$SYS*/>", "sys")
    assert table.match("$SYS/a") == set()


def test_adding_a_dollar_prefix_filter_reaches_a_cached_system_topic(
    table: SubscriptionTable,
) -> None:
    assert table.match("$SYS/a") == set()  # cached empty when there is a cache
    table.add("$S*/>", "sys")
    assert table.match("$SYS/a") == {"sys"}


def test_filters_of_lists_the_filter_strings_a_subscriber_holds(table: SubscriptionTable) -> None:
    table.add("a/>", "s1")
    table.add("b/#", "s1", dialect="mqtt")
    table.add("c", "s2")
    assert table.filters_of("s1") == {"a/>", "b/#"}
    assert table.filters_of("nobody") == set()
    table.remove("a/>", "s1")
    assert table.filters_of("s1") == {"b/#"}


def test_subscribers_can_be_any_hashable(table: SubscriptionTable) -> None:
    table.add("a", ("conn", 1))
    table.add("a", 7)
    assert table.match("a") == {("conn", 1), 7}


def test_removing_everything_leaves_an_empty_trie(table: SubscriptionTable) -> None:
    entries = [("a/b/c", "s1"), ("a/*/c", "s2"), ("a/b*/>", "s3"), ("x/>", "s1"), ("a/b/c", "s2")]
    for flt, sub in entries:
        table.add(flt, sub)
    table.add("a/#", "s4", dialect="mqtt")
    table.match("a/b/c")
    for flt, sub in entries:
        assert table.remove(flt, sub)
    assert table.remove("a/#", "s4", dialect="mqtt")
    stats = table.statistics()
    assert (stats.subscriptions, stats.filters, stats.subscribers, stats.trie_nodes) == (0, 0, 0, 1)
    assert stats.cache_entries <= 1  # at most the now-empty answer for a/b/c
    assert table.match("a/b/c") == set()


def test_unsubscribe_stops_matching(table: SubscriptionTable) -> None:
    table.add("a/*", "s1")
    assert table.match("a/b") == {"s1"}
    table.remove("a/*", "s1")
    assert table.match("a/b") == set()


def test_remove_subscriber_drops_all_its_filters(table: SubscriptionTable) -> None:
    table.add("a", "s1")
    table.add("b/#", "s1", dialect="mqtt")
    table.add("a", "s2")
    assert table.remove_subscriber("s1") == 2
    assert table.match("a") == {"s2"}
    assert table.filters_of("s1") == set()


def test_filters_under_answers_where_filters_live(table: SubscriptionTable) -> None:
    table.add("beacon/eu/>", "s1")
    table.add("beacon/eu/de/*/checkout", "s2")
    table.add("beacon/eu/>", "s3")
    table.add("beacon/*/de", "s4")
    table.add("beacon/eu/#", "s5", dialect="mqtt")
    under = {(f.text, f.dialect) for f in table.filters_under("beacon/eu")}
    assert under == {
        ("beacon/eu/>", "native"),
        ("beacon/eu/de/*/checkout", "native"),
        ("beacon/eu/#", "mqtt"),
    }
    assert table.filters_under("beacon/na") == []


def test_generation_moves_on_every_change_only(table: SubscriptionTable) -> None:
    g0 = table.generation
    table.add("a", "s1")
    g1 = table.generation
    table.add("a", "s1")  # no change
    table.match("a")
    assert g1 > g0 and table.generation == g1
    table.remove("a", "s1")
    assert table.generation > g1


def test_contains_checks_an_entry(table: SubscriptionTable) -> None:
    table.add("a/#", "s1", dialect="mqtt")
    assert ("a/#", "s1", "mqtt") in table
    assert ("a/#", "s1") not in table


def test_statistics_count_matches(table: SubscriptionTable) -> None:
    table.add("a", "s1")
    for _ in range(3):
        table.match("a")
    assert table.statistics().matches == 3


def test_cache_answers_repeat_matches_and_is_invalidated_by_changes() -> None:
    table = SubscriptionTable(cache_size=16)
    table.add("a/*", "s1")
    assert table.match("a/b") == {"s1"}
    assert table.match("a/b") == {"s1"}
    assert table.statistics().cache_hits == 1
    table.add("a/b", "s2")
    assert table.match("a/b") == {"s1", "s2"}
    table.remove("a/*", "s1")
    assert table.match("a/b") == {"s2"}


def test_cache_stays_within_its_bound() -> None:
    table = SubscriptionTable(cache_size=64)
    table.add(">", "s1")
    for i in range(1000):
        table.match(f"t/{i}")
        assert table.statistics().cache_entries <= 64
    assert table.statistics().cache_evictions > 0


def test_filters_under_a_deep_prefix(table: SubscriptionTable) -> None:
    table.add("a/b/c/d/e/f", "s1")
    table.add("a/b/c/d/e/>", "s2")
    table.add("a/b/c/d/x", "s3")
    table.add("a/b/c/d/*/f", "s4")
    table.add("a/b/c/d/e", "s5", dialect="mqtt")
    under = {f.text for f in table.filters_under("a/b/c/d/e")}
    assert under == {"a/b/c/d/e/f", "a/b/c/d/e/>", "a/b/c/d/e"}
    assert {f.text for f in table.filters_under("a/b/c/d/e/f")} == {"a/b/c/d/e/f"}
    assert table.filters_under("a/b/c/d/e/f/g") == []


def test_filters_starting_with_a_wildcard_live_under_no_prefix(table: SubscriptionTable) -> None:
    table.add(">", "s1")
    table.add("a/>", "s2")
    table.add("#", "s3", dialect="mqtt")
    assert {f.text for f in table.filters_under("a")} == {"a/>"}


# -- the match cache through subscription changes ------------------------------------------


def warm_table(*topics: str) -> SubscriptionTable:
    table = SubscriptionTable(cache_size=64)
    table.add("a/>", "base")
    for topic in topics:
        table.match(topic)
    return table


def test_a_cached_topic_a_new_filter_matches_is_not_served_stale() -> None:
    table = warm_table("a/b/c")
    table.add("a/*/c", "new")
    assert table.match("a/b/c") == {"base", "new"}


def test_a_cached_topic_a_new_filter_matches_stays_cached() -> None:
    table = warm_table("a/b/c")
    hits = table.statistics().cache_hits
    table.add("a/*/c", "new")
    table.match("a/b/c")
    assert table.statistics().cache_hits == hits + 1


def test_unrelated_cached_topics_stay_cached_after_a_subscribe() -> None:
    table = warm_table("a/b/c", "a/x/d")
    table.add("a/*/c", "new")
    before = table.statistics()
    assert table.match("a/x/d") == {"base"}
    after = table.statistics()
    assert (after.cache_hits, after.cache_misses) == (before.cache_hits + 1, before.cache_misses)


def test_unsubscribe_takes_the_subscriber_out_of_cached_answers_and_keeps_them_cached() -> None:
    table = warm_table("a/b/c")
    table.add("a/*/c", "new")
    table.match("a/b/c")
    table.remove("a/*/c", "new")
    before = table.statistics()
    assert table.match("a/b/c") == {"base"}
    assert table.statistics().cache_hits == before.cache_hits + 1


def test_a_cached_answer_keeps_a_subscriber_another_of_its_filters_still_matches() -> None:
    table = warm_table("a/b/c", "a/x/c")
    table.add("a/*/c", "new")
    table.add("a/b/>", "new")
    table.remove("a/*/c", "new")
    assert table.match("a/b/c") == {"base", "new"}  # still through a/b/>
    assert table.match("a/x/c") == {"base"}


def test_a_subscriber_holding_many_filters_keeps_what_one_still_matches() -> None:
    table = warm_table("a/b/c", "a/x/c")
    for i in range(20):  # more than the filters tested one by one: the trie answers
        table.add(f"z/{i}", "many")
    table.add("a/*/c", "many")
    table.add("a/b/+", "many", dialect="mqtt")
    table.remove("a/*/c", "many")
    assert table.match("a/b/c") == {"base", "many"}
    assert table.match("a/x/c") == {"base"}


def test_a_wildcard_first_subscribe_leaves_cached_system_topics_alone() -> None:
    table = warm_table("a/b", "$SYS/b")
    table.add("*/b", "wild")
    before = table.statistics()
    assert table.match("$SYS/b") == set()
    assert table.match("a/b") == {"base", "wild"}
    after = table.statistics()
    assert after.cache_hits == before.cache_hits + 2
    assert after.cache_clears == 0


def test_a_dollar_prefix_subscribe_reaches_cached_system_topics() -> None:
    table = warm_table("a/b", "$SYS/b", "$x/b")
    table.add("$S*/>", "sys")
    assert table.match("$SYS/b") == {"sys"}
    assert table.match("$x/b") == set()
    assert table.match("a/b") == {"base"}
    assert table.statistics().cache_clears == 0


def test_add_many_patches_cached_answers() -> None:
    table = warm_table("a/b/c", "a/x/c")
    table.add_many([(parse_filter("a/*/c"), "s1"), (parse_filter("a/b/#", "mqtt"), "s2")])
    assert table.match("a/b/c") == {"base", "s1", "s2"}
    assert table.match("a/x/c") == {"base", "s1"}
    assert table.statistics().cache_misses == 2  # the two warming matches only


def test_cache_invalidated_counts_the_answers_a_change_altered() -> None:
    table = warm_table("a/b/c", "a/x/c", "a/x/d")
    table.add("a/*/c", "new")
    table.remove("a/*/c", "new")
    assert table.statistics().cache_invalidated == 4


def test_one_subscriber_twice_at_one_node_then_once(table: SubscriptionTable) -> None:
    """Two filters ending at the same node for one subscriber (a reference count of two),
    then one of them gone: it still matches, and the last removal empties the trie."""
    table.add("a/*", "s1")
    table.add("a/+", "s1", dialect="mqtt")
    table.add("a/+", "s2", dialect="mqtt")
    assert table.match("a/x") == {"s1", "s2"}
    table.remove("a/+", "s1", dialect="mqtt")
    assert table.match("a/x") == {"s1", "s2"}
    table.remove("a/+", "s2", dialect="mqtt")
    assert table.match("a/x") == {"s1"}
    assert table.remove("a/*", "s1")
    assert table.match("a/x") == set()
    assert table.statistics().trie_nodes == 1


def test_none_is_a_subscriber_like_any_other(table: SubscriptionTable) -> None:
    table.add("a/b", None)
    table.add("a/b", "s1")
    assert table.match("a/b") == {None, "s1"}
    table.remove("a/b", "s1")
    assert table.match("a/b") == {None}
    table.remove("a/b", None)
    assert table.match("a/b") == set()
    assert table.statistics().trie_nodes == 1


def test_siblings_and_prefixes_come_and_go(table: SubscriptionTable) -> None:
    """A node's children grow from one to several and shrink back (literal and prefix)."""
    texts = ["a/b", "a/c", "a/d", "a/b*", "a/c*", "a/bc*/>"]
    for text in texts:
        table.add(text, text)
    assert table.match("a/bcd") == {"a/b*"}
    assert table.match("a/bcd/e") == {"a/bc*/>"}
    assert table.match("a/c") == {"a/c", "a/c*"}
    for text in texts[::2]:  # a/b, a/d, a/c*
        table.remove(text, text)
    assert table.match("a/c") == {"a/c"}
    assert table.match("a/b") == {"a/b*"}
    assert table.match("a/bcd/e") == {"a/bc*/>"}
    for text in texts[1::2]:
        table.remove(text, text)
    assert table.statistics().trie_nodes == 1
