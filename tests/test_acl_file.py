"""The topic ACL file: every mistake is one line naming the file, the rule and the problem,
at start-up of a real ``topiary serve`` too; SIGHUP reloads it in a running process."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from broker.config import ConfigError, build_config
from broker.security.acl_file import load_policy
from routing.acl import PUBLISH, SUBSCRIBE
from tests.test_cli import TOPIARY, free_port, run, wait_listening

ISSUE_EXAMPLE = """
[[rule]]
who = "*"
allow = ["subscribe", "publish"]
filter = "user/%u/#"
dialect = "mqtt"

[[rule]]
who = "user:billing"
deny = ["subscribe"]
filter = "beacon/*/*/*/admin/>"
"""


def test_the_issues_example_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(ISSUE_EXAMPLE)
    policy = load_policy(path)
    first, second = policy.rules
    assert (first.who, first.allow, first.dialect) == ("*", {SUBSCRIBE, PUBLISH}, "mqtt")
    assert (second.who, second.deny, second.dialect) == ("user:billing", {SUBSCRIBE}, "native")


def test_the_acl_table_of_the_config_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "topiary.toml"
    config.write_text('[acl]\nfile = "acl.toml"\n')
    assert build_config(config).acl_file == "acl.toml"


GOOD = 'who = "*"\nallow = ["publish"]\nfilter = "a/>"\n'


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (
            'who = "*"\nallow = ["publish"]\nfilter = "a/>"\ncolour = "red"\n',
            "unknown key 'colour'",
        ),
        ('who = "bob"\nallow = ["publish"]\nfilter = "a/>"\n', "who must be"),
        ('who = "*"\nallow = ["read"]\nfilter = "a/>"\n', "allow may hold"),
        ('who = "*"\nallow = "publish"\nfilter = "a/>"\n', "allow must be a list"),
        ('who = "*"\nfilter = "a/>"\n', "allow and deny are empty"),
        ('who = "*"\nallow = ["publish"]\nfilter = "a/>/b"\n', "'>' must be the last level"),
        ('who = "*"\nallow = ["publish"]\nfilter = "a/#/b"\ndialect = "mqtt"\n', "'#' must be"),
        ('who = "*"\nallow = ["publish"]\nfilter = "a"\ndialect = "amqp"\n', "dialect must be"),
        ('who = "*"\nallow = ["publish"]\n', "filter is missing"),
        ('allow = ["publish"]\nfilter = "a"\n', "who is missing"),
    ],
)
def test_a_bad_rule_is_one_line_naming_the_file_the_rule_and_the_problem(
    tmp_path: Path, body: str, problem: str
) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(f"[[rule]]\n{GOOD}\n[[rule]]\n{body}")
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: rule 2: ")
    assert problem in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [("rule = 3\n", "array of tables"), ("[rules]\n", "unknown key 'rules'"), ("[[rule\n", "TOML")],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem) as caught:
        load_policy(path)
    assert str(path) in str(caught.value)


def test_a_missing_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read") as caught:
        load_policy(tmp_path / "nowhere.toml")
    assert "nowhere.toml" in str(caught.value)


def test_a_bad_acl_file_stops_serve_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "acl.toml").write_text('[[rule]]\nwho = "*"\nallow = ["fly"]\nfilter = "a"\n')
    config = tmp_path / "topiary.toml"
    config.write_text(f'[acl]\nfile = "{tmp_path / "acl.toml"}"\n')
    result = run("serve", "--port", str(free_port()), "--config", str(config))
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert "acl.toml: rule 1: allow may hold" in line
    assert "Traceback" not in result.stderr


def test_sighup_reloads_the_rules_of_a_running_serve(tmp_path: Path) -> None:
    acl = tmp_path / "acl.toml"
    acl.write_text('[[rule]]\nwho = "*"\nallow = ["publish"]\nfilter = "open/>"\n')
    config = tmp_path / "topiary.toml"
    config.write_text(f'[acl]\nfile = "{acl}"\n')
    port = free_port()
    proc = subprocess.Popen(
        [*TOPIARY, "serve", "--port", str(port), "--config", str(config)],
        stderr=subprocess.DEVNULL,
    )
    server = f"127.0.0.1:{port}"
    try:
        wait_listening(port, proc)
        assert run("pub", "open/x", "1", "--confirm", server=server).returncode == 0
        acl.write_text('[[rule]]\nwho = "*"\nallow = ["publish"]\nfilter = "other/>"\n')
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:  # the signal is handled by the broker's loop: poll, bounded
            result = run("pub", "open/x", "2", "--confirm", server=server)
            if result.returncode != 0:
                break
            assert time.monotonic() < deadline, "the new rules never took effect"
        assert "NOT_AUTHORIZED" in result.stderr
        assert run("pub", "other/x", "3", "--confirm", server=server).returncode == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
