"""What every benchmark reports: the machine it ran on, figures as table cells, how it ends.

One place for the report's shape, so that every benchmark's table, JSON and last lines
read alike and the smoke tests can check them the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any


def arg_parser(doc: str, quick: str = "tiny counts (CI smoke test)") -> argparse.ArgumentParser:
    """A benchmark's command line, described by the first line of its docstring ``doc``, with
    the options every benchmark has: ``--quick`` (``quick`` says what it does) and ``--json``."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", metavar="PATH", help="write all figures as JSON to PATH")
    return parser


def machine_info(**extra: Any) -> dict[str, Any]:
    """Python, platform and CPU count, plus ``extra`` (library versions): figures mean
    little without the machine they came from."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        **extra,
    }


def file_system(path: Path) -> str | None:
    """The type of the file system holding ``path`` (ext4, tmpfs, ...): the longest mount
    point in /proc/self/mounts that contains it. Storage benchmarks depend on it."""
    target = str(path.resolve())
    best, kind = "", None
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1]
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return None
    return kind


def print_ending(report: dict[str, Any], shown: Callable[[Any], str] = str) -> None:
    """The lines a benchmark ends with: load and total time, a line per goal, the notes."""
    load = " ".join(f"{x:.2f}" for x in report["load_average_end"])
    print(f"load average at end {load}; total {report['elapsed_seconds']:.1f} s")
    print()
    for goal in report["goals"]:
        note = f" ({goal['note']})" if "note" in goal else ""
        print(f"check  {goal['status']:<12} {goal['goal']}: {shown(goal['value'])}{note}")
    if report.get("notes"):
        print()
        for line in report["notes"]:
            print(f"note   {line}")


def write_report(
    report: dict[str, Any], path: str | Path | None, *, sort_keys: bool = True
) -> None:
    """The report as JSON at ``path`` (--json), if one was given; its directory is made if
    need be. ``sort_keys=False`` keeps the report's own key order."""
    if path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, sort_keys=sort_keys) + "\n")


def goal_line(goal: str, value: Any, met: bool | None) -> dict[str, Any]:
    """One entry of a report's "goals": PASS, FAIL, or "not measured" when ``met`` is None."""
    status = "not measured" if met is None else ("PASS" if met else "FAIL")
    return {"goal": goal, "value": value, "status": status}


class Goals(list[dict[str, Any]]):
    """A report's "goals", in the order they were added."""

    def add(self, goal: str, value: Any, met: bool | None) -> None:
        self.append(goal_line(goal, value, met))


def percentile(ordered: list[int], q: float) -> int:
    """Nearest-rank percentile of a sorted list."""
    rank = max(1, math.ceil(len(ordered) * q))
    return ordered[min(len(ordered), rank) - 1]


def fmt(value: Any, spec: str = ",") -> str:
    """A table cell: ``value`` formatted by ``spec``, or "-" when it was not measured."""
    if value is None:
        return "-"
    return format(value, spec)


def format_columns(rows: list[dict[str, Any]], columns: tuple[tuple[str, str, str], ...]) -> str:
    """Rows as a right-aligned text table: ``columns`` are (header, key, format spec); a
    "correct" key shows yes/NO, an empty spec ``str``."""
    cells = [
        [
            ("yes" if row[key] else "NO")
            if key == "correct"
            else fmt(row[key], spec)
            if spec
            else str(row[key])
            for _header, key, spec in columns
        ]
        for row in rows
    ]
    headers = [header for header, _key, _spec in columns]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
