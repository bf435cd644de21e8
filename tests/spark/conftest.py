"""One local[2] SparkSession per test module (helpers are in tests/spark/helpers.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.spark.helpers import java_available


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    # No skipping: a suite without Spark or Java must fail, not pass quietly.
    if not java_available():
        pytest.fail("Spark needs Java 17: apt-get install -y openjdk-17-jre-headless")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pymq.export.datasource import register
    from pymq.export.spark_daemon import DAEMON_CONFIG

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pymq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config(map=DAEMON_CONFIG)
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
