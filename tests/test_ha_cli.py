"""``topiary witness`` as a real process, and [ha] in a broker's config."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from broker.config import ConfigError, build_config
from broker.ha.client import connect_witness
from broker.ha.messages import OK, REFUSED, Renew, Vote
from tests.test_cli import TOPIARY, free_port, run, wait_listening

LEASE = "0.3"


def _start(data_dir: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*TOPIARY, "witness", "--port", str(port), "--data-dir", str(data_dir),
         "--lease", LEASE, "--log-format", "json", *extra],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    wait_listening(port, proc)
    return proc


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    return stderr


async def _ask(port: int, request: Renew | Vote) -> tuple[str, int, float]:
    client = await connect_witness("127.0.0.1", port, b"s")
    with trio.fail_after(5):
        answer = await client.ask(request)
    await client.aclose()
    return answer.verdict, answer.term, answer.wait


def test_the_witness_keeps_its_term_across_a_restart_and_waits_a_lease_before_voting(
    tmp_path: Path,
) -> None:
    port = free_port()
    proc = _start(tmp_path, port, "--secret", "s")
    try:
        verdict, _, wait = trio.run(_ask, port, Vote(1, "a"))
        if verdict == REFUSED:  # still inside the first lease after start
            trio.run(trio.sleep, wait)
            verdict, _, _ = trio.run(_ask, port, Vote(1, "a"))
        assert verdict == OK
    finally:
        stopped = _stop(proc)
    assert json.loads(stopped.strip().splitlines()[-1])["votes_granted"] == 1
    proc = _start(tmp_path, port, "--secret", "s")
    try:
        assert trio.run(_ask, port, Renew(1, "a"))[:2] == (OK, 1)  # term 1 and a remembered
        verdict, term, wait = trio.run(_ask, port, Vote(2, "b"))
        assert (verdict, term) == (REFUSED, 1) and wait > 0  # the restart's lease wait
    finally:
        _stop(proc)


def test_a_corrupt_term_file_stops_the_witness_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "witness-term").write_text('{"term": 7, "primary": "a", "crc32": 12}\n')
    result = run("witness", "--port", str(free_port()), "--data-dir", str(tmp_path),
                 "--secret", "s")  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "witness-term: corrupt" in result.stderr


def test_the_witness_reads_its_secret_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "witness.toml"
    config.write_text('[ha]\nsecret = "s"\nlease = 0.3\n')
    port = free_port()
    proc = _start(tmp_path / "data", port, "--config", str(config))
    try:
        assert trio.run(_ask, port, Renew(0, "a"))[0] == "stale"  # authenticated, answered
    finally:
        _stop(proc)


def test_a_config_without_the_secret_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "witness.toml"
    config.write_text("[ha]\nlease = 0.3\n")
    result = run("witness", "--data-dir", str(tmp_path), "--config", str(config))
    assert result.returncode == 2 and "[ha] secret is required" in result.stderr


HA = 'role = "primary"\npartner = "127.0.0.1:7475"\nwitness = "127.0.0.1:7480"\nsecret = "s"\n'


def test_serve_with_a_corrupt_ha_term_file_stops_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path}"\n[ha]\n{HA}')
    (tmp_path / "ha-term").write_text('{"me": "b-1", "term": 3, "primary": null, "crc32": 1}\n')
    result = run("serve", "--port", str(free_port()), "--config", str(config))
    assert result.returncode == 2
    assert "ha-term: corrupt" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_ha_keys_are_read_with_their_defaults(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path}"\n[ha]\n{HA}')
    cfg = build_config(config)
    assert cfg.ha_configured and cfg.ha_role == "primary" and cfg.ha_sync is True
    assert (cfg.ha_lease, cfg.ha_failure_timeout) == (1.0, 0.6)
    assert not build_config().ha_configured


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        (HA.replace('"primary"', '"leader"'), 'ha role must be "primary" or "standby"'),
        (HA.replace('partner = "127.0.0.1:7475"\n', ""), "ha partner is required"),
        (HA.replace("127.0.0.1:7480", "nowhere"), "ha witness must be HOST:PORT"),
        (HA.replace('secret = "s"\n', ""), "ha secret is required"),
        (HA + "lease = 0\n", "ha lease must be in (0, 3600] seconds"),
        (HA + "lease = 3.0\nfailure_timeout = 0.5\n", "failure_timeout must be more than"),
        (HA + 'sync = "yes"\n', "ha_sync must be bool"),
        (HA + "ttl = 3\n", "unknown key 'ttl' in [ha]"),
        (HA + "link_port = 0\n", "ha link_port must be a port (1-65535)"),
        (HA + "partner_link_port = 70000\n", "ha partner_link_port must be a port (1-65535)"),
        (HA + 'failover = "auto"\n', 'ha failover must be "witness" or "manual"'),
        ("lease = 0.5\n", "ha role must be"),  # any [ha] key makes the four needed
    ],
)
def test_bad_ha_keys_are_one_line_errors(tmp_path: Path, keys: str, problem: str) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f'[server]\ndata_dir = "{tmp_path}"\n[ha]\n{keys}')
    with pytest.raises(ConfigError, match=re.escape(problem)):
        build_config(config)


def test_ha_needs_a_data_dir(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text(f"[ha]\n{HA}")
    with pytest.raises(ConfigError, match="needs server data_dir"):
        build_config(config)
