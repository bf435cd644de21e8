"""The sessions' Python workers run from pymq's daemon and import the installed PySpark."""

from __future__ import annotations

import os

from pymq.export.spark_daemon import DAEMON_MODULE


def _where(_rows: object) -> object:
    import sys

    yield (
        sys.modules["pyspark"].__file__,
        sys.modules["pyspark.worker"].__file__,
        sys.modules["pyspark.daemon"].__file__,
        sys.modules["__main__"].__spec__.name,
    )


def test_workers_import_pyspark_s_installed_package_not_its_zip(spark):
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == DAEMON_MODULE
    import pyspark

    installed = os.path.dirname(pyspark.__file__)
    found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_where).collect()
    assert len(found) == 2
    for package, worker, daemon, main in found:
        # The daemon runs as __main__ from pymq's module; PySpark comes from its package's
        # cached bytecode: a path inside pyspark.zip would mean the zip was imported.
        assert main == DAEMON_MODULE
        for path in (package, worker, daemon):
            assert ".zip" not in path, path
            assert os.path.commonpath([installed, path]) == installed, path
