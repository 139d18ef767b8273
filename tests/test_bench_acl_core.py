"""Smoke test for bench/acl_core.py: it runs at its ``--quick`` size in a subprocess and reports
every case, each round having delivered every message (timings are not judged here)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

from bench import acl_core as acl  # noqa: E402
from tests.benchrun import run_quick  # noqa: E402


def test_quick_run_reports_each_case_against_no_acls(tmp_path: Path) -> None:
    process, report = run_quick(ROOT / "bench" / "acl_core.py", tmp_path / "acl_core.json")
    assert process.returncode == 0
    assert report["benchmark"] == "acl_core"
    assert report["parameters"]["counts"] == acl.QUICK
    rows = report["results"]
    assert [row["case"] for row in rows] == list(acl.CASES)
    assert rows[0]["ratio"] == 1.0
    for row in rows:
        assert row["deliveries_per_s"] > 0
        assert len(row["rounds"]) == acl.QUICK["rounds"]
