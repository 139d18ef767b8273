"""The topic ACL file (``[acl] file = "acl.toml"``): read, checked, and reloaded at SIGHUP.

    [[rule]]
    who = "*"                        # *, user:NAME, group:NAME, cert:SUBJECT
    allow = ["subscribe", "publish"] # and/or deny = [...]
    filter = "user/%u/#"             # %u: user name, %c: client id
    dialect = "mqtt"                 # or "native" (the default)

The whole file is checked before any rule is used: an unknown key, a bad ``who``, an
unknown action, an invalid filter or a rule that allows and denies nothing stops start-up
(or a reload, which then keeps the rules it had) with one line naming the file, the rule
number and the problem. docs/security.md ("Topic ACLs") states the semantics.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import trio

from broker.config import ConfigError, read_toml
from broker.core import Broker, Session
from broker.log import get_logger
from broker.store import StoreError
from routing import Filter
from routing.acl import Policy, Rule

log = get_logger("topiary.acl")

_KEYS = ("who", "allow", "deny", "filter", "dialect")


def load_policy(path: str | Path) -> Policy:
    """The rules of the ACL file at ``path``; raises ``ConfigError`` (one line)."""
    document = read_toml(path)
    unknown = sorted(set(document) - {"rule"})
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (rules are [[rule]] tables)")
    body = document.get("rule", [])
    if not isinstance(body, list):
        raise ConfigError(f"{path}: rule must be an array of tables, like [[rule]]")
    return Policy([_rule(path, number, table) for number, table in enumerate(body, 1)])


def _rule(path: str | Path, number: int, table: Any) -> Rule:
    where = f"{path}: rule {number}"
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table, like [[rule]]")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
    for key in ("who", "filter"):
        if key not in table:
            raise ConfigError(f"{where}: {key} is missing")
        if not isinstance(table[key], str):
            raise ConfigError(f"{where}: {key} must be a string, got {table[key]!r}")
    dialect = table.get("dialect", "native")
    if not isinstance(dialect, str):
        raise ConfigError(f"{where}: dialect must be a string, got {dialect!r}")
    actions = {}
    for key in ("allow", "deny"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            raise ConfigError(f"{where}: {key} must be a list of actions, got {value!r}")
        actions[key] = frozenset(value)
    try:
        return Rule(table["who"], table["filter"], dialect, actions["allow"], actions["deny"])
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


class AclFile:
    """The ``Reloadable`` of the ACL file: a good file replaces every client's rules at
    once (``Broker.set_policy``) and removes the subscriptions they no longer grant; a bad
    one keeps the old rules. Filters removed from durable sessions leave the store through
    ``run``, a task of the server's."""

    name = "acl"

    def __init__(self, broker: Broker, path: str | Path) -> None:
        self.broker = broker
        self.path = path
        self._send, self._receive = trio.open_memory_channel[tuple[str, Filter]](math.inf)

    def load(self) -> None:
        """Read the file and switch to its rules (start-up and SIGHUP)."""
        policy = load_policy(self.path)
        changed = self.broker.set_policy(policy)
        log.info("topic ACLs loaded", file=str(self.path), rules=len(policy))
        for session, removed in changed:
            self.forget(session, removed)

    reload = load

    def forget(self, session: Session, removed: list[tuple[int, Filter]]) -> None:
        """Queue the store removal of a durable session's revoked filters. (Once the broker
        is shutting down they stay stored: the next start's restore removes them again.)"""
        if session.durable and self.broker.store is not None:
            for _sub_id, flt in removed:
                if (flt.text, flt.dialect) not in session.refs:  # (not subscribed again)
                    with contextlib.suppress(trio.ClosedResourceError):
                        self._send.send_nowait((session.client_id, flt))

    def close(self) -> None:
        """Shutting down: ``run`` writes what is queued, then returns."""
        self._send.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Remove revoked filters of durable sessions from the store, in order, until
        ``close``."""
        task_status.started()
        store = self.broker.store
        async for client_id, flt in self._receive:
            if store is None:
                continue
            try:
                await store.remove_filter(client_id, flt.text, flt.dialect)
            except StoreError as exc:
                log.error("store failed", client=client_id, error=str(exc))
