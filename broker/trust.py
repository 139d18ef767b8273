"""Who may open a peer link: the ``[[peering.peer]]`` and ``[[peering.observer]]`` entries.

Pure data and decisions, no I/O, and no import of the rest of the broker (``broker.config``
parses the entries with it; ``broker.mesh`` asks it at each PEER_HELLO), so both can use it
without an import cycle.

Two modes, per role (docs/security.md, "Trusted peers"):

- *open*: no entry for the role. Any id may link; when ``[peering] secret`` is set, the
  PEER_HELLO must carry it. This is how every mesh worked before per-peer credentials, and
  it keeps working unchanged.
- *closed*: brokers once a ``[[peering.peer]]`` is listed; observers once a
  ``[[peering.observer]]`` or a ``[[peering.peer]]`` is listed (a broker that names its
  peers would otherwise show every filter to any observer). Only a listed id of that role
  gets in, and only with its own credentials: its ``secret`` (compared in constant time)
  and, when ``cert`` is set, a TLS client certificate with exactly that subject.

A pair of brokers shares one secret per link, used in both directions (like a BGP
neighbour's password): each end lists the other with the same ``secret``.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

BROKER = "broker"
OBSERVER = "observer"

#: Keys of one entry, per role (observers are never dialled: no address).
_ENTRY_KEYS = {
    BROKER: ("id", "address", "secret", "cert"),
    OBSERVER: ("id", "secret", "cert"),
}


@dataclass(frozen=True, slots=True)
class TrustedPeer:
    """One configured broker or observer and how it proves who it is.

    ``secret`` is what it must present in PEER_HELLO (and, for a broker, what this broker
    presents when it dials it); ``cert`` the RFC 4514 subject its TLS client certificate
    must have; ``address`` (brokers only) where to dial it, None: only accept its links.
    """

    id: str
    role: str = BROKER
    secret: str | None = None
    cert: str | None = None
    address: str | None = None

    def __repr__(self) -> str:  # never the secret, in a log line or a traceback
        secret = None if self.secret is None else "***"
        return (
            f"TrustedPeer(id={self.id!r}, role={self.role!r}, secret={secret}, "
            f"cert={self.cert!r}, address={self.address!r})"
        )


def parse_entries(raw: Any, role: str) -> tuple[TrustedPeer, ...]:
    """``[[peering.peer]]`` or ``[[peering.observer]]`` (a list of tables) as entries; a
    ValueError names the entry and the key at fault. Address syntax and id rules are checked
    with the rest of the config."""
    table = "peer" if role == BROKER else "observer"
    if not isinstance(raw, list):
        raise ValueError(f"[[peering.{table}]] must be an array of tables")
    entries = []
    for n, body in enumerate(raw, 1):
        where = f"[[peering.{table}]] #{n}"
        if not isinstance(body, dict):
            raise ValueError(f"{where} must be a table")
        for key, value in body.items():
            if key not in _ENTRY_KEYS[role]:
                known = ", ".join(_ENTRY_KEYS[role])
                raise ValueError(f"{where}: unknown key {key!r} (known: {known})")
            if not isinstance(value, str) or not value:
                raise ValueError(f"{where}: {key} must be a non-empty string, got {value!r}")
        if "id" not in body:
            raise ValueError(f"{where}: id is required")
        if "secret" not in body and "cert" not in body:
            raise ValueError(f"{where} ({body['id']}): give it a secret, a cert, or both")
        entries.append(
            TrustedPeer(
                id=body["id"],
                role=role,
                secret=body.get("secret"),
                cert=body.get("cert"),
                address=body.get("address"),
            )
        )
    return tuple(entries)


class Trust:
    """The decision at each PEER_HELLO: may this id, in this role, with this secret and
    this certificate, open a link? (See the module docstring for the two modes.)"""

    def __init__(self, entries: Iterable[TrustedPeer], shared_secret: str | None = None) -> None:
        self.entries = {entry.id: entry for entry in entries}
        self.shared_secret = shared_secret
        roles = {entry.role for entry in self.entries.values()}
        self.closed = {
            BROKER: BROKER in roles,
            OBSERVER: bool(roles),
        }

    def refusal(self, peer_id: str, role: str, secret: str | None, cert: str | None) -> str | None:
        """Why the link is refused (a text for the log and the ERROR), or None."""
        if not self.closed.get(role, True):
            if self.shared_secret is not None and not _same(secret, self.shared_secret):
                return "bad or missing peer secret"
            return None
        entry = self.entries.get(peer_id)
        if entry is None or entry.role != role:
            _same(secret, "")  # the same work as for a listed id: timing tells nothing
            return f"{peer_id!r} is not a configured {role}"
        if entry.secret is not None and not _same(secret, entry.secret):
            return f"bad or missing secret for {role} {peer_id!r}"
        if entry.cert is not None and cert != entry.cert:
            got = "no verified client certificate" if cert is None else f"certificate {cert!r}"
            return f"{role} {peer_id!r} must present certificate {entry.cert!r}, not {got}"
        return None

    def dial_secret(self, peer_id: str | None) -> str | None:
        """The secret to present when dialling ``peer_id`` (a listed broker), else the shared
        one (a plain ``peers`` address)."""
        entry = self.entries.get(peer_id) if peer_id is not None else None
        return entry.secret if entry is not None else self.shared_secret

    def dialled(self) -> list[TrustedPeer]:
        """The listed brokers with an address: this broker dials them."""
        return [e for e in self.entries.values() if e.role == BROKER and e.address is not None]


def _same(given: str | None, expected: str) -> bool:
    """Constant-time comparison (``hmac.compare_digest``); a missing secret never matches."""
    supplied = (given or "").encode()
    return hmac.compare_digest(supplied, expected.encode()) and given is not None
