"""``topiary passwd`` and the client commands' logins, as real processes: the password from
stdin and from a terminal (a pty), atomic private files, one-line refusals."""

from __future__ import annotations

import os
import pty
import select
import stat
import subprocess
import time
from pathlib import Path

import pytest

from broker.security.users import load_users
from tests.test_cli import TOPIARY, run, serving
from tests.test_users import make_users

WAIT = 20.0


def passwd(path: Path, *args: str, stdin: str = "pw\n") -> subprocess.CompletedProcess[str]:
    return run("passwd", str(path), *args, stdin=stdin)


def test_passwd_adds_a_user_from_stdin_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    done = passwd(path, "alice", "--group", "ops", "--group", "billing", stdin="s3cret\n")
    assert (done.returncode, done.stderr) == (0, f"added user 'alice' in {path}\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    alice = load_users(path)["alice"]
    assert alice.groups == frozenset({"ops", "billing"})
    assert alice.hash.verify(b"s3cret") and not alice.hash.verify(b"s3cret\n")
    assert "s3cret" not in path.read_text()


def test_passwd_keeps_other_users_and_a_changed_users_groups(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    assert passwd(path, "alice", "--group", "ops").returncode == 0
    assert passwd(path, "bob").returncode == 0
    changed = passwd(path, "alice", stdin="new\n")
    assert changed.stderr == f"changed user 'alice' in {path}\n"
    users = load_users(path)
    assert sorted(users) == ["alice", "bob"]
    assert users["alice"].groups == frozenset({"ops"})
    assert users["alice"].hash.verify(b"new")


def test_passwd_deletes_a_user_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    path = make_users(tmp_path / "users.toml", alice=("a", []), bob=("b", []))
    assert passwd(path, "bob", "--delete").returncode == 0
    assert sorted(load_users(path)) == ["alice"]
    missing = passwd(path, "bob", "--delete")
    assert (missing.returncode, missing.stderr) == (1, f"topiary passwd: no user 'bob' in {path}\n")


@pytest.mark.parametrize(
    ("args", "stdin", "problem"),
    [
        (["a/#"], "pw\n", "a user name must be"),
        (["alice", "--group", "a b"], "pw\n", "a group name must be"),
        (["alice"], "\n", "empty password; nothing changed"),
    ],
)
def test_passwd_refuses_bad_input_in_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], stdin: str, problem: str
) -> None:
    path = tmp_path / "users.toml"
    done = passwd(path, *args, stdin=stdin)
    assert done.returncode == 1 and problem in done.stderr
    assert done.stderr.count("\n") == 1
    assert not path.exists()


def test_passwd_refuses_to_edit_a_bad_users_file(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text("[users\n")
    done = passwd(path, "alice")
    assert done.returncode == 1
    assert done.stderr.startswith(f"topiary passwd: users file {path}: not valid TOML")
    assert path.read_text() == "[users\n"


def _wait_reading(pid: int, deadline: float) -> None:
    """Until process ``pid`` sleeps in a read (``/proc/PID/wchan``): an answer typed while
    getpass is still switching the terminal's echo off can be echoed, or lost."""
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/wchan") as handle:
            if handle.read() in ("wait_woken", "n_tty_read"):
                return
        time.sleep(0.001)  # a real process: poll its state (bounded) until it reads


def _talk(path: Path, answers: list[str]) -> tuple[int, str]:
    """``topiary passwd`` on a pseudo-terminal: answer each prompt; (status, what it said)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*TOPIARY, "passwd", str(path), "alice"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    said = b""
    deadline = time.monotonic() + WAIT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                chunk = os.read(leader, 1024)
            except OSError:  # the terminal closed: the process is done
                break
            if not chunk:
                break
            said += chunk
            if answers and said.rstrip().endswith(b":"):
                _wait_reading(proc.pid, deadline)
                os.write(leader, answers.pop(0).encode() + b"\n")
        return proc.wait(timeout=WAIT), said.decode(errors="replace")
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()


def test_passwd_asks_twice_on_a_terminal_without_echoing(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    status, said = _talk(path, ["hidden1", "hidden1"])
    assert status == 0, said
    assert "Password: " in said and "Password again: " in said
    assert "hidden1" not in said  # not echoed
    assert load_users(path)["alice"].hash.verify(b"hidden1")


def test_passwd_on_a_terminal_refuses_two_different_passwords(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    status, said = _talk(path, ["one", "two"])
    assert status == 1
    assert "the passwords differ; nothing changed" in said
    assert not path.exists()


def test_serve_stops_with_one_line_for_a_bad_users_file(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text('[users.alice]\nhash = "plain"\n')
    done = subprocess.run(
        [*TOPIARY, "serve", "--port", "0", "--users", str(path)],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        f"topiary serve: error: users file {path}: user 'alice': bad hash: "
        "not a scrypt$n=N,r=R,p=P$SALT$HASH string"
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("cli")
    users = make_users(directory / "users.toml", alice=("wonder", []))
    config = directory / "topiary.toml"
    config.write_text(f'[auth]\nusers = "{users}"\nfailure_delay = 0.05\n')
    with serving("--config", str(config)) as server:
        yield server


def test_client_commands_log_in_with_a_password_file(secured: str, tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("wonder\n")
    login = ["--username", "alice", "--password-file", str(secret)]
    assert run("pub", *login, "t/1", "x", "--confirm", server=secured).returncode == 0
    stats = run("stats", *login, server=secured)
    assert stats.returncode == 0 and '"logins": ' in stats.stdout


def test_client_commands_log_in_from_the_environment(secured: str) -> None:
    env = dict(os.environ, TOPIARY_SERVER=secured, TOPIARY_USERNAME="alice")
    for password, status in (("wonder", 0), ("wander", 1)):
        done = subprocess.run(
            [*TOPIARY, "sessions"],
            env={**env, "TOPIARY_PASSWORD": password},
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert done.returncode == status, done.stderr
    assert done.stderr == (
        "topiary sessions: refused by the broker: AUTH_FAILED: bad user name or password\n"
    )


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--username", "alice"], "user 'alice' needs a password"),
        (["--password-file", "/nonexistent/pw"], "cannot read password file /nonexistent/pw"),
    ],
)
def test_client_login_flags_that_cannot_work_are_usage_errors(
    args: list[str], problem: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPIARY_")}
    done = subprocess.run(
        [*TOPIARY, "stats", *args], env=env, capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 2 and problem in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_refused_anonymous_client_command_says_so_in_one_line(secured: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPIARY_")}
    done = subprocess.run(
        [*TOPIARY, "sub", "--server", secured, "t/>"],
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 1
    assert done.stderr == (
        "topiary sub: refused by the broker: AUTH_FAILED: anonymous access is off: "
        "log in with a user name and password\n"
    )
