"""The witness' rules, sans-IO: a request and the time in, an answer (and what to persist) out.

The witness keeps one thing that matters across restarts: the current term and its primary
(``Persisted``). It keeps in memory only when the current primary's lease runs out. Every
change of the persisted pair is handed to the caller in ``Decision.persist``, and the caller
must write it durably *before* it sends ``Decision.answer``; a vote the witness forgot after
a crash would let it grant the same term twice.

Rules (docs/ha.md, "Design"):

- RENEW(T, id): OK with a lease of ``lease`` seconds from now when T is the current term and
  id its primary; else STALE with the current term and primary.
- VOTE(T, id): when T is new (greater than the current term) and the current primary's
  lease has run out, grant it: term := T, primary := id, persisted, then OK with a lease (the
  vote starts the new primary's first lease). A repeated VOTE for the current term from the
  broker that already has it is granted again (its first answer may have been lost).
  Otherwise REFUSED: with ``wait`` when only the lease stands in the way.
- A witness that starts knows no lease: it takes one full lease from its start as the
  current lease, so that a lease it granted before a crash has run out before it votes.

Time is the witness' own monotonic clock, passed in as a number.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.ha.messages import OK, REFUSED, STALE, Answer, Renew, Request, Vote

__all__ = ["Decision", "Persisted", "WitnessState"]


@dataclass(frozen=True, slots=True)
class Persisted:
    """What the witness keeps on disk: the current term (0: none yet) and its primary."""

    term: int = 0
    primary: str | None = None

    def __post_init__(self) -> None:
        if self.term.__class__ is not int or self.term < 0:
            raise ValueError(f"term must be a whole number >= 0, got {self.term!r}")
        if (self.term == 0) != (self.primary is None):
            raise ValueError("a term has a primary, and term 0 has none")


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to send and, when not None, the state to persist before sending it."""

    answer: Answer
    persist: Persisted | None = None


class WitnessState:
    """The witness' state machine; see the module docstring for the rules."""

    __slots__ = ("lease", "lease_until", "state")

    def __init__(self, state: Persisted, *, lease: float, now: float) -> None:
        self.state = state
        self.lease = lease
        #: When the current primary's lease runs out by our clock (a restart: one lease on).
        self.lease_until = now + lease

    def handle(self, request: Request, now: float) -> Decision:
        """The decision for ``request`` received at ``now``."""
        if isinstance(request, Renew):
            return self._renew(request, now)
        return self._vote(request, now)

    def lease_left(self, now: float) -> float:
        """Seconds until the current lease runs out (0 when it has)."""
        return max(0.0, self.lease_until - now)

    def _renew(self, request: Renew, now: float) -> Decision:
        state = self.state
        if request.term != state.term or request.broker_id != state.primary:
            return Decision(Answer(STALE, state.term, state.primary, why="not the primary"))
        self.lease_until = max(self.lease_until, now + self.lease)
        return Decision(Answer(OK, state.term, state.primary, lease=self.lease))

    def _vote(self, request: Vote, now: float) -> Decision:
        state = self.state
        if request.term == state.term and request.broker_id == state.primary:
            self.lease_until = max(self.lease_until, now + self.lease)
            return Decision(Answer(OK, state.term, state.primary, lease=self.lease))
        if request.term <= state.term:
            why = f"term {request.term} is not newer than {state.term}"
            return Decision(Answer(REFUSED, state.term, state.primary, why=why))
        if now < self.lease_until:
            wait = self.lease_until - now
            why = f"the lease of {state.primary or 'a previous primary'} has {wait:.3f} s left"
            return Decision(Answer(REFUSED, state.term, state.primary, wait=wait, why=why))
        self.state = Persisted(request.term, request.broker_id)
        self.lease_until = now + self.lease
        answer = Answer(OK, request.term, request.broker_id, lease=self.lease)
        return Decision(answer, persist=self.state)
