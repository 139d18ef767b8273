"""The one rule for a broker's address, ``HOST:PORT``, and the default port.

The client, the CLI, the broker's peer list and the bridge each had a copy of this rule,
and the copies had drifted (one read ``::1:7474`` as host ``::1`` port 7474, another as
the host ``::1:7474``). One copy keeps a string that one accepts meaning the same to all.

The rule: surrounding whitespace is ignored; an IPv6 host goes in brackets
(``[::1]:7474``), and a bare IPv6 address (more than one colon, no brackets) is a host
without a port; the port is ASCII digits, in 1..65535. Where a port may be left out
(``--server``, ``connect``) it defaults to :data:`DEFAULT_PORT`; a peer or a bridge's
broker must name it. A client's server list (``--server A,B``, ``connect(["A", "B"])``)
is such addresses separated by commas, each named once; so is a peer's address list
(``"tls://a:7443,tls://b:7443"``, the two brokers of a pair). No imports (but
``collections.abc``, which Python loads at start-up), so that the CLI can check an
argument without loading the client.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_PORT = 7474


def split_address(
    text: str, *, default_port: int | None = DEFAULT_PORT, listening: bool = False
) -> tuple[str, int]:
    """``HOST:PORT`` as ``(host, port)``; without a port, ``default_port`` (None: the port
    is required). An address to listen on (``listening``) may have port 0: any free port.
    Raises ValueError saying what is wrong."""
    stripped = text.strip()
    if not stripped:
        raise ValueError("server address is empty")
    port_text: str | None
    if stripped.startswith("["):  # [::1]:7474
        host, bracket, rest = stripped[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        port_text = rest[1:] if rest else None
    elif stripped.count(":") == 1:
        host, port_text = stripped.split(":")
    else:  # a name, or a bare IPv6 address: no port
        host, port_text = stripped, None
    if port_text is None:
        port = DEFAULT_PORT if default_port is None else default_port
    elif port_text.isascii() and port_text.removeprefix("-").isdigit():
        port = int(port_text)  # a negative one is refused below, as out of range
    else:
        raise ValueError(f"bad port {port_text!r} in server address {text!r}")
    address = _checked(host, port, text, lowest=0 if listening else 1)
    if port_text is None and default_port is None:  # checked last: the CLI's order of errors
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return address


def _checked(host: str, port: int, address: object, lowest: int = 1) -> tuple[str, int]:
    """``(host, port)`` if the host is not empty and the port in range (``address`` is what
    an error names), else ValueError."""
    if not host:
        raise ValueError(f"no host in server address {address!r}")
    if not lowest <= port < 65536:
        raise ValueError(f"port must be in {lowest}..65535, got {port}")
    return host, port


def parse_server(server: str | tuple[str, int]) -> tuple[str, int]:
    """``host:port``, ``host`` or ``(host, port)``, the way :func:`broker.client.connect`
    takes it; raises ValueError saying what is wrong."""
    if isinstance(server, tuple):
        host, port = server
        return _checked(host, port, server)
    return split_address(server)


def parse_servers(
    servers: str | tuple[str, int] | Sequence[str | tuple[str, int]],
) -> list[tuple[str, int]]:
    """A server list as :func:`broker.client.connect` and ``--server`` take it: one server
    (as :func:`parse_server`), a comma-separated ``"A,B"``, or a sequence of servers; in
    the order given. Raises ValueError naming the entry that is wrong (an empty one, a bad
    address, one listed twice)."""
    if isinstance(servers, tuple) and len(servers) == 2 and isinstance(servers[1], int):
        return [parse_server(servers)]  # type: ignore[arg-type]
    entries: list[str | tuple[str, int]]
    if isinstance(servers, str):
        entries = servers.split(",") if servers.strip() else []
    else:
        entries = list(servers)
    if not entries:
        raise ValueError("the server list is empty")
    parsed: list[tuple[str, int]] = []
    for number, entry in enumerate(entries, 1):
        if isinstance(entry, str) and not entry.strip():
            raise ValueError(f"server {number} of {servers!r} is empty")
        try:
            address = parse_server(entry)
        except ValueError as exc:
            if len(entries) == 1:
                raise
            raise ValueError(f"server {number} of {servers!r}: {exc}") from None
        if address in parsed:
            raise ValueError(f"server {format_address(address)} is listed twice in {servers!r}")
        parsed.append(address)
    return parsed


def format_address(address: tuple[str, int]) -> str:
    """``(host, port)`` as ``HOST:PORT`` (an IPv6 host in brackets), the way it is parsed."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_host_port(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` with the port required (a peer, a bridge's broker), or None when
    ``text`` is not one; callers say what they expected in their own words."""
    try:
        return split_address(text, default_port=None)
    except ValueError:
        return None


def parse_listen(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` to listen on (port required, 0 for any free port), or None."""
    try:
        return split_address(text, default_port=None, listening=True)
    except ValueError:
        return None


#: How a peer entry asks for TLS: ``tls://HOST:PORT`` (plain ``HOST:PORT`` stays TCP).
PEER_TLS_SCHEME = "tls://"


def parse_peer_addresses(text: str) -> list[tuple[str, int, bool]]:
    """A peer's addresses as ``(host, port, tls)``: one ``HOST:PORT`` or ``tls://HOST:PORT``,
    or several separated by commas (the two brokers of a hot-spare pair, each address with
    its own scheme), in the order given. Raises ValueError naming the entry at fault (empty,
    not an address, listed twice)."""
    entries = text.split(",") if isinstance(text, str) else [text]
    addresses: list[tuple[str, int, bool]] = []
    for number, entry in enumerate(entries, 1):
        where = f"address {number} of {text!r}" if len(entries) > 1 else repr(text)
        secure = isinstance(entry, str) and entry.strip().startswith(PEER_TLS_SCHEME)
        parsed = (
            parse_host_port(entry.strip().removeprefix(PEER_TLS_SCHEME))
            if isinstance(entry, str)
            else None
        )
        if parsed is None:
            raise ValueError(f"{where} must be HOST:PORT or tls://HOST:PORT")
        address = (parsed[0], parsed[1], secure)
        if address in addresses:
            raise ValueError(f"{where} is listed twice")
        addresses.append(address)
    return addresses
