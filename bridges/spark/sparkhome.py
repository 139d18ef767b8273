"""A SPARK_HOME whose Python workers import PySpark compiled, not from Spark's source zip.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on every Python
worker's path. For a pip-installed PySpark that zip holds only ``.py`` files, so every
worker process compiles the PySpark modules it imports from source, about 0.6 CPU seconds
each time (measured: importing one data source worker module takes 0.86-1.05 s from the zip,
0.20-0.22 s from the installed package). A streaming query starts a daemon and workers for
each of Spark's Python planners and for the tasks, so on 2 cores this was 4-5 s of the first
micro-batch.

The fix keeps Spark as it is and changes only where it looks: a directory that links to
everything in the installed PySpark's home except ``python/``. Spark's launcher and jars are
the same files; the workers' zip entries point at nothing, Python skips them, and PySpark
comes from the installed package, whose bytecode is cached like any other. Only for a
pip-installed PySpark and only when the user has not set SPARK_HOME: a real Spark
distribution (a cluster's) is left alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from broker.log import get_logger

log = get_logger("topiary.bridge.spark")

#: What the linked home leaves out: the source zips the workers would import from.
LEFT_OUT = "python"


def installed_spark_home() -> Path | None:
    """The installed PySpark's own home (its package directory), or None when SPARK_HOME is
    set by the user or PySpark's home is not the package (a Spark distribution)."""
    if os.environ.get("SPARK_HOME"):
        return None
    try:
        import pyspark
    except ImportError:
        return None
    package = Path(pyspark.__file__).resolve().parent
    if not (package / "jars").is_dir() or not (package / LEFT_OUT / "lib").is_dir():
        return None
    return package


def linked_home(real: Path, base: Path) -> Path:
    """``base/<hash>``: links to every entry of ``real`` but ``python/``. Built once in a
    scratch directory and renamed into place; a stale or tampered one is rebuilt."""
    entries = sorted(p.name for p in real.iterdir() if p.name != LEFT_OUT)
    digest = hashlib.sha256("\n".join([str(real), *entries]).encode()).hexdigest()[:16]
    home = base / digest
    if _intact(home, real, entries):
        return home
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=base))
    try:
        for name in entries:
            (scratch / name).symlink_to(real / name)
        if (home.exists() or home.is_symlink()) and not _intact(home, real, entries):
            _remove(home)  # stale or tampered (a concurrent start's good copy is kept)
        try:
            scratch.rename(home)
        except OSError:
            if not _intact(home, real, entries):  # not a concurrent start's good copy
                raise
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
    return home


def _intact(home: Path, real: Path, entries: list[str]) -> bool:
    if home.is_symlink() or not home.is_dir():
        return False
    found = sorted(p.name for p in home.iterdir())
    return found == entries and all(
        (home / name).is_symlink() and os.readlink(home / name) == str(real / name)
        for name in entries
    )


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path)


def default_base() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "topiary" / "spark-home"


def use_compiled_pyspark(base: Path | None = None) -> Path | None:
    """Point SPARK_HOME at a linked home (see the module docstring); the home, or None when
    it does not apply or cannot be made (then Spark runs as it would have, only slower)."""
    real = installed_spark_home()
    if real is None:
        return None
    try:
        home = linked_home(real, base or default_base())
    except OSError as exc:
        log.warning("spark: workers will import PySpark from its zip", error=str(exc))
        return None
    os.environ["SPARK_HOME"] = str(home)
    return home
