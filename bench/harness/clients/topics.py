"""Topics and filters that topiary, an MQTT broker and NATS all understand the same way.

The benchmarks name everything in topiary's native form (``/`` between levels, ``*`` one
level, ``>`` the remaining levels) and translate at the edge:

============  ===================  =======================  ==============================
protocol      level separator      one level                the rest
============  ===================  =======================  ==============================
native        ``/``                ``*``                    ``>`` (one or more levels)
mqtt          ``/``                ``+``                    ``#`` (zero or more levels)
nats          ``.``                ``*``                    ``>`` (one or more tokens)
============  ===================  =======================  ==============================

Only filters all three can express are *portable*: literal levels, whole-level single
wildcards and a trailing multi-level wildcard. Topiary's prefix wildcards (``check*``)
have no equivalent and are left out. MQTT's ``#`` also matches the parent level
(``a/#`` matches ``a``) where ``>`` does not; the benchmarks' topics all have six levels
and no portable filter ends in ``#`` after its sixth level, so the two never disagree on
them (tests/test_bench_clients.py checks it on the workload). A literal level must be
acceptable everywhere: no ``.`` (NATS' separator), no whitespace, no ``*``, ``>``, ``+``
or ``#``, no leading ``$`` (system topics follow different rules in each broker).
"""

from __future__ import annotations

from typing import Final

from routing import MQTT, NATIVE

PROTOCOLS: Final = ("native", "mqtt", "nats")
_FORBIDDEN: Final = frozenset(".*>+# \t\r\n\x00")


class NotPortable(ValueError):
    """A topic or filter that some protocol cannot express (or would read differently)."""


def _literal(level: str) -> bool:
    return bool(level) and not (_FORBIDDEN & set(level)) and not level.startswith("$")


def check_topic(topic: str) -> str:
    """``topic`` (native form) if every protocol can carry it unchanged; else NotPortable."""
    if not all(_literal(level) for level in topic.split("/")):
        raise NotPortable(f"topic {topic!r} has a level NATS or MQTT would read differently")
    return topic


def portable(text: str, dialect: str = NATIVE) -> str | None:
    """The native form of filter ``text`` (written in ``dialect``) if all three protocols
    can express it, else None: MQTT ``+``/``#`` become ``*``/``>``."""
    one, rest = ("*", ">") if dialect == NATIVE else ("+", "#")
    if dialect not in (NATIVE, MQTT):
        raise ValueError(f"unknown dialect {dialect!r}")
    levels = text.split("/")
    out = []
    for index, level in enumerate(levels):
        if level == one:
            out.append("*")
        elif level == rest and index == len(levels) - 1 and index > 0:
            out.append(">")
        elif _literal(level):
            out.append(level)
        else:
            return None
    return "/".join(out)


def wire_topic(protocol: str, topic: str) -> str:
    """A native topic as ``protocol`` writes it."""
    if protocol == "nats":
        return topic.replace("/", ".")
    if protocol in ("native", "mqtt"):
        return topic
    raise ValueError(f"unknown protocol {protocol!r}")


def wire_filter(protocol: str, portable_filter: str) -> str:
    """A portable filter (native form) as ``protocol`` writes it."""
    if protocol == "mqtt":
        levels = portable_filter.split("/")
        if levels[-1] == ">":
            levels[-1] = "#"
        return "/".join("+" if level == "*" else level for level in levels)
    return wire_topic(protocol, portable_filter)
