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


def broker_notes(tag: str, result: dict[str, Any]) -> list[str]:
    """Notes for a report on a broker run's ``broker_log_summary`` (``scan_log``) and
    ``broker_stop``: problem lines in its log, and a stop that was not clean."""
    notes = []
    summary = result.get("broker_log_summary", {})
    if summary.get("problem_count"):
        notes.append(
            f"{tag}: broker log has {summary['problem_count']} warning/error/non-JSON "
            f"lines, first: {summary['problems'][0][:200]}"
        )
    stop = result.get("broker_stop", {})
    if stop.get("killed") or stop.get("exit_status") not in (0, None):
        notes.append(f"{tag}: broker stop: {stop}")
    return notes
