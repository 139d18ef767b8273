"""Confirmed publishes for a while: the load of the benchmarks that measure durable work."""

from __future__ import annotations

import trio

from broker.client import Client


async def publish_confirmed_for(
    client: Client, topic: str, payload: bytes, tasks: int, seconds: float
) -> tuple[int, float]:
    """``tasks`` trio tasks on ``client``, each awaiting ``publish(..., confirm=True)`` in a
    loop until ``seconds`` have passed: (PUBACKs, seconds from their start until the last
    task returned, the publishes in flight at the deadline included). Bounded: the tasks
    are cancelled 60 s past the deadline, with ``trio.TooSlowError``."""
    confirmed = 0
    started = trio.current_time()
    deadline = started + seconds

    async def one() -> None:
        nonlocal confirmed
        while trio.current_time() < deadline:
            await client.publish(topic, payload, confirm=True)
            confirmed += 1

    with trio.fail_after(seconds + 60):
        async with trio.open_nursery() as nursery:
            for _ in range(tasks):
                nursery.start_soon(one)
    return confirmed, trio.current_time() - started
