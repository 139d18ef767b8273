"""A broker's side of the election, sans-IO: primary, standby or candidate, its term, its lease.

Inputs (each with the broker's own monotonic time ``now``): the witness' answers
(``on_answer``), contact from the partner's replication stream (``on_primary_contact`` on a
standby, ``on_standby_ack`` and ``on_partner_term`` on a primary). Outputs: the request to
send to the witness when one is due (``poll``), when to call ``poll`` next (``wake_at``),
and the question every write asks: ``may_write(now)``.

A primary may accept writes while its lease is valid (counted from when it *sent* the
renewal the witness granted, for ``Timing.trusted_lease``) or while the standby
acknowledges its replication stream in its term (``standby_in_sync_until``, counted from
when the acknowledged record was sent, for ``Timing.trusted_sync``). When neither holds it is
fenced: ``may_write`` is False and ``status`` says "fenced", until one holds again. A primary
told of a higher term (STALE from the witness, or the partner) steps down to standby.

A standby that has heard nothing from the primary for ``failure_timeout`` becomes a
candidate: it asks VOTE(term + 1) every ``renew_interval`` (sooner when a refusal says when
the lease runs out) and stops acknowledging the old primary's stream, until the witness
grants the vote (it becomes primary), refuses it for a term at least as new (it stays
standby of that term), or the primary is heard again (it stays standby). A standby of term
0 (first start, never told of a primary) never asks for a vote: it has nothing to serve.
A primary of term 0 (first start) asks VOTE(1) to get its first term.

Why two primaries never accept writes at once (docs/ha.md, "Guarantees"): the witness grants
a vote only after the old primary's lease ran out on the witness' clock, hence earlier on
the primary's; and a standby asks only after ``failure_timeout`` without the stream, hence
after every acknowledgement it gave has stopped counting on the primary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from broker.ha.messages import OK, REFUSED, STALE, Answer, Renew, Request, Vote
from broker.ha.timing import CLOCK_RATE_BOUND, Timing

__all__ = ["CANDIDATE", "FENCED", "PRIMARY", "STANDBY", "Role", "RoleName", "RoleStatus"]

RoleName = Literal["primary", "standby", "candidate", "fenced"]
PRIMARY: RoleName = "primary"
STANDBY: RoleName = "standby"
CANDIDATE: RoleName = "candidate"
#: Not a state of its own: a primary whose lease and standby acknowledgements have run out.
FENCED: RoleName = "fenced"

_NEVER = float("-inf")


@dataclass(frozen=True, slots=True)
class RoleStatus:
    """A snapshot for ``topiary ha status`` and the counters."""

    role: RoleName
    term: int
    lease_left: float
    sync_left: float
    since_primary_heard: float | None


class Role:
    """One broker's election state machine; see the module docstring."""

    __slots__ = (
        "_next_request_at",
        "broker_id",
        "elections",
        "lease_sent_at",
        "lease_until",
        "primary_heard_at",
        "role",
        "standby_in_sync_until",
        "step_downs",
        "term",
        "timing",
    )

    def __init__(
        self, broker_id: str, *, role: RoleName, term: int, timing: Timing, now: float
    ) -> None:
        if role not in (PRIMARY, STANDBY):
            raise ValueError(f"a broker starts as primary or standby, not {role!r}")
        self.broker_id = broker_id
        self.timing = timing
        self.role: RoleName = PRIMARY if role == PRIMARY and term > 0 else role
        self.term = term
        #: The lease and the standby's acknowledgements: writes are allowed before these.
        self.lease_until = _NEVER
        self.standby_in_sync_until = _NEVER
        #: When the renewal (or vote) that granted the newest lease was sent.
        self.lease_sent_at = _NEVER
        #: When the primary's stream was last heard (a standby starts counting at start).
        self.primary_heard_at = now
        self._next_request_at = now
        #: Counters: votes won, and times this broker stopped being primary.
        self.elections = 0
        self.step_downs = 0
        if role == PRIMARY and term == 0:
            self.role = CANDIDATE  # first start: ask for term 1 at once

    # -- questions ---------------------------------------------------------------------------

    def lease_renewed_since(self, since: float, now: float) -> bool:
        """True while this primary holds a lease asked for at or after ``since``: the
        witness saw it alive after that instant and grants no vote before that lease runs
        out, so a write confirmed meanwhile on this broker alone is not overtaken by a
        promotion (docs/ha.md, "Confirming alone")."""
        return self.role == PRIMARY and self.lease_sent_at >= since and now < self.lease_until

    def may_write(self, now: float) -> bool:
        """True while this broker is the primary and its lease or the standby's acks hold."""
        return self.role == PRIMARY and (now < self.lease_until or now < self.standby_in_sync_until)

    def status(self, now: float) -> RoleStatus:
        role = self.role
        if role == PRIMARY and not self.may_write(now):
            role = FENCED
        heard = None if self.role == PRIMARY else max(0.0, now - self.primary_heard_at)
        return RoleStatus(
            role,
            self.term,
            max(0.0, self.lease_until - now),
            max(0.0, self.standby_in_sync_until - now),
            heard,
        )

    def wake_at(self) -> float:
        """When ``poll`` next has something to do (a request due or a timeout to check)."""
        if self.role == STANDBY:
            if self.term == 0:
                return float("inf")
            return self.primary_heard_at + self.timing.failure_timeout
        return self._next_request_at

    # -- outputs -----------------------------------------------------------------------------

    def poll(self, now: float) -> Request | None:
        """The request to send to the witness now, if one is due (then remember it was sent)."""
        if self.role == STANDBY:
            if self.term == 0 or now < self.primary_heard_at + self.timing.failure_timeout:
                return None
            self.role = CANDIDATE  # the primary is silent: stop acknowledging it, ask
            self._next_request_at = now
        if now < self._next_request_at:
            return None
        self._next_request_at = now + self.timing.renew_interval
        if self.role == PRIMARY:
            return Renew(self.term, self.broker_id)
        return Vote(self.term + 1, self.broker_id)

    # -- inputs ------------------------------------------------------------------------------

    def on_answer(self, request: Request, sent_at: float, answer: Answer, now: float) -> None:
        """The witness answered ``request``, which was sent at ``sent_at``."""
        if answer.verdict == OK:
            if answer.term != request.term or answer.primary != self.broker_id:
                return  # not an answer the witness gives; ignore rather than trust it
            if isinstance(request, Renew):
                if self.role == PRIMARY and request.term == self.term:
                    self._extend_lease(sent_at, answer.lease)
            elif self.role == CANDIDATE and request.term == self.term + 1:
                self.role = PRIMARY
                self.term = request.term
                self.elections += 1
                self.standby_in_sync_until = _NEVER
                self.lease_until = _NEVER
                self._extend_lease(sent_at, answer.lease)
                self._next_request_at = now + self.timing.renew_interval
            return
        if answer.verdict not in (STALE, REFUSED):
            return
        if answer.term > self.term:
            self._step_down(answer.term, now)  # someone else has (or had) a newer term
        elif (
            self.role == CANDIDATE
            and isinstance(request, Vote)
            and request.term == self.term + 1
            and answer.wait > 0
        ):  # only the lease stands in the way: ask again as it runs out
            retry = now + self.timing.local_wait(answer.wait)
            self._next_request_at = min(self._next_request_at, retry)

    def on_primary_contact(self, term: int, now: float) -> bool:
        """The primary's stream (records or heartbeat) of ``term`` arrived; True: acknowledge."""
        if term < self.term:
            return False  # an old primary: the shell tells it our term (on_partner_term)
        if self.role == PRIMARY:
            if term == self.term:
                return False  # two primaries of one term cannot be; never acknowledge it
            self._step_down(term, now)
        elif term > self.term:
            self.term = term
        self.role = STANDBY
        self.primary_heard_at = now
        return True

    def on_standby_ack(self, term: int, sent_at: float) -> None:
        """The standby acknowledged, in ``term``, a record this primary sent at ``sent_at``."""
        if self.role == PRIMARY and term == self.term:
            until = sent_at + self.timing.trusted_sync
            self.standby_in_sync_until = max(self.standby_in_sync_until, until)

    def on_partner_term(self, term: int, now: float) -> None:
        """The partner told us of ``term``: a newer one means we are no longer primary."""
        if term > self.term:
            self._step_down(term, now)

    # -- helpers -----------------------------------------------------------------------------

    def _extend_lease(self, sent_at: float, lease: float) -> None:
        """Trust the granted lease (never longer than ours) from when we sent the request."""
        trusted = min(lease, self.timing.lease) * (1 - 2 * CLOCK_RATE_BOUND)
        self.lease_until = max(self.lease_until, sent_at + trusted)
        self.lease_sent_at = max(self.lease_sent_at, sent_at)

    def _step_down(self, term: int, now: float) -> None:
        if self.role == PRIMARY:
            self.step_downs += 1
        self.role = STANDBY
        self.term = term
        self.lease_until = _NEVER
        self.standby_in_sync_until = _NEVER
        self.primary_heard_at = now
