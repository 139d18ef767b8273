"""What a broker may ask the witness and what it answers: small frozen values, no I/O.

Both state machines (``witness_state`` and ``role``) and the wire codec (``codec``) speak
these, so the rules are tested without sockets and the wire only carries them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["OK", "REFUSED", "STALE", "Answer", "Renew", "Request", "Verdict", "Vote"]

Verdict = Literal["ok", "stale", "refused"]
#: The lease (RENEW) or the vote (VOTE) is granted.
OK: Verdict = "ok"
#: RENEW for a term or primary the witness no longer has: ``term`` and ``primary`` say whose.
STALE: Verdict = "stale"
#: VOTE not granted: the term is not new, or the primary's lease has not run out (``wait``).
REFUSED: Verdict = "refused"


@dataclass(frozen=True, slots=True)
class Renew:
    """The primary of ``term`` asks to extend its lease."""

    term: int
    broker_id: str


@dataclass(frozen=True, slots=True)
class Vote:
    """A broker asks to become the primary of ``term`` (one more than the term it knows)."""

    term: int
    broker_id: str


Request = Renew | Vote


@dataclass(frozen=True, slots=True)
class Answer:
    """The witness' answer, with its state after the request.

    ``term``/``primary``: the witness' current term and that term's primary (None before the
    first vote). ``lease``: seconds granted with OK, from when the witness received the
    request. ``wait``: with REFUSED for a live lease, seconds (by the witness' clock) until
    that lease runs out, so a candidate knows when to ask again. ``why``: one line for logs.
    """

    verdict: Verdict
    term: int
    primary: str | None
    lease: float = 0.0
    wait: float = 0.0
    why: str = ""
