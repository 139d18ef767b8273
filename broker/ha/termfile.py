"""The witness' term file: the only state it keeps, written so that a crash never loses it.

One line of JSON, ``{"term": 3, "primary": "a", "crc32": ...}``, in ``DIR/witness-term``.
Written to a temporary file, fsynced, renamed over the old one, and the directory fsynced,
so after a crash the file is either the old state or the new one, never a mix. The CRC
catches a file damaged afterwards. A file that cannot be read, parsed or checked is a
``TermFileError`` naming the file: the witness refuses to start rather than reset the term,
because a witness that forgot a vote could grant the same term twice. No file at all is a
first start (term 0). A lock file keeps two witnesses off one directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import zlib
from pathlib import Path
from typing import IO

from broker.ha.witness_state import Persisted

__all__ = ["TERM_FILE", "TermFile", "TermFileError"]

TERM_FILE = "witness-term"
LOCK_FILE = "witness.lock"


class TermFileError(Exception):
    """The term file or its directory is unusable; the message names the file."""


def _crc(term: int, primary: str | None) -> int:
    return zlib.crc32(json.dumps([term, primary]).encode())


class TermFile:
    """The term file in ``directory`` (created if missing), locked while this object lives."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / TERM_FILE
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock: IO[bytes] | None = open(self.directory / LOCK_FILE, "ab")  # noqa: SIM115
        except OSError as exc:
            raise TermFileError(f"{self.directory}: cannot use: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.close()
            raise TermFileError(f"{self.directory}: another witness is using it") from None

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def load(self) -> Persisted:
        """The persisted state; term 0 when there is no file yet."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return Persisted()
        except (OSError, UnicodeDecodeError) as exc:
            raise TermFileError(f"{self.path}: cannot read: {exc}") from None
        try:
            data = json.loads(text)
            term, primary, crc = data["term"], data["primary"], data["crc32"]
        except (ValueError, TypeError, KeyError) as exc:
            raise TermFileError(f"{self.path}: corrupt (not the term file's JSON: {exc})") from None
        if (
            term.__class__ is not int
            or not (primary is None or primary.__class__ is str)
            or crc != _crc(term, primary)
        ):
            raise TermFileError(f"{self.path}: corrupt (checksum or types do not match)")
        try:
            return Persisted(term, primary)
        except ValueError as exc:
            raise TermFileError(f"{self.path}: corrupt ({exc})") from None

    def save(self, state: Persisted) -> None:
        """Write ``state`` durably (temp file, fsync, rename, directory fsync)."""
        line = json.dumps(
            {"term": state.term, "primary": state.primary, "crc32": _crc(state.term, state.primary)}
        )
        temp = self.path.with_name(TERM_FILE + ".tmp")
        with open(temp, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self.path)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
