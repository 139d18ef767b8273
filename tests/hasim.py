"""A simulated pair and witness for the election rules: real time, drifting clocks, a lossy
network with delays, process pauses and witness restarts, all driven by the test.

Each broker runs ``broker.ha.role.Role`` and the witness ``broker.ha.witness_state``, both
fed with their own clock (``rate * real + offset``). The primary's replication stream is
modelled by heartbeats every ``renew_interval`` which the standby acknowledges (or answers
with its newer term). ``check`` asserts the safety properties after every event.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

from broker.ha.messages import Answer, Request
from broker.ha.role import PRIMARY, Role, RoleName
from broker.ha.timing import Timing
from broker.ha.witness_state import Persisted, WitnessState

WITNESS = "w"


@dataclass
class Clock:
    rate: float = 1.0
    offset: float = 0.0

    def at(self, real: float) -> float:
        return self.rate * real + self.offset


@dataclass
class Broker:
    name: str
    role: Role
    clock: Clock
    paused_until: float = 0.0
    dead: bool = False
    next_heartbeat: float = 0.0  # local time


@dataclass
class Witness:
    clock: Clock
    disk: Persisted
    state: WitnessState
    down_until: float = 0.0


@dataclass
class Sim:
    """The world; ``delay(src, dst)`` decides each message's fate (None: lost)."""

    timing: Timing
    brokers: dict[str, Broker]
    witness: Witness
    delay: Any  # (src, dst, message) -> float | None
    now: float = 0.0
    queue: list[tuple[float, int, str, str, tuple[Any, ...]]] = field(default_factory=list)
    counter: Any = field(default_factory=itertools.count)
    primaries: dict[int, str] = field(default_factory=dict)  # term -> the broker that led it
    grants: dict[int, str] = field(default_factory=dict)  # term -> the id the witness voted for
    writers_seen: int = 0

    @classmethod
    def build(
        cls,
        timing: Timing,
        delay: Any,
        rates: tuple[float, float, float] = (1.0, 1.0, 1.0),
        offsets: tuple[float, float, float] = (0.0, 0.0, 0.0),
    ) -> Sim:
        clocks = [Clock(r, o) for r, o in zip(rates, offsets, strict=True)]
        brokers = {}
        for name, start, clock in (("a", PRIMARY, clocks[0]), ("b", "standby", clocks[1])):
            role: RoleName = start  # type: ignore[assignment]
            brokers[name] = Broker(
                name, Role(name, role=role, term=0, timing=timing, now=clock.at(0)), clock
            )
        state = WitnessState(Persisted(), lease=timing.lease, now=clocks[2].at(0))
        return cls(timing, brokers, Witness(clocks[2], Persisted(), state), delay)

    # -- the world's moves --------------------------------------------------------------------

    def send(self, src: str, dst: str, message: tuple[Any, ...]) -> None:
        delay = self.delay(src, dst, message)
        if delay is not None:
            heapq.heappush(self.queue, (self.now + delay, next(self.counter), src, dst, message))

    def pause(self, name: str, seconds: float) -> None:
        self.brokers[name].paused_until = self.now + seconds

    def kill(self, name: str) -> None:
        self.brokers[name].dead = True

    def restart_witness(self, down: float) -> None:
        """The witness crashes now and starts again ``down`` seconds later from its disk."""
        w = self.witness
        w.down_until = self.now + down
        w.state = WitnessState(w.disk, lease=self.timing.lease, now=w.clock.at(w.down_until))

    def run_until(self, end: float, step: float) -> None:
        """Advance real time to ``end``, letting every process act every ``step`` seconds."""
        while self.now < end:
            self._deliver_until(min(end, self.now + step))
            self.now = min(end, self.now + step)
            for broker in self.brokers.values():
                self._act(broker)
            self.check()

    # -- internals ----------------------------------------------------------------------------

    def _running(self, broker: Broker) -> bool:
        return not broker.dead and self.now >= broker.paused_until

    def _deliver_until(self, end: float) -> None:
        held = []
        while self.queue and self.queue[0][0] <= end:
            at, n, src, dst, message = heapq.heappop(self.queue)
            self.now = max(self.now, at)
            if dst == WITNESS:
                self._witness_receives(src, message)
            else:
                broker = self.brokers[dst]
                if broker.dead:
                    continue
                if self.now < broker.paused_until:  # kept in the socket until it runs again
                    held.append((broker.paused_until, n, src, dst, message))
                    continue
                self._broker_receives(broker, src, message)
                self._act(broker)
            self.check()
        for item in held:
            heapq.heappush(self.queue, item)

    def _witness_receives(self, src: str, message: tuple[Any, ...]) -> None:
        w = self.witness
        if self.now < w.down_until:
            return  # lost with the process
        request, sent_at = message
        decision = w.state.handle(request, w.clock.at(self.now))
        if decision.persist is not None:
            w.disk = decision.persist  # durably, before the answer leaves
            granted = self.grants.setdefault(decision.persist.term, decision.persist.primary)
            assert granted == decision.persist.primary, "the witness voted twice in a term"
        self.send(WITNESS, src, ("answer", request, sent_at, decision.answer))

    def _broker_receives(self, broker: Broker, src: str, message: tuple[Any, ...]) -> None:
        role, local = broker.role, broker.clock.at(self.now)
        kind = message[0]
        if kind == "answer":
            _, request, sent_at, answer = message
            assert isinstance(answer, Answer)
            role.on_answer(request, sent_at, answer, local)
        elif kind == "stream":
            _, term, sent_at = message
            if role.on_primary_contact(term, local):
                self.send(broker.name, src, ("ack", term, sent_at))
            elif role.term > term:
                self.send(broker.name, src, ("term", role.term))
        elif kind == "ack":
            role.on_standby_ack(message[1], message[2])
        elif kind == "term":
            role.on_partner_term(message[1], local)
        self._record(broker)

    def _act(self, broker: Broker) -> None:
        if not self._running(broker):
            return
        role, local = broker.role, broker.clock.at(self.now)
        for _ in range(3):  # bounded: at most one request is due per call
            request: Request | None = role.poll(local)
            if request is None:
                break
            self.send(broker.name, WITNESS, (request, local))
        if role.role == PRIMARY and local >= broker.next_heartbeat:
            broker.next_heartbeat = local + self.timing.renew_interval
            other = next(name for name in self.brokers if name != broker.name)
            self.send(broker.name, other, ("stream", role.term, local))
        self._record(broker)

    def _record(self, broker: Broker) -> None:
        role = broker.role
        if role.role == PRIMARY:
            leader = self.primaries.setdefault(role.term, broker.name)
            assert leader == broker.name, f"two primaries in term {role.term}"

    def writers(self) -> list[str]:
        """The brokers that would accept a write at this instant (by their own clocks)."""
        return [
            b.name
            for b in self.brokers.values()
            if not b.dead and b.role.may_write(b.clock.at(self.now))
        ]

    def check(self) -> None:
        writers = self.writers()
        assert len(writers) <= 1, f"two brokers accept writes at {self.now:.3f}: {writers}"
        self.writers_seen = max(self.writers_seen, len(writers))
