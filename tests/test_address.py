"""The one HOST:PORT rule (broker/address.py) that the client, CLI, config and bridge share."""

from __future__ import annotations

import pytest

from broker.address import DEFAULT_PORT, parse_host_port, parse_server, split_address

ADDRESSES = [
    ("127.0.0.1:7000", ("127.0.0.1", 7000)),
    (" h:80 ", ("h", 80)),
    ("h:0080", ("h", 80)),
    ("[::1]:7001", ("::1", 7001)),
    ("h:65535", ("h", 65535)),
]
WITHOUT_PORT = [
    ("localhost", ("localhost", DEFAULT_PORT)),
    ("[::1]", ("::1", DEFAULT_PORT)),
    ("::1", ("::1", DEFAULT_PORT)),  # a bare IPv6 address has no port
    ("::1:80", ("::1:80", DEFAULT_PORT)),
]
REFUSED = [
    ("", "server address is empty"),
    ("  ", "server address is empty"),
    ("h:x", "bad port 'x' in server address 'h:x'"),
    ("h:", "bad port '' in server address 'h:'"),
    ("h:+80", "bad port '+80' in server address 'h:+80'"),
    ("h:٨٠", "bad port '٨٠' in server address 'h:٨٠'"),
    ("h:0", "port must be in 1..65535, got 0"),
    ("h:-1", "port must be in 1..65535, got -1"),
    ("h:70000", "port must be in 1..65535, got 70000"),
    (":80", "no host in server address ':80'"),
    ("[]:80", "no host in server address '[]:80'"),
    ("[::1", "expected HOST:PORT, got '[::1'"),
    ("[::1]x", "expected HOST:PORT, got '[::1]x'"),
]


@pytest.mark.parametrize(("text", "expected"), ADDRESSES + WITHOUT_PORT)
def test_an_address_splits_into_host_and_port(text: str, expected: tuple[str, int]) -> None:
    assert split_address(text) == expected == parse_server(text)


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_a_bad_address_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        split_address(text)
    assert str(info.value) == message
    assert parse_host_port(text) is None


@pytest.mark.parametrize(("text", "expected"), ADDRESSES)
def test_host_port_means_the_same_where_the_port_is_required(
    text: str, expected: tuple[str, int]
) -> None:
    assert split_address(text, default_port=None) == expected == parse_host_port(text)


@pytest.mark.parametrize(("text", "_expected"), WITHOUT_PORT)
def test_where_the_port_is_required_its_absence_is_refused(
    text: str, _expected: tuple[str, int]
) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        split_address(text, default_port=None)
    assert parse_host_port(text) is None


def test_a_tuple_is_checked_like_a_string() -> None:
    assert parse_server(("h", 1)) == ("h", 1)
    with pytest.raises(ValueError, match="no host"):
        parse_server(("", 1))
    with pytest.raises(ValueError, match="got 0"):
        parse_server(("h", 0))
