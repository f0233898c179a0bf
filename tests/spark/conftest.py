"""Fixtures for the Spark connector tests: one local SparkSession and one dev cluster per run.

A SparkSession takes 5-15 s to start, so every Spark test shares one (``local[2]``); the dev
cluster runs on a background event loop (``SparkDevCluster``) so it keeps serving while the
driver blocks, and listens on loopback where Spark's Python worker processes reach it.
Tests create their own topics, so sharing the cluster is safe.
"""

from __future__ import annotations

import importlib.util
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
    from smartnsq.testing.spark import local_session

    session = local_session("smartnsq-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def nsq() -> Iterator[Any]:
    """A 3-node youzan dev cluster with one lookupd, shared by the Spark tests."""
    if not HAVE_SPARK:
        pytest.skip("pyspark/pyarrow not installed (pip install -e '.[dev]')")
    from smartnsq.testing.spark import SparkDevCluster

    with SparkDevCluster(nodes=3, lookupds=1) as cluster:
        yield cluster
