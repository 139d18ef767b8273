"""Every benchmark answers ``--help``: the first thing an operator runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchrun import ROOT

SCRIPTS = sorted(
    p for p in (ROOT / "bench").glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_prints_usage_and_exits_zero(script) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")
