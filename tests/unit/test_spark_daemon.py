"""The export's Spark worker daemon prefers the installed PySpark to Spark's bundled zips."""

from __future__ import annotations

import contextlib
import pathlib
import types

from pymq.export import job
from pymq.export.spark_daemon import DAEMON_CONFIG, DAEMON_MODULE, prefer_installed


def _package(root: pathlib.Path, name: str, version: str | None = None) -> pathlib.Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "__init__.py").write_text("")
    if version is not None:
        (directory / "version.py").write_text(f"__version__ = '{version}'\n")
    return directory


def _site(tmp_path: pathlib.Path, py4j: str | None = "0.10.9.9") -> tuple[str, str, str]:
    """A site-packages with pyspark (and py4j at ``py4j``) installed; returns it and the two
    zips inside the installed pyspark."""
    site = tmp_path / "site-packages"
    lib = _package(site, "pyspark") / "python" / "lib"
    lib.mkdir(parents=True)
    if py4j is not None:
        _package(site, "py4j", py4j)
    zips = (lib / "pyspark.zip", lib / "py4j-0.10.9.9-src.zip")
    for z in zips:
        z.write_bytes(b"PK")
    return str(site), str(zips[0]), str(zips[1])


def test_the_bundled_zips_go_to_the_end_and_the_rest_keeps_its_order(tmp_path):
    site, pyspark_zip, py4j_zip = _site(tmp_path)
    path = [pyspark_zip, py4j_zip, "", "/somewhere/else", site, "/last"]
    assert prefer_installed(path) == ["", "/somewhere/else", site, "/last", pyspark_zip, py4j_zip]
    assert path[0] == pyspark_zip  # the argument is left as it was


def test_py4j_s_zip_stays_unless_the_installed_py4j_is_its_version(tmp_path):
    site, pyspark_zip, py4j_zip = _site(tmp_path, py4j="0.10.9.7")
    assert prefer_installed([pyspark_zip, py4j_zip, site]) == [py4j_zip, site, pyspark_zip]
    site2, pyspark_zip2, py4j_zip2 = _site(tmp_path / "b", py4j=None)
    assert prefer_installed([pyspark_zip2, py4j_zip2, site2]) == [py4j_zip2, site2, pyspark_zip2]


def test_zips_of_another_spark_are_left_first(tmp_path):
    site, _pyspark_zip, _py4j_zip = _site(tmp_path)
    other = tmp_path / "spark-home" / "python" / "lib"
    other.mkdir(parents=True)
    foreign = [str(other / "pyspark.zip"), str(other / "py4j-0.10.9.9-src.zip")]
    for z in foreign:
        pathlib.Path(z).write_bytes(b"PK")
    assert prefer_installed([*foreign, site]) == [*foreign, site]


def test_without_an_installed_pyspark_nothing_moves(tmp_path):
    _site_dir, pyspark_zip, py4j_zip = _site(tmp_path)
    path = [pyspark_zip, py4j_zip, str(tmp_path / "empty"), "/nonexistent"]
    assert prefer_installed(path) == path


def test_an_export_s_own_session_starts_its_workers_from_the_daemon(monkeypatch):
    """``run_export`` without a session of the caller's builds one with the daemon set."""
    import pyspark.sql

    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []

    class Builder:
        def __getattr__(self, name: str) -> object:
            def chained(*args: object, **kwargs: object) -> object:
                calls.append(((name, *args), kwargs))
                return session if name == "getOrCreate" else self

            return chained

    session = types.SimpleNamespace(
        sparkContext=types.SimpleNamespace(setLogLevel=lambda level: None), stop=lambda: None
    )
    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", Builder())
    cfg = job.JobConfig(store="/nonexistent", output="/nonexistent-out")
    with contextlib.ExitStack() as stack:
        assert stack.enter_context(job._session(cfg, None)) is session
    settings: dict[object, object] = {}
    for (name, *args), kwargs in calls:
        if name == "config":
            settings.update(kwargs.get("map") or {args[0]: args[1]})  # type: ignore[dict-item]
    assert settings["spark.python.daemon.module"] == DAEMON_MODULE
    assert DAEMON_CONFIG == {"spark.python.daemon.module": DAEMON_MODULE}
