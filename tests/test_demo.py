"""``make demo`` keeps working: the whole picture runs and every subscriber gets its slice."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bridges.tansu import TansuUnavailable, tansu_binary
from tests.benchrun import ROOT


def test_the_demo_runs_end_to_end_and_every_subscriber_gets_what_it_wanted() -> None:
    try:
        tansu_binary()
    except TansuUnavailable as exc:
        pytest.skip(f"Tansu not available: {exc}")
    result = subprocess.run(
        [sys.executable, "-m", "bridges.demo", "--seconds", "1", "--rate", "1000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "message economy" in out
    assert "(expected" not in out, out  # a subscriber got more or fewer than it wanted
    assert "sent to the dead-letter topic" in out
    forwarded = int(out.split("forwarded to the broker")[1].split()[0])
    assert forwarded > 0
