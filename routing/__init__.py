"""Pure routing logic: topics, filters, the subscription trie, covering.

No I/O here; the broker and bridges build on these objects.
"""

from routing.cache import MatchCache
from routing.covering import covers
from routing.errors import TopicError
from routing.filters import MQTT, NATIVE, Filter, parse_filter
from routing.retained import RetainedTrie
from routing.summary import Summarizer, SummaryChange
from routing.table import SubscriptionTable, TableStatistics
from routing.topics import MAX_LEVELS, MAX_TOPIC_BYTES, is_system_topic, validate_topic

__all__ = [
    "MAX_LEVELS",
    "MAX_TOPIC_BYTES",
    "MQTT",
    "NATIVE",
    "Filter",
    "MatchCache",
    "RetainedTrie",
    "SubscriptionTable",
    "Summarizer",
    "SummaryChange",
    "TableStatistics",
    "TopicError",
    "covers",
    "is_system_topic",
    "parse_filter",
    "validate_topic",
]
