"""A Spark driver for ``test_spark_driver_kill``: a streaming query from nsq into parquet.

Run as its own process (``python driver_child.py LOOKUPD TOPIC OUT CHECKPOINT MODE``) so the
test can SIGKILL it mid-stream and start it again from the same checkpoint. ``MODE`` is
``stream`` (run until killed) or ``drain`` (``Trigger.AvailableNow``: read what is there,
then exit 0). The test restarts the query with ``start_query`` in its own, already running
SparkSession: a second JVM start-up would double the test's time.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def main(lookupd: str, topic: str, out: str, checkpoint: str, mode: str) -> int:
    from smartnsq.testing.spark import python_for_workers

    python_for_workers()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import smartnsq.spark

    spark = (SparkSession.builder.master("local[2]").appName("smartnsq-driver-kill")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.python.authenticate.socketTimeout", "60s")
             .config("spark.driver.extraJavaOptions",
                     "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    smartnsq.spark.register(spark)
    query = start_query(spark, lookupd, topic, out, checkpoint, mode)
    print("started", flush=True)
    query.awaitTermination()
    spark.stop()
    return 0


def start_query(spark: Any, lookupd: str, topic: str, out: str, checkpoint: str,
                mode: str) -> Any:
    """The query, in this process or in the test's own session (a restart elsewhere)."""
    source = (spark.readStream.format("nsq").option("lookupd", lookupd).option("topic", topic)
              .option("startingOffsets", "earliest")
              # small batches while streaming (several in flight when it is killed); large
              # ones to drain: each micro-batch costs the loaded test machine a second or two
              .option("maxMessagesPerTrigger", "150" if mode == "stream" else "2000")
              .option("leaderTimeout", "60").load())
    writer = (source.writeStream.format("parquet").queryName(f"driver_kill_{mode}")
              .option("path", out).option("checkpointLocation", checkpoint))
    if mode == "drain":
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="0 seconds").start()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
