"""Every ``smartnsq`` command against a dev cluster, in-process (``main(argv)``).

``main`` runs its own event loop (``asyncio.run``), so the tests call it in a worker thread
while the ``nsq_cluster`` fixture's servers keep running on the test's loop.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest
from support import cli, closed_port, rows

from smartnsq.cli import main
from smartnsq.cli.util import CLIError
from smartnsq.model.sharding import murmur3_partition


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- usage ------------------------------------------------------------------------------------

async def test_help_version_and_usage_errors() -> None:
    code, out, _ = await cli("--help")
    assert code == 0 and "demo" in out and "tail" in out
    code, out, _ = await cli("--version")
    assert code == 0 and out.startswith("smartnsq ")
    code, out, _ = await cli()
    assert code == 2 and "COMMAND" in out
    code, _, err = await cli("pub")  # missing TOPIC
    assert code == 2 and "usage:" in err
    code, _, err = await cli("lookup", "t", "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in err
    code, out, _ = await cli("dev-cluster", "--help")
    assert code == 0 and "smartnsq dev-cluster" in out


async def test_no_cluster_given() -> None:
    code, _, err = await cli("pub", "orders", stdin="x\n")
    assert_one_line_error(code, err, "no cluster given")
    code, _, err = await cli("lookup", "orders", "--lookupd", "not-an-address")
    assert_one_line_error(code, err, "bad lookupd address")


# -- pub, lookup, stats, tail on one topic -----------------------------------------------------

async def test_pub_key_field_then_lookup_stats_and_tail(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("events", partitions=2, replicas=2, channels=["default"])
    lookupd = ",".join(nsq_cluster.lookupd_http_addresses)
    lines = [json.dumps({"user": {"id": f"u{i % 5}"}, "seq": i}) for i in range(30)]
    code, out, err = await cli("pub", "events", "--lookupd", lookupd, "--key-field", "user.id",
                               "--batch", "4", stdin="\n".join(lines) + "\n\n")
    assert code == 0, err
    assert out.startswith("published 30 messages to events")

    # lookup: both partitions, their leaders, the replica each one has
    code, out, err = await cli("lookup", "events", "--lookupd", lookupd)
    assert code == 0, err
    assert "meta: 2 partitions, replica 2" in out
    code, out, _ = await cli("--lookupd", lookupd, "lookup", "events", "--json")
    view = json.loads(out)
    assert view["meta"]["partition_num"] == 2
    assert [p["partition"] for p in view["partitions"]] == [0, 1]
    for p in view["partitions"]:
        leader = nsq_cluster.node_info(nsq_cluster.leader_of("events", p["partition"]))
        assert p["leader"]["address"] == leader.tcp_address
        assert len(p["replicas"]) == 1 and p["replicas"][0] != p["leader"]["http_address"]

    # stats: the default channel holds every message, split by partition
    code, out, err = await cli("stats", "events", "--lookupd", lookupd, "--json")
    assert code == 0, err
    stats = rows(out)
    assert {s["partition"] for s in stats} == {0, 1}
    assert sum(s["depth"] for s in stats if s["channel"] == "default") == 30
    code, out, _ = await cli("stats", "--lookupd", lookupd)
    assert code == 0 and "events" in out and "in-flight" in out

    # tail from the start: each key on its partition, in order per key
    code, out, err = await cli("tail", "events", "--lookupd", lookupd, "--from", "earliest",
                               "-n", "30", "--json")
    assert code == 0, err
    seen = rows(out)
    assert len(seen) == 30
    last: dict[str, int] = {}
    for row in seen:
        body = json.loads(row["body"])
        key = body["user"]["id"]
        assert row["partition"] == murmur3_partition(key, 2)
        assert body["seq"] > last.get(key, -1)
        last[key] = body["seq"]
        assert row["topic"] == "events" and row["attempts"] == 1
    # the ephemeral channel consumed nothing of the durable one
    code, out, _ = await cli("stats", "events", "--lookupd", lookupd, "--json",
                             "--channel", "default")
    assert sum(s["depth"] for s in rows(out)) == 30


async def test_stats_youzan_topic_rows_have_no_message_depth(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("nochan", partitions=1, channels=[])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    leader = nsq_cluster.node_info(nsq_cluster.leader_of("nochan", 0)).tcp_address
    # straight to the leader: youzan's write lookup hides a partition without a channel
    code, _, err = await cli("pub", "nochan", "--nsqd", leader, stdin="a\nb\nc\n")
    assert code == 0, err
    code, out, err = await cli("stats", "nochan", "--lookupd", lookupd, "--json")
    assert code == 0, err
    [row] = rows(out)  # no channel: the topic's own row, whose youzan "depth" is bytes
    assert (row["channel"], row["depth"], row["messages"]) == (None, None, 3)
    assert row["queue_bytes"] > 0
    code, out, _ = await cli("stats", "nochan", "--lookupd", lookupd)
    assert code == 0 and "nochan" in out


async def test_pub_files_sharding_key_and_partition(nsq_cluster: Any, tmp_path: Any) -> None:
    await nsq_cluster.create_topic("files", partitions=3, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    first = tmp_path / "a.txt"
    first.write_text("one\ntwo\n")
    second = tmp_path / "b.txt"
    second.write_text("three\n")
    code, out, err = await cli("pub", "files", str(first), str(second), "--lookupd", lookupd,
                               "--sharding-key", "customer-7", "--no-progress")
    assert code == 0, err
    assert "published 3 messages" in out
    expected = murmur3_partition("customer-7", 3)
    code, out, err = await cli("pub", "files", "--lookupd", lookupd, "--partition", "2",
                               "--batch", "1", stdin="four\n")
    assert code == 0, err
    code, out, _ = await cli("tail", "files", "--lookupd", lookupd, "--from", "earliest",
                             "-n", "4", "--json")
    got = {(r["body"], r["partition"]) for r in rows(out)}
    assert got == {("one", expected), ("two", expected), ("three", expected), ("four", 2)}


async def test_pub_traced_with_headers_on_ext_topic(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("extt", partitions=1, ext=True, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, out, err = await cli("pub", "extt", "--lookupd", lookupd, "--trace-id", "4242",
                               "--header", "tenant=acme", "--partition", "0", stdin="hello\n")
    assert code == 0, err
    code, out, err = await cli("tail", "extt", "--lookupd", lookupd, "--from", "earliest",
                               "-n", "1", "--json")
    assert code == 0, err
    (row,) = rows(out)
    assert row["body"] == "hello" and row["trace_id"] == 4242
    assert row["headers"]["tenant"] == "acme"
    code, out, _ = await cli("tail", "extt", "--lookupd", lookupd, "--from", "earliest",
                             "-n", "1", "--show", "meta")
    assert "trace 4242" in out and "| hello" in out


async def test_tail_new_messages_on_ephemeral_channel(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("live", partitions=2, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    await cli("pub", "live", "--lookupd", lookupd, stdin="old\n")
    tail = asyncio.create_task(cli("tail", "live", "--lookupd", lookupd, "-n", "3"))
    published = 0
    # publish until the tail (which only sees messages after it subscribed) has three
    while not tail.done() and published < 500:
        code, _, err = await cli("pub", "live", "--lookupd", lookupd, "--batch", "1",
                                 stdin=f"new-{published}\n")
        assert code == 0, err
        published += 1
        await asyncio.wait({tail}, timeout=0.05)
    code, out, err = await asyncio.wait_for(tail, 10)
    assert code == 0, err
    lines = out.split()
    assert len(lines) == 3 and all(line.startswith("new-") for line in lines)


async def test_ordered_topic_tail_and_unsharded_pub(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("ord", partitions=2, ordered=True, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await cli("pub", "ord", "--lookupd", lookupd, stdin="x\n")
    assert_one_line_error(code, err, "ordered", "--sharding-key")
    body = "".join(f'{{"k": "a", "n": {i}}}\n' for i in range(10))
    code, _, err = await cli("pub", "ord", "--lookupd", lookupd, "--key-field", "k",
                             stdin=body)
    assert code == 0, err
    code, out, err = await cli("tail", "ord", "--lookupd", lookupd, "--from", "earliest",
                               "--ordered", "-n", "10", "--json")
    assert code == 0, err
    got = rows(out)
    assert [json.loads(r["body"])["n"] for r in got] == list(range(10))
    assert all(r["queue_offset"] is not None for r in got)  # SUB_ORDERED carries offsets


# -- bad input ----------------------------------------------------------------------------------

async def test_unknown_topic_is_one_line_error(nsq_cluster: Any) -> None:
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    for argv in (("lookup", "nope"), ("tail", "nope", "-n", "1")):
        code, _, err = await cli(*argv, "--lookupd", lookupd)
        assert_one_line_error(code, err, "'nope' does not exist: create it first",
                              "fault create-topic nope:")
    code, _, err = await cli("stats", "nope", "--lookupd", lookupd)
    assert_one_line_error(code, err, "'nope'", "not found")
    code, _, err = await cli("pub", "nope", "--lookupd", lookupd, stdin="x\n")
    assert_one_line_error(code, err, "'nope' does not exist: create it first")
    code, _, err = await cli("pub", "bad topic!", "--lookupd", lookupd, stdin="x\n")
    assert_one_line_error(code, err, "bad topic name")


async def test_unreachable_lookupd_is_one_line_error() -> None:
    lookupd = f"127.0.0.1:{closed_port()}"
    for argv in (("lookup", "t"), ("pub", "t"), ("tail", "t", "-n", "1"), ("stats", "t")):
        code, _, err = await cli(*argv, "--lookupd", lookupd, "--timeout", "1", stdin="x\n")
        assert_one_line_error(code, err, lookupd.split(":")[1])


async def test_malformed_json_line(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("js", partitions=2, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await cli("pub", "js", "--lookupd", lookupd, "--key-field", "id",
                             stdin='{"id": 1}\n{"id": \n')
    assert_one_line_error(code, err, "stdin:2", "not a JSON line")
    code, _, err = await cli("pub", "js", "--lookupd", lookupd, "--key-field", "id",
                             stdin='{"id": 1}\n{"other": 2}\n')
    assert_one_line_error(code, err, "stdin:2", "'id' is missing")
    code, _, err = await cli("pub", "js", "--lookupd", lookupd, "--key-field", "id",
                             stdin='{"id": [1]}\n')
    assert_one_line_error(code, err, "stdin:1", "string or an integer")
    # nothing of a chunk with a bad line was sent
    code, out, _ = await cli("stats", "js", "--lookupd", lookupd, "--json")
    assert sum(r["depth"] for r in rows(out)) == 0


async def test_other_bad_arguments(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("ba", partitions=2, channels=["default"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await cli("pub", "ba", "--lookupd", lookupd, "--partition", "5",
                             stdin="x\n")
    assert_one_line_error(code, err, "has 2 partitions")
    code, _, err = await cli("pub", "ba", "--lookupd", lookupd, "--header", "novalue",
                             stdin="x\n")
    assert_one_line_error(code, err, "NAME=VALUE")
    code, _, err = await cli("pub", "ba", "--lookupd", lookupd, "--header", "a=b",
                             stdin="x\n")  # not an ext topic: the server's refusal, one line
    assert_one_line_error(code, err)
    code, _, err = await cli("tail", "ba", "--lookupd", lookupd, "--from", "yesterday")
    assert_one_line_error(code, err, "bad --from")
    code, _, err = await cli("pub", "ba", "/no/such/file", "--lookupd", lookupd)
    assert_one_line_error(code, err, "cannot read /no/such/file")
    code, _, err = await cli("pub", "ba", "--lookupd", lookupd, "--nsqd", "127.0.0.1:1")
    assert_one_line_error(code, err, "not both")


async def test_debug_shows_the_exception(nsq_cluster: Any) -> None:
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    with pytest.raises(CLIError, match="does not exist"):
        await asyncio.to_thread(main, ["lookup", "nope", "--lookupd", lookupd, "--debug"],
                                stdout=io.StringIO(), stderr=io.StringIO())


async def test_pub_direct_to_nsqd(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("direct", partitions=1, channels=["default"])
    leader = nsq_cluster.node_info(nsq_cluster.leader_of("direct", 0)).tcp_address
    code, out, err = await cli("pub", "direct", "--nsqd", leader, stdin="a\nb\n")
    assert code == 0, err
    assert "published 2 messages" in out
