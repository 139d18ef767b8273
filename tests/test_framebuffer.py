"""FrameBuffer: cutting a byte stream into length-prefixed bodies, with the limit up front."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from broker.wire.buffer import MAX_LENGTH, FrameBuffer, add_length_prefix
from tests.helpers import CHUNKING_NAMES, TRAILING, chunked, splits


def prefixed(body: bytes) -> bytes:
    return add_length_prefix(body)


def collect(buf: FrameBuffer, chunks: list[bytes]) -> list[bytes]:
    """Feed each chunk and take every whole body available after it."""
    bodies = []
    for chunk in chunks:
        buf.feed(chunk)
        while (body := buf.next_frame()) is not None:
            bodies.append(body)
    return bodies


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_one_frame_comes_out_whole_however_it_is_fed(chunking: str) -> None:
    buf = FrameBuffer()
    assert collect(buf, chunked(chunking, prefixed(b"hello"))) == [b"hello"]
    assert buf.buffered == (len(TRAILING) if chunking == "trailing" else 0)


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_several_frames_come_out_in_order(chunking: str) -> None:
    data = prefixed(b"a") + prefixed(b"bb" * 100) + prefixed(b"c")
    assert collect(FrameBuffer(), chunked(chunking, data)) == [b"a", b"bb" * 100, b"c"]


def test_next_frame_returns_none_until_the_body_is_complete() -> None:
    buf = FrameBuffer()
    data = prefixed(b"abcdef")
    for i in range(len(data) - 1):
        buf.feed(data[i : i + 1])
        assert buf.next_frame() is None
    buf.feed(data[-1:])
    assert buf.next_frame() == b"abcdef"
    assert buf.next_frame() is None


def test_frame_over_limit_is_rejected_before_its_body_is_buffered() -> None:
    buf = FrameBuffer(max_frame=100)
    buf.feed((101).to_bytes(4, "big"))  # only the header: no body byte has arrived
    with pytest.raises(RemoteProtocolError) as info:
        buf.next_frame()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert "101" in info.value.text
    assert buf.buffered == 0


def test_frame_over_limit_is_rejected_one_byte_at_a_time() -> None:
    buf = FrameBuffer(max_frame=100)
    header = (1 << 31).to_bytes(4, "big")
    for byte in header[:3]:
        buf.feed(bytes([byte]))
        assert buf.next_frame() is None
    buf.feed(header[3:])
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        buf.next_frame()


def test_body_bytes_after_an_oversized_header_are_never_kept() -> None:
    buf = FrameBuffer(max_frame=100)
    buf.feed((1000).to_bytes(4, "big") + b"x" * 500)
    assert buf.buffered == 0
    buf.feed(b"x" * 500)  # the buffer refuses further data
    assert buf.buffered == 0
    for _ in range(2):  # and the error stays
        with pytest.raises(RemoteProtocolError, match="exceeds"):
            buf.next_frame()


def test_frames_before_an_oversized_one_are_still_delivered() -> None:
    buf = FrameBuffer(max_frame=100)
    buf.feed(prefixed(b"ok") + (101).to_bytes(4, "big") + b"y" * 50)
    assert buf.next_frame() == b"ok"
    with pytest.raises(RemoteProtocolError) as info:
        buf.next_frame()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_frame_of_exactly_max_frame_is_accepted(chunking: str) -> None:
    body = bytes(range(256)) * 4
    assert collect(FrameBuffer(max_frame=1024), chunked(chunking, prefixed(body))) == [body]


@pytest.mark.parametrize("chunking", CHUNKING_NAMES)
def test_zero_length_frame_is_bad_frame(chunking: str) -> None:
    buf = FrameBuffer()
    with pytest.raises(RemoteProtocolError) as info:
        collect(buf, chunked(chunking, b"\x00\x00\x00\x00"))
    assert info.value.code == ErrorCode.BAD_FRAME
    assert "zero-length" in info.value.text


def test_clean_eof_at_a_frame_boundary_is_not_an_error() -> None:
    buf = FrameBuffer()
    buf.feed(prefixed(b"x"))
    buf.feed(b"")
    assert buf.at_eof
    assert buf.next_frame() == b"x"
    assert buf.next_frame() is None


@pytest.mark.parametrize("cut", [1, 3, 4, 6])
def test_eof_mid_frame_is_bad_frame(cut: int) -> None:
    buf = FrameBuffer()
    buf.feed(prefixed(b"abcdef")[:cut])
    assert buf.next_frame() is None
    buf.feed(b"")
    for _ in range(2):
        with pytest.raises(RemoteProtocolError, match="connection closed mid-frame") as info:
            buf.next_frame()
        assert info.value.code == ErrorCode.BAD_FRAME


def test_data_after_eof_is_a_local_error() -> None:
    buf = FrameBuffer()
    buf.feed(b"")
    buf.feed(b"")  # repeating EOF is harmless
    with pytest.raises(LocalProtocolError):
        buf.feed(b"x")


def test_consumed_bytes_are_released_as_frames_are_taken() -> None:
    buf = FrameBuffer()
    frame = prefixed(b"z" * 1000)
    stream = frame * 1500
    size = 64 * len(frame) + 500  # chunks end mid-frame, so the buffer never empties fully
    taken = 0
    for i in range(0, len(stream), size):
        chunk = stream[i : i + size]
        buf.feed(chunk)
        while buf.next_frame() is not None:
            taken += 1
        # Handed-out frames are not held: only the start of the frame a chunk cut is.
        assert buf.buffered < len(frame)
    assert taken == 1500
    assert buf.buffered == 0


def test_max_frame_must_fit_the_length_prefix() -> None:
    with pytest.raises(ValueError):
        FrameBuffer(max_frame=MAX_LENGTH + 1)
    with pytest.raises(ValueError):
        FrameBuffer(max_frame=0)
    with pytest.raises(TypeError):
        FrameBuffer(max_frame=True)


def test_add_length_prefix_refuses_an_empty_body() -> None:
    assert add_length_prefix(b"ab") == b"\x00\x00\x00\x02ab"
    with pytest.raises(LocalProtocolError):
        add_length_prefix(b"")


@settings(deadline=None)
@given(bodies=st.lists(st.binary(min_size=1, max_size=40), max_size=6), data=st.data())
def test_any_split_of_a_stream_yields_the_same_bodies(
    bodies: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(prefixed(body) for body in bodies)
    chunks = data.draw(splits(stream)) if stream else []
    buf = FrameBuffer(max_frame=40)
    assert collect(buf, chunks) == bodies
    buf.feed(b"")
    assert buf.next_frame() is None


def _drain(take: Callable[[], list[bytes]]) -> list[bytes | str]:
    """What ``take`` returns until it returns nothing, then the error code if it raised."""
    out: list[bytes | str] = []
    while True:
        try:
            bodies = take()
        except RemoteProtocolError as exc:
            return [*out, str(exc.code)]
        if not bodies:
            return out
        out += bodies


def _drain_one_by_one(buf: FrameBuffer) -> list[bytes | str]:
    return _drain(lambda: [] if (body := buf.next_frame()) is None else [body])


def _drain_in_batches(buf: FrameBuffer) -> list[bytes | str]:
    return _drain(buf.next_frames)


@settings(deadline=None)
@given(
    bodies=st.lists(st.binary(min_size=0, max_size=50), max_size=8),
    cut=st.integers(min_value=0, max_value=3),
    data=st.data(),
)
def test_next_frames_returns_what_next_frame_returns(
    bodies: list[bytes], cut: int, data: st.DataObject
) -> None:
    """Whole bodies in order, then the error where one is due (empty or oversized frames,
    a frame cut short by EOF), whatever the chunks."""
    stream = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    stream = stream[: len(stream) - cut]
    chunks = [*(data.draw(splits(stream)) if stream else []), b""]
    one, batch = FrameBuffer(max_frame=40), FrameBuffer(max_frame=40)
    for chunk in chunks:
        one.feed(chunk)
        batch.feed(chunk)
        expected = _drain_one_by_one(one)
        assert _drain_in_batches(batch) == expected
        assert batch.buffered == one.buffered
        if expected and isinstance(expected[-1], str):
            break


def _reference(stream: bytes, max_frame: int) -> list[bytes | str]:
    """What a whole stream, then EOF, must come out as: the bodies, then the error due."""
    out: list[bytes | str] = []
    pos = 0
    while len(stream) - pos >= 4:
        size = int.from_bytes(stream[pos : pos + 4], "big")
        if size == 0:
            return [*out, str(ErrorCode.BAD_FRAME)]
        if size > max_frame:
            return [*out, str(ErrorCode.FRAME_TOO_LARGE)]
        if pos + 4 + size > len(stream):
            break
        out.append(stream[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out if pos == len(stream) else [*out, str(ErrorCode.BAD_FRAME)]


#: Between two chunks: take nothing, one body, or a batch of at most 0 (all), 1 or 3.
TAKE = st.sampled_from(["none", "one", "all", "batch-1", "batch-3"])


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(
        st.one_of(st.binary(min_size=1, max_size=30), st.sampled_from([b"", b"x" * 41])),
        max_size=10,
    ),
    cut=st.integers(min_value=0, max_value=5),
    data=st.data(),
)
def test_any_split_and_any_takes_yield_the_stream_cut_by_hand(
    bodies: list[bytes], cut: int, data: st.DataObject
) -> None:
    """Bodies as views of the reads, cut once at feed: the same bodies and errors as a
    reference cutter on the whole stream, whatever the chunks (bytes, or a bytearray the
    caller reuses afterwards), and however the caller takes them between feeds."""
    stream = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    stream = stream[: len(stream) - cut]
    chunks = data.draw(splits(stream)) if stream else []
    buf = FrameBuffer(max_frame=40)
    out: list[bytes | str] = []
    failed = False

    def take(how: str) -> None:
        nonlocal failed
        if failed or how == "none":
            return
        try:
            if how == "one":
                body = buf.next_frame()
                got = [] if body is None else [body]
            else:
                got = buf.next_frames(0 if how == "all" else int(how[-1]))
        except RemoteProtocolError as exc:
            out.append(str(exc.code))
            failed = True
            return
        out.extend(bytes(body) for body in got)

    for chunk in chunks:
        if data.draw(st.booleans()):
            reused = bytearray(chunk)
            buf.feed(reused)  # type: ignore[arg-type]
            reused[:] = b"\xff" * len(reused)  # the caller's buffer, overwritten
        else:
            buf.feed(chunk)
        take(data.draw(TAKE))
    buf.feed(b"")
    for _ in range(len(bodies) + 2):
        take("all")
    assert out == _reference(stream, 40)
