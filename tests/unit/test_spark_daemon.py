"""The export's Spark worker daemon prefers the installed PySpark to Spark's bundled zips."""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

from pymq.export import spark_daemon
from pymq.export.spark_daemon import load_daemon, prefer_installed


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


def test_links_are_followed_to_the_installed_package(tmp_path):
    """Spark names its zips through the real path (``find_spark_home`` resolves links), while
    site-packages may be on the path through a link (a venv's lib64, say)."""
    site, pyspark_zip, py4j_zip = _site(tmp_path)
    link = tmp_path / "lib64"
    link.symlink_to(site)
    path = [pyspark_zip, py4j_zip, str(link)]
    assert prefer_installed(path) == [str(link), pyspark_zip, py4j_zip]
    via_link = [str(link / "pyspark" / "python" / "lib" / "pyspark.zip"), site]
    assert prefer_installed(via_link) == [site, via_link[0]]


class _Imports:
    """importlib.import_module's stand-in: fails the first ``failures`` calls; records the
    path each call saw."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.paths: list[list[str]] = []
        self.module = types.SimpleNamespace(manager=lambda: None)

    def import_module(self, name: str) -> object:
        assert name == "pyspark.daemon"
        self.paths.append(list(sys.path))
        if len(self.paths) <= self.failures:
            raise ImportError("planted")
        return self.module


def _loading(monkeypatch: pytest.MonkeyPatch, failures: int, reorder: object) -> _Imports:
    """load_daemon's surroundings: imports that fail ``failures`` times, sys.path
    ``["/zips/pyspark.zip", "/site"]`` and ``reorder`` as prefer_installed."""
    imports = _Imports(failures)
    monkeypatch.setattr(spark_daemon, "importlib", imports)
    monkeypatch.setattr(sys, "path", ["/zips/pyspark.zip", "/site"])
    monkeypatch.setattr(spark_daemon, "prefer_installed", reorder)
    return imports


def _zips_last(path: list[str]) -> list[str]:
    return path[1:] + path[:1]


def _broken(path: list[str]) -> list[str]:
    raise OSError("planted")


def test_the_daemon_loads_with_the_reordered_path(monkeypatch):
    imports = _loading(monkeypatch, 0, _zips_last)
    assert load_daemon() is imports.module
    assert imports.paths == [["/site", "/zips/pyspark.zip"]]


def test_a_failed_reorder_leaves_pyspark_s_own_path(monkeypatch):
    imports = _loading(monkeypatch, 0, _broken)
    assert load_daemon() is imports.module
    assert imports.paths == [["/zips/pyspark.zip", "/site"]]


def test_an_installed_pyspark_that_fails_to_import_falls_back_to_the_zip(monkeypatch):
    imports = _loading(monkeypatch, 1, _zips_last)
    # What the failed import left behind goes, so that the zip's modules are imported afresh.
    left = {"pyspark": 1, "pyspark.serializers": 2, "py4j": 3, "py4j.java_gateway": 4}
    kept = {"pysparkling": 5, "pymq_other": 6}
    monkeypatch.setattr(sys, "modules", {**sys.modules, **left, **kept})
    assert load_daemon() is imports.module
    assert imports.paths == [["/site", "/zips/pyspark.zip"], ["/zips/pyspark.zip", "/site"]]
    assert not set(left) & set(sys.modules)
    assert set(kept) <= set(sys.modules)


def test_a_daemon_that_fails_with_pyspark_s_own_path_fails(monkeypatch):
    imports = _loading(monkeypatch, 2, list)
    with pytest.raises(ImportError, match="planted"):
        load_daemon()
    assert len(imports.paths) == 1  # nothing to fall back to: one try
