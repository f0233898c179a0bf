"""A dev cluster for Spark jobs: the embedded ``DevCluster`` on a background event loop.

Spark code is blocking and Spark's Python workers are other processes, so the cluster has to
keep serving while the driver blocks in ``df.write...save()``: it runs on its own loop thread
and listens on loopback, where every worker process reaches it. Used by the Spark tests, the
example and the benchmark::

    with SparkDevCluster(nodes=3, lookupds=1) as cluster:
        cluster.create_topic("orders", partitions=2)
        df.write.format("nsq").option("lookupd", cluster.lookupd).option("topic", "orders")...
"""

from __future__ import annotations

import os
import sys
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from ..devcluster.cluster import DevCluster
from ..transport.loop_thread import LoopThread

__all__ = ["SparkDevCluster", "local_session", "python_for_workers"]

T = TypeVar("T")


def python_for_workers() -> None:
    """Make Spark's Python workers run this interpreter (which has smartnsq installed).

    Without it Spark starts the machine's default ``python3``, and the workers fail with
    ``ModuleNotFoundError``. Call before the SparkSession is created.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def local_session(app_name: str) -> Any:
    """A ``local[2]`` SparkSession for tests, with the ``nsq`` format registered.

    Tuned for a small, shared machine, where JVM start-up and warm-up dominate short tests.
    The caller stops it.
    """
    python_for_workers()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from ..spark import register

    session = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.streaming.stopTimeout", "30s")
               # a loaded 2-core box starts Python workers slowly: the default 15 s for a
               # worker to connect back failed a streaming query's source runner
               .config("spark.python.authenticate.socketTimeout", "60s")
               # C2 compiler threads compete with the test for the machine's two cores
               .config("spark.driver.extraJavaOptions",
                       "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


class SparkDevCluster:
    """A started ``DevCluster`` served from a background loop; blocking helpers around it.

    ``real``: the directory of the real youzan binaries (``$SMARTNSQ_REAL_NSQ``): the real
    servers as processes (``testing.realcluster.RealCluster``, with etcd) instead, behind the
    same helpers (``nodes`` and ``lookupds`` are passed on; other options are the dev
    cluster's)."""

    def __init__(self, *, real: str | None = None, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._real = real
        self._loop_thread = LoopThread("smartnsq-devcluster")
        self.cluster: Any = None

    def start(self) -> SparkDevCluster:
        self._loop_thread.start()

        async def make() -> Any:
            if self._real is not None:
                from .realcluster import RealCluster

                real = RealCluster(self._kwargs.get("nodes", 3), self._kwargs.get("lookupds", 1),
                                   binaries=self._real)
                await real.start()
                return real
            cluster = DevCluster(**self._kwargs)
            await cluster.start()
            return cluster

        self.cluster = self._loop_thread.run(make(), timeout=30 if self._real is None else 120)
        return self

    def stop(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            self._loop_thread.run(cluster.stop(), timeout=30)
        self._loop_thread.stop()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the cluster's loop (fault injection, topic creation...)."""
        return self._loop_thread.run(coro, timeout)

    def create_topic(self, name: str, partitions: int = 1, replicas: int = 1,
                     **kwargs: Any) -> Any:
        assert self.cluster is not None
        return self.run(self.cluster.create_topic(name, partitions, replicas, **kwargs))

    @property
    def lookupd(self) -> str:
        """The nsqlookupd HTTP addresses as the ``lookupd`` option wants them."""
        assert self.cluster is not None
        return ",".join(self.cluster.lookupd_http_addresses)

    @property
    def nsqd_http(self) -> str:
        assert self.cluster is not None
        return ",".join(self.cluster.nsqd_http_addresses)

    @property
    def nsqd_tcp(self) -> str:
        assert self.cluster is not None
        return ",".join(self.cluster.nsqd_tcp_addresses)

    def __enter__(self) -> SparkDevCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
