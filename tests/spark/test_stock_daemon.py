"""A session of a user's own, without pymq's daemon module: the data source and the export
work with PySpark's stock daemon too."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest

from pymq.export.job import JobConfig, run_export
from tests.spark.helpers import make_messages, produce, store_of, worker_imports

SPARK_STOCK_DAEMON = True  # tests/spark/conftest.py: no DAEMON_CONFIG for this module's session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]


def test_read_and_export_with_pyspark_s_own_daemon(spark, tmp_path):
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == "pyspark.daemon"
    found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(worker_imports).collect()
    assert [main for *_, main in found] == ["pyspark.daemon", "pyspark.daemon"]
    data_dir = str(tmp_path / "data")
    sent = produce(data_dir, make_messages(60, seed=5))
    df = spark.read.format("pymq").option("path", store_of(data_dir)).load()
    assert sorted(r.unique_key for r in df.collect()) == sorted(s.result.msg_id for s in sent)
    out = str(tmp_path / "out")
    run_export(JobConfig(store=store_of(data_dir), output=out), spark=spark)
    files = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".parquet")]
    assert sum(pq.read_metadata(f).num_rows for f in files) == len(sent)
