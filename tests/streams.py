"""Reading a subscription in tests: a bounded wait for N messages, or for silence."""

from __future__ import annotations

import trio


async def take(sub, count: int, seconds: float = 10.0) -> list:
    """The next ``count`` messages; TooSlowError if they do not come within ``seconds``."""
    got = []
    with trio.fail_after(seconds):
        while len(got) < count:
            got.append(await sub.get())
    return got


async def quiet(sub, seconds: float = 0.3) -> bool:
    """True if nothing arrives for ``seconds``."""
    with trio.move_on_after(seconds):
        await sub.get()
        return False
    return True
