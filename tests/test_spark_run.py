"""How ``topiary bridge spark`` turns the query's end into an exit status (no Spark here:
the query is a stand-in with StreamingQuery's few members that matter)."""

from __future__ import annotations

import threading

from bridges.spark.run import wait_for_query


class FakeQuery:
    def __init__(self, *, active: bool = True, error_on_stop: str | None = None) -> None:
        self.isActive = active
        self.error: str | None = None
        self.error_on_stop = error_on_stop
        self.recentProgress: list[dict] = [{}, {}]
        self.stops = 0

    def awaitTermination(self, timeout: float) -> bool:
        return not self.isActive

    def stop(self) -> None:
        self.stops += 1
        self.isActive = False
        self.error = self.error_on_stop

    def exception(self) -> str | None:
        return self.error


def stop_requested() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def test_a_query_that_fails_on_its_own_exits_1() -> None:
    query = FakeQuery(active=False)
    query.error = "[STREAM_FAILED] boom"
    assert wait_for_query(query, threading.Event()) == 1
    assert query.stops == 0


def test_a_query_that_finishes_on_its_own_exits_0() -> None:
    assert wait_for_query(FakeQuery(active=False), threading.Event()) == 0


def test_a_requested_stop_stops_the_query_and_exits_0() -> None:
    query = FakeQuery()
    assert wait_for_query(query, stop_requested()) == 0
    assert query.stops == 1


def test_an_error_that_the_requested_stop_causes_is_not_a_failure() -> None:
    query = FakeQuery(error_on_stop="[STREAM_FAILED] (no cause message)")
    assert wait_for_query(query, stop_requested()) == 0


def test_a_failure_found_when_the_stop_is_requested_still_counts() -> None:
    query = FakeQuery(active=False)
    query.error = "[STREAM_FAILED] boom"
    assert wait_for_query(query, stop_requested()) == 1
