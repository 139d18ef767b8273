"""Frames to bytes and bytes to frames: the generic codec and the hand-written fast paths.

Wire form: each frame body is a msgpack map with a ``"type"`` key holding the wire type (the
class's ``TYPE``) and one key per field, named as the field. Fields whose value is None are
left out (so are the flags in ``_OFF_WHEN_FALSE`` when False), and a missing optional
field takes its default, so the spellings are equal.

Compatibility rule: keys a receiver does not know are ignored, so a newer peer may add
optional fields without breaking older ones. An unknown ``type`` is an error (UNKNOWN_TYPE),
because skipping a frame silently could lose a request.

Generic: ``encode_frame`` and ``decode_frame`` (``unpack_body`` then ``build_frame``, split so
that ``Connection`` checks the frame type against its state before it looks at the fields)
handle every frame class in ``broker.wire.frames``.

Fast paths: fan-out, publishing and confirmation are what a broker does most, and building a
frame object, checking its fields and packing a dict for each costs more than the routing
it carries. The fast decoders (``fast_pub``, ``fast_sub``, ...) check the common shape of a
map inline and fill the frame without the dataclass machinery, falling back to
``build_frame`` for anything else (and its precise errors). The fast encoders write the bytes
directly: a MSG reuses the message's shared fields, packed once (``shared_fields``), and adds
only ``sub`` and ``seq``; a reply is a fixed head and an id. Skipping the frame checks is safe
because every field came from a frame that passed them (a PUB's from the client, which checks
them with errors meant for the application). Tests check that each fast path agrees with the
generic one. The sans-IO ``Connection`` wraps the fast encoders in ``send_puback``,
``append_msg``, ... so that its state and the peer's frame limit are checked for them too.

All of it is one module so that the wire form is written down in one place.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from typing import Any, Final

import msgpack

import routing
from broker.core.message import Message
from broker.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from broker.wire.buffer import MAX_LENGTH
from broker.wire.checks import MAX_BROKER_ID_BYTES, MAX_MSG_ID_BYTES, U64_MAX, type_name
from broker.wire.frames import (
    FRAME_TYPES,
    Frame,
    Fwd,
    Msg,
    Pub,
    PubAck,
    Sub,
    SubAck,
    Unsub,
    UnsubAck,
)

__all__ = [
    "append_msg",
    "build_frame",
    "decode_frame",
    "encode_frame",
    "encode_fwd",
    "encode_msg",
    "encode_pub",
    "encode_puback",
    "encode_suback",
    "encode_unsuback",
    "fast_fwd",
    "fast_pub",
    "fast_puback",
    "fast_sub",
    "fast_suback",
    "fast_unsub",
    "fast_unsuback",
    "frame_too_large",
    "shared_fields",
    "unpack_body",
]

# -- every frame -----------------------------------------------------------------------------

_MISSING: Any = object()

# Per class: (field name, default or _MISSING), in declaration order; read once, used per frame.
# A field with a default factory (``digest``, ``add``) is optional: its default is the factory.
_FIELDS: dict[type[Frame], tuple[tuple[str, Any], ...]] = {
    cls: tuple(
        (
            f.name,
            f.default
            if f.default is not dataclasses.MISSING
            else _MISSING
            if f.default_factory is dataclasses.MISSING
            else f.default_factory,
        )
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.init
    )
    for cls in FRAME_TYPES.values()
}


#: Per class: the wire keys that are fields.
_NAMES: dict[type[Frame], frozenset[str]] = {
    cls: frozenset(name for name, _default in fields) for cls, fields in _FIELDS.items()
}


#: Flags added to a frame later, left off the wire when False: such a frame is then the
#: same bytes as before the flag existed (and absent reads as False).
_OFF_WHEN_FALSE: Final = frozenset({(Pub, "retain"), (Msg, "retained")})


def encode_frame(frame: Frame) -> bytes:
    """The msgpack body of ``frame`` (no length prefix; ``Connection.send`` adds it)."""
    try:
        fields = _FIELDS[type(frame)]
    except KeyError:
        raise LocalProtocolError(
            ErrorCode.INTERNAL, f"not a frame: {type(frame).__name__}"
        ) from None
    cls = type(frame)
    wire: dict[str, Any] = {"type": frame.TYPE}
    for name, _default in fields:
        value = getattr(frame, name)
        if value is not None and (value is not False or (cls, name) not in _OFF_WHEN_FALSE):
            wire[name] = value
    return msgpack.packb(wire, use_bin_type=True)


def unpack_body(body: bytes) -> tuple[type[Frame], dict[str, Any]]:
    """Step one of decoding: the frame class and the raw map, before any field is checked.

    Split out so that ``Connection`` can check the frame type against its state before it
    looks at the fields (a PUB before HELLO is HELLO_REQUIRED, whatever its topic).
    """
    try:
        wire = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise RemoteProtocolError(ErrorCode.BAD_FRAME, f"undecodable msgpack: {exc}") from None
    if type(wire) is not dict:
        raise RemoteProtocolError(
            ErrorCode.BAD_FRAME, f"a frame must be a msgpack map, got {type_name(wire)}"
        )
    wire_type = wire.get("type", _MISSING)
    if wire_type is _MISSING:
        raise RemoteProtocolError(ErrorCode.BAD_FRAME, "frame has no 'type' field")
    if type(wire_type) is not str:
        raise RemoteProtocolError(
            ErrorCode.BAD_FRAME, f"frame field 'type' must be str, got {type_name(wire_type)}"
        )
    cls = FRAME_TYPES.get(wire_type)
    if cls is None:
        raise RemoteProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown frame type {wire_type!r}")
    return cls, wire


def build_frame(cls: type[Frame], wire: Mapping[str, Any]) -> Frame:
    """Step two of decoding: the frame, from its class and raw map; unknown keys are ignored."""
    names = _NAMES[cls]
    kwargs = {name: value for name, value in wire.items() if name in names}
    try:
        return cls(**kwargs)
    except LocalProtocolError as exc:
        # The peer built it, so it is the peer's fault (code, text and ref unchanged).
        raise RemoteProtocolError(exc.code, exc.text, ref=exc.ref) from None
    except TypeError:  # a required field is missing: say which
        for name, default in _FIELDS[cls]:
            if default is _MISSING and name not in kwargs:
                raise RemoteProtocolError(
                    ErrorCode.BAD_FRAME, f"{cls.TYPE} field {name!r} is missing"
                ) from None
        raise


def decode_frame(body: bytes) -> Frame:
    """The frame in ``body`` (no length prefix); raises RemoteProtocolError if it is bad."""
    cls, wire = unpack_body(body)
    return build_frame(cls, wire)


# -- fast decoders ---------------------------------------------------------------------------
# Each takes the unpacked map of its frame type and returns the same frame build_frame would,
# or raises the same error.

_new_pub = _new_frame = object.__new__
_set = object.__setattr__


def _slot_setter(cls: type[Frame], name: str) -> Any:
    """The setter of a frame's slot, for building a frame on a hot path: what
    ``object.__setattr__`` does, without looking the slot up each time (a third faster)."""
    return cls.__dict__[name].__set__


_pub_topic = _slot_setter(Pub, "topic")
_pub_payload = _slot_setter(Pub, "payload")
_pub_headers = _slot_setter(Pub, "headers")
_pub_id = _slot_setter(Pub, "id")
_pub_msg_id = _slot_setter(Pub, "msg_id")
_pub_retain = _slot_setter(Pub, "retain")
_validate_topic = routing.validate_topic


def fast_pub(wire: dict[str, Any]) -> Pub:
    """The Pub in an unpacked PUB map, for the broker's hot path.

    The common shape (int-or-absent id, str topic, bytes payload, no headers, short ASCII
    msg_id or none, no retain flag) is checked inline and the frame is built without
    re-running the checks; anything else (a retained PUB too: rarer, and one test cheaper
    than a get for every PUB) goes through ``build_frame`` for its precise errors. Either way
    the result is a valid Pub, or RemoteProtocolError.
    """
    topic = wire.get("topic")
    payload = wire.get("payload")
    rid = wire.get("id")
    msg_id = wire.get("msg_id")
    if (
        topic.__class__ is str
        and payload.__class__ is bytes
        and "headers" not in wire
        and (rid is None or (rid.__class__ is int and 0 <= rid <= U64_MAX))
        and (
            msg_id is None
            or (msg_id.__class__ is str and msg_id.isascii() and len(msg_id) <= MAX_MSG_ID_BYTES)
        )
        and "retain" not in wire
    ):
        try:
            _validate_topic(topic)
        except routing.TopicError as exc:
            raise RemoteProtocolError(ErrorCode.INVALID_TOPIC, str(exc), ref=rid) from None
        frame = _new_pub(Pub)
        _pub_topic(frame, topic)
        _pub_payload(frame, payload)
        _pub_headers(frame, None)
        _pub_id(frame, rid)
        _pub_msg_id(frame, msg_id)
        _pub_retain(frame, False)
        return frame
    return build_frame(Pub, wire)  # type: ignore[return-value]


#: A plain PUB as ``plain_pub`` passes it on: its checked wire map, read with ``["topic"]``,
#: ``["payload"]`` and ``.get("msg_id")`` (a PUB with no id, headers or retain flag).
PlainPub = dict[str, Any]


def plain_pub(wire: dict[str, Any]) -> PlainPub | Pub:
    """``fast_pub`` for a server that routes plain PUBs from their map (the broker's native
    front end, through ``Connection.plain_pubs``): a PUB holding only its type, a valid topic
    (str), a payload (bytes) and perhaps a valid ``msg_id`` is returned as it came, with no
    frame built for it; any other goes through ``fast_pub``, with its checks and errors.

    A publisher sends hundreds of PUBs per read and most are plain: their frames (a new
    object and six slots, set one call each) would cost about as much as unpacking did.
    ``Connection.next_events`` makes this function's commonest case (type, topic and
    payload only) inline, and calls it for the rest.
    """
    topic = wire.get("topic")
    size = len(wire)
    if (
        topic.__class__ is str
        and wire.get("payload").__class__ is bytes
        and (
            size == 3  # type, topic, payload: no id, msg_id, headers, retain or unknown key
            or (
                size == 4
                and (msg_id := wire.get("msg_id")).__class__ is str
                and msg_id.isascii()
                and len(msg_id) <= MAX_MSG_ID_BYTES
            )
        )
    ):
        try:
            _validate_topic(topic)
        except routing.TopicError:
            return fast_pub(wire)  # (raises its precise error)
        return wire
    return fast_pub(wire)


def fast_sub(wire: dict[str, Any]) -> Sub:
    """The Sub in an unpacked SUB map, for the broker's subscribe path (as ``fast_pub``).

    A client may pipeline tens of thousands of SUBs; the common shape (uint id, str filter,
    str-or-absent dialect, bool-or-absent sync and retained) is checked inline, the filter
    parsed once, and the frame built without the dataclass machinery. Anything else goes
    through ``build_frame`` for its precise errors. Either way the result is a valid Sub, or
    RemoteProtocolError.
    """
    rid = wire.get("id")
    text = wire.get("filter")
    dialect = wire.get("dialect", routing.NATIVE)
    sync = wire.get("sync", False)
    retained = wire.get("retained", True)
    if (
        rid.__class__ is int
        and 0 <= rid <= U64_MAX
        and text.__class__ is str
        and dialect.__class__ is str
        and sync.__class__ is bool
        and retained.__class__ is bool
    ):
        try:
            parsed = routing.parse_filter(text, dialect)
        except ValueError as exc:  # TopicError, or ValueError for an unknown dialect
            raise RemoteProtocolError(ErrorCode.INVALID_FILTER, str(exc), ref=rid) from None
        frame = _new_frame(Sub)
        _set(frame, "id", rid)
        _set(frame, "filter", text)
        _set(frame, "dialect", dialect)
        _set(frame, "sync", sync)
        _set(frame, "retained", retained)
        _set(frame, "parsed", parsed)
        return frame
    return build_frame(Sub, wire)  # type: ignore[return-value]


def fast_unsub(wire: dict[str, Any]) -> Unsub:
    """The Unsub in an unpacked UNSUB map (as ``fast_sub``: pipelined by the ten thousand):
    well-formed ids are taken as they are, anything else gets the full checks and their
    precise error."""
    rid = wire.get("id")
    sub = wire.get("sub")
    if (
        rid.__class__ is int
        and sub.__class__ is int
        and 0 <= rid <= U64_MAX
        and 0 <= sub <= U64_MAX
    ):
        frame = _new_frame(Unsub)
        _set(frame, "id", rid)
        _set(frame, "sub", sub)
        return frame
    return build_frame(Unsub, wire)  # type: ignore[return-value]


def fast_unsuback(wire: dict[str, Any]) -> UnsubAck:
    """The UnsubAck in an unpacked UNSUBACK map (as ``fast_suback``)."""
    rid = wire.get("id")
    if rid.__class__ is int and 0 <= rid <= U64_MAX and len(wire) == 2:
        frame = _new_frame(UnsubAck)
        _set(frame, "id", rid)
        return frame
    return build_frame(UnsubAck, wire)  # type: ignore[return-value]


def _fast_id(value: Any) -> bool:
    """The common shape of a broker id (short printable ASCII, no space), checked inline."""
    return (
        value.__class__ is str
        and 0 < len(value) <= MAX_BROKER_ID_BYTES
        and value.isascii()
        and value.isprintable()
        and " " not in value
    )


def fast_puback(wire: dict[str, Any]) -> PubAck:
    """The PubAck in an unpacked PUBACK map, for a confirming publisher's hot path (one per
    confirmed message): a well-formed id is taken as it is, anything else gets the full
    checks and their precise error."""
    rid = wire.get("id")
    if rid.__class__ is int and 0 <= rid <= U64_MAX and len(wire) == 2:
        frame = _new_frame(PubAck)
        _set(frame, "id", rid)
        return frame
    return build_frame(PubAck, wire)  # type: ignore[return-value]


def fast_suback(wire: dict[str, Any]) -> SubAck:
    """The SubAck in an unpacked SUBACK map, for a client that pipelines many SUBs (as
    ``fast_puback``): well-formed ids are taken as they are, anything else gets the full
    checks and their precise error."""
    rid = wire.get("id")
    sub = wire.get("sub")
    if (
        rid.__class__ is int
        and sub.__class__ is int
        and 0 <= rid <= U64_MAX
        and 0 <= sub <= U64_MAX
        and len(wire) == 3
    ):
        frame = _new_frame(SubAck)
        _set(frame, "id", rid)
        _set(frame, "sub", sub)
        return frame
    return build_frame(SubAck, wire)  # type: ignore[return-value]


def fast_fwd(wire: dict[str, Any]) -> Fwd:
    """The Fwd in an unpacked FWD map, for the hot path between brokers (as ``fast_pub``).

    The common shape (str topic, bytes payload, no headers, short ASCII msg_id, bool or
    absent dedup, distinct ASCII broker ids in ``dests`` and ``source``, uint hops) is
    checked inline and the frame is built without re-running the checks; anything else goes
    through ``build_frame`` for its precise errors. Either way the result is a valid Fwd, or
    RemoteProtocolError.
    """
    topic = wire.get("topic")
    payload = wire.get("payload")
    msg_id = wire.get("msg_id")
    dedup = wire.get("dedup", False)
    dests = wire.get("dests")
    hops = wire.get("hops")
    source = wire.get("source")
    if (
        topic.__class__ is str
        and payload.__class__ is bytes
        and "headers" not in wire
        and msg_id.__class__ is str
        and msg_id.isascii()
        and len(msg_id) <= MAX_MSG_ID_BYTES
        and dedup.__class__ is bool
        and hops.__class__ is int
        and 0 <= hops <= U64_MAX
        and _fast_id(source)
        and dests.__class__ is list
        and (
            (len(dests) == 1 and _fast_id(dests[0]))
            or (
                len(dests) > 1
                and all(_fast_id(dest) for dest in dests)
                and len(set(dests)) == len(dests)
            )
        )
    ):
        try:
            routing.validate_topic(topic, empty_levels=True)  # (it may come from MQTT)
        except routing.TopicError as exc:
            raise RemoteProtocolError(ErrorCode.INVALID_TOPIC, str(exc)) from None
        frame = _new_frame(Fwd)
        _set(frame, "topic", topic)
        _set(frame, "payload", payload)
        _set(frame, "headers", None)
        _set(frame, "msg_id", msg_id)
        _set(frame, "dedup", dedup)
        _set(frame, "dests", dests)
        _set(frame, "hops", hops)
        _set(frame, "source", source)
        return frame
    return build_frame(Fwd, wire)  # type: ignore[return-value]


# -- fast encoders ---------------------------------------------------------------------------
# Each returns the wire bytes, length prefix included.

_packb = msgpack.Packer(use_bin_type=True).pack
_SUB_KEY: Final = _packb("sub")
_SEQ_KEY: Final = _packb("seq")
_DISCARDED_KEY: Final = _packb("discarded")
_MAP_HEADERS: Final = tuple(bytes((0x80 | n,)) for n in range(16))


def _head(frame_type: str, fields: int) -> bytes:
    return bytes((0x80 | (fields + 1),)) + _packb("type") + _packb(frame_type)


_PUBACK: Final = _head("PUBACK", 1) + _packb("id")


def _msg_heads() -> tuple[tuple[Any, int, bytes, bytes], ...]:
    """What ``append_msg`` packs before a MSG's shared fields, by the widths of its ``sub``
    and ``seq``: (pack, body bytes besides the shared fields, sub key, seq key).

    A MSG's head is its length prefix, its map header and the two fields that differ per
    delivery, ``sub`` and ``seq`` (a map's keys may come in any order, so they come first).
    One ``struct`` call packs it, in the smallest msgpack form of each uint as ``_packb``
    would: the format byte of ``sub``'s and ``seq``'s width is the last byte of its key.
    Indexed by ``_SUB_WIDTH[sub.bit_length()] + _SEQ_WIDTH[seq.bit_length()]``.
    """
    widths = ((b"", "B", 1), (b"\xcc", "B", 1), (b"\xcd", "H", 2), (b"\xce", "I", 4))
    widths += ((b"\xcf", "Q", 8),)  # positive fixint, uint 8, 16, 32, 64
    heads = []
    for sub_format, sub_code, sub_size in widths:
        for seq_format, seq_code, seq_size in widths:
            sub_key, seq_key = _SUB_KEY + sub_format, _SEQ_KEY + seq_format
            layout = f">IB{len(sub_key)}s{sub_code}{len(seq_key)}s{seq_code}"
            extra = 1 + len(sub_key) + sub_size + len(seq_key) + seq_size
            heads.append((struct.Struct(layout).pack, extra, sub_key, seq_key))
    return tuple(heads)


def _width(bits: int) -> int:
    """The index of the msgpack uint form for a value of ``bits`` bits (``_msg_heads``)."""
    return 0 if bits <= 7 else 1 if bits <= 8 else 2 if bits <= 16 else 3 if bits <= 32 else 4


_MSG_HEADS: Final = _msg_heads()
_SUB_WIDTH: Final = tuple(5 * _width(bits) for bits in range(65))
_SEQ_WIDTH: Final = tuple(_width(bits) for bits in range(65))
_SUBACK: Final = _head("SUBACK", 2) + _packb("id")
_UNSUBACK: Final = _head("UNSUBACK", 1) + _packb("id")


def frame_too_large(frame_type: str, size: int, limit: int) -> LocalProtocolError:
    """The error for a frame whose body of ``size`` bytes is over the receiver's ``limit``."""
    return LocalProtocolError(
        ErrorCode.FRAME_TOO_LARGE,
        f"{frame_type} frame of {size} bytes exceeds the peer's limit of {limit} bytes",
    )


def _framed(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def encode_puback(request_id: int) -> bytes:
    return _framed(_PUBACK + _packb(request_id))


def encode_suback(request_id: int, sub_id: int) -> bytes:
    return _framed(_SUBACK + _packb(request_id) + _SUB_KEY + _packb(sub_id))


def encode_unsuback(request_id: int) -> bytes:
    return _framed(_UNSUBACK + _packb(request_id))


#: The start of a MSG's shared fields (after its map header and head): "type", "topic".
_MSG_TYPE_TOPIC: Final = _packb("type") + _packb("MSG") + _packb("topic")
_MSG_ID_KEY: Final = _packb("msg_id")
_HEADERS_KEY: Final = _packb("headers")
_PAYLOAD_KEY: Final = _packb("payload")
_RETAINED_TRUE: Final = _packb("retained") + _packb(True)
#: msgpack bin headers: for lengths below 256 (bin 8), then bin 16 and bin 32.
_BIN_HEADS: Final = tuple(bytes((0xC4, n)) for n in range(256))
_BIN16: Final = struct.Struct(">BH").pack
_BIN32: Final = struct.Struct(">BI").pack


def shared_fields(message: Message) -> tuple[bytes, int]:
    """The encoded fields every MSG of ``message`` carries, up to its payload, and how many
    fields there are (packed once, kept on the message).

    They end with the ``payload`` key and the payload's bin header: ``append_msg`` appends
    the payload itself, which is copied once, into the batch, and never packed. A message
    from the retained store (``from_retained``) carries ``retained: true`` among them (its
    own Message object, so live deliveries of the same topic never get it).
    """
    if message.encoded is None:
        size = message.size
        if size < 256:
            payload_head = _BIN_HEADS[size]
        elif size < 0x10000:
            payload_head = _BIN16(0xC5, size)
        else:
            payload_head = _BIN32(0xC6, size)
        headers = message.headers
        retained = message.from_retained
        if headers is None and not retained:  # (the packer's str form: as _packb gives it)
            message.encoded = b"".join(
                (
                    _MSG_TYPE_TOPIC,
                    _packb(message.topic),
                    _MSG_ID_KEY,
                    _packb(message.msg_id),
                    _PAYLOAD_KEY,
                    payload_head,
                )
            )
            message.encoded_fields = 4
        else:
            message.encoded = b"".join(
                (
                    _MSG_TYPE_TOPIC,
                    _packb(message.topic),
                    _MSG_ID_KEY,
                    _packb(message.msg_id),
                    b"" if headers is None else _HEADERS_KEY + _packb(headers),
                    _RETAINED_TRUE if retained else b"",
                    _PAYLOAD_KEY,
                    payload_head,
                )
            )
            message.encoded_fields = 4 + (headers is not None) + retained
    return message.encoded, message.encoded_fields


def encode_msg(message: Message, sub: int, seq: int) -> bytes:
    """The wire bytes (length prefix included) of MSG(sub, seq) for ``message``."""
    parts: list[bytes | memoryview] = []
    append_msg(parts, message, sub, seq)
    return b"".join(parts)


def append_msg(
    parts: list[bytes | memoryview],
    message: Message,
    sub: int,
    seq: int,
    limit: int = MAX_LENGTH,
    discarded: int = 0,
) -> int:
    """Append the pieces of MSG(sub, seq) for ``message`` to ``parts``; their total size.
    ``discarded`` > 0 adds the field that says how many messages were dropped before it.

    For a writer that joins a whole batch at once: the payload is copied once, into the
    batch, instead of into a MSG first and the batch then. A body
    larger than ``limit`` (``Connection.append_msg`` passes the peer's) is refused before
    anything is appended, so a batch is never left with half a frame.
    """
    shared = message.encoded
    if shared is None:
        shared, fields = shared_fields(message)
    else:
        fields = message.encoded_fields
    if not discarded:  # the common case: the head is one struct call (see _msg_heads)
        pack, extra, sub_key, seq_key = _MSG_HEADS[
            _SUB_WIDTH[sub.bit_length()] + _SEQ_WIDTH[seq.bit_length()]
        ]
        size = extra + len(shared) + message.size
        if size > limit:
            raise frame_too_large("MSG", size, limit)
        parts.append(pack(size, 0x82 + fields, sub_key, sub, seq_key, seq))
        parts.append(shared)
        parts.append(message.payload)
        return size + 4
    tail = b"".join((_SUB_KEY, _packb(sub), _SEQ_KEY, _packb(seq)))
    tail += _DISCARDED_KEY + _packb(discarded)
    fields += 1
    size = 1 + len(shared) + message.size + len(tail)
    if size > limit:
        raise frame_too_large("MSG", size, limit)
    parts.append(size.to_bytes(4, "big") + _MAP_HEADERS[fields + 2])
    parts.append(shared)
    parts.append(message.payload)
    parts.append(tail)
    return size + 4


def append_msg_run(
    parts: list[bytes | memoryview], entries: list[Any], start: int, end: int, budget: int
) -> tuple[int, int, int]:
    """``append_msg`` for the queued deliveries ``entries[start:end]`` in one loop, for a
    session's writer (``Session.take_batch``'s ``append_run``): each entry a tuple
    (message, sub id, seq), as long as it is one and its message is not sampled
    (``routed_at``), and until ``budget`` bytes are appended; returns (the index after the
    last encoded, bytes appended, payload bytes).

    A read of PUBs fans out to thousands of deliveries; one call per delivery (and the
    look-ups each call repeats) cost more than encoding its head does.
    """
    heads = _MSG_HEADS
    sub_width = _SUB_WIDTH
    seq_width = _SEQ_WIDTH
    size = payload_bytes = 0
    for i in range(start, end):
        entry = entries[i]
        if entry.__class__ is not tuple or size >= budget:
            return i, size, payload_bytes
        message, sub, seq = entry
        if message.routed_at:
            return i, size, payload_bytes
        shared = message.encoded
        if shared is None:
            shared, fields = shared_fields(message)
        else:
            fields = message.encoded_fields
        pack, extra, sub_key, seq_key = heads[
            sub_width[sub.bit_length()] + seq_width[seq.bit_length()]
        ]
        length = message.size
        body = extra + len(shared) + length
        if body > MAX_LENGTH:
            raise frame_too_large("MSG", body, MAX_LENGTH)
        parts += (pack(body, 0x82 + fields, sub_key, sub, seq_key, seq), shared, message.payload)
        size += body + 4
        payload_bytes += length
    return end, size, payload_bytes


def encode_fwd(
    message: Message, dedup: bool, dests: tuple[str, ...], hops: int, source: str
) -> bytes:
    """The wire bytes (length prefix included) of a FWD frame carrying ``message``.

    Brokers forward every event they route to peers, so this skips the frame class and its
    checks: every field came from a PUB or a FWD that passed them.
    """
    fields: dict[str, object] = {
        "type": "FWD",
        "topic": message.topic,
        "payload": message.payload,
        "msg_id": message.msg_id,
        "dests": list(dests),
        "hops": hops,
        "source": source,
    }
    if dedup:
        fields["dedup"] = True
    if message.headers is not None:
        fields["headers"] = message.headers
    body = _packb(fields)
    return len(body).to_bytes(4, "big") + body


def encode_pub(
    topic: str,
    payload: bytes,
    headers: dict[str, str] | None = None,
    request_id: int | None = None,
    msg_id: str | None = None,
) -> bytes:
    """The wire bytes (length prefix included) of PUB; ``request_id`` asks for PUBACK.

    A publisher's hot path, so no Pub frame is built: the fields are the caller's to check
    (the client checks them first, with errors meant for the application).
    """
    fields: dict[str, object] = {"type": "PUB", "topic": topic, "payload": payload}
    if headers is not None:
        fields["headers"] = headers
    if msg_id is not None:
        fields["msg_id"] = msg_id
    if request_id is not None:
        fields["id"] = request_id
    body = _packb(fields)
    return len(body).to_bytes(4, "big") + body
