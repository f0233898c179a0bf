"""Spark connector throughput: rows/s written and read for local[1|2] and 1, 2, 4 partitions.

Runs a local SparkSession per core count against an embedded dev cluster (4 nsqd, one
lookupd, on a background loop in this process) and, for each partition count, times

* write: ``df.write.format("nsq")`` of ``--rows`` rows (``--size`` byte bodies, sharded by one
  of ``--keys`` keys), the DataFrame split into one Spark partition per core;
* read: ``spark.read.format("nsq")`` of the whole topic, forcing every body through Spark
  (``sum(length(body))``).

A small write and read per session run first, untimed, so Python worker start-up (several
seconds) is not counted. The dev cluster shares the machine's cores with Spark, so absolute
figures understate a real cluster; the scaling across partitions and cores is the point.

    python bench/spark.py                      # 200k rows, cores 1 2, partitions 1 2 4
    python bench/spark.py --rows 50000 --cores 2 --partitions 1 4 --json
    python bench/spark.py --cores 2 --partitions 4 --ordered   # plain and ordered topics
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from smartnsq.spark.testing import SparkDevCluster, python_for_workers

    python_for_workers()
    from pyspark.sql import SparkSession

    import smartnsq.spark

    results = []
    with SparkDevCluster(nodes=4, lookupds=1) as cluster:
        for cores in args.cores:
            spark = (SparkSession.builder.master(f"local[{cores}]")
                     .appName(f"smartnsq-bench-{cores}")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.shuffle.partitions", str(cores))
                     .getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            smartnsq.spark.register(spark)
            try:
                warm = f"bench_warm_{cores}"
                cluster.create_topic(warm, partitions=max(args.partitions))
                _write(spark, cluster, warm, 2000, args.size, args.keys, cores)
                _read(spark, cluster, warm)
                cells = [(p, False) for p in args.partitions]
                if args.ordered:
                    cells += [(p, True) for p in args.partitions]
                for partitions, ordered in cells:
                    topic = f"bench_c{cores}_p{partitions}{'_ord' if ordered else ''}"
                    cluster.create_topic(topic, partitions=partitions, ordered=ordered)
                    wrote = _write(spark, cluster, topic, args.rows, args.size, args.keys,
                                   cores)
                    read_s, count = _read(spark, cluster, topic)
                    assert count == args.rows, (count, args.rows)
                    row = {"cores": cores, "partitions": partitions, "ordered": ordered,
                           "rows": args.rows, "body_bytes": args.size,
                           "write_rows_per_s": round(args.rows / wrote),
                           "read_rows_per_s": round(args.rows / read_s),
                           "write_s": round(wrote, 2), "read_s": round(read_s, 2)}
                    results.append(row)
                    if not args.json:
                        kind = "ordered" if ordered else "plain  "
                        print(f"local[{cores}] partitions={partitions} {kind}: write "
                              f"{row['write_rows_per_s']:>8} rows/s ({wrote:.2f} s), read "
                              f"{row['read_rows_per_s']:>8} rows/s ({read_s:.2f} s)",
                              flush=True)
            finally:
                spark.stop()
    return results


def _write(spark: Any, cluster: Any, topic: str, rows: int, size: int, keys: int,
           cores: int) -> float:
    from pyspark.sql import functions as F

    df = (spark.range(rows, numPartitions=cores)
          .select(F.concat(F.lit("key-"), (F.col("id") % keys).cast("string")).alias("key"),
                  F.concat(F.col("id").cast("string"), F.lit("|"),
                           F.expr(f"repeat('x', {size})")).cast("binary").alias("body")))
    df = df.cache()
    df.count()  # materialise first: time the publish, not the generation
    started = time.perf_counter()
    (df.write.format("nsq").option("lookupd", cluster.lookupd).option("topic", topic)
     .option("shardingKeyColumn", "key").mode("append").save())
    elapsed = time.perf_counter() - started
    df.unpersist()
    return elapsed


def _read(spark: Any, cluster: Any, topic: str) -> tuple[float, int]:
    started = time.perf_counter()
    row = (spark.read.format("nsq").option("lookupd", cluster.lookupd).option("topic", topic)
           .load().selectExpr("count(*) AS n", "sum(length(body)) AS bytes").collect()[0])
    return time.perf_counter() - started, int(row["n"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--keys", type=int, default=1000, help="distinct sharding keys")
    parser.add_argument("--cores", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--ordered", action="store_true",
                        help="also time ordered topics (SUB_ORDERED reads)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("pyspark is not installed: pip install 'smartnsq[spark]'", file=sys.stderr)
        return 2
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
