"""Fixtures for the Spark connector tests: one local SparkSession and one dev cluster per run.

A SparkSession takes 5-15 s to start, so every Spark test shares one (``local[2]``); the dev
cluster runs on a background event loop (``SparkDevCluster``) so it keeps serving while the
driver blocks, and listens on loopback where Spark's Python worker processes reach it.
Tests create their own topics, so sharing the cluster is safe.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

HAVE_SPARK = all(importlib.util.find_spec(m) is not None for m in ("pyspark", "pyarrow"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "spark: needs pyspark (the spark extra) and starts a local SparkSession; "
        "deselect with -m 'not spark' for a quick run")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if not HAVE_SPARK:
        pytest.skip("pyspark/pyarrow not installed (pip install -e '.[dev]')")
    from smartnsq.spark.testing import python_for_workers

    python_for_workers()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import smartnsq.spark

    session = (SparkSession.builder.master("local[2]").appName("smartnsq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.streaming.stopTimeout", "30s")
               # a loaded 2-core box starts Python workers slowly: the default 15 s for a
               # worker to connect back failed a streaming query's source runner
               .config("spark.python.authenticate.socketTimeout", "60s")
               # the tests are short: JVM start-up and warm-up dominate, and C2 compiler
               # threads compete with the test for the machine's two cores
               .config("spark.driver.extraJavaOptions",
                       "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    smartnsq.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def nsq() -> Iterator[Any]:
    """A 3-node youzan dev cluster with one lookupd, shared by the Spark tests."""
    if not HAVE_SPARK:
        pytest.skip("pyspark/pyarrow not installed (pip install -e '.[dev]')")
    from smartnsq.spark.testing import SparkDevCluster

    with SparkDevCluster(nodes=3, lookupds=1) as cluster:
        yield cluster
