"""A Spark driver for the driver-SIGKILL tests: a streaming query from nsq into parquet.

Run as its own process (``python driver_child.py LOOKUPD TOPIC OUT CHECKPOINT MODE``) so the
test can SIGKILL it mid-stream and start it again from the same checkpoint. ``MODE`` is
``stream`` (run until killed) or ``drain`` (``Trigger.AvailableNow``: read what is there,
then exit 0). The tests restart the query with ``start_query`` in their own, already running
SparkSession: a second JVM start-up would double a test's time.

Also what both tests (tests/spark/test_spark_driver_kill.py on the dev cluster,
tests/both/test_spark_driver_kill_both.py on dev and real) do to the child: start it, count
its committed batches, kill it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

CHILD = Path(__file__).resolve()


def spawn(lookupd: str, topic: str, out: Path, checkpoint: Path, mode: str,
          log: IO[bytes]) -> subprocess.Popen[bytes]:
    """This driver in a session of its own, so that SIGKILL to its group takes the JVM and
    its Python workers at once, as a dead driver machine would."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), lookupd, topic, str(out), str(checkpoint), mode],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def sigkill(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver with everything it started; waits for it (bounded)."""
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(30)


def committed_batches(checkpoint: Path) -> int:
    """Micro-batches the query has committed (the checkpoint's commit log)."""
    commits = checkpoint / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.exists() else 0


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
