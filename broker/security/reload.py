"""SIGHUP: re-read what may change without a restart (certificates, users, ACL rules).

Each part that can be reloaded registers a ``Reloadable`` with the server. A reload reads
and checks everything first: a part whose new files are bad raises ``ConfigError`` and
keeps what it had, with one log line naming the file and the problem; the others still
reload. Connections are never dropped by a reload.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from broker.config import ConfigError
from broker.log import get_logger

log = get_logger("topiary.reload")


class Reloadable(Protocol):
    #: What is reloaded, for the log ("tls", "users", "acl").
    name: str

    def reload(self) -> None:
        """Read the files again and switch to them; raise ``ConfigError`` (and keep the
        old state) when they are bad."""
        ...


def reload_all(parts: Iterable[Reloadable]) -> dict[str, str | None]:
    """Reload each part; name -> None when it reloaded, else the error that kept it as it
    was."""
    outcome: dict[str, str | None] = {}
    for part in parts:
        try:
            part.reload()
        except ConfigError as exc:
            outcome[part.name] = str(exc)
            log.error("reload failed, kept the old state", part=part.name, error=str(exc))
        else:
            outcome[part.name] = None
            log.info("reloaded", part=part.name)
    return outcome
