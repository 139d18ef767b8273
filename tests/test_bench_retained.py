"""Smoke test for bench/retained.py: it runs at its ``--quick`` size in a subprocess, and its
JSON has the promised shape and says every subscription got exactly its retained set
(timings are not judged here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

from bench import retained  # noqa: E402
from tests.benchrun import run_quick  # noqa: E402

SCRIPT = ROOT / "bench" / "retained.py"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "retained.json")


def test_quick_run_writes_a_row_per_answer_with_both_timings(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "retained"
    assert {"python", "platform", "cpu_count"} <= report["machine"].keys()
    assert report["parameters"]["quick"] is True
    rows = report["results"]
    assert [(r["size"], r["answer"]) for r in rows] == [
        (size, answer) for size in retained.QUICK_SIZES for answer in retained.QUICK_ANSWERS
    ]
    for row in rows:
        assert row["core_us"] > 0 and row["e2e_ms"] > 0
        assert 1 <= row["e2e_runs"] <= retained.QUICK["repeats"]


def test_quick_run_delivers_exactly_each_retained_set(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["correct"] is True
    assert all(row["correct"] for row in report["results"])


def test_quick_run_prints_a_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["retained"])
    for column in ("answer", "core us", "e2e ms", "correct"):
        assert column in lines[header]
    assert lines[header + 2].split()[-1] == "yes"
