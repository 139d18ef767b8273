"""The driver JVM's class data sharing (CDS) archive, kept between runs of the bridge.

Why: most of the Spark driver's start-up is the JVM loading and verifying ~15,000 classes
from Spark's jars, cold, on every start (measured on 2 cores: ~9 of ~19 CPU seconds up to the
first micro-batch, docs/benchmarks.md). HotSpot can dump the classes a run loaded into an
archive when it exits (``-XX:ArchiveClassesAtExit``) and map that archive at the next start
(``-XX:SharedArchiveFile``) instead of loading the classes again.

How: one archive per (Java runtime, Spark jars, extra class path), named by a hash of those,
in a cache directory (default ``$XDG_CACHE_HOME/topiary/spark``). A start that finds the
archive uses it. A start that does not find it, and finds no live process already writing
it, takes a lock file and asks its JVM to write the archive to a temporary name at exit; once
that JVM has exited cleanly, :meth:`ClassCache.finish` renames the file into place, so a
reader never sees half an archive. A driver killed before it exits leaves a stale lock and
maybe a partial temporary file: the next start removes both and writes again.

A JVM that cannot use an archive (another runtime, changed jars: the hash should have caught
that; a damaged file) starts without it, silently on Java 17 (``-Xlog:cds`` says why); delete
the directory to start over. The archive is big
(~150-170 MB) and written once: the first clean exit takes some seconds longer.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from broker.log import get_logger

log = get_logger("topiary.bridge.spark")

#: HotSpot prints a warning for every class it cannot archive (signed jars, old class
#: files): hundreds of lines that say nothing an operator can act on. Errors still show.
_QUIET = "-Xlog:cds=error -Xlog:cds+dynamic=error"


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "topiary" / "spark"


def runtime_key(extra_class_path: str = "") -> str:
    """A hash of what an archive depends on: the java binary, Spark's jars, the class path."""
    from pyspark import __version__ as pyspark_version
    from pyspark.find_spark_home import _find_spark_home

    digest = hashlib.sha256()
    java = _java_binary()
    for path in [java] if java else []:
        stat = os.stat(path)
        digest.update(f"java {path} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    digest.update(f"pyspark {pyspark_version}\n".encode())
    jars = Path(_find_spark_home()) / "jars"
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"jar {jar.name} {jar.stat().st_size}\n".encode())
    digest.update(f"classpath {extra_class_path}\n".encode())
    return digest.hexdigest()[:16]


def _java_binary() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class ClassCache:
    """One driver start's view of the cache: use the archive, write it, or neither."""

    directory: Path
    key: str
    writable: bool = True  # False: map an archive that is there, never write one
    mode: str = "off"  # "use" | "write" | "off", set by prepare()

    @property
    def archive(self) -> Path:
        return self.directory / f"spark-{self.key}.jsa"

    @property
    def _lock(self) -> Path:
        return self.directory / f"spark-{self.key}.lock"

    @property
    def _partial(self) -> Path:
        return self.directory / f"spark-{self.key}.{os.getpid()}.tmp"

    def prepare(self) -> str:
        """Decide, and return the JVM options for it ("" when the cache stays out of it)."""
        if self.archive.is_file() and self.archive.stat().st_size > 0:
            self.mode = "use"
            log.info("class cache: using", archive=str(self.archive))
            return f"-XX:SharedArchiveFile={self.archive}"
        if not self.writable:
            self.mode = "off"
            return ""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not self._take_lock():
                self.mode = "off"
                return ""
        except OSError as exc:
            log.warning("class cache: not writable, starting without it", error=str(exc))
            self.mode = "off"
            return ""
        self.mode = "write"
        log.info("class cache: the JVM writes it at exit", archive=str(self.archive))
        return f"-XX:ArchiveClassesAtExit={self._partial} {_QUIET}"

    def finish(self, jvm_exit_status: int | None) -> bool:
        """After the driver JVM exited: put the archive in place if it wrote one whole."""
        if self.mode != "write":
            return False
        partial, written = self._partial, False
        try:
            if jvm_exit_status == 0 and partial.is_file() and partial.stat().st_size > 0:
                os.replace(partial, self.archive)
                written = True
                log.info("class cache: written", archive=str(self.archive),
                         mb=round(self.archive.stat().st_size / 1e6))  # fmt: skip
            else:
                log.warning("class cache: the JVM wrote no archive", status=jvm_exit_status)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
            with contextlib.suppress(FileNotFoundError):
                self._lock.unlink()
            self.mode = "off"
        return written

    def _take_lock(self) -> bool:
        """True when this process may write the archive (no live writer holds the lock)."""
        for _attempt in range(2):
            try:
                fd = os.open(self._lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _lock_holder(self._lock)
                if holder is not None and _alive(holder):
                    log.info("class cache: another process is writing it", pid=holder)
                    return False
                self._remove_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return True
        return False

    def _remove_stale(self) -> None:
        """A writer that died: its lock and whatever part of an archive it left."""
        for path in [self._lock, *self.directory.glob(f"spark-{self.key}.*.tmp")]:
            pid = _tmp_pid(path)
            if pid is not None and _alive(pid):
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def _lock_holder(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


def _tmp_pid(path: Path) -> int | None:
    """The writer's pid in ``spark-<key>.<pid>.tmp``; None for the lock file."""
    parts = path.name.split(".")
    return int(parts[1]) if len(parts) == 3 and parts[2] == "tmp" and parts[1].isdigit() else None


def class_cache(
    directory: str | Path | None, extra_class_path: str = "", *, writable: bool = True
) -> ClassCache | None:
    """The cache for this runtime in ``directory`` (None: the default place; "": none)."""
    if directory == "":
        return None
    path = Path(directory).expanduser() if directory is not None else default_directory()
    return ClassCache(path, runtime_key(extra_class_path), writable)
