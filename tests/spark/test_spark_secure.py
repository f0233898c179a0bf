"""TLS, AUTH and compression through the connector, against a secured dev cluster.

The dev nsqd offers ``tls_v1`` with a certificate of a throw-away CA and asks for AUTH; the
connector's options carry the CA file and the secret to every connection (sink producer,
range readers, the ack source's consumer). The secret must never appear in a query plan.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.spark

SECRET = "sp4rk-s3cret-value"
AUTH = {SECRET: {"identity": "spark", "authorizations": [
    {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}]}}


@pytest.fixture(scope="module")
def secured(spark: Any, tmp_path_factory: Any) -> Iterator[tuple[Any, dict[str, str]]]:
    from smartnsq.testing.spark import SparkDevCluster

    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with SparkDevCluster(nodes=1, lookupds=1, tls=context, auth=AUTH) as cluster:
        options = {"lookupd": cluster.lookupd, "tls": "true", "tlsCaFile": str(ca_file),
                   "authSecret": SECRET}
        yield cluster, options


def test_tls_auth_and_compression_write_and_read(spark: Any, secured: Any) -> None:
    cluster, options = secured
    cluster.create_topic("secure_t", partitions=2)
    rows = [(f"k{i % 5}", f"s{i}".encode()) for i in range(50)]
    df = spark.createDataFrame(rows, "key STRING, body BINARY")
    (df.write.format("nsq").options(**options, compression="snappy").option("topic", "secure_t")
     .option("shardingKeyColumn", "key").mode("append").save())
    read = (spark.read.format("nsq").options(**options, compression="deflate")
            .option("topic", "secure_t").load())
    assert sorted(r.body for r in read.collect()) == sorted(body for _, body in rows)

    # the secret stays out of every rendering of the plan
    plans = [read._jdf.queryExecution().toString(),
             read._jdf.queryExecution().simpleString(),
             df.write.format("nsq").options(**options).option("topic", "x")._jwrite.toString()]
    for plan in plans:
        assert SECRET not in plan


def test_a_wrong_secret_fails_naming_the_auth_error(spark: Any, secured: Any) -> None:
    cluster, options = secured
    cluster.create_topic("secure_denied", partitions=1)
    df = spark.createDataFrame([(b"x",)], "body BINARY")
    with pytest.raises(Exception, match="E_AUTH_FAILED") as info:
        (df.write.format("nsq").options(**{**options, "authSecret": "wrong-one"})
         .option("topic", "secure_denied").option("timeout", "5").mode("append").save())
    assert "wrong-one" not in str(info.value)
