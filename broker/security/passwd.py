"""``topiary passwd FILE NAME [--group G]... [--delete]``: edit one user of a users file.

The password comes from the terminal (asked twice, not echoed) or, when stdin is not a
terminal, from its first line, so scripts can pipe it in; it never appears in the command
line (which other local users can read in ``ps``). The file is rewritten whole and
atomically (``write_users``), keeping the other users; comments in it are not kept.
"""

from __future__ import annotations

import getpass
import os
import sys
from typing import TextIO

from broker.config import ConfigError
from broker.security.passwords import hash_password
from broker.security.users import NAME_RULE, load_users, valid_name, write_users

__all__ = ["PasswdError", "edit_user", "read_password"]


class PasswdError(Exception):
    """Why the user was not changed: one line for the operator."""


def read_password(stdin: TextIO | None = None) -> str:
    """A new password: asked twice on a terminal, else the first line of ``stdin``."""
    stdin = stdin or sys.stdin
    if stdin.isatty():
        first = getpass.getpass("Password: ")
        if getpass.getpass("Password again: ") != first:
            raise PasswdError("the passwords differ; nothing changed")
        password = first
    else:
        line = stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password.removesuffix("\r")
    if not password:
        raise PasswdError("empty password; nothing changed")
    if "\x00" in password:
        raise PasswdError("a password may not contain a NUL byte; nothing changed")
    return password


def edit_user(
    path: str, name: str, *, groups: list[str] | None, delete: bool, password: str | None
) -> str:
    """Add, change or delete ``name`` in the users file at ``path`` (created if missing);
    returns what was done. ``groups`` None keeps an existing user's groups."""
    if not valid_name(name):
        raise PasswdError(f"a user name must be {NAME_RULE}, got {name!r}")
    for group in groups or ():
        if not valid_name(group):
            raise PasswdError(f"a group name must be {NAME_RULE}, got {group!r}")
    try:
        existing = load_users(path) if os.path.exists(path) else {}
    except ConfigError as exc:
        raise PasswdError(f"{exc}; nothing changed") from None
    users = {n: (u.hash.encode(), sorted(u.groups)) for n, u in existing.items()}
    if delete:
        if name not in users:
            raise PasswdError(f"no user {name!r} in {path}")
        del users[name]
        done = "deleted"
    else:
        assert password is not None
        old_groups = users[name][1] if name in users else []
        done = "changed" if name in users else "added"
        users[name] = (
            hash_password(password.encode()),
            list(groups) if groups is not None else old_groups,
        )
    try:
        write_users(path, users)
    except OSError as exc:
        raise PasswdError(f"cannot write {path}: {exc.strerror or exc}") from None
    return done
