"""NSQ as a PySpark data source and sink (Python Data Source API, pyspark >= 4.0).

::

    import smartnsq.spark
    smartnsq.spark.register(spark)

    (df.write.format("nsq").option("lookupd", "127.0.0.1:4161").option("topic", "orders")
       .option("shardingKeyColumn", "order_id").mode("append").save())

    stream = (spark.readStream.format("nsq").option("lookupd", "127.0.0.1:4161")
              .option("topic", "orders").option("startingOffsets", "earliest").load())

The sink (``sink.py``) publishes each task's rows in MPUB batches through a producer cached
per Python worker, routed exactly as ``Producer`` routes. The source (``source.py``) reads
youzan topics replayably by queue offset, one Spark input partition per NSQ partition range.
See ``docs/spark.md`` for the options and the delivery guarantees.

Spark starts Python workers as separate processes: the nsqlookupd/nsqd addresses given in the
options must be reachable from every executor, and the workers must run a Python that has
smartnsq installed (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from ..errors import InvalidArgument
from .ack_source import NSQAckStreamReader
from .options import AckSourceOptions, SinkOptions, SourceOptions, source_mode
from .schema import READ_COLUMNS, READ_SCHEMA_DDL, read_schema
from .sink import NSQCommitMessage, make_stream_writer, make_writer
from .source import NSQBatchReader, NSQRangePartition, NSQStreamReader

__all__ = [
    "READ_COLUMNS",
    "READ_SCHEMA_DDL",
    "NSQCommitMessage",
    "NSQDataSource",
    "NSQRangePartition",
    "read_schema",
    "register",
]


class NSQDataSource(DataSource):
    """``format("nsq")``: options are parsed (and checked) when Spark asks for a reader/writer."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> Any:
        return read_schema()

    def reader(self, schema: Any) -> DataSourceReader:
        return NSQBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if source_mode(self.options) == "ack":
            return NSQAckStreamReader(AckSourceOptions.parse(self.options))
        return NSQStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidArgument("mode", "a topic can only be appended to: use "
                                  "mode('append')", "overwrite")
        return make_writer(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return make_stream_writer(SinkOptions.parse(self.options), schema)


def register(spark: Any) -> None:
    """Make ``format("nsq")`` available in this SparkSession."""
    spark.dataSource.register(NSQDataSource)
