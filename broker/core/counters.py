"""Broker counters: everything an operator would graph, as one snapshot."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Counters:
    connections_total: int = 0
    connections_refused: int = 0
    messages_in: int = 0
    messages_out: int = 0
    messages_unrouted: int = 0
    duplicates_dropped: int = 0
    store_errors: int = 0
    store_full: int = 0  # store writes the disk refused (full): their confirmed PUBs refused
    messages_replayed: int = 0
    quota_dropped: int = 0
    quota_rejected: int = 0
    group_redelivered: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    bytes_sent: int = 0
    dropped: int = 0
    slow_consumer_disconnects: int = 0
    idle_disconnects: int = 0
    turns_yielded: int = 0
    subscribes: int = 0
    unsubscribes: int = 0
    retained_sent: int = 0
    acl_denied_publish: int = 0
    acl_denied_subscribe: int = 0
    acl_denied_deliveries: int = 0
    logins: int = 0  # user name and password checked and accepted
    auth_failures: int = 0  # logins refused: bad credentials, or anonymous when it is off
    tls_handshake_failures: int = 0  # not TLS, an old version, a bad client cert, too slow
    errors: Counter[str] = field(default_factory=Counter)
    # refusals by limit against floods (broker/security/floods.py): limit name -> count
    limit_refused: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, Any]:
        return {
            "connections_total": self.connections_total,
            "connections_refused": self.connections_refused,
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
            "messages_unrouted": self.messages_unrouted,
            "duplicates_dropped": self.duplicates_dropped,
            "store_errors": self.store_errors,
            "store_full": self.store_full,
            "messages_replayed": self.messages_replayed,
            "quota_dropped": self.quota_dropped,
            "quota_rejected": self.quota_rejected,
            "group_redelivered": self.group_redelivered,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "bytes_sent": self.bytes_sent,
            "dropped": self.dropped,
            "slow_consumer_disconnects": self.slow_consumer_disconnects,
            "idle_disconnects": self.idle_disconnects,
            "turns_yielded": self.turns_yielded,
            "subscribes": self.subscribes,
            "unsubscribes": self.unsubscribes,
            "retained_sent": self.retained_sent,
            "acl_denied_publish": self.acl_denied_publish,
            "acl_denied_subscribe": self.acl_denied_subscribe,
            "acl_denied_deliveries": self.acl_denied_deliveries,
            "logins": self.logins,
            "auth_failures": self.auth_failures,
            "tls_handshake_failures": self.tls_handshake_failures,
            "errors": dict(self.errors),
            "limit_refused": dict(self.limit_refused),
        }
