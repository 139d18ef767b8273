"""The linked SPARK_HOME that lets Python workers import PySpark compiled."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bridges.spark.sparkhome import installed_spark_home, linked_home, use_compiled_pyspark


def fake_home(root: Path) -> Path:
    home = root / "pyspark"
    for name in ("bin", "jars", "python/lib"):
        (home / name).mkdir(parents=True)
    (home / "python" / "lib" / "pyspark.zip").write_bytes(b"PK")
    (home / "jars" / "spark-core.jar").write_bytes(b"jar")
    (home / "__init__.py").write_text("")
    return home


def test_the_linked_home_has_everything_but_the_python_sources(tmp_path: Path) -> None:
    real = fake_home(tmp_path)
    home = linked_home(real, tmp_path / "homes")
    assert sorted(p.name for p in home.iterdir()) == ["__init__.py", "bin", "jars"]
    assert (home / "jars" / "spark-core.jar").read_bytes() == b"jar"
    assert not (home / "python" / "lib" / "pyspark.zip").exists()


def test_the_linked_home_is_made_once_and_reused(tmp_path: Path) -> None:
    real = fake_home(tmp_path)
    first = linked_home(real, tmp_path / "homes")
    made = first.stat().st_ino
    second = linked_home(real, tmp_path / "homes")
    assert second == first
    assert second.stat().st_ino == made
    assert [p.name for p in (tmp_path / "homes").iterdir()] == [first.name]  # no scratch left


def test_a_tampered_linked_home_is_rebuilt(tmp_path: Path) -> None:
    real = fake_home(tmp_path)
    home = linked_home(real, tmp_path / "homes")
    (home / "bin").unlink()
    (home / "bin").symlink_to(tmp_path)  # somewhere else
    again = linked_home(real, tmp_path / "homes")
    assert again == home
    assert os.readlink(again / "bin") == str(real / "bin")


def test_a_changed_installation_gets_a_new_linked_home(tmp_path: Path) -> None:
    real = fake_home(tmp_path)
    before = linked_home(real, tmp_path / "homes")
    (real / "sbin").mkdir()
    after = linked_home(real, tmp_path / "homes")
    assert after != before
    assert (after / "sbin").is_dir()


def test_a_spark_home_the_user_set_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "their-spark"))
    assert installed_spark_home() is None
    assert use_compiled_pyspark(tmp_path / "homes") is None
    assert os.environ["SPARK_HOME"] == str(tmp_path / "their-spark")
    assert not (tmp_path / "homes").exists()


def test_the_installed_pyspark_gets_a_linked_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark")
    monkeypatch.setenv("SPARK_HOME", "restored-after-the-test")
    monkeypatch.delenv("SPARK_HOME")
    home = use_compiled_pyspark(tmp_path / "homes")
    assert home is not None
    assert os.environ["SPARK_HOME"] == str(home)
    assert (home / "jars").is_dir()
    assert (home / "bin" / "spark-submit").exists()
    assert not (home / "python").exists()


def test_a_python_worker_imports_pyspark_compiled_not_from_the_zip(spark: Any) -> None:
    def where(_rows: Any) -> Any:
        import pyspark

        yield pyspark.__file__

    [path] = spark.sparkContext.parallelize([0], 1).mapPartitions(where).collect()
    assert ".zip" not in path
    assert path.endswith(os.path.join("pyspark", "__init__.py"))


def test_a_good_linked_home_made_meanwhile_by_another_start_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridges.spark import sparkhome

    real = fake_home(tmp_path)
    home = linked_home(real, tmp_path / "homes")
    made = home.stat().st_ino
    intact = sparkhome._intact
    looks: list[bool] = []

    def first_look_misses(*args: Any) -> bool:  # as if it were not there yet
        looks.append(True)
        return len(looks) > 1 and intact(*args)

    monkeypatch.setattr(sparkhome, "_intact", first_look_misses)
    assert linked_home(real, tmp_path / "homes") == home
    assert home.stat().st_ino == made
    assert [p.name for p in (tmp_path / "homes").iterdir()] == [home.name]
