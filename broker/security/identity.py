"""Who a connection is, once it has proved it: the subject of every access decision.

One value for every front end (native HELLO, MQTT CONNECT, a client certificate), so the
ACL rules (``user:NAME``, ``group:NAME``, ``cert:SUBJECT``, ``*``) and durable-session
ownership do not care which protocol a client spoke.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated principal; ``ANONYMOUS`` when nothing was proved.

    ``user`` is a name from the users file (checked password), ``groups`` that user's
    groups, ``cert`` the RFC 4514 subject of a client certificate the TLS layer verified
    against the configured CA. A client may have both a user and a certificate.
    """

    user: str | None = None
    groups: frozenset[str] = frozenset()
    cert: str | None = None

    @property
    def anonymous(self) -> bool:
        return self.user is None and self.cert is None

    @property
    def owner(self) -> str:
        """The name a durable session is owned by: ``user:NAME``, else ``cert:SUBJECT``,
        else ``anonymous``."""
        if self.user is not None:
            return f"user:{self.user}"
        if self.cert is not None:
            return f"cert:{self.cert}"
        return "anonymous"


ANONYMOUS = Identity()


def certificate_subject(stream: object) -> str | None:
    """The RFC 4514 subject of the client certificate that TLS verified on ``stream`` (a
    ``trio.SSLStream`` after its handshake, or a stream wrapping one in ``transport_stream``),
    or None: plain TCP, no certificate, or one that was not verified."""
    while stream is not None:
        getpeercert = getattr(stream, "getpeercert", None)
        if getpeercert is not None:
            try:
                cert = getpeercert()
            except (ValueError, AttributeError):  # handshake not done
                return None
            return _subject(cert) if cert else None
        stream = getattr(stream, "transport_stream", None)
    return None


def _subject(cert: dict) -> str | None:
    """RFC 4514 order (most specific first) from ``ssl.getpeercert()``'s RDN tuples."""
    names = {
        "commonName": "CN",
        "organizationName": "O",
        "organizationalUnitName": "OU",
        "countryName": "C",
        "stateOrProvinceName": "ST",
        "localityName": "L",
        "domainComponent": "DC",
        "emailAddress": "emailAddress",
        "userId": "UID",
    }
    parts = []
    for rdn in reversed(cert.get("subject", ())):
        attrs = "+".join(f"{names.get(k, k)}={_escape(v)}" for k, v in rdn)
        parts.append(attrs)
    return ",".join(parts) or None


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;=' or (ch in " #" and i == 0) or (ch == " " and i == len(value) - 1):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)
