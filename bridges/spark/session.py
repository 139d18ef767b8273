"""A SparkSession set up the way this project runs it: loopback only, this interpreter.

Executors start Python workers with PYSPARK_PYTHON; unless it is the interpreter that
runs the driver, they may not find topiary or confluent-kafka, and the failure ("Python
worker failed to connect back") hides the real ImportError in stderr. SPARK_LOCAL_IP keeps
Spark's own sockets on 127.0.0.1. For a pip-installed PySpark, SPARK_HOME is pointed at a
linked copy of its home without the source zips, so workers import PySpark compiled
(bridges/spark/sparkhome.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from bridges.spark.classcache import ClassCache
from bridges.spark.sparkhome import use_compiled_pyspark

#: Faster JVM start on small machines: the C1 compiler only, the serial collector. For tests,
#: short jobs and restarts that must be quick: without C2 the compiled topic mapping alone
#: runs 2.5-3.5x slower, the whole local pipeline ~10% (docs/benchmarks.md, "Spark
#: pipeline").
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
    class_cache: ClassCache | None = None,
) -> Any:
    """Get or create the SparkSession; ``conf`` is passed through (it wins).

    ``fast_start`` gives the driver JVM FAST_JVM: seconds less to start, much slower once
    running, so only tests ask for it. ``class_cache`` adds its JVM options to
    ``spark.driver.extraJavaOptions`` (after conf's own); stop with :func:`stop_session` so
    the archive a first run writes is put in place.
    """
    check_spark()
    use_compiled_pyspark()
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
        # Rows per Arrow batch handed to the sink's Python worker (default 10,000): a
        # query's first rows reach the broker sooner (first delivery ~0.5 s earlier on 2
        # cores), with no steady cost measured (docs/benchmarks.md).
        "spark.sql.execution.arrow.maxRecordsPerBatch": "2000",
    }
    if local:
        settings |= {
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
        }
    if fast_start:
        settings["spark.driver.extraJavaOptions"] = FAST_JVM
    settings |= dict(conf or {})
    if class_cache is not None:
        java = " ".join(
            part
            for part in (
                str(settings.get("spark.driver.extraJavaOptions", "")),
                class_cache.prepare(),
            )
            if part
        )
        if java:
            settings["spark.driver.extraJavaOptions"] = java
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


#: How long stop_session waits for the driver JVM to exit (writing the class cache included).
JVM_EXIT_TIMEOUT = 120.0


def stop_session(spark: Any, class_cache: ClassCache | None = None) -> int | None:
    """Stop the session and its driver JVM, and return the JVM's exit status.

    Without this the JVM exits only after Python does (it watches its stdin), too late to
    put a newly written class cache in place. None: no local JVM, or it had to be killed.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    status: int | None = None
    if proc is not None:
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
        if proc.stdin is not None:
            proc.stdin.close()  # the JVM's cue to exit
        try:
            status = proc.wait(JVM_EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if class_cache is not None:
        class_cache.finish(status)
    return status
