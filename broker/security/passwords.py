"""Password hashes: salted scrypt, in a string that says how it was made.

``scrypt$n=16384,r=8,p=1$<salt>$<hash>`` (salt and hash in unpadded base64): the cost
parameters travel with each hash, so they can be raised later and old hashes still verify.
scrypt is slow and memory-hard on purpose (tens of ms and 16 MiB at the defaults): a stolen
users file costs an attacker that much per guess. Callers run ``verify`` off the event loop.

A password may not hold a NUL byte: scrypt keys HMAC-SHA256 with the password, and HMAC
pads a short key with zeros, so ``b"pw"`` and ``b"pw\x00"`` would be the same password.
``hash_password`` refuses such a password and ``verify`` never accepts one (after the same
work, so the answer's timing says nothing).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

__all__ = ["DEFAULT_N", "DEFAULT_P", "DEFAULT_R", "HashError", "ScryptHash", "hash_password"]

DEFAULT_N = 1 << 14
DEFAULT_R = 8
DEFAULT_P = 1
SALT_BYTES = 16
HASH_BYTES = 32
#: Above these a hash would cost more memory or time than a login should; refused at loading.
MAX_N = 1 << 20
MAX_R = 32
MAX_P = 16
MAX_MEMORY = 256 * 1024 * 1024

_FORMAT = re.compile(
    r"scrypt\$n=(\d{1,8}),r=(\d{1,3}),p=(\d{1,3})\$([A-Za-z0-9+/]{16,88})\$([A-Za-z0-9+/]{22,88})"
)


class HashError(ValueError):
    """A hash string that is not one this module writes, or parameters out of range."""


@dataclass(frozen=True, slots=True)
class ScryptHash:
    """A parsed hash: cost parameters, salt and the derived key."""

    n: int
    r: int
    p: int
    salt: bytes
    key: bytes

    def __post_init__(self) -> None:
        if not (1 < self.n <= MAX_N and self.n & (self.n - 1) == 0):
            raise HashError(f"n must be a power of 2 in 2..{MAX_N}, got {self.n}")
        if not 1 <= self.r <= MAX_R:
            raise HashError(f"r must be in 1..{MAX_R}, got {self.r}")
        if not 1 <= self.p <= MAX_P:
            raise HashError(f"p must be in 1..{MAX_P}, got {self.p}")
        if self.memory > MAX_MEMORY:
            raise HashError(f"n={self.n}, r={self.r} needs more than {MAX_MEMORY >> 20} MiB")
        if len(self.salt) < 8 or len(self.key) < 16:
            raise HashError("salt or hash too short")

    @property
    def memory(self) -> int:
        """Bytes scrypt needs for these parameters (OpenSSL refuses past its ``maxmem``)."""
        return 128 * self.r * (self.n + self.p + 2)

    @classmethod
    def parse(cls, text: str) -> ScryptHash:
        match = _FORMAT.fullmatch(text)
        if match is None:
            raise HashError("not a scrypt$n=N,r=R,p=P$SALT$HASH string")
        n, r, p, salt, key = match.groups()
        try:
            return cls(int(n), int(r), int(p), _unb64(salt), _unb64(key))
        except ValueError as exc:  # bad base64 (HashError is a ValueError too)
            raise HashError(str(exc)) from None

    def encode(self) -> str:
        return f"scrypt$n={self.n},r={self.r},p={self.p}${_b64(self.salt)}${_b64(self.key)}"

    def derive(self, password: bytes) -> bytes:
        """The key ``password`` gives with this hash's salt and parameters (the slow part)."""
        return hashlib.scrypt(
            password,
            salt=self.salt,
            n=self.n,
            r=self.r,
            p=self.p,
            maxmem=self.memory + (1 << 20),
            dklen=len(self.key),
        )

    def verify(self, password: bytes) -> bool:
        """Whether ``password`` is the one hashed; compared in constant time."""
        matches = hmac.compare_digest(self.derive(password), self.key)
        return matches and b"\x00" not in password

    def decoy(self) -> ScryptHash:
        """A hash with the same parameters that no password matches (random key): checking
        an unknown user against it costs what checking a known one does."""
        return ScryptHash(
            self.n, self.r, self.p, os.urandom(len(self.salt)), os.urandom(len(self.key))
        )


def hash_password(
    password: bytes, *, n: int = DEFAULT_N, r: int = DEFAULT_R, p: int = DEFAULT_P
) -> str:
    """A new salted hash of ``password`` (the string stored in the users file); a password
    with a NUL byte is a ``ValueError`` (see the module docstring)."""
    if b"\x00" in password:
        raise ValueError("a password may not contain a NUL byte")
    template = ScryptHash(n, r, p, os.urandom(SALT_BYTES), bytes(HASH_BYTES))
    return ScryptHash(n, r, p, template.salt, template.derive(password)).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
