"""The users file: who may log in with a password, and their groups.

    [users.alice]
    hash = "scrypt$n=16384,r=8,p=1$...$..."   # written by `topiary passwd users.toml alice`
    groups = ["ops", "billing"]

A file is read and checked whole: a bad one is one ``ConfigError`` line naming the file and
the problem, which stops start-up, or (at SIGHUP) keeps the users loaded before. User and
group names are restricted to letters, digits and ``. _ @ -`` because they end up in ACL
rules (``user:NAME``, ``group:NAME``) and in topic filters (``%u``): a name holding ``/``
or a wildcard would widen a rule.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from broker.config import ConfigError
from broker.security.passwords import HashError, ScryptHash

__all__ = ["NAME_RULE", "User", "Users", "load_users", "valid_name", "write_users"]

NAME_RULE = "1..128 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")


def valid_name(name: object) -> bool:
    """Whether ``name`` may be a user or group name (``NAME_RULE``)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class User:
    name: str
    hash: ScryptHash
    groups: frozenset[str]


def load_users(path: str | Path) -> dict[str, User]:
    """Every user in the file at ``path``; raises ``ConfigError`` naming the file and problem."""
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"users file {path}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"users file {path}: not valid TOML: {exc}") from None
    unknown = set(document) - {"users"}
    if unknown:
        raise ConfigError(f"users file {path}: unknown table [{sorted(unknown)[0]}] (only [users])")
    table = document.get("users", {})
    if not isinstance(table, dict):
        raise ConfigError(f"users file {path}: users must be a table of [users.NAME] tables")
    users = {}
    for name, body in table.items():
        where = f"users file {path}: user {name!r}"
        if not valid_name(name):
            raise ConfigError(f"{where}: a user name must be {NAME_RULE}")
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: must be a table with hash and groups")
        extra = set(body) - {"hash", "groups"}
        if extra:
            raise ConfigError(f"{where}: unknown key {sorted(extra)[0]!r} (known: hash, groups)")
        text = body.get("hash")
        if not isinstance(text, str):
            raise ConfigError(f"{where}: hash is missing (set it with `topiary passwd`)")
        try:
            parsed = ScryptHash.parse(text)
        except HashError as exc:
            raise ConfigError(f"{where}: bad hash: {exc}") from None
        groups = body.get("groups", [])
        if not isinstance(groups, list) or not all(valid_name(g) for g in groups):
            raise ConfigError(f"{where}: groups must be a list of names, each {NAME_RULE}")
        users[name] = User(name, parsed, frozenset(groups))
    return users


class Users:
    """The users of one file, reloadable (``broker.security.reload``) at SIGHUP.

    ``check`` is the slow part of a login (scrypt): callers run it in a thread. A name that
    is not in the file is checked against a decoy hash with the same parameters, so that an
    unknown user costs the same time as a wrong password and timing tells nothing.
    """

    name = "users"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._users: dict[str, User] = {}
        self._decoy = ScryptHash.parse(_DEFAULT_DECOY)
        self.reload()

    def reload(self) -> None:
        users = load_users(self.path)  # raises before anything changes
        first = next(iter(users.values()), None)
        self._decoy = (first.hash if first else ScryptHash.parse(_DEFAULT_DECOY)).decoy()
        self._users = users

    def __len__(self) -> int:
        return len(self._users)

    def get(self, name: str) -> User | None:
        return self._users.get(name)

    def check(self, name: str, password: bytes) -> User | None:
        """The user if ``password`` is theirs, else None; the same cost either way."""
        user = self._users.get(name)
        matches = (user.hash if user else self._decoy).verify(password)
        return user if matches and user is not None else None


# A default-cost hash of nothing in particular: the decoy's parameters when the file is empty.
_DEFAULT_DECOY = "scrypt$n=16384,r=8,p=1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43


def write_users(path: str | Path, users: dict[str, tuple[str, list[str]]]) -> None:
    """Write ``users`` (name -> (hash, groups)) to ``path`` atomically: a temporary file in
    the same directory, flushed to disk, then renamed over the old one. A new file is mode
    0600 (it holds hashes); an existing one keeps its mode."""
    target = Path(path)
    lines = ["# topiary users: edit with `topiary passwd FILE NAME` (docs/security.md)", ""]
    for name in sorted(users):
        hashed, groups = users[name]
        lines.append(f"[users.{json.dumps(name)}]")
        lines.append(f"hash = {json.dumps(hashed)}")
        lines.append(f"groups = [{', '.join(json.dumps(g) for g in sorted(set(groups)))}]")
        lines.append("")
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write("\n".join(lines))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
