"""A pair broker's own HA state on disk: its id for the witness, the newest term it knows
and that term's primary (``DATA_DIR/ha-term``).

Kept beside the store, not in it: a snapshot from the partner replaces the database, never
this file. After a restart the broker's role comes from here (the primary of the stored
term starts as primary and renews; any other starts as standby of it), and ``[ha] role``
only decides the first start. The id is random and made at the first start: ``server_id``
may be shared by the pair (one broker id in the mesh), the witness' ids may not.

Written as the witness' term file is (temp file, fsync, rename, directory fsync) with a
CRC; a damaged file stops start-up with one line rather than guess a role.
"""

from __future__ import annotations

import json
import os
import secrets
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from broker.config import ConfigError

__all__ = ["BROKER_TERM_FILE", "BrokerTerm", "load_broker_term", "save_broker_term"]

BROKER_TERM_FILE = "ha-term"


@dataclass(frozen=True, slots=True)
class BrokerTerm:
    me: str
    term: int = 0
    primary: str | None = None

    def with_term(self, term: int, primary: str | None) -> BrokerTerm:
        return replace(self, term=term, primary=primary)


def _crc(state: BrokerTerm) -> int:
    return zlib.crc32(json.dumps([state.me, state.term, state.primary]).encode())


def load_broker_term(directory: str | os.PathLike[str]) -> BrokerTerm:
    """The stored state; a new id (saved at once) at the first start."""
    path = Path(directory) / BROKER_TERM_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        state = BrokerTerm(me="b-" + secrets.token_hex(6))
        save_broker_term(directory, state)
        return state
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        data = json.loads(text)
        state = BrokerTerm(data["me"], data["term"], data["primary"])
        ok = (
            isinstance(state.me, str)
            and state.term.__class__ is int
            and state.term >= 0
            and (state.primary is None or isinstance(state.primary, str))
            and data["crc32"] == _crc(state)
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{path}: corrupt ({exc}); remove it to start as [ha] role") from None
    if not ok:
        raise ConfigError(f"{path}: corrupt (checksum or types); remove it to start as [ha] role")
    return state


def save_broker_term(directory: str | os.PathLike[str], state: BrokerTerm) -> None:
    """Write ``state`` durably (temp file, fsync, rename, directory fsync)."""
    folder = Path(directory)
    path = folder / BROKER_TERM_FILE
    line = json.dumps(
        {"me": state.me, "term": state.term, "primary": state.primary, "crc32": _crc(state)}
    )
    temp = path.with_name(BROKER_TERM_FILE + ".tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
