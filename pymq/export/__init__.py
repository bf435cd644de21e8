"""Spark batch export of a store's messages (``spark.read.format("pymq")``) and its job.

``options`` parses what an export reads, ``scan`` plans and scans commit-log files in plain
Python, ``datasource`` is the Spark data source over them, ``arrow_writer`` has Spark tasks write
Parquet with pyarrow and ``job`` writes Parquet or JSON.  Only ``datasource``, ``arrow_writer``
and ``job`` import pyspark.
"""
