"""Topic ACLs: who may publish to, and subscribe to, which topics; decided exactly.

A ``Policy`` holds ``Rule``s. Each rule names who it is for (``who``), allows and/or denies
``publish`` and/or ``subscribe``, and has a filter in either dialect, in which ``%u`` stands
for the client's user name and ``%c`` for its client id. For one client,
``policy.access(principal, client_id)`` compiles only the rules that name it into an
``Access``, which answers:

- ``may_publish(topic)``: true iff an allow-publish filter matches the topic and no
  deny-publish filter does;
- ``may_subscribe(filter)``: true iff one allow-subscribe filter *covers* it
  (``routing.covers``: every topic the filter can match, that rule allows), rule by rule;
- ``denies(topic)``: whether a deny-subscribe filter matches the topic: a granted
  subscription never delivers it (deny-subscribe rules act per message).

``who``: ``*`` is every client, anonymous ones included; ``user:NAME`` a client that logged
in as NAME; ``group:NAME`` one whose user is in group NAME; ``cert:SUBJECT`` one whose
verified client certificate has exactly that RFC 4514 subject (as
``broker.security.certificate_subject`` writes it: ``CN=dev1,O=Acme``), compared as text.

Substitution never lets a name add levels or wildcards, nor reach system topics: a user
name or client id that is empty, starts with ``$``, or holds ``/``, ``+``, ``#``, ``*``,
``>``, ``%`` or NUL makes each rule that uses it apply to nothing for that client, as does a
name that makes the filter invalid (too long). An anonymous client has no user name, so
rules with ``%u`` never apply to it.

Cost: the questions asked per message (``may_publish``, and ``Denials.denies`` per
delivery) go to ``FilterSet``s: one compiled regular expression for the few filters that
name a client, a trie past that, never a scan of the rules in Python. ``may_subscribe``
walks a small ``SubscriptionTable`` for the candidate rules and keeps its answers.
Clients with the same applicable rules and the same substituted names share one
``Access`` (``Policy`` keeps them), clients with the same deny-subscribe filters share one
``Denials`` (a router asks it once per message for all of them), and ``has_denies`` is
false when no deny-subscribe rule applies, so a router can leave such clients on its fast
path. No I/O, and nothing from ``broker/``: the caller passes who the client is.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from routing.covering import covers
from routing.errors import TopicError
from routing.filters import DIALECTS, NATIVE, STAR, Filter, parse_filter
from routing.filterset import FilterSet
from routing.table import SubscriptionTable
from routing.topics import MAX_LEVELS, MAX_TOPIC_BYTES

PUBLISH: Final = "publish"
SUBSCRIBE: Final = "subscribe"
ACTIONS: Final = (PUBLISH, SUBSCRIBE)
#: The characters a substituted name may not hold (and ``$`` may not start it).
FORBIDDEN_IN_NAMES: Final = ("/", "+", "#", "*", ">", "%", "\x00")
#: Subscribe answers an ``Access`` keeps before it empties that cache.
ANSWERS_MAX: Final = 4096
#: ``Access`` objects a ``Policy`` keeps for reuse before it empties that cache.
ACCESS_MAX: Final = 4096

_PLACEHOLDER = re.compile("%[uc]")
_WHO_KINDS: Final = ("user:", "group:", "cert:")


class Principal(Protocol):
    """Who a client is, as the rules see it (``broker.security.Identity`` is one)."""

    @property
    def user(self) -> str | None: ...

    @property
    def groups(self) -> frozenset[str]: ...

    @property
    def cert(self) -> str | None: ...


def safe_name(name: str | None) -> bool:
    """May ``name`` be substituted for ``%u`` or ``%c``? (See the module docstring.)"""
    return (
        bool(name) and not name.startswith("$") and not any(c in name for c in FORBIDDEN_IN_NAMES)
    )  # type: ignore[union-attr]


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule; a bad one raises ``ValueError`` saying what is wrong (not where)."""

    who: str
    filter: str
    dialect: str = NATIVE
    allow: frozenset[str] = frozenset()
    deny: frozenset[str] = frozenset()
    #: The parsed filter when it has no placeholder (else each client's is made on use).
    parsed: Filter | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        who = self.who
        if not isinstance(who, str) or not (
            who == "*" or any(who.startswith(k) and len(who) > len(k) for k in _WHO_KINDS)
        ):
            raise ValueError(
                f"who must be '*', 'user:NAME', 'group:NAME' or 'cert:SUBJECT', got {who!r}"
            )
        for kind in ("allow", "deny"):
            actions = getattr(self, kind)
            unknown = sorted(str(a) for a in actions if a not in ACTIONS)
            if unknown:
                got = ", ".join(map(repr, unknown))
                raise ValueError(f"{kind} may hold 'publish' and 'subscribe', got {got}")
        if not self.allow and not self.deny:
            raise ValueError("a rule must allow or deny something (allow and deny are empty)")
        both = sorted(self.allow & self.deny)
        if both:
            raise ValueError(f"{both[0]} is both allowed and denied")
        if self.dialect not in DIALECTS:
            raise ValueError(f"dialect must be 'native' or 'mqtt', got {self.dialect!r}")
        if not isinstance(self.filter, str):
            raise ValueError(f"filter must be a string, got {type(self.filter).__name__}")
        try:
            if self.uses_names:  # checked with a harmless name in each placeholder
                parse_filter(_PLACEHOLDER.sub("x", self.filter), self.dialect)
            else:
                object.__setattr__(self, "parsed", parse_filter(self.filter, self.dialect))
        except TopicError as exc:
            raise ValueError(str(exc)) from None

    @property
    def uses_user(self) -> bool:
        return "%u" in self.filter

    @property
    def uses_client(self) -> bool:
        return "%c" in self.filter

    @property
    def uses_names(self) -> bool:
        return _PLACEHOLDER.search(self.filter) is not None

    def names(self, principal: Principal) -> bool:
        """Is this rule for ``principal``?"""
        who = self.who
        if who == "*":
            return True
        kind, _, name = who.partition(":")
        if kind == "user":
            return principal.user == name
        if kind == "group":
            return principal.user is not None and name in principal.groups
        return principal.cert == name

    def filter_for(self, user: str | None, client_id: str | None) -> Filter | None:
        """The filter with ``%u`` and ``%c`` substituted; None when the rule applies to
        nothing for these names (a name unsafe, missing, or making the filter invalid)."""
        if self.parsed is not None:
            return self.parsed
        if self.uses_user and not safe_name(user):
            return None
        if self.uses_client and not safe_name(client_id):
            return None
        names = {"%u": user, "%c": client_id}
        text = _PLACEHOLDER.sub(lambda m: names[m.group()], self.filter)  # type: ignore[arg-type,return-value]
        try:
            return parse_filter(text, self.dialect)
        except TopicError:
            return None


class Access:
    """One client's compiled rules (see the module docstring); immutable once made."""

    __slots__ = (
        "_allow_subscribe",
        "_deny_publish",
        "_may_publish",
        "_sub_answers",
        "_sub_table",
        "denials",
        "has_denies",
        "rules",
    )

    def __init__(
        self,
        allow_publish: Iterable[Filter] = (),
        deny_publish: Iterable[Filter] = (),
        allow_subscribe: Iterable[Filter] = (),
        deny_subscribe: Iterable[Filter] = (),
        denials: Denials | None = None,
    ) -> None:
        # A table only where there are filters (a broker may hold an Access per client, and
        # the cyclic GC walks all of it). Match caches are off where this class keeps its
        # own answers (one bool per question).
        allow = FilterSet(allow_publish)
        deny = FilterSet(deny_publish)
        self._may_publish = allow.matches if allow else None
        self._deny_publish = deny.matches if deny else None
        self._allow_subscribe = list(dict.fromkeys(allow_subscribe))
        self._sub_table = _table(list(zip(self._allow_subscribe, itertools.count())), 0)
        if denials is None:
            deny = list(deny_subscribe)
            denials = Denials(deny) if deny else None
        #: The deny-subscribe rules, shared by the clients that have the same ones (a router
        #: asks once per message for all of them); None when there are none.
        self.denials = denials
        self.has_denies = denials is not None
        self._sub_answers: dict[Filter | tuple[str, str], bool] = {}
        self.rules = (
            len(allow) + len(deny) + len(self._allow_subscribe) + (len(denials) if denials else 0)
        )

    def may_publish(self, topic: str) -> bool:
        """May this client publish to ``topic`` (a valid topic)? Asked of every publish: a
        ``FilterSet`` each for the allow and the deny rules, no per-topic cache (a stream's
        topics are too many for one to hit)."""
        allowed = self._may_publish
        if allowed is None or not allowed(topic):
            return False
        denied = self._deny_publish
        return denied is None or not denied(topic)

    def may_subscribe(self, flt: Filter) -> bool:
        """May this client subscribe to ``flt``: does one allow-subscribe filter cover it?"""
        answer = self._sub_answers.get(flt)
        if answer is None:
            answer = self._covered(flt)
            if len(self._sub_answers) >= ANSWERS_MAX:
                self._sub_answers.clear()
            self._sub_answers[flt] = answer
        return answer

    def may_subscribe_text(self, text: str, dialect: str) -> bool:
        """``may_subscribe`` for a filter held as text (a valid one), parsed on a miss."""
        answer = self._sub_answers.get((text, dialect))
        if answer is None:
            answer = self.may_subscribe(parse_filter(text, dialect))
            self._sub_answers[(text, dialect)] = answer
        return answer

    def denies(self, topic: str) -> bool:
        """Does a deny-subscribe rule of this client match ``topic`` (a valid topic)?"""
        denials = self.denials
        return denials is not None and denials.denies(topic)

    def _covered(self, flt: Filter) -> bool:
        """A filter that covers ``flt`` matches every topic ``flt`` matches, ``example`` among
        them: only the allow filters that match it are tried."""
        allow = self._allow_subscribe
        table = self._sub_table
        if table is None:
            return False
        topic = example_topic(flt)
        if topic is None:  # flt matches no topic (or none we can name): try every rule
            return any(covers(general, flt) for general in allow)
        return any(covers(allow[i], flt) for i in table.match(topic))


class Denials:
    """A set of deny-subscribe filters, asked per delivery: a ``FilterSet``, shared by the
    clients that have the same ones (the router asks once per message for all of them)."""

    __slots__ = ("denies", "filters")

    def __init__(self, filters: Sequence[Filter]) -> None:
        matcher = FilterSet(filters)
        self.filters = matcher.filters
        #: Does one of the filters match this topic (a valid topic)?
        self.denies = matcher.matches

    def __len__(self) -> int:
        return len(self.filters)


def _table(
    entries: list[tuple[Filter, Hashable]], cache_size: int | None = None
) -> SubscriptionTable | None:
    """A table of (filter, subscriber) entries, or None for none."""
    if not entries:
        return None
    table = SubscriptionTable() if cache_size is None else SubscriptionTable(cache_size=cache_size)
    table.add_many(entries)
    return table


#: Everything allowed, nothing denied: what a client gets with no policy at all is no
#: ``Access`` (None); this is for tests and callers that want an object.
NOTHING: Final = Access()


def example_topic(flt: Filter) -> str | None:
    """One valid topic ``flt`` matches (its cheapest), or None when there is none (a literal
    holding ``*`` or ``>``, as the MQTT dialect allows, or too long)."""
    levels: list[str] = []
    for token in flt.levels:
        if token.__class__ is str:
            if "*" in token or ">" in token:  # type: ignore[operator]
                return None
            levels.append(token)  # type: ignore[arg-type]
        elif token is STAR:
            levels.append("x")  # (not a `$` value: a first `*` may not match those)
        else:
            levels.append(token.prefix or "x")  # type: ignore[union-attr]
    if flt.rest is not None:
        levels.extend("x" * flt.rest.min_levels)
        if not levels:
            levels.append("x")  # a lone `#` matches one level at least
    if len(levels) > MAX_LEVELS:
        return None
    topic = "/".join(levels)
    if len(topic.encode()) > MAX_TOPIC_BYTES:
        return None
    return topic


class Policy:
    """Every rule, and the ``Access`` of each kind of client (shared, kept for reuse)."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self.rules = tuple(rules)
        # who -> the indices of its rules, so a client's rules are found by name, not scan
        self._by_who: dict[str, list[int]] = {}
        for i, rule in enumerate(self.rules):
            self._by_who.setdefault(rule.who, []).append(i)
        self._made: dict[tuple[object, ...], Access] = {}
        self._denials: dict[tuple[Filter, ...], Denials] = {}  # shared between clients

    def __len__(self) -> int:
        return len(self.rules)

    def rules_for(self, principal: Principal) -> list[int]:
        """The indices of the rules that name ``principal``, in file order."""
        by_who = self._by_who
        found = list(by_who.get("*", ()))
        if principal.user is not None:
            found += by_who.get(f"user:{principal.user}", ())
            for group in principal.groups:
                found += by_who.get(f"group:{group}", ())
        if principal.cert is not None:
            found += by_who.get(f"cert:{principal.cert}", ())
        return sorted(set(found))

    def access(self, principal: Principal, client_id: str | None) -> Access:
        """The compiled rules of a client (see the module docstring)."""
        indices = self.rules_for(principal)
        rules = self.rules
        user = principal.user if any(rules[i].uses_user for i in indices) else None
        client = client_id if any(rules[i].uses_client for i in indices) else None
        key = (tuple(indices), user, client)
        made = self._made.get(key)
        if made is not None:
            return made
        lists: dict[tuple[bool, str], list[Filter]] = {
            (allow, action): [] for allow in (True, False) for action in ACTIONS
        }
        for i in indices:
            rule = rules[i]
            flt = rule.filter_for(user, client)
            if flt is None:
                continue
            for action in rule.allow:
                lists[True, action].append(flt)
            for action in rule.deny:
                lists[False, action].append(flt)
        deny = tuple(lists[False, SUBSCRIBE])
        denials = self._denials.get(deny) if deny else None
        if deny and denials is None:
            if len(self._denials) >= ACCESS_MAX:
                self._denials.clear()
            denials = self._denials[deny] = Denials(deny)
        made = Access(
            allow_publish=lists[True, PUBLISH],
            deny_publish=lists[False, PUBLISH],
            allow_subscribe=lists[True, SUBSCRIBE],
            denials=denials,
        )
        if len(self._made) >= ACCESS_MAX:
            self._made.clear()
        self._made[key] = made
        return made
