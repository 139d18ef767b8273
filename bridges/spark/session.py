"""A SparkSession set up the way this project runs it: loopback only, this interpreter.

Executors start Python workers with PYSPARK_PYTHON; unless it is the interpreter that
runs the driver, they may not find topiary or confluent-kafka, and the failure ("Python
worker failed to connect back") hides the real ImportError in stderr. SPARK_LOCAL_IP keeps
Spark's own sockets on 127.0.0.1.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

#: Faster JVM start on small machines: the C1 compiler only, the serial collector. For tests
#: and short jobs only: without C2 the compiled topic mapping runs 2.5-3.5x slower in a long
#: run (docs/benchmarks.md, "Spark pipeline").
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class SparkUnavailable(RuntimeError):
    """pyspark, pyarrow or Java is missing; the message says which."""


def check_spark() -> None:
    """Raise SparkUnavailable with the reason when a local Spark cannot run here."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        missing = exc.name or str(exc)
        raise SparkUnavailable(f"{missing} is not installed (topiary[spark])") from None
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else None
    if not (java and os.access(java, os.X_OK)) and not _on_path("java"):
        raise SparkUnavailable("no Java runtime (java on PATH or JAVA_HOME)")


def _on_path(name: str) -> bool:
    import shutil

    return shutil.which(name) is not None


def build_session(
    master: str = "local[*]",
    *,
    app_name: str = "topiary-bridge",
    conf: Mapping[str, Any] | None = None,
    local: bool = True,
    fast_start: bool = False,
) -> Any:
    """Get or create the SparkSession; ``conf`` is passed through (it wins).

    ``fast_start`` gives the driver JVM FAST_JVM: seconds less to start, much slower once
    running, so only tests ask for it.
    """
    check_spark()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings: dict[str, Any] = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "1" if master.startswith("local") else "200",
        "spark.sql.chunkBase64String.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if local:
        settings |= {
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
        }
    if fast_start:
        settings["spark.driver.extraJavaOptions"] = FAST_JVM
    settings |= dict(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
