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

* where the read's CPU goes (``--profile``): the CPU seconds each process spent during the
  read, from ``/proc``: the driver process (the dev cluster serving the reads: the driver
  itself only waits), the JVM, the Python workers (the range reader and the Arrow
  conversion) and, with ``--real``, the servers' processes, beside the wall time and the
  cores that wall time offered; plus, outside Spark, the Arrow conversion alone
  (``message_batch`` per message) and Spark's own ceiling (the same schema from a Python
  source that yields pre-built record batches, no NSQ).

* the connector's cost above Spark's own (``--noop``): every column of the topic into the
  ``noop`` sink, then the same rows from a trivial Python source of pre-built record batches
  (same schema, same partition count), ``--repeat`` rounds; the difference per row is what
  the connector adds. Each round also reads a topic of four rows a partition both ways: the
  fixed cost of a query (planning, tasks, each partition's channel and subscription).

* a rate-limited stream (``--stream N``): ``readStream`` of the whole topic with
  ``Trigger.AvailableNow`` into the ``noop`` sink (``length(body)`` forced), unlimited and
  with ``maxMessagesPerTrigger=N``, one after the other on the same rows; for each, the wall
  time, the micro-batches, and the driver's share (Spark's ``durationMs.latestOffset``
  summed over the batches: where the source finds each batch's end).

At the end a table puts write and read rates side by side, plain and ordered.

    python bench/spark.py                      # 200k rows, cores 1 2, partitions 1 2 4
    python bench/spark.py --rows 50000 --cores 2 --partitions 1 4 --json
    python bench/spark.py --cores 2 --partitions 4 --ordered   # plain and ordered topics
    python bench/spark.py --cores 2 --partitions 4 --ordered --profile
    python bench/spark.py --cores 2 --partitions 4 --ordered --read-option orderedReadChannels=1
    python bench/spark.py --rows 100000 --cores 2 --partitions 4 --stream 10000
    python bench/spark.py --rows 100000 --cores 2 --partitions 4 --noop --repeat 5
    python bench/spark.py --rows 100000 --cores 2 --partitions 4 --stream 10000 --real
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from smartnsq.testing.spark import SparkDevCluster, python_for_workers

    python_for_workers()
    from pyspark.sql import SparkSession

    import smartnsq.spark

    results = []
    with SparkDevCluster(nodes=4 if args.real is None else 3, lookupds=1,
                         real=args.real) as cluster:
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
                _read(spark, cluster, warm, args.read_options)
                if args.profile:
                    results.append(_spark_ceiling(spark, args.rows, args.size, cores))
                if args.noop:
                    results.extend(_noop_rounds(spark, cluster, args, cores))
                    continue
                cells = [(p, False) for p in args.partitions]
                if args.ordered:
                    cells += [(p, True) for p in args.partitions]
                for partitions, ordered in cells:
                    topic = f"bench_c{cores}_p{partitions}{'_ord' if ordered else ''}"
                    cluster.create_topic(topic, partitions=partitions, ordered=ordered)
                    wrote = _write(spark, cluster, topic, args.rows, args.size, args.keys,
                                   cores)
                    before = _cpu(spark) if args.profile else {}
                    read_s, count = _read(spark, cluster, topic, args.read_options)
                    cpu = _cpu_delta(before, _cpu(spark)) if args.profile else {}
                    assert count == args.rows, (count, args.rows)
                    row = {"cores": cores, "partitions": partitions, "ordered": ordered,
                           "rows": args.rows, "body_bytes": args.size,
                           "write_rows_per_s": round(args.rows / wrote),
                           "read_rows_per_s": round(args.rows / read_s),
                           "write_s": round(wrote, 2), "read_s": round(read_s, 2)}
                    if cpu:
                        row["read_cpu_s"] = cpu
                        row["read_core_s"] = round(read_s * (os.cpu_count() or 1), 2)
                    if args.stream:
                        row["stream"] = [_stream(spark, cluster, topic, limit, args)
                                         for limit in (None, args.stream)]
                        row["stream_ceiling"] = [
                            _stream_ceiling(spark, args.rows, args.size, limit)
                            for limit in (None, args.stream)]
                    results.append(row)
                    if not args.json:
                        kind = "ordered" if ordered else "plain  "
                        print(f"local[{cores}] partitions={partitions} {kind}: write "
                              f"{row['write_rows_per_s']:>8} rows/s ({wrote:.2f} s), read "
                              f"{row['read_rows_per_s']:>8} rows/s ({read_s:.2f} s)",
                              flush=True)
                        if cpu:
                            print(f"    read CPU s: {cpu} (wall {read_s:.2f} s)", flush=True)
                        for timed in row.get("stream", ()):
                            print(f"    stream {timed['limit'] or 'unlimited':>9}: "
                                  f"{timed['wall_s']:.2f} s in {timed['batches']} batches, "
                                  f"latestOffset {timed['latest_offset_s']:.2f} s; Spark's "
                                  f"phases {timed['phases_s']}", flush=True)
                        for timed in row.get("stream_ceiling", ()):
                            print(f"    Spark's own {timed['limit'] or 'unlimited':>9}: "
                                  f"{timed['wall_s']:.2f} s in {timed['batches']} batches "
                                  "(pre-built batches, no NSQ)", flush=True)
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


def _read(spark: Any, cluster: Any, topic: str,
          options: dict[str, str] | None = None) -> tuple[float, int]:
    started = time.perf_counter()
    reader = spark.read.format("nsq").option("lookupd", cluster.lookupd).option("topic", topic)
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    row = (reader.load().selectExpr("count(*) AS n", "sum(length(body)) AS bytes")
           .collect()[0])
    return time.perf_counter() - started, int(row["n"])


def _stream(spark: Any, cluster: Any, topic: str, limit: int | None,
            args: argparse.Namespace) -> dict[str, Any]:
    """One ``Trigger.AvailableNow`` run over the whole topic into the noop sink."""
    import tempfile

    reader = (spark.readStream.format("nsq").option("lookupd", cluster.lookupd)
              .option("topic", topic).option("startingOffsets", "earliest"))
    if limit:
        reader = reader.option("maxMessagesPerTrigger", str(limit))
    for key, value in args.read_options.items():
        reader = reader.option(key, value)
    with tempfile.TemporaryDirectory(prefix="smartnsq-bench-stream-") as checkpoint:
        started = time.perf_counter()
        query = (reader.load().selectExpr("length(body) AS n").writeStream.format("noop")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()
        wall = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == args.rows, (rows, args.rows)
    if limit:
        assert all(p["numInputRows"] <= limit for p in progress), progress
    phases: dict[str, float] = {}
    for p in query.recentProgress:
        for phase, ms in p["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + ms / 1000
    return {"limit": limit, "wall_s": round(wall, 2), "batches": len(progress),
            "latest_offset_s": round(phases.get("latestOffset", 0), 2),
            "phases_s": {k: round(v, 2) for k, v in sorted(phases.items())}}


def _synthetic(size: int, count: int) -> Iterator[Any]:
    """``count`` rows of the read schema as record batches of 4096 built once (the trivial
    sources' rows: Spark's own cost, no NSQ)."""
    from smartnsq.protocol.frames import MessageFrame, youzan_message_id
    from smartnsq.spark.schema import message_batch

    batch = message_batch("t", "n", [
        MessageFrame(time.time_ns(), 1, youzan_message_id(i, 0), b"x" * size, 0, b"",
                     i * (size + 30), size + 30, True) for i in range(4096)])
    left = count
    while left > 0:
        yield batch.slice(0, min(left, 4096))
        left -= 4096


def _stream_ceiling(spark: Any, rows: int, size: int, limit: int | None) -> dict[str, Any]:
    """Spark's own cost of the same ``Trigger.AvailableNow`` run: the nsq schema from a
    Python stream source of pre-built record batches (4 partitions a batch, no NSQ), so the
    per-batch work that is Spark's (checkpoint writes, planning, task launches) shows."""
    import tempfile

    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    from smartnsq.spark import read_schema

    class SyntheticStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def prepareForTriggerAvailableNow(self) -> None:
            pass  # the end is fixed: ``rows``

        def getDefaultReadLimit(self) -> Any:
            return ReadMaxRows(limit) if limit else ReadAllAvailable()

        def latestOffset(self, start: dict[str, int], read_limit: Any) -> dict[str, int]:
            step = rows if isinstance(read_limit, ReadAllAvailable) else read_limit.max_rows
            return {"n": min(rows, start["n"] + step)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            count = end["n"] - start["n"]
            return [InputPartition(count // 4 + (i < count % 4)) for i in range(4)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            yield from _synthetic(size, partition.value)

        def commit(self, end: dict[str, int]) -> None:
            pass

    class SyntheticStreamSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nsq_bench_synthetic_stream"

        def schema(self) -> Any:
            return read_schema()

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return SyntheticStream()

    spark.dataSource.register(SyntheticStreamSource)
    with tempfile.TemporaryDirectory(prefix="smartnsq-bench-ceiling-") as checkpoint:
        started = time.perf_counter()
        query = (spark.readStream.format("nsq_bench_synthetic_stream").load()
                 .selectExpr("length(body) AS n").writeStream.format("noop")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()
        wall = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert sum(p["numInputRows"] for p in progress) == rows
    return {"limit": limit, "wall_s": round(wall, 2), "batches": len(progress)}


def _noop_read(load: Any) -> float:
    """Seconds to push every column of ``load`` through Spark into the ``noop`` sink."""
    started = time.perf_counter()
    load.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _floor_source(spark: Any, rows: int, size: int, partitions: int) -> Any:
    """The trivial Python data source: the nsq schema, ``rows`` rows over ``partitions``
    partitions, yielded as record batches built once per task (no NSQ at all)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from smartnsq.spark import read_schema

    class Floor(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(rows // partitions + (i < rows % partitions))
                    for i in range(partitions)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            yield from _synthetic(size, partition.value)

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nsq_bench_floor"

        def schema(self) -> Any:
            return read_schema()

        def reader(self, schema: Any) -> DataSourceReader:
            return Floor()

    spark.dataSource.register(FloorSource)
    return spark.read.format("nsq_bench_floor").load()


def _noop_rounds(spark: Any, cluster: Any, args: argparse.Namespace,
                 cores: int) -> list[dict[str, Any]]:
    """``--noop``: every column into the ``noop`` sink, the connector and the trivial source
    in turn, ``--repeat`` times each, per partition count: the connector's cost per row above
    what Spark itself costs for the same rows."""
    out = []
    for partitions in args.partitions:
        topic = f"bench_noop_c{cores}_p{partitions}"
        cluster.create_topic(topic, partitions=partitions, ordered=args.ordered)
        _write(spark, cluster, topic, args.rows, args.size, args.keys, cores)
        reader = (spark.read.format("nsq").option("lookupd", cluster.lookupd)
                  .option("topic", topic))
        for key, value in args.read_options.items():
            reader = reader.option(key, value)
        nsq = reader.load()
        assert nsq.count() == args.rows
        floor = _floor_source(spark, args.rows, args.size, partitions)
        _noop_read(floor)  # warm-up
        # the fixed cost of a query (planning, tasks, channels): the same reads of one row a
        # partition
        small = f"{topic}_small"
        cluster.create_topic(small, partitions=partitions, ordered=args.ordered)
        _write(spark, cluster, small, partitions * 4, args.size, partitions * 4, cores)
        small_reader = (spark.read.format("nsq").option("lookupd", cluster.lookupd)
                        .option("topic", small))
        for key, value in args.read_options.items():
            small_reader = small_reader.option(key, value)
        small_nsq = small_reader.load()
        small_floor = _floor_source(spark, partitions, args.size, partitions)
        rounds = []
        for _ in range(args.repeat):
            load = os.getloadavg()[0]
            small_s = _noop_read(small_nsq)
            small_floor_s = _noop_read(small_floor)
            before = _cpu(spark) if args.profile else {}
            read_s = _noop_read(nsq)
            cpu = _cpu_delta(before, _cpu(spark)) if args.profile else {}
            before = _cpu(spark) if args.profile else {}
            floor_s = _noop_read(floor)
            floor_cpu = _cpu_delta(before, _cpu(spark)) if args.profile else {}
            over = (read_s - floor_s) / args.rows * 1e6
            rounds.append({"read_s": round(read_s, 3), "floor_s": round(floor_s, 3),
                           "small_read_s": round(small_s, 3),
                           "small_floor_s": round(small_floor_s, 3),
                           "over_us_per_row": round(over, 2), "load1": load, **(
                               {"read_cpu_s": cpu, "floor_cpu_s": floor_cpu} if cpu else {})})
            if not args.json:
                print(f"local[{cores}] partitions={partitions} noop: connector {read_s:.2f} s, "
                      f"trivial source {floor_s:.2f} s: {over:.1f} us/row above it "
                      f"(load {load:.2f}); a few rows: {small_s:.2f} s, trivial source "
                      f"{small_floor_s:.2f} s", flush=True)
                if cpu:
                    print(f"    CPU s: connector {cpu}, trivial source {floor_cpu}", flush=True)
        overs = sorted(r["over_us_per_row"] for r in rounds)
        out.append({"cores": cores, "partitions": partitions, "rows": args.rows,
                    "noop": rounds, "median_over_us_per_row": overs[len(overs) // 2]})
        if not args.json:
            print(f"local[{cores}] partitions={partitions} noop: median "
                  f"{overs[len(overs) // 2]:.1f} us/row above the trivial source", flush=True)
    return out


def _tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _cpu_of(pid: int) -> tuple[str, float]:
    """``(kind, user + system seconds)`` of one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone", 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    kind = "jvm" if "java" in cmd.split(" ", 1)[0] else "python_workers"
    return kind, (int(fields[11]) + int(fields[12])) / ticks


def _cpu(spark: Any) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of the driver process, the JVM and every Python worker."""
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    spark_pids = _tree(jvm)
    out = {pid: _cpu_of(pid) for pid in spark_pids}
    for pid in set(_tree(os.getpid())) - set(spark_pids) - {os.getpid()}:
        out[pid] = ("servers", _cpu_of(pid)[1])  # --real: etcd, nsqd, nsqlookupd
    out[os.getpid()] = ("driver_devcluster", _cpu_of(os.getpid())[1])
    return out


def _cpu_delta(before: dict[int, tuple[str, float]],
               after: dict[int, tuple[str, float]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for pid, (kind, seconds) in after.items():
        if kind == "gone":
            continue
        spent = seconds - before.get(pid, (kind, 0.0))[1]
        totals[kind] = totals.get(kind, 0.0) + spent
    return {k: round(v, 2) for k, v in sorted(totals.items())}


def _arrow_cost(rows: int, size: int) -> dict[str, Any]:
    """CPU per message of the Arrow conversion alone: ``run_batch`` over a received chunk's
    columns (what a range read builds) and ``message_batch`` over message objects (what a
    stream in ``mode=ack`` builds)."""
    from smartnsq.protocol.frames import MessageFrame, youzan_message_id
    from smartnsq.protocol.runs import MessageRun
    from smartnsq.spark.columns import run_batch
    from smartnsq.spark.schema import message_batch

    batch = [MessageFrame(time.time_ns(), 1, youzan_message_id(i, 0), b"x" * size, 0, b"",
                     i * (size + 30), size + 30, True) for i in range(4096)]
    run = MessageRun.of(batch)
    loops = max(1, rows // 4096)
    out: dict[str, Any] = {}
    builds: list[tuple[str, Callable[[], object]]] = [
        ("arrow", lambda: message_batch("t", "n", batch)),
        ("arrow_columns", lambda: run_batch("t", "n", run))]
    for name, build in builds:
        build()  # warm-up (imports)
        started = time.process_time()
        for _ in range(loops):
            build()
        per = (time.process_time() - started) / (loops * 4096)
        out[f"{name}_us_per_message"] = round(per * 1e6, 2)
    return out


def _spark_ceiling(spark: Any, rows: int, size: int, cores: int) -> dict[str, Any]:
    """Spark's own read ceiling: the nsq schema from a Python source of pre-built batches."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from smartnsq.spark import read_schema

    class Synthetic(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(4)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            yield from _synthetic(size, rows // 4 // 4096 * 4096)

    class SyntheticSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nsq_bench_synthetic"

        def schema(self) -> Any:
            return read_schema()

        def reader(self, schema: Any) -> DataSourceReader:
            return Synthetic()

    spark.dataSource.register(SyntheticSource)
    load = spark.read.format("nsq_bench_synthetic").load()
    load.selectExpr("count(*)").collect()  # warm-up
    started = time.perf_counter()
    n = load.selectExpr("count(*) AS n", "sum(length(body)) AS bytes").collect()[0]["n"]
    elapsed = time.perf_counter() - started
    out = {"cores": cores, "spark_ceiling_rows_per_s": round(n / elapsed),
           **_arrow_cost(rows, size)}
    print(f"local[{cores}] Spark's ceiling (pre-built Arrow batches, no NSQ): "
          f"{out['spark_ceiling_rows_per_s']} rows/s; Arrow conversion alone: "
          f"{out['arrow_columns_us_per_message']} us/message from a chunk's columns, "
          f"{out['arrow_us_per_message']} from message objects", flush=True)
    return out


def _table(results: list[dict[str, Any]]) -> str:
    """Write and read rates side by side, plain and ordered, per core and partition count."""
    cells: dict[tuple[int, int], dict[bool, dict[str, Any]]] = {}
    for row in results:
        if "partitions" in row:
            cells.setdefault((row["cores"], row["partitions"]), {})[row["ordered"]] = row
    lines = ["| local cores | partitions | plain write | plain read | ordered write | "
             "ordered read |", "|---|---|---|---|---|---|"]
    for (cores, partitions), kinds in sorted(cells.items()):
        def rate(ordered: bool, key: str, kinds: dict[bool, dict[str, Any]] = kinds) -> str:
            row = kinds.get(ordered)
            return f"{row[key] / 1000:.1f}k" if row else "-"
        lines.append(f"| {cores} | {partitions} | {rate(False, 'write_rows_per_s')} | "
                     f"{rate(False, 'read_rows_per_s')} | {rate(True, 'write_rows_per_s')} | "
                     f"{rate(True, 'read_rows_per_s')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--keys", type=int, default=1000, help="distinct sharding keys")
    parser.add_argument("--cores", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--ordered", action="store_true",
                        help="also time ordered topics (SUB_ORDERED reads)")
    parser.add_argument("--profile", action="store_true",
                        help="where the read's CPU goes, Spark's ceiling, Arrow's cost")
    parser.add_argument("--read-option", action="append", default=[], metavar="NAME=VALUE",
                        help="a source option for the reads, e.g. orderedReadChannels=1")
    parser.add_argument("--stream", type=int, metavar="N",
                        help="also time an AvailableNow stream, unlimited and with "
                             "maxMessagesPerTrigger=N")
    parser.add_argument("--real", nargs="?", const=os.environ.get("SMARTNSQ_REAL_NSQ", ""),
                        metavar="DIR", help="the real youzan servers (binaries in DIR, "
                        "default $SMARTNSQ_REAL_NSQ) instead of the dev cluster")
    parser.add_argument("--noop", action="store_true",
                        help="instead of the table: every column into the noop sink, beside "
                        "the trivial Python source of the same rows, --repeat times")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of --noop")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    try:
        args.read_options = dict(item.split("=", 1) for item in args.read_option)
    except ValueError:
        parser.error("--read-option takes NAME=VALUE")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("pyspark is not installed: pip install 'smartnsq[spark]'", file=sys.stderr)
        return 2
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=2))
    elif not args.noop:
        print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
