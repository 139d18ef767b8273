"""Smoke test for bench/fanout_replay.py: it runs at its ``--quick`` size in a subprocess, and
its JSON says topiary's replay delivered exactly the copies the reference relay delivered,
nothing dropped (timings are not judged here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.benchrun import run_quick

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "fanout_replay.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "fanout_replay.json")


def test_quick_run_delivers_what_the_relay_delivers(quick_run: tuple) -> None:
    process, report = quick_run
    assert report["benchmark"] == "fanout_replay"
    [result] = report["results"]
    topiary, relay = result["topiary"], result["relay"]
    assert topiary["deliveries"] == relay["deliveries"] > result["messages"]
    assert topiary["dropped"] == 0
    assert topiary["us_per_message_min"] > 0 and relay["us_per_message_min"] > 0
    assert "| 1,000 | topiary |" in process.stdout
