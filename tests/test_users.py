"""The users file (broker/security/users.py): loading, refusing bad files in one line,
writing atomically, reloading."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from broker.config import ConfigError
from broker.security.passwords import ScryptHash, hash_password
from broker.security.users import Users, load_users, write_users

CHEAP = {"n": 16, "r": 1, "p": 1}


def make_users(path: Path, **users: tuple[str, list[str]]) -> Path:
    """A users file with cheap hashes: name=(password, groups)."""
    write_users(
        path,
        {
            name: (hash_password(pw.encode(), **CHEAP), groups)
            for name, (pw, groups) in users.items()
        },
    )
    return path


def test_users_load_with_their_groups(tmp_path: Path) -> None:
    path = make_users(
        tmp_path / "users.toml",
        alice=("a", ["ops", "billing"]),
        bob=("b", []),
        **{"c.d@e": ("c", [])},
    )
    users = load_users(path)
    assert sorted(users) == ["alice", "bob", "c.d@e"]
    assert users["alice"].groups == frozenset({"ops", "billing"})
    assert users["bob"].groups == frozenset()


def test_check_accepts_the_password_and_refuses_others_and_strangers(tmp_path: Path) -> None:
    users = Users(make_users(tmp_path / "u.toml", alice=("right", ["ops"])))
    user = users.check("alice", b"right")
    assert user is not None and user.name == "alice"
    assert users.check("alice", b"wrong") is None
    assert users.check("mallory", b"right") is None


def test_a_stranger_is_checked_against_a_decoy_with_the_files_parameters(tmp_path: Path) -> None:
    users = Users(make_users(tmp_path / "u.toml", alice=("right", [])))
    decoy = users._decoy
    assert (decoy.n, decoy.r, decoy.p) == (16, 1, 1)


GOOD_HASH = "scrypt$n=16,r=1,p=1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[users.alice\n", "not valid TOML"),
        ('[people.alice]\nhash = "x"\n', "unknown table [people]"),
        ("users = 3\n", "must be a table"),
        (f'[users."a/b"]\nhash = "{GOOD_HASH}"\n', "user 'a/b': a user name must be"),
        ("[users.alice]\ngroups = []\n", "user 'alice': hash is missing"),
        ('[users.alice]\nhash = "plain"\n', "user 'alice': bad hash"),
        (f'[users.alice]\nhash = "{GOOD_HASH}"\ngroups = "ops"\n', "groups must be a list"),
        (f'[users.alice]\nhash = "{GOOD_HASH}"\ngroups = ["#"]\n', "groups must be a list"),
        (f'[users.alice]\nhash = "{GOOD_HASH}"\nrole = "x"\n', "unknown key 'role'"),
    ],
)
def test_a_bad_users_file_is_one_line_naming_file_and_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "users.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_users(path)
    message = str(info.value)
    assert message.startswith(f"users file {path}: ") and problem in message
    assert "\n" not in message


def test_a_missing_users_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"users file .*nope\.toml: cannot read it"):
        load_users(tmp_path / "nope.toml")


def test_a_new_users_file_is_private_and_an_old_one_keeps_its_mode(tmp_path: Path) -> None:
    path = make_users(tmp_path / "users.toml", alice=("a", []))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o640)
    make_users(path, alice=("a", []), bob=("b", []))
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(load_users(path)) == ["alice", "bob"]
    assert [p.name for p in tmp_path.iterdir()] == ["users.toml"]  # no temporary file left


def test_reload_switches_to_a_good_file_and_keeps_the_old_users_for_a_bad_one(
    tmp_path: Path,
) -> None:
    path = make_users(tmp_path / "users.toml", alice=("a", []))
    users = Users(path)
    make_users(path, bob=("b", ["ops"]))
    users.reload()
    assert users.get("alice") is None and users.get("bob") is not None
    path.write_text("[users.bob\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        users.reload()
    assert users.check("bob", b"b") is not None


def test_hashes_written_are_the_ones_read(tmp_path: Path) -> None:
    text = hash_password(b"pw", **CHEAP)
    write_users(tmp_path / "u.toml", {"alice": (text, ["ops"])})
    assert load_users(tmp_path / "u.toml")["alice"].hash == ScryptHash.parse(text)


def test_an_empty_users_file_lets_nobody_in_at_the_default_cost(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text("# nobody yet\n")
    users = Users(path)
    assert len(users) == 0
    assert users.check("alice", b"") is None
    assert users._decoy.n == 16384
