"""What the both-tier Spark tests of ``mode=ack`` and of the driver SIGKILL share: one local
SparkSession per module, and the driver child of tests/spark (``driver_child.py``, also used by
the dev-only tests/spark/test_spark_driver_kill.py) with its helpers.

tests/spark is put on ``sys.path`` here, as pytest does for its own test modules, so the child
and its helpers stay in one file for both folders.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SPARK_TESTS = Path(__file__).resolve().parents[1] / "spark"
if str(SPARK_TESTS) not in sys.path:
    sys.path.append(str(SPARK_TESTS))

from driver_child import committed_batches, sigkill, spawn, start_query  # noqa: E402

__all__ = ["HAVE_SPARK", "committed_batches", "sigkill", "spark_session", "spawn",
           "start_query"]

HAVE_SPARK = all(importlib.util.find_spec(m) is not None for m in ("pyspark", "pyarrow"))


@pytest.fixture(scope="module")
def spark_session() -> Iterator[Any]:
    """A local SparkSession for the module using it, stopped after it."""
    if not HAVE_SPARK:
        pytest.skip("pyspark/pyarrow not installed (pip install -e '.[spark]')")
    from smartnsq.testing.spark import local_session

    session = local_session("smartnsq-tests-both-driver")
    try:
        yield session
    finally:
        session.stop()
