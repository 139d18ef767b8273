"""Password hashes (broker/security/passwords.py): round trips, refusals, the string format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.security.passwords import DEFAULT_N, HashError, ScryptHash, hash_password

# Cheap parameters: the format carries them, so the property tests need not pay for the
# default cost (tens of ms per hash) a hundred times over.
CHEAP = {"n": 16, "r": 1, "p": 1}


# Passwords as they may be: any bytes but NUL (passwords.py says why NUL is refused).
passwords = st.binary(max_size=64).filter(lambda b: b"\x00" not in b)


@given(password=passwords)
def test_a_password_verifies_against_its_own_hash(password: bytes) -> None:
    assert ScryptHash.parse(hash_password(password, **CHEAP)).verify(password)


@given(password=passwords, other=st.binary(max_size=32))
def test_any_other_password_fails(password: bytes, other: bytes) -> None:
    if other != password:
        assert not ScryptHash.parse(hash_password(password, **CHEAP)).verify(other)


def test_passwords_that_differ_by_trailing_nul_bytes_are_not_the_same() -> None:
    # HMAC pads its key with zeros: without the NUL rule, b"" and b"\x00" would match.
    stored = ScryptHash.parse(hash_password(b"pw", **CHEAP))
    assert not stored.verify(b"pw\x00")
    assert not ScryptHash.parse(hash_password(b"", **CHEAP)).verify(b"\x00")


def test_a_password_with_a_nul_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="NUL"):
        hash_password(b"p\x00w", **CHEAP)


@given(password=passwords)
def test_two_hashes_of_one_password_differ_by_their_salt(password: bytes) -> None:
    first, second = (ScryptHash.parse(hash_password(password, **CHEAP)) for _ in range(2))
    assert first.salt != second.salt and first.key != second.key


def test_the_default_hash_names_its_parameters_and_verifies() -> None:
    text = hash_password(b"s3cret")
    assert text.startswith(f"scrypt$n={DEFAULT_N},r=8,p=1$")
    parsed = ScryptHash.parse(text)
    assert parsed.encode() == text
    assert parsed.verify(b"s3cret") and not parsed.verify(b"s3cret ")


def test_a_decoy_has_the_same_parameters_and_matches_nothing() -> None:
    real = ScryptHash.parse(hash_password(b"pw", **CHEAP))
    decoy = real.decoy()
    assert (decoy.n, decoy.r, decoy.p, len(decoy.salt), len(decoy.key)) == (16, 1, 1, 16, 32)
    assert not decoy.verify(b"pw")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("bcrypt$2b$12$abc", "not a scrypt"),
        ("scrypt$n=1000,r=8,p=1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43, "power of 2"),
        ("scrypt$n=16777216,r=8,p=1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43, "power of 2"),
        ("scrypt$n=1048576,r=32,p=1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43, "MiB"),
        ("scrypt$n=16384,r=0,p=1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43, "r must be"),
        ("scrypt$n=16384,r=8,p=1$AAAAAAAAAAAAAAAAAAAAA$" + "A" * 43, "base64"),
    ],
)
def test_a_bad_hash_string_is_refused_saying_why(text: str, problem: str) -> None:
    with pytest.raises(HashError, match=problem):
        ScryptHash.parse(text)
