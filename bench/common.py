"""What every benchmark reports about the machine it ran on."""

from __future__ import annotations

import os
import platform
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
