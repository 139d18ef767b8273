"""The driver JVM's class cache: who writes the archive, who uses it, what a crash leaves.

No JVM here: these drive the bookkeeping around the JVM's own options. The crash test in
test_spark_pipeline.py has a real driver write an archive after a killed one left its lock.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from bridges.spark.classcache import ClassCache, class_cache, default_directory, runtime_key


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
