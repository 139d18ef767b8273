"""Starting a worker thread at once, for the store's writer.

``trio.to_thread.run_sync`` first takes a scheduling round in
``CapacityLimiter.acquire_on_behalf_of``, and a commit then started a round late (another
task's work ran in between). ``run_sync_at_once`` takes a free limiter without a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import trio

__all__ = ["run_sync_at_once"]


async def run_sync_at_once(
    fn: Callable[..., Any], *args: Any, limiter: trio.CapacityLimiter, borrower: object
) -> Any:
    """``trio.to_thread.run_sync(fn, *args, limiter=limiter)``, but the thread starts at once
    when the limiter is free (taken on behalf of ``borrower``). Not abandoned on cancel (like
    ``run_sync``): a cancelled caller still waits for the thread's outcome."""
    await trio.lowlevel.checkpoint_if_cancelled()
    try:
        limiter.acquire_on_behalf_of_nowait(borrower)
    except trio.WouldBlock:
        await limiter.acquire_on_behalf_of(borrower)  # a read holds the connection
    try:
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        reschedule = trio.lowlevel.reschedule

        def deliver(outcome: Any) -> None:  # in the worker thread
            token.run_sync_soon(reschedule, task, outcome)

        trio.lowlevel.start_thread_soon(partial(fn, *args), deliver)
        return await trio.lowlevel.wait_task_rescheduled(
            lambda _raise_cancel: trio.lowlevel.Abort.FAILED
        )
    finally:
        limiter.release_on_behalf_of(borrower)
