"""One local[2] SparkSession per test module (helpers are in tests/spark/helpers.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.spark.helpers import java_available


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Iterator[object]:
    """The module's session; its Python workers start from pymq's daemon module
    (``DAEMON_CONFIG``) unless the module sets ``SPARK_STOCK_DAEMON = True``."""
    # No skipping: a suite without Spark or Java must fail, not pass quietly.
    if not java_available():
        pytest.fail("Spark needs Java 17: apt-get install -y openjdk-17-jre-headless")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pymq.export.datasource import register
    from pymq.export.spark_daemon import DAEMON_CONFIG

    # Named either way: a builder's options outlive it (PySpark keeps them in the class).
    stock = getattr(request.module, "SPARK_STOCK_DAEMON", False)
    builder = SparkSession.builder.config(
        map={"spark.python.daemon.module": "pyspark.daemon"} if stock else dict(DAEMON_CONFIG)
    )
    session = (
        builder.master("local[2]")
        .appName("pymq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
