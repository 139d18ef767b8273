"""Worker processes that a benchmark coordinates through pipes.

Publishers and subscribers run in processes of their own (spawn context), never in the
coordinating one, so that their CPU does not distort what the coordinator measures.
A worker answers commands with ``(kind, ...)`` tuples; a crash comes back as
``("error", traceback)`` instead of a silent hang.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from typing import Any

import trio

from bench.harness import BenchError


def _worker_entry(target: Callable[..., Any], pipe: Pipe, *args: Any) -> None:
    try:
        trio.run(target, pipe, *args)
    except BaseException:
        with contextlib.suppress(Exception):
            pipe.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None


class Worker:
    """A worker process and the coordinator's end of its pipe."""

    def __init__(self, ctx: Any, target: Callable[..., Any], args: tuple, name: str) -> None:
        self.name = name
        self.pipe, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_entry, args=(target, child, *args), name=name, daemon=True
        )
        self.process.start()
        child.close()
        self.pid = self.process.pid

    def send(self, message: tuple) -> None:
        self.pipe.send(message)

    def expect(self, kind: str, timeout: float) -> tuple:
        """The next message, which must be of ``kind``; BenchError on anything else, on a
        dead worker or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(f"{self.name}: no {kind!r} within {timeout:g} s")
            if self.pipe.poll(min(remaining, 0.2)):
                try:
                    message = self.pipe.recv()
                except EOFError:
                    raise BenchError(f"{self.name} exited ({self.process.exitcode})") from None
                if message[0] == "error":
                    raise BenchError(f"{self.name} failed:\n{message[1]}")
                if message[0] != kind:
                    raise BenchError(f"{self.name}: expected {kind!r}, got {message[0]!r}")
                return message
            if not self.process.is_alive() and not self.pipe.poll(0):
                raise BenchError(f"{self.name} exited with status {self.process.exitcode}")

    def stop(self) -> None:
        """Ask it to finish; terminate, then kill, if it does not."""
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.pipe.send(("stop",))
            self.process.join(5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.pipe.close()
