"""The witness protocol against the real witness server on 127.0.0.1 (in-process trio), and
the codec and term file on their own."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from broker.ha.client import connect_witness
from broker.ha.codec import (
    WitnessAuthError,
    WitnessProtocolError,
    decode_answer,
    decode_hello,
    decode_request,
    decode_welcome,
    encode_answer,
    encode_request,
    encode_welcome,
    session_key,
)
from broker.ha.messages import OK, REFUSED, STALE, Answer, Renew, Vote
from broker.ha.stream import FrameStream
from broker.ha.termfile import TermFile, TermFileError
from broker.ha.witness import Witness, run_witness
from broker.ha.witness_state import Persisted

SECRET = b"pair-secret"
LEASE = 0.2


async def _start(nursery: trio.Nursery, data_dir: Path) -> Witness:
    witness: Witness = await nursery.start(
        lambda task_status: run_witness(
            "127.0.0.1", 0, str(data_dir), SECRET, lease=LEASE, task_status=task_status
        )
    )
    return witness


async def test_a_vote_is_refused_for_one_lease_after_start_then_granted_and_on_disk(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        witness = await _start(nursery, tmp_path)
        client = await connect_witness("127.0.0.1", witness.port, SECRET)
        refused = await client.ask(Vote(1, "a"))
        assert refused.verdict == REFUSED and 0 < refused.wait <= LEASE
        await trio.sleep(refused.wait)  # the time under test: the lease the witness waits out
        granted = await client.ask(Vote(1, "a"))
        assert (granted.verdict, granted.term, granted.primary) == (OK, 1, "a")
        assert granted.lease == LEASE
        nursery.cancel_scope.cancel()
    with _opened(tmp_path) as termfile:
        assert termfile.load() == Persisted(1, "a")


async def test_renewals_answer_ok_to_the_primary_and_stale_to_others(tmp_path: Path) -> None:
    with _opened(tmp_path) as termfile:
        termfile.save(Persisted(4, "a"))
    async with trio.open_nursery() as nursery:
        witness = await _start(nursery, tmp_path)
        a = await connect_witness("127.0.0.1", witness.port, SECRET)
        b = await connect_witness("127.0.0.1", witness.port, SECRET)
        assert (await a.ask(Renew(4, "a"))).verdict == OK
        stale = await b.ask(Renew(3, "b"))
        assert (stale.verdict, stale.term, stale.primary) == (STALE, 4, "a")
        assert witness.counters.renewals_granted == 1 and witness.counters.renewals_stale == 1
        nursery.cancel_scope.cancel()


async def test_a_wrong_secret_is_refused_and_counted_and_others_are_served(tmp_path: Path) -> None:
    with _opened(tmp_path) as termfile:
        termfile.save(Persisted(1, "a"))
    async with trio.open_nursery() as nursery:
        witness = await _start(nursery, tmp_path)
        good = await connect_witness("127.0.0.1", witness.port, SECRET)
        bad = await connect_witness("127.0.0.1", witness.port, b"guess")
        with pytest.raises(WitnessProtocolError, match="bad MAC"):
            await bad.ask(Renew(1, "a"))
        assert witness.counters.auth_failures == 1
        assert (await good.ask(Renew(1, "a"))).verdict == OK
        nursery.cancel_scope.cancel()


async def test_garbage_and_replayed_frames_close_only_that_connection(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        witness = await _start(nursery, tmp_path)
        good = await connect_witness("127.0.0.1", witness.port, SECRET)
        raw = FrameStream(await trio.open_tcp_stream("127.0.0.1", witness.port))
        await raw.send(b"\x00\x00\x00\x03\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
        with pytest.raises(WitnessProtocolError, match="refused: not a msgpack frame"):
            decode_welcome(await raw.receive())  # the WITNESS_ERROR, then EOF
        with pytest.raises(WitnessProtocolError, match="connection closed"):
            await raw.receive()
        replay = await connect_witness("127.0.0.1", witness.port, SECRET)
        frame = encode_request(replay._key, 1, Renew(0, "a"))
        await replay._frames.send(frame + frame)  # the same seq twice
        await replay._frames.receive()  # the first is answered
        with pytest.raises(WitnessProtocolError, match="repeated or out of order"):
            decode_answer(replay._key, await replay._frames.receive(), 1)
        assert witness.counters.protocol_errors == 2
        assert (await good.ask(Renew(0, "x"))).verdict == STALE
        nursery.cancel_scope.cancel()


async def test_the_client_refuses_answers_from_a_witness_without_the_secret() -> None:
    async def impostor(stream: trio.SocketStream) -> None:
        frames = FrameStream(stream)
        nonce = os.urandom(16)
        broker_nonce = decode_hello(await frames.receive())
        await frames.send(encode_welcome(nonce))
        key = session_key(b"not the secret", broker_nonce, nonce)
        await frames.receive()
        await frames.send(encode_answer(key, 1, Answer(OK, 2, "b", lease=1.0)))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, impostor, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        client = await connect_witness("127.0.0.1", port, SECRET)
        with pytest.raises(WitnessAuthError):
            await client.ask(Vote(2, "b"))
        nursery.cancel_scope.cancel()


# -- codec ------------------------------------------------------------------------------------

terms = st.integers(0, 2**63 - 1)
ids = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=64)
requests = st.builds(Renew, terms, ids) | st.builds(Vote, terms, ids)
answers = st.builds(
    Answer,
    st.sampled_from([OK, STALE, REFUSED]),
    terms,
    st.none() | ids,
    st.floats(0, 1e6),
    st.floats(0, 1e6),
    st.text(max_size=50),
)


@given(requests, st.integers(1, 2**62), st.binary(min_size=32, max_size=32))
def test_a_request_decodes_back_to_itself_and_a_changed_key_fails(request, seq, key) -> None:  # type: ignore[no-untyped-def]
    body = encode_request(key, seq, request)[4:]
    assert decode_request(key, body, seq - 1) == (seq, request)
    with pytest.raises(WitnessAuthError):
        decode_request(bytes(b ^ 1 for b in key), body, seq - 1)


@given(answers, st.integers(1, 2**62), st.binary(min_size=32, max_size=32), st.data())
def test_an_answer_decodes_back_to_itself_and_any_flipped_byte_is_refused(  # type: ignore[no-untyped-def]
    answer, seq, key, data
) -> None:
    body = encode_answer(key, seq, answer)[4:]
    assert decode_answer(key, body, seq) == answer
    at = data.draw(st.integers(0, len(body) - 1))
    flipped = body[:at] + bytes([body[at] ^ data.draw(st.integers(1, 255))]) + body[at + 1 :]
    try:
        decoded = decode_answer(key, flipped, seq)
    except WitnessProtocolError:
        return
    assert decoded == answer  # a flip msgpack reads as the same value (e.g. in a float's NaN)


# -- term file --------------------------------------------------------------------------------


class _opened:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __enter__(self) -> TermFile:
        self.termfile = TermFile(self.directory)
        return self.termfile

    def __exit__(self, *exc: object) -> None:
        self.termfile.close()


def test_the_term_file_keeps_the_last_state_saved(tmp_path: Path) -> None:
    with _opened(tmp_path) as termfile:
        assert termfile.load() == Persisted()
        termfile.save(Persisted(1, "a"))
        termfile.save(Persisted(2, "b"))
    with _opened(tmp_path) as termfile:
        assert termfile.load() == Persisted(2, "b")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        '{"term": 2, "primary": "b"}',
        '{"term": 3, "primary": "b", "crc32": 1}',
        '{"term": "2", "primary": "b", "crc32": 0}',
    ],
)
def test_a_damaged_term_file_is_refused_naming_it(tmp_path: Path, text: str) -> None:
    (tmp_path / "witness-term").write_text(text)
    with _opened(tmp_path) as termfile, pytest.raises(TermFileError, match="witness-term"):
        termfile.load()


def test_two_witnesses_cannot_share_a_directory(tmp_path: Path) -> None:
    with _opened(tmp_path), pytest.raises(TermFileError, match="another witness"):
        TermFile(tmp_path)
