"""Bytes received but not yet cut into frames.

Framing: every frame is a 4-byte big-endian length, then that many bytes of body.

Operations:
  - ``feed(data)`` appends what the transport read; ``feed(b"")`` records EOF.
  - ``next_frame()`` returns the next whole body, or None while more bytes are needed.
  - ``next_frames()`` returns every whole body there is, at once (the broker's readers).

Goal: work linear in the bytes received, and little Python work per frame, since a read
brings hundreds of small frames. Each length prefix is read once, by ``feed``, which cuts
the whole frames of a read out of it there and then as read-only ``memoryview`` slices of
the bytes read (nothing is copied: the transport's bytes are immutable, so a view of them
stays valid); ``next_frames`` hands them out as a list slice, and msgpack unpacks a view as
it does bytes. Only a frame split across reads is copied: its start waits in a
``bytearray`` (appends are amortised linear, whatever the chunk sizes) and becomes one
bytes object once it is whole. ``next_frame`` returns ``bytes`` (a copy of the view), for
callers that keep a body.

Memory: a view keeps the read it was cut from alive until it is dropped, so the buffer
holds the reads whose frames were not handed out yet, plus one partial frame: as before,
at most the whole frames fed so far and ``4 + max_frame`` bytes.

Limit: a length prefix above ``max_frame`` is an error as soon as its 4 bytes arrive, before
any of its body is kept. Waiting for the body first would let one peer make us hold up to
4 GiB per connection just by announcing it. The error itself is raised by ``next_frame``
(or ``next_frames``) once the frames before it have been handed out, and the buffer drops
all later data: after a bad prefix the stream cannot be trusted.
"""

from __future__ import annotations

import struct

from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError

__all__ = ["DEFAULT_MAX_FRAME", "LENGTH_PREFIX", "MAX_LENGTH", "FrameBuffer", "add_length_prefix"]

#: Bytes in the length prefix.
LENGTH_PREFIX = 4
#: The largest length the prefix can express.
MAX_LENGTH = (1 << 32) - 1
#: Default maximum body size (1 MiB), as in DESIGN.md.
DEFAULT_MAX_FRAME = 1 << 20
# One call, no slice: the hot path reads one prefix per frame.
_read_length = struct.Struct(">I").unpack_from


def add_length_prefix(body: bytes) -> bytes:
    """The wire form of one frame body; refuses bodies the 4-byte prefix cannot describe."""
    size = len(body)
    if not 0 < size <= MAX_LENGTH:
        raise LocalProtocolError(ErrorCode.INTERNAL, f"cannot frame a body of {size} bytes")
    return size.to_bytes(LENGTH_PREFIX, "big") + body


class FrameBuffer:
    """Cuts a byte stream into length-prefixed frame bodies; see the module docstring."""

    __slots__ = ("_eof", "_error", "_frames", "_next", "_tail", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if isinstance(max_frame, bool) or not isinstance(max_frame, int):
            raise TypeError(f"max_frame must be int, got {type(max_frame).__name__}")
        if not 0 < max_frame <= MAX_LENGTH:
            raise ValueError(f"max_frame must be in 1..{MAX_LENGTH}, got {max_frame}")
        self.max_frame = max_frame
        # Whole bodies cut by feed(), handed out from _next on.
        self._frames: list[memoryview] = []
        self._next = 0
        # The start of a frame whose end has not arrived yet (prefix included).
        self._tail = bytearray()
        self._eof = False
        # A bad prefix found by feed() (or EOF mid-frame): raised once the frames before it
        # are handed out.
        self._error: RemoteProtocolError | None = None

    @property
    def at_eof(self) -> bool:
        """True once ``feed(b"")`` was called."""
        return self._eof

    @property
    def buffered(self) -> int:
        """Bytes held and not handed out yet (prefixes included)."""
        frames = self._frames
        pending = len(frames) - self._next
        return len(self._tail) + LENGTH_PREFIX * pending + sum(map(len, frames[self._next :]))

    def feed(self, data: bytes) -> None:
        """Append received bytes; ``b""`` means the peer closed its side (EOF)."""
        if self._eof:
            if data:
                raise LocalProtocolError(ErrorCode.INTERNAL, "data fed after EOF")
            return
        if not data:
            self._eof = True
            return
        if self._error is not None:
            return  # the stream is already broken: keep nothing more
        if data.__class__ is not bytes:
            data = bytes(data)  # (views of it must not change under them)
        pos = 0
        tail = self._tail
        if tail:  # finish the frame the last read left unfinished
            pos = self._finish_tail(data)
            if pos < 0:
                return  # still unfinished, or a bad prefix
        self._cut(data, pos)

    def _finish_tail(self, data: bytes) -> int:
        """Complete the partial frame in ``_tail`` from ``data``: the offset in ``data``
        after it, or -1 when ``data`` ran out first (kept) or its prefix is bad."""
        tail = self._tail
        pos = 0
        if len(tail) < LENGTH_PREFIX:
            pos = LENGTH_PREFIX - len(tail)
            tail += data[:pos]
            if len(tail) < LENGTH_PREFIX:
                return -1
            if not self._prefix_ok(_read_length(tail, 0)[0]):
                tail.clear()
                return -1
        need = LENGTH_PREFIX + _read_length(tail, 0)[0] - len(tail)
        if len(data) - pos < need:
            tail += memoryview(data)[pos:]
            return -1
        tail += memoryview(data)[pos : pos + need]
        self._frames.append(memoryview(bytes(tail))[LENGTH_PREFIX:])
        tail.clear()
        return pos + need

    def _cut(self, data: bytes, pos: int) -> None:
        """Cut the whole frames of ``data`` from ``pos`` on, checking every prefix; keep the
        start of a frame that does not end in it."""
        append = self._frames.append
        view = memoryview(data)
        end = len(data)
        max_frame = self.max_frame
        while pos + LENGTH_PREFIX <= end:
            size = _read_length(data, pos)[0]
            if size == 0 or size > max_frame:
                self._prefix_ok(size)
                return  # (and whatever followed it is dropped)
            stop = pos + LENGTH_PREFIX + size
            if stop > end:
                break  # partial body, and its size is within the limit
            append(view[pos + LENGTH_PREFIX : stop])
            pos = stop
        if pos < end:
            self._tail += view[pos:]

    def _prefix_ok(self, size: int) -> bool:
        """Is ``size`` a body length we accept? If not, the error is due after the frames
        cut so far."""
        if 0 < size <= self.max_frame:
            return True
        if size == 0:
            self._error = RemoteProtocolError(ErrorCode.BAD_FRAME, "zero-length frame")
        else:
            self._error = RemoteProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame of {size} bytes exceeds the limit of {self.max_frame} bytes",
            )
        return False

    def next_frame(self) -> bytes | None:
        """The next whole frame body, or None when more data is needed (or at a clean EOF)."""
        frames = self._frames
        i = self._next
        if i < len(frames):
            body = frames[i].tobytes()
            i += 1
            if i == len(frames):
                frames.clear()
                i = 0
            self._next = i
            return body
        self._no_frame()
        return None

    def next_frames(self, limit: int = 0) -> list[memoryview]:
        """Every whole frame body there is now (at most ``limit`` when it is not 0), in
        order, as read-only views of the bytes read (see the module docstring): what
        ``next_frame`` would return until None, in one call. An empty list when more data
        is needed (or at a clean EOF); an error is raised as by ``next_frame``, once the
        bodies before it have been returned."""
        frames = self._frames
        start = self._next
        count = len(frames) - start
        if not count:
            self._no_frame()
            return []
        if limit and count > limit:
            self._next = start + limit
            return frames[start : start + limit]
        self._frames = []
        self._next = 0
        return frames if not start else frames[start:]

    def _no_frame(self) -> None:
        """No whole frame is left: raise the error that is due, if any."""
        if self._error is not None:
            raise self._error
        if self._eof and self._tail:
            self._error = RemoteProtocolError(
                ErrorCode.BAD_FRAME,
                f"connection closed mid-frame ({len(self._tail)} bytes pending)",
            )
            self._tail.clear()
            raise self._error
