"""What every benchmark reports about the machine it ran on."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine_info(**extra: Any) -> dict[str, Any]:
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
