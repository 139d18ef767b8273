"""The election rules (broker/ha/role.py, broker/ha/witness_state.py) in a simulated world:
random message loss and delays, link cuts, process pauses, witness restarts and clocks that
drift within the stated bound. Safety is checked after every event (tests/hasim.py): never
two brokers that may accept writes at once, at most one primary and one vote per term."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ha.messages import OK, REFUSED, STALE, Renew, Vote
from broker.ha.role import CANDIDATE, FENCED, PRIMARY, STANDBY, Role
from broker.ha.timing import CLOCK_RATE_BOUND, Timing
from broker.ha.witness_state import Persisted, WitnessState
from tests.hasim import WITNESS, Sim

TIMING = Timing()
LINKS = ("a-b", "a-w", "b-w")
rates = st.floats(1 - CLOCK_RATE_BOUND, 1 + CLOCK_RATE_BOUND)


def _link(src: str, dst: str) -> str:
    return "-".join(sorted((src, dst)))


faults = st.fixed_dictionaries(
    {
        "seed": st.integers(0, 2**32 - 1),
        "loss": st.sampled_from([0.0, 0.05, 0.3]),
        "max_delay": st.sampled_from([0.001, 0.05, 0.4, 1.5]),
        "rates": st.tuples(rates, rates, rates),
        "offsets": st.tuples(*[st.floats(-1e4, 1e4)] * 3),
        "cuts": st.lists(
            st.tuples(st.floats(0, 10), st.floats(0, 4), st.sampled_from(LINKS)), max_size=4
        ),
        "pauses": st.lists(
            st.tuples(st.floats(0, 10), st.floats(0, 4), st.sampled_from("ab")), max_size=3
        ),
        "witness_restarts": st.lists(st.tuples(st.floats(0, 10), st.floats(0, 2)), max_size=2),
    }
)


@settings(max_examples=150)
@given(faults)
def test_never_two_writers_and_one_primary_per_term(plan: dict) -> None:
    rng = random.Random(plan["seed"])
    cuts = plan["cuts"]

    def delay(src: str, dst: str, message: object) -> float | None:
        for start, length, link in cuts:
            if link == _link(src, dst) and start <= sim.now < start + length:
                return None
        if rng.random() < plan["loss"]:
            return None
        return rng.uniform(0, plan["max_delay"])

    sim = Sim.build(TIMING, delay, plan["rates"], plan["offsets"])
    events = [(at, "pause", (node, length)) for at, length, node in plan["pauses"]]
    events += [(at, "restart", (down,)) for at, down in plan["witness_restarts"]]
    for at, kind, args in sorted(events):
        sim.run_until(at, 0.05)
        if kind == "pause":
            sim.pause(*args)
        else:
            sim.restart_witness(*args)
    sim.run_until(14.0, 0.05)  # every fault is over by 14 s; sim.check ran after each event


def _quiet(src: str, dst: str, message: object) -> float:
    return 0.002


@pytest.mark.parametrize("witness_first", [False, True])
def test_first_start_the_configured_primary_gets_term_1_and_writes(witness_first: bool) -> None:
    sim = Sim.build(TIMING, _quiet)
    sim.run_until(TIMING.lease + 0.1, 0.01)  # a witness votes one lease after its start
    assert sim.writers() == ["a"]
    assert (sim.brokers["a"].role.term, sim.brokers["b"].role.term) == (1, 1)
    assert sim.brokers["b"].role.role == STANDBY


@settings(max_examples=30)
@given(kill_at=st.floats(2.0, 6.0), rates=st.tuples(rates, rates, rates))
def test_a_dead_primary_is_replaced_within_failure_timeout_lease_and_a_round_trip(
    kill_at: float, rates: tuple[float, float, float]
) -> None:
    sim = Sim.build(TIMING, _quiet, rates)
    sim.run_until(kill_at, 0.01)
    assert sim.writers() == ["a"]
    sim.kill("a")
    # Grant bound: the witness' lease (from the last renewal it got, before the kill) plus
    # the ask/answer round trip and the simulation's step; the failure timeout is inside it.
    deadline = kill_at + max(TIMING.failure_timeout, TIMING.lease) + 2 * 0.002 + 0.02
    deadline *= 1 + 2 * CLOCK_RATE_BOUND
    sim.run_until(deadline, 0.01)
    assert sim.writers() == ["b"]
    assert sim.brokers["b"].role.term == 2
    assert deadline - kill_at <= TIMING.failure_timeout + TIMING.lease + 0.1


def test_the_witness_lost_changes_nothing_while_both_brokers_are_healthy() -> None:
    def no_witness(src: str, dst: str, message: object) -> float | None:
        return None if WITNESS in (src, dst) and sim.now > 2.0 else 0.002

    sim = Sim.build(TIMING, no_witness)
    sim.run_until(10.0, 0.01)
    assert sim.writers() == ["a"]  # kept by the standby's acknowledgements alone
    assert sim.brokers["a"].role.term == 1 and sim.brokers["b"].role.role == STANDBY


def test_a_primary_that_loses_standby_and_witness_is_fenced() -> None:
    def isolated(src: str, dst: str, message: object) -> float | None:
        return None if "a" in (src, dst) and sim.now > 2.0 else 0.002

    sim = Sim.build(TIMING, isolated)
    sim.run_until(2.0, 0.01)
    assert sim.writers() == ["a"]
    sim.run_until(2.0 + TIMING.lease, 0.01)
    assert sim.brokers["a"].role.status(sim.brokers["a"].clock.at(sim.now)).role == FENCED
    sim.run_until(6.0, 0.01)
    assert sim.writers() == ["b"]  # and the standby took over in term 2


def test_a_paused_primary_finds_itself_replaced_and_steps_down() -> None:
    sim = Sim.build(TIMING, _quiet)
    sim.run_until(2.0, 0.01)
    sim.pause("a", 3.0)  # SIGSTOP longer than the failure timeout, then SIGCONT
    sim.run_until(5.0, 0.01)
    assert sim.writers() == ["b"]
    sim.run_until(5.5, 0.01)
    a = sim.brokers["a"].role
    assert (a.role, a.term, a.step_downs) == (STANDBY, 2, 1)


# -- the witness' rules, one by one -----------------------------------------------------------


def test_witness_renews_only_the_current_primary() -> None:
    w = WitnessState(Persisted(3, "a"), lease=1.0, now=0.0)
    assert w.handle(Renew(3, "a"), 0.5).answer.verdict == OK
    assert w.handle(Renew(3, "b"), 0.5).answer.verdict == STALE
    stale = w.handle(Renew(2, "a"), 0.5).answer
    assert (stale.verdict, stale.term, stale.primary) == (STALE, 3, "a")


def test_restarted_witness_refuses_votes_for_one_lease_then_grants_and_persists() -> None:
    w = WitnessState(Persisted(3, "a"), lease=1.0, now=100.0)
    refused = w.handle(Vote(4, "b"), 100.4).answer
    assert refused.verdict == REFUSED and refused.wait == pytest.approx(0.6)
    decision = w.handle(Vote(4, "b"), 101.0)
    assert decision.answer.verdict == OK and decision.persist == Persisted(4, "b")


def test_witness_grants_a_term_once_and_repeats_it_only_to_its_winner() -> None:
    w = WitnessState(Persisted(1, "a"), lease=1.0, now=0.0)
    assert w.handle(Vote(2, "b"), 2.0).persist == Persisted(2, "b")
    again = w.handle(Vote(2, "b"), 2.1)
    assert again.answer.verdict == OK and again.persist is None
    other = w.handle(Vote(2, "a"), 9.0).answer
    assert (other.verdict, other.term, other.primary) == (REFUSED, 2, "b")


def test_a_renewal_keeps_votes_away() -> None:
    w = WitnessState(Persisted(1, "a"), lease=1.0, now=0.0)
    w.handle(Renew(1, "a"), 1.5)
    assert w.handle(Vote(2, "b"), 2.4).answer.verdict == REFUSED
    assert w.handle(Vote(2, "b"), 2.5).answer.verdict == OK


def test_persisted_state_is_checked() -> None:
    with pytest.raises(ValueError):
        Persisted(0, "a")
    with pytest.raises(ValueError):
        Persisted(2, None)
    with pytest.raises(ValueError):
        Persisted(-1, None)


# -- the broker's rules, one by one -----------------------------------------------------------


def test_standby_of_term_0_never_asks_for_a_vote() -> None:
    role = Role("b", role=STANDBY, term=0, timing=TIMING, now=0.0)
    assert role.poll(100.0) is None and role.wake_at() == float("inf")


def test_silent_primary_makes_the_standby_a_candidate_that_stops_acknowledging() -> None:
    role = Role("b", role=STANDBY, term=4, timing=TIMING, now=0.0)
    assert role.on_primary_contact(4, 0.1)
    assert role.poll(0.1 + TIMING.failure_timeout - 0.01) is None
    assert role.poll(0.1 + TIMING.failure_timeout) == Vote(5, "b")
    assert role.role == CANDIDATE
    assert role.on_primary_contact(4, 1.0)  # heard again: a standby again, acknowledging
    assert role.role == STANDBY


def test_candidate_asks_again_when_the_refusal_says_the_lease_runs_out() -> None:
    role = Role("b", role=STANDBY, term=4, timing=TIMING, now=0.0)
    vote = role.poll(TIMING.failure_timeout)
    assert vote == Vote(5, "b")
    answer_at = TIMING.failure_timeout + 0.01
    role.on_answer(vote, 0.6, _answer(REFUSED, 4, "a", wait=0.05), answer_at)
    assert role.poll(answer_at + 0.05) is None
    assert role.poll(answer_at + TIMING.local_wait(0.05)) == Vote(5, "b")


def test_vote_granted_makes_a_primary_with_a_lease_counted_from_the_request() -> None:
    role = Role("b", role=STANDBY, term=4, timing=TIMING, now=0.0)
    vote = role.poll(1.0)
    assert vote is not None
    role.on_answer(vote, 1.0, _answer(OK, 5, "b", lease=1.0), 1.3)
    assert role.role == PRIMARY and role.term == 5
    assert role.may_write(1.0 + TIMING.trusted_lease - 0.001)
    assert not role.may_write(1.0 + TIMING.trusted_lease)


def test_stale_with_a_newer_term_makes_the_primary_step_down() -> None:
    role = Role("a", role=PRIMARY, term=2, timing=TIMING, now=0.0)
    renew = role.poll(0.0)
    assert renew == Renew(2, "a")
    role.on_answer(renew, 0.0, _answer(STALE, 3, "b"), 0.01)
    assert (role.role, role.term, role.may_write(0.02)) == (STANDBY, 3, False)


def test_standby_acknowledgements_keep_a_primary_writing_without_the_witness() -> None:
    role = Role("a", role=PRIMARY, term=2, timing=TIMING, now=0.0)
    assert not role.may_write(0.0)  # a restarted primary waits for its lease or its standby
    role.on_standby_ack(2, 0.5)
    assert role.may_write(0.5 + TIMING.trusted_sync - 0.001)
    assert not role.may_write(0.5 + TIMING.trusted_sync)
    role.on_standby_ack(1, 5.0)  # an acknowledgement of another term counts for nothing
    assert not role.may_write(5.0)


def test_an_ok_for_someone_else_is_not_trusted() -> None:
    role = Role("b", role=STANDBY, term=4, timing=TIMING, now=0.0)
    vote = role.poll(1.0)
    assert vote is not None
    role.on_answer(vote, 1.0, _answer(OK, 5, "a", lease=1.0), 1.1)
    assert role.role == CANDIDATE and not role.may_write(1.1)


def _answer(verdict, term, primary, *, lease=0.0, wait=0.0):  # type: ignore[no-untyped-def]
    from broker.ha.messages import Answer

    return Answer(verdict, term, primary, lease=lease, wait=wait)
