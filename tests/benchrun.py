"""Running a benchmark script the way an operator would, for the smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_quick(
    script: Path, json_path: Path, *extra: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """``python SCRIPT --quick --json PATH [EXTRA...]``: the process and the JSON it wrote."""
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(json_path), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, json.loads(json_path.read_text())
