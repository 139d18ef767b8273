"""The broker's election task: one ``Role`` and one connection to the witness, for the
whole life of the process (through every change of role).

``run`` asks the witness whatever ``Role.poll`` says is due (RENEW as primary, VOTE as a
candidate), each request bounded by the lease, the connection opened again after any
failure; it sleeps until ``Role.wake_at`` or until an input changed something. The
replication code feeds the inputs (``on_primary_contact`` from the standby's follower,
``on_standby_ack`` and ``on_partner_term`` from the primary's shipper) and asks
``may_write`` (the shipper before a batch and after the standby's ack; the PUBACK paths
before each confirmation). Every change of term is written to ``DATA_DIR/ha-term``
(``brokerterm``) before the role change is announced (``changed``), so a restart resumes
from the newest term this broker knew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import trio

from broker.address import parse_host_port
from broker.ha.brokerterm import BrokerTerm, load_broker_term, save_broker_term
from broker.ha.client import WitnessClient, WitnessTlsError, connect_witness
from broker.ha.codec import WitnessProtocolError
from broker.ha.role import CANDIDATE, PRIMARY, STANDBY, Role, RoleName
from broker.ha.timing import Timing
from broker.ha.tls import PairTls
from broker.log import get_logger

__all__ = ["ELECTOR_HELP", "Elector", "ElectorCounters"]

log = get_logger("topiary.ha.elector")

#: What each of ``Elector.statistics`` is: (kind, help) for /metrics (``topiary_ha_<name>``).
ELECTOR_HELP: dict[str, tuple[str, str]] = {
    "promotions": ("counter", "Votes won: times this broker became primary."),
    "step_downs": ("counter", "Times this broker stopped being primary (a newer term)."),
    "fenced_seconds": ("counter", "Seconds this broker was primary but could not write."),
    "witness_requests": ("counter", "Requests sent to the witness (renewals and votes)."),
    "witness_answers": ("counter", "Answers received from the witness."),
    "witness_failures": ("counter", "Witness requests that failed (unreachable, timeout)."),
    "witness_tls_failures": (
        "counter",
        "Witness connections whose TLS handshake failed (a bad certificate, not TLS).",
    ),
    "seconds_since_witness": ("gauge", "Seconds since the witness last answered (-1: never)."),
    "lease_left": ("gauge", "Seconds of the witness' lease this primary still trusts."),
}


@dataclass(slots=True)
class ElectorCounters:
    witness_requests: int = 0
    witness_answers: int = 0
    witness_failures: int = 0
    witness_tls_failures: int = 0
    fenced_seconds: float = 0.0


class Elector:
    """See the module docstring. ``data_dir`` holds the term file; ``role_at_first_start``
    is ``[ha] role``, used only when that file knows no term."""

    def __init__(
        self,
        data_dir: str,
        *,
        witness: str,
        secret: bytes,
        timing: Timing,
        role_at_first_start: str,
        tls: PairTls | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.tls = tls
        address = parse_host_port(witness)
        assert address is not None  # checked with the config
        self.witness = address
        self.secret = secret
        self.timing = timing
        self.stored: BrokerTerm = load_broker_term(data_dir)
        if self.stored.term == 0:
            start: RoleName = PRIMARY if role_at_first_start == "primary" else STANDBY
        else:
            start = PRIMARY if self.stored.primary == self.stored.me else STANDBY
        now = trio.current_time()
        self.role = Role(self.stored.me, role=start, term=self.stored.term, timing=timing, now=now)
        self.counters = ElectorCounters()
        self.last_answer: float | None = None
        self._client: WitnessClient | None = None
        self._tls_failing: str | None = None  # the last TLS failure's reason, until an answer
        self._wake = trio.Event()
        self._changed = trio.Event()
        self._seen = (self.role.role, self.role.term)
        self._fenced_since: float | None = None
        log.info("ha role at start", role=self.role.role, term=self.role.term, id=self.stored.me)

    # -- questions -----------------------------------------------------------------------------

    @property
    def is_primary(self) -> bool:
        """Primary of its term (it may still be fenced: ``may_write``)."""
        return self.role.role == PRIMARY

    @property
    def term(self) -> int:
        return self.role.term

    def may_write(self) -> bool:
        now = trio.current_time()
        allowed = self.role.may_write(now)
        self._account_fencing(allowed, now)
        return allowed

    def refusal(self) -> str | None:
        """Why writes are refused now (one line), or None when this primary may write."""
        if self.may_write():
            return None
        if self.is_primary:
            return f"fenced: primary of term {self.term} without the witness' lease or the standby"
        return f"not the primary (term {self.term})"

    def lease_renewed_since(self, since: float) -> bool:
        """This primary holds a lease asked for at or after ``since`` (trio time)."""
        return self.role.lease_renewed_since(since, trio.current_time())

    async def wait_changed(self) -> None:
        """Return at the next change of role or term."""
        await self._changed.wait()

    def statistics(self) -> dict[str, int | float | str | None]:
        now = trio.current_time()
        status = self.role.status(now)
        self._account_fencing(status.role != "fenced" or not self.is_primary, now)
        return {
            "role": status.role,
            "ha_term": status.term,
            "promotions": self.role.elections,
            "step_downs": self.role.step_downs,
            "fenced_seconds": round(self.counters.fenced_seconds, 3),
            "witness_requests": self.counters.witness_requests,
            "witness_answers": self.counters.witness_answers,
            "witness_failures": self.counters.witness_failures,
            "witness_tls_failures": self.counters.witness_tls_failures,
            "seconds_since_witness": -1.0 if self.last_answer is None else now - self.last_answer,
            "lease_left": status.lease_left,
            "seconds_since_primary": status.since_primary_heard,
        }

    # -- inputs from replication ---------------------------------------------------------------

    def on_primary_contact(self, term: int) -> bool:
        """The primary's stream of ``term`` arrived; True: acknowledge it."""
        acknowledge = self.role.on_primary_contact(term, trio.current_time())
        self._after()
        return acknowledge

    def may_acknowledge(self) -> bool:
        """A standby acknowledges the stream; a candidate (asking for a vote) does not."""
        return self.role.role == STANDBY

    def on_standby_ack(self, term: int, sent_at: float) -> None:
        self.role.on_standby_ack(term, sent_at)

    def on_partner_term(self, term: int) -> None:
        self.role.on_partner_term(term, trio.current_time())
        self._after()

    # -- the task ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                now = trio.current_time()
                request = self.role.poll(now)
                self._after()
                if request is not None:
                    await self._ask(request, now)
                    self._after()
                    continue
                wake = self.role.wake_at()
                if self.is_primary:  # count fenced time as it passes
                    wake = min(wake, now + self.timing.renew_interval)
                with trio.move_on_at(wake if math.isfinite(wake) else now + 3600):
                    await self._wake.wait()
                self._wake = trio.Event()
        finally:
            if self._client is not None:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(self._client._frames.stream)

    async def _ask(self, request: Any, sent_at: float) -> None:
        self.counters.witness_requests += 1
        try:
            with trio.fail_after(self.timing.lease):
                if self._client is None:
                    self._client = await connect_witness(*self.witness, self.secret, self.tls)
                answer = await self._client.ask(request)
        except (
            OSError,
            trio.TooSlowError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            WitnessProtocolError,
        ) as exc:
            self.counters.witness_failures += 1
            if isinstance(exc, WitnessTlsError):
                self.counters.witness_tls_failures += 1
                # (each new reason once at warning: the elector asks several times a second)
                level = log.debug if str(exc) == self._tls_failing else log.warning
                self._tls_failing = str(exc)
                level("witness: TLS handshake failed", reason=str(exc),
                      tls_failures=self.counters.witness_tls_failures)  # fmt: skip
            else:
                log.debug("witness request failed", request=type(request).__name__,
                          reason=str(exc))  # fmt: skip
            if self._client is not None:
                client, self._client = self._client, None
                await trio.aclose_forcefully(client._frames.stream)
            return
        self.counters.witness_answers += 1
        self._tls_failing = None
        self.last_answer = trio.current_time()
        if answer.verdict != "ok":
            log.info("witness answer", request=type(request).__name__, verdict=answer.verdict,
                     term=answer.term, primary=answer.primary, why=answer.why)  # fmt: skip
        self.role.on_answer(request, sent_at, answer, trio.current_time())

    def _after(self) -> None:
        """Persist a new term, then announce a change of role or term."""
        seen = (self.role.role, self.role.term)
        if seen == self._seen:
            return
        old_role = self._seen[0]
        self._seen = seen
        if self.role.term != self.stored.term or (
            self.role.role == PRIMARY and self.stored.primary != self.stored.me
        ):
            primary = self.stored.me if self.role.role == PRIMARY else None
            if self.role.term == self.stored.term and primary is None:
                primary = self.stored.primary
            self.stored = self.stored.with_term(self.role.term, primary)
            save_broker_term(self.data_dir, self.stored)
        if old_role != self.role.role and CANDIDATE not in (old_role, self.role.role):
            log.warning("ha role changed", old=old_role, new=self.role.role, term=self.role.term)
        elif old_role != self.role.role:
            log.info("ha role changed", old=old_role, new=self.role.role, term=self.role.term)
        self._changed.set()
        self._changed = trio.Event()
        self._wake.set()

    def _account_fencing(self, allowed: bool, now: float) -> None:
        fenced = self.is_primary and not allowed
        if fenced and self._fenced_since is None:
            self._fenced_since = now
            log.error("fenced: no lease from the witness and no standby", term=self.term)
        elif self._fenced_since is not None:
            self.counters.fenced_seconds += now - self._fenced_since
            self._fenced_since = now if fenced else None
            if not fenced:
                log.warning("no longer fenced", term=self.term)
