"""A Spark pipeline over NSQ: read a topic, aggregate per sharding key, publish the totals.

Starts an embedded dev cluster (on a background loop, so it keeps serving while Spark
blocks) and a local SparkSession, then:

1. publishes orders to ``orders`` (3 partitions), sharded by customer;
2. reads the topic with ``spark.read.format("nsq")`` (a bounded, replayable read: one Spark
   task per NSQ partition);
3. sums the amounts per customer;
4. writes one message per customer to ``customer_totals``, sharded by customer, so the
   totals of a customer land in the same partition as its orders would;
5. reads ``customer_totals`` back and prints it.

    pip install -e '.[spark]'          # from the clone; pyspark >= 4.0 and pyarrow; Java 17+
    python examples/spark_pipeline.py
"""

from __future__ import annotations

import json
import os
import random

from smartnsq import sync
from smartnsq.testing.spark import SparkDevCluster, python_for_workers

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
python_for_workers()  # Spark's Python workers must run this interpreter (it has smartnsq)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import smartnsq.spark  # noqa: E402

CUSTOMERS = [f"customer-{i}" for i in range(8)]


def main() -> None:
    with SparkDevCluster(nodes=3, lookupds=1) as cluster:
        cluster.create_topic("orders", partitions=3)
        cluster.create_topic("customer_totals", partitions=3)

        # 1. some orders, sharded by customer (the Producer routes; Spark reads them back)
        rng = random.Random(7)
        expected: dict[str, int] = {}
        with sync.Producer(lookupd=cluster.lookupd.split(",")) as producer:
            for n in range(120):
                customer = rng.choice(CUSTOMERS)
                amount = rng.randint(1, 100)
                expected[customer] = expected.get(customer, 0) + amount
                producer.publish("orders", json.dumps({"order": n, "customer": customer,
                                                       "amount": amount}).encode(),
                                 sharding_key=customer)

        spark = (SparkSession.builder.master("local[2]").appName("nsq-pipeline")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 # a short local job: start-up dominates, so skip the JVM's C2 compiler
                 .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        smartnsq.spark.register(spark)
        try:
            # 2. read the topic (earliest to latest by default)
            orders = (spark.read.format("nsq").option("lookupd", cluster.lookupd)
                      .option("topic", "orders").load()
                      .select(F.from_json(F.col("body").cast("string"),
                                          "order INT, customer STRING, amount INT")
                              .alias("o"), "partition")
                      .select("o.*", "partition"))
            # 3. aggregate by the sharding key
            totals = (orders.groupBy("customer")
                      .agg(F.count("*").alias("orders"), F.sum("amount").alias("total"))
                      .select("customer",
                              F.to_json(F.struct("customer", "orders", "total"))
                              .cast("binary").alias("body")))
            # 4. publish one message per customer, sharded by customer
            (totals.write.format("nsq").option("lookupd", cluster.lookupd)
             .option("topic", "customer_totals").option("shardingKeyColumn", "customer")
             .mode("append").save())
            # 5. read the result back
            result = (spark.read.format("nsq").option("lookupd", cluster.lookupd)
                      .option("topic", "customer_totals").load()
                      .select("partition", F.col("body").cast("string").alias("body"))
                      .orderBy("body").collect())
        finally:
            spark.stop()

    got = {}
    for row in result:
        record = json.loads(row.body)
        got[record["customer"]] = record["total"]
        print(f"partition {row.partition}: {row.body}")
    assert got == expected, (got, expected)
    print(f"{len(got)} customer totals published to customer_totals; all match")


if __name__ == "__main__":
    main()
