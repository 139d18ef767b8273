"""The driver JVM's class cache: who writes the archive, who uses it, what a crash leaves.

Most of these drive the bookkeeping around the JVM's own options without a JVM. The last
two hand those options to a real JVM the way a driver gets them: through ``spark-submit`` and
``spark.driver.extraJavaOptions``, with Spark's own launcher on Spark's class path (its
``--version``: ~2 s, where a whole driver writing its archive takes 10 s more at exit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from bridges.spark.classcache import ClassCache, class_cache, default_directory, runtime_key
from bridges.spark.session import SparkUnavailable, check_spark


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def written_by_jvm(cache: ClassCache, options: str) -> Path:
    """What the JVM does at a clean exit: write the archive where the option says."""
    prefix = "-XX:ArchiveClassesAtExit="
    path = Path(next(o for o in options.split() if o.startswith(prefix))[len(prefix) :])
    path.write_bytes(b"archive")
    return path


def test_a_first_start_asks_the_jvm_to_write_the_archive_at_exit(tmp_path: Path) -> None:
    cache = ClassCache(tmp_path / "cache", "k1")
    options = cache.prepare()
    assert cache.mode == "write"
    partial = written_by_jvm(cache, options)
    assert partial.parent == tmp_path / "cache" and partial != cache.archive
    assert not cache.archive.exists(), "never under the final name while it is written"


def test_a_clean_exit_puts_the_archive_in_place_and_the_next_start_uses_it(
    tmp_path: Path,
) -> None:
    cache = ClassCache(tmp_path, "k1")
    partial = written_by_jvm(cache, cache.prepare())
    assert cache.finish(0)
    assert cache.archive.read_bytes() == b"archive"
    assert not partial.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [cache.archive.name], "lock left"
    following = ClassCache(tmp_path, "k1")
    assert following.prepare() == f"-XX:SharedArchiveFile={cache.archive}"
    assert following.mode == "use"


@pytest.mark.parametrize("status", [1, None])
def test_a_failed_jvm_leaves_no_archive_and_no_lock(tmp_path: Path, status: int | None) -> None:
    cache = ClassCache(tmp_path, "k1")
    written_by_jvm(cache, cache.prepare())
    assert not cache.finish(status)
    assert list(tmp_path.iterdir()) == []


def test_an_exit_without_a_written_file_leaves_nothing(tmp_path: Path) -> None:
    cache = ClassCache(tmp_path, "k1")
    cache.prepare()
    assert not cache.finish(0)
    assert list(tmp_path.iterdir()) == []


def test_while_one_process_writes_another_start_stays_out_of_the_cache(tmp_path: Path) -> None:
    writer = ClassCache(tmp_path, "k1")
    writer.prepare()
    other = ClassCache(tmp_path, "k1")
    # The lock names this (live) process: a second start neither writes nor waits.
    assert other.prepare() == ""
    assert other.mode == "off"
    assert not other.finish(0)
    assert writer.mode == "write" and (tmp_path / "spark-k1.lock").exists()


def test_a_killed_writers_lock_and_partial_archive_are_cleared(tmp_path: Path) -> None:
    pid = dead_pid()
    (tmp_path / "spark-k1.lock").write_text(str(pid))
    (tmp_path / f"spark-k1.{pid}.tmp").write_bytes(b"half an arch")
    cache = ClassCache(tmp_path, "k1")
    options = cache.prepare()
    assert cache.mode == "write"
    assert not (tmp_path / f"spark-k1.{pid}.tmp").exists()
    assert (tmp_path / "spark-k1.lock").read_text() == str(os.getpid())
    written_by_jvm(cache, options)
    assert cache.finish(0)


def test_a_read_only_cache_maps_an_archive_but_never_writes_one(tmp_path: Path) -> None:
    reader = ClassCache(tmp_path, "k1", writable=False)
    assert reader.prepare() == "" and reader.mode == "off"
    assert list(tmp_path.iterdir()) == [], "no lock taken"
    writer = ClassCache(tmp_path, "k1")
    written_by_jvm(writer, writer.prepare())
    writer.finish(0)
    assert reader.prepare() == f"-XX:SharedArchiveFile={writer.archive}"


def test_an_empty_archive_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "spark-k1.jsa").write_bytes(b"")
    cache = ClassCache(tmp_path, "k1")
    assert cache.prepare().startswith("-XX:ArchiveClassesAtExit=")


def test_an_unwritable_directory_means_starting_without_the_cache(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = ClassCache(blocker / "cache", "k1")
    assert cache.prepare() == ""
    assert cache.mode == "off"


def test_archives_of_different_keys_do_not_meet(tmp_path: Path) -> None:
    one = ClassCache(tmp_path, "k1")
    written_by_jvm(one, one.prepare())
    one.finish(0)
    other = ClassCache(tmp_path, "k2")
    assert other.prepare().startswith("-XX:ArchiveClassesAtExit=")


def test_the_key_follows_the_class_path_and_is_stable() -> None:
    assert runtime_key() == runtime_key()
    assert runtime_key("/opt/extra.jar") != runtime_key()
    assert len(runtime_key()) == 16


def test_an_empty_setting_turns_the_cache_off_and_none_means_the_default_place(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert class_cache("") is None
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_directory() == tmp_path / "topiary" / "spark"
    cache = class_cache(None)
    assert cache is not None and cache.directory == tmp_path / "topiary" / "spark"
    assert class_cache("~/x") is not None
    assert class_cache("~/x").directory == Path.home() / "x"  # type: ignore[union-attr]


# --- with a real JVM --------------------------------------------------------------------------


def spark_submit_version(java_options: str) -> subprocess.CompletedProcess:
    """``spark-submit --version`` with ``java_options`` for the driver JVM, as a driver gets
    them from build_session (SPARK_HOME is the test session's linked home)."""
    from pyspark.find_spark_home import _find_spark_home

    command = [
        str(Path(_find_spark_home()) / "bin" / "spark-submit"),
        "--conf",
        f"spark.driver.extraJavaOptions={java_options}",
        "--version",
    ]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, env=env)


@pytest.fixture
def real_jvm(linked_spark_home: Path | None) -> None:
    try:
        check_spark()
    except SparkUnavailable as exc:
        pytest.skip(f"Spark is unavailable: {exc}")


@pytest.mark.usefixtures("real_jvm")
def test_a_real_jvm_writes_the_archive_and_the_next_start_maps_its_classes(
    tmp_path: Path,
) -> None:
    writer = class_cache(tmp_path)
    assert writer is not None
    done = spark_submit_version(writer.prepare())
    assert done.returncode == 0, done.stderr[-2000:]
    assert writer.finish(done.returncode), "the JVM wrote no archive"
    assert [p.name for p in tmp_path.iterdir()] == [writer.archive.name]
    assert writer.archive.stat().st_size > 1_000_000
    reader = class_cache(tmp_path, writable=False)
    assert reader is not None
    # -Xshare:on: a JVM that cannot map the archive refuses to start instead of going on.
    done = spark_submit_version(f"{reader.prepare()} -Xshare:on -Xlog:class+load=info")
    assert done.returncode == 0, done.stderr[-2000:]
    shared = done.stdout.count("source: shared objects file (top)")
    assert shared > 1_000, "Spark's classes came from the jars, not the archive"


@pytest.mark.usefixtures("real_jvm")
def test_an_archive_the_jvm_cannot_map_is_passed_over_and_the_driver_starts_anyway(
    tmp_path: Path,
) -> None:
    cache = ClassCache(tmp_path, "k1")
    cache.archive.write_bytes(b"not an archive at all")
    assert cache.prepare() == f"-XX:SharedArchiveFile={cache.archive}"
    done = spark_submit_version(cache.prepare())
    assert done.returncode == 0, done.stderr[-2000:]
    from pyspark import __version__

    assert f"version {__version__}" in done.stderr, "Spark's launcher did not run"
