"""What a broker's JSON log says went wrong: levels, problems, "closing" events.

Benchmarks scan the log afterwards rather than trusting the exit status: a broker can
log a traceback and go on serving, and that belongs in the report.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def scan_log(path: Path) -> dict[str, Any]:
    """Levels, warnings/errors/tracebacks and "closing" events in the broker's log."""
    levels: Counter[str] = Counter()
    closing: Counter[str] = Counter()
    problems: list[str] = []
    problem_count = 0
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return {"error": str(exc)}
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            levels["(not json)"] += 1
            problem_count += 1
            if len(problems) < 12:
                problems.append(line[:400])
            continue
        level = str(record.get("level", "?"))
        levels[level] += 1
        if record.get("event") == "closing":
            closing[str(record.get("code"))] += 1
        if level in ("warning", "error", "critical", "exception"):
            problem_count += 1
            if len(problems) < 12:
                problems.append(line[:400])
    return {
        "lines": len(lines),
        "levels": dict(levels),
        "closing": dict(closing),
        "problem_count": problem_count,
        "problems": problems,
    }
