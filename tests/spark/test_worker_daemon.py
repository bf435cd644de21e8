"""The sessions' Python workers run from pymq's daemon and import the installed PySpark."""

from __future__ import annotations

import os
import types

import pytest

from pymq.export import job
from pymq.export.spark_daemon import DAEMON_CONFIG, DAEMON_MODULE
from tests.spark.helpers import worker_imports

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]


def test_workers_import_pyspark_s_installed_package_not_its_zip(spark):
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == DAEMON_MODULE
    import pyspark

    installed = os.path.dirname(pyspark.__file__)
    found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(worker_imports).collect()
    assert len(found) == 2
    for package, worker, daemon, main in found:
        # The daemon runs as __main__ from pymq's module; PySpark comes from its package's
        # cached bytecode: a path inside pyspark.zip would mean the zip was imported.
        assert main == DAEMON_MODULE
        for path in (package, worker, daemon):
            assert path, "a PySpark module was not imported as a module"
            assert ".zip" not in path, path
            assert os.path.commonpath([installed, path]) == installed, path


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
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)  # _session sets it: restored after
    monkeypatch.setattr(pyspark.sql.SparkSession, "builder", Builder())
    cfg = job.JobConfig(store="/nonexistent", output="/nonexistent-out")
    with job._session(cfg, None) as made:
        assert made is session
    settings: dict[object, object] = {}
    for (name, *args), kwargs in calls:
        if name == "config":
            given = kwargs.get("map")
            settings.update(given if isinstance(given, dict) else {args[0]: args[1]})
    assert settings["spark.python.daemon.module"] == DAEMON_MODULE
    assert dict(DAEMON_CONFIG) == {"spark.python.daemon.module": DAEMON_MODULE}
