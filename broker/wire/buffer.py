"""Bytes received but not yet cut into frames.

Framing: every frame is a 4-byte big-endian length, then that many bytes of body.

Operations:
  - ``feed(data)`` appends what the transport read; ``feed(b"")`` records EOF.
  - ``next_frame()`` returns the next whole body, or None while more bytes are needed.

Goal: work linear in the bytes received. Nothing is rescanned: each length prefix is read
once, when its 4 bytes are there, and each body is copied once, when it is handed out.

Plan: one ``bytearray`` plus ``_start``, the offset of the first byte not handed out yet.
Handing out a frame only moves ``_start``; the consumed prefix is deleted when it is all of
the buffer (free) or when it is at least half of it and over ``COMPACT_AT`` bytes, so each
byte is moved at most a constant number of times on average, whatever the chunk sizes.

Limit: a length prefix above ``max_frame`` is an error as soon as its 4 bytes arrive, before
any of its body is kept. Waiting for the body first would let one peer make us hold up to
4 GiB per connection just by announcing it. ``feed`` checks the prefix of every frame in the
data it is given (cheap: it jumps from prefix to prefix), so whatever the caller's pattern of
``feed`` and ``next_frame`` calls, the buffer holds at most the whole frames fed so far plus
one partial frame of at most ``4 + max_frame`` bytes. The error itself is raised by
``next_frame`` once the frames before it have been handed out, and the buffer drops all
later data: after a bad prefix the stream cannot be trusted.
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
#: Compact once this many consumed bytes sit at the front (and they are half the buffer).
COMPACT_AT = 1 << 16
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

    __slots__ = ("_data", "_eof", "_error", "_error_at", "_scan", "_start", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if isinstance(max_frame, bool) or not isinstance(max_frame, int):
            raise TypeError(f"max_frame must be int, got {type(max_frame).__name__}")
        if not 0 < max_frame <= MAX_LENGTH:
            raise ValueError(f"max_frame must be in 1..{MAX_LENGTH}, got {max_frame}")
        self.max_frame = max_frame
        self._data = bytearray()
        # First byte not handed out yet.
        self._start = 0
        # Start of the first frame that is not known to be complete (its prefix may be unread).
        self._scan = 0
        self._eof = False
        # A bad prefix found by feed(): raised by next_frame() once _start reaches _error_at.
        self._error: RemoteProtocolError | None = None
        self._error_at = 0

    @property
    def at_eof(self) -> bool:
        """True once ``feed(b"")`` was called."""
        return self._eof

    @property
    def buffered(self) -> int:
        """Bytes held and not handed out yet (prefixes included)."""
        return len(self._data) - self._start

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
        self._data += data
        self._check_prefixes()

    def next_frame(self) -> bytes | None:
        """The next whole frame body, or None when more data is needed (or at a clean EOF)."""
        if self._error is not None and self._start == self._error_at:
            raise self._error
        start = self._start
        if start < self._scan:
            data = self._data
            start += LENGTH_PREFIX
            end = start + _read_length(data, start - LENGTH_PREFIX)[0]
            body = bytes(data[start:end])
            self._start = end
            if end == len(data) or end >= COMPACT_AT:  # (compacting is rarely due)
                self._compact()
            return body
        if self._eof and self._start < len(self._data):
            self._error = RemoteProtocolError(
                ErrorCode.BAD_FRAME,
                f"connection closed mid-frame ({len(self._data) - self._start} bytes pending)",
            )
            self._error_at = self._start
            raise self._error
        return None

    def next_frames(self, limit: int = 0) -> list[bytes]:
        """Every whole frame body there is now (at most ``limit`` when it is not 0), in
        order: ``next_frame`` until None, in one call. An empty list when more data is
        needed (or at a clean EOF); an error is raised as by ``next_frame``, once the bodies
        before it have been returned."""
        start = self._start
        scan = self._scan
        if start == scan:
            body = self.next_frame()  # no whole frame: None, or the error that is due
            return [] if body is None else [body]
        bodies: list[bytes] = []
        append = bodies.append
        # Each body is copied once, out of a view (slicing the bytearray would copy it
        # twice); the view is released before the buffer may change size again.
        with memoryview(self._data) as data:
            while start < scan:
                if limit and len(bodies) == limit:
                    break
                body_start = start + LENGTH_PREFIX
                start = body_start + _read_length(data, start)[0]
                append(data[body_start:start].tobytes())
        self._start = start
        self._compact()
        return bodies

    def _check_prefixes(self) -> None:
        """Advance ``_scan`` over whole frames, checking every prefix once."""
        data = self._data
        end = len(data)
        scan = self._scan
        max_frame = self.max_frame
        while scan + LENGTH_PREFIX <= end:
            size = _read_length(data, scan)[0]
            if size == 0 or size > max_frame:
                if size == 0:
                    self._error = RemoteProtocolError(ErrorCode.BAD_FRAME, "zero-length frame")
                else:
                    self._error = RemoteProtocolError(
                        ErrorCode.FRAME_TOO_LARGE,
                        f"frame of {size} bytes exceeds the limit of {self.max_frame} bytes",
                    )
                self._error_at = scan
                del data[scan:]  # drop the bad prefix and whatever followed it
                break
            if scan + LENGTH_PREFIX + size > end:
                break  # partial body, and its size is within the limit
            scan += LENGTH_PREFIX + size
        self._scan = scan

    def _compact(self) -> None:
        """Drop the consumed front when that is free or amortised (see the module docstring)."""
        start = self._start
        if start == len(self._data):
            self._data.clear()
        elif start >= COMPACT_AT and 2 * start >= len(self._data):
            del self._data[:start]
        else:
            return
        self._start = 0
        self._scan -= start
        self._error_at -= start
