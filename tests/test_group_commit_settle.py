"""Group commit with ``settle`` (a replicated batch is confirmed once the standby has it):
outcomes wait for their settle, the writer does not, and commit order is kept."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from broker.store.group_commit import GroupCommit


async def test_a_settling_batch_holds_its_outcomes_and_those_after_it_but_not_the_writer() -> None:
    release = trio.Event()
    committed: list[list[Any]] = []
    done: list[str] = []

    async def run(works: list[Any]) -> Any:
        committed.append(list(works))
        if works == ["first"]:
            return True, [(True, "first")], release.wait  # settles when released
        return True, [(True, w) for w in works]  # no settle of its own

    queue = GroupCommit(run, name="q", noun="queue", error=RuntimeError, max_batch=1, max_queued=10)
    async with trio.open_nursery() as nursery:
        queue.start(nursery)
        first = await queue.enqueue("first", lambda _e: done.append("first"))
        await trio.testing.wait_all_tasks_blocked()
        second = await queue.enqueue("second", lambda _e: done.append("second"))
        await trio.testing.wait_all_tasks_blocked()
        assert committed == [["first"], ["second"]]  # the writer went on
        assert not first.done and not second.done and done == []  # nothing confirmed yet
        release.set()
        assert await second.wait() == "second"
        assert done == ["first", "second"]  # in commit order
        await queue.aclose()


async def test_closing_while_a_batch_settles_fails_it_instead_of_confirming_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def run(works: list[Any]) -> Any:
        return True, [(True, w) for w in works], trio.sleep_forever

    queue = GroupCommit(run, name="q", noun="queue", error=RuntimeError, max_batch=1, max_queued=10)
    errors: list[BaseException | None] = []
    with trio.move_on_after(30):
        async with trio.open_nursery() as nursery:
            queue.start(nursery)
            await queue.enqueue("w", errors.append)
            await trio.testing.wait_all_tasks_blocked()
            # settle never returns: aclose gives up after CLEANUP_TIMEOUT (the clock jumps)
            await queue.aclose()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
