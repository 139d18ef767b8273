"""Retained messages: the last message published with the retain flag, per topic.

A new subscription is sent the retained message of every topic its filter matches (MQTT's
retained messages; the native protocol has them too). ``Retained`` holds them in a
``routing.RetainedTrie``, so finding the ones a filter matches costs what the answer costs,
not what the number of retained topics costs. Each held message is a ``Message`` of its own,
flagged ``retain`` and ``from_retained``: its shared encoding (``Message.encoded``) says
"from the retained store" and is made once for every subscriber it goes to. An empty payload
deletes the topic's retained message (MQTT's rule). The store keeps the same state on disk
(``broker.store``); the router writes both.
"""

from __future__ import annotations

import routing
from broker.core.message import Message

__all__ = ["Retained"]


class Retained:
    """Topic -> its retained ``Message``, with counts for the operator."""

    __slots__ = ("_trie", "bytes")

    def __init__(self) -> None:
        self._trie: routing.RetainedTrie[Message] = routing.RetainedTrie()
        self.bytes = 0  # payload bytes held

    def __len__(self) -> int:
        return len(self._trie)

    def update(
        self,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        msg_id: str,
        like: Message | None = None,
    ) -> None:
        """Keep this as the retained message of ``topic``; an empty payload deletes it.
        ``like``: the published message, whose QoS and MQTT properties the copy keeps."""
        if not payload:
            self.discard(topic)
            return
        kept = Message(topic, payload, headers, msg_id, retain=True, from_retained=True)
        if like is not None:
            kept.qos = like.qos
            kept.mqtt_props = like.mqtt_props
            kept.expires_at = like.expires_at
        old = self._trie.get(topic)
        if old is not None:
            self.bytes -= old.size
        self._trie.set(topic, kept)
        self.bytes += kept.size

    def discard(self, topic: str) -> bool:
        """Forget the retained message of ``topic``; whether there was one."""
        old = self._trie.discard(topic)
        if old is None:
            return False
        self.bytes -= old.size
        return True

    def get(self, topic: str) -> Message | None:
        return self._trie.get(topic)

    def matching(self, flt: routing.Filter) -> list[Message]:
        """The retained messages whose topics ``flt`` matches, in no particular order."""
        return [message for _topic, message in self._trie.matching(flt)]
