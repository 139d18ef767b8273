"""Smoke test for bench/tls.py: it runs at its ``--quick`` size in a subprocess (a real
``topiary serve``, certificates from openssl), and its JSON and table have the promised
shape, every fan-out delivery correct (timings are not judged here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

from bench import tls  # noqa: E402
from tests.benchrun import run_quick  # noqa: E402

SCRIPT = ROOT / "bench" / "tls.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "tls.json")


def test_quick_run_measures_each_workload_plain_and_tls(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "tls"
    assert report["parameters"]["quick"] is True
    assert report["parameters"]["counts"] == tls.QUICK
    rows = report["results"]
    assert [row["workload"] for row in rows] == ["fanout", "sequential", "concurrent"]
    for row in rows:
        assert row["plain"] > 0 and row["tls"] > 0
        assert row["ratio"] == pytest.approx(row["tls"] / row["plain"])
        assert [len(row["runs"][mode]) for mode in tls.MODES] == [tls.QUICK["repeats"]] * 2


def test_quick_run_delivers_every_message_to_every_subscriber(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["correct"] is True


def test_quick_run_prints_a_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["workload"])
    for column in ("plain", "tls", "tls/plain", "correct"):
        assert column in lines[header]
    assert lines[header + 2].split()[0] == "fanout"
    assert lines[header + 2].split()[-1] == "yes"
