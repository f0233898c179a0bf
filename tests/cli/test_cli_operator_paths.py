"""``smartnsq tail``, ``lookup`` and ``top`` on the paths operators hit beyond the happy one.

tail: usage refusals before anything is dialled, ``--from`` refused on classic NSQ and when a
channel cannot be positioned (the server's reason), unknown partitions named, ``--idle-exit``
ending a quiet or drained tail with 0, metadata lines for classic and youzan messages
(attempts shown once redelivered), binary bodies as base64 in ``--json``. lookup: classic
topics as a producer table, partitions without a leader shown, nodes whose ``/stats`` does
not answer named in a warning. top: its option rules, nodes that fail (a warning beside the
rows, or the error alone when no node answered), a channel filter, each replicated partition
once. Commands run in-process (``main`` in a worker thread) against dev clusters.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime, timezone

import pytest
from support import cli, closed_port, rows

from smartnsq import Consumer, Producer
from smartnsq.cli.util import CLIError, parse_start
from smartnsq.devcluster import DevCluster
from smartnsq.protocol.commands import StartPosition

BOUND = 20.0


def one_line_error(code: int, err: str) -> str:
    assert code == 1, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


async def publish(cluster: DevCluster, topic: str, bodies: list[bytes],
                  partition: int | None = None) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=10) as producer:
        await asyncio.wait_for(producer.publish_many(topic, bodies, partition=partition), BOUND)


# -- tail: refusals before anything is dialled -------------------------------------------------


def test_parse_start_reads_iso_dates_with_a_zone() -> None:
    when = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)
    assert parse_start("timestamp:2024-03-01T14:00:00+02:00") == \
        StartPosition.timestamp(int(when.timestamp()))
    assert parse_start("ts:2024-03-01T12:00:00") == StartPosition.timestamp(int(when.timestamp()))
    assert parse_start("msgcount:5") == StartPosition.message_count(5)
    assert parse_start("virtual_queue:7") == StartPosition.queue_offset(7)
    for bad in ("offset:", "count:many", "timestamp:tomorrow", "where:1"):
        with pytest.raises(CLIError, match=re.escape(f"bad --from {bad!r}")):
            parse_start(bad)


async def test_tail_usage_refusals() -> None:
    nsqd = f"127.0.0.1:{closed_port()}"
    code, _, err = await cli("tail", "t", "--nsqd", nsqd, "-n", "0")
    assert one_line_error(code, err).endswith("-n must be at least 1")
    code, _, err = await cli("tail", "t", "--nsqd", nsqd, "--channel", "no spaces")
    assert "bad --channel 'no spaces'" in one_line_error(code, err)
    code, _, err = await cli("tail", "t", "--nsqd", nsqd, "--from", "earliest", "--ordered")
    assert one_line_error(code, err).endswith(
        "--from with --ordered needs --lookupd (the channel is positioned on each partition's "
        "leader over HTTP)")


# -- tail on youzan topics ---------------------------------------------------------------------


async def test_tail_names_unknown_partitions(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("tp", partitions=2)
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await cli("tail", "tp", "--lookupd", lookupd, "--partition", "1",
                             "--partition", "4", "-n", "1")
    assert one_line_error(code, err).endswith(
        "--partition [4]: topic 'tp' has partitions [0, 1]")


async def test_tail_names_unknown_partitions_of_an_ordered_topic(
        nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("tpo", partitions=2, ordered=True)
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await cli("tail", "tpo", "--lookupd", lookupd, "--from", "earliest",
                             "--partition", "3", "-n", "1")
    assert one_line_error(code, err).endswith(
        "--partition [3]: topic 'tpo' has partitions [0, 1]")


async def test_tail_from_an_offset_the_server_refuses(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("off", partitions=1, ordered=True)
    await publish(nsq_cluster, "off", [b"one"], partition=0)  # (never written: no refusal)
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, _, err = await cli("tail", "off", "--lookupd", lookupd, "--from", "offset:99999",
                             "-n", "1")
    line = one_line_error(code, err)
    assert "positioning the channel on partition 0:" in line
    assert "queue offset 99999 is out of range" in line


async def test_idle_exit_ends_a_quiet_tail_and_a_drained_one(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("idle", partitions=2)
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, out, err = await cli("tail", "idle", "--lookupd", lookupd, "--idle-exit", "0.3")
    assert (code, out, err) == (0, "", "")
    await publish(nsq_cluster, "idle", [b"one", b"two"], partition=0)
    await publish(nsq_cluster, "idle", [b"three"], partition=1)
    code, out, err = await cli("tail", "idle", "--lookupd", lookupd, "--from", "earliest",
                               "--idle-exit", "1")
    assert code == 0, err
    assert sorted(out.split()) == ["one", "three", "two"]


async def test_meta_lines_of_youzan_messages_show_redeliveries(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("meta", partitions=1, channels=["work"])
    lookupd = nsq_cluster.lookupd_http_addresses
    await publish(nsq_cluster, "meta", [b"again"])
    # a consumer of the channel takes the message and gives it back
    async with Consumer("meta", "work", lookupd=lookupd, handler=None) as consumer:
        async def first() -> None:
            async for message in consumer:
                assert message.attempts == 1
                message.req(0, backoff=False)
                return
        await asyncio.wait_for(first(), BOUND)
    code, out, err = await cli("tail", "meta", "--lookupd", lookupd[0], "--channel", "work",
                               "-n", "1", "--show", "meta")
    assert code == 0, err
    line = out.strip()
    # partition and internal id, no trace id (none was given), and the delivery count
    shown = re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} p0 id \d+ attempts (\d+) \| again", line)
    assert shown is not None, line
    assert int(shown.group(1)) >= 2
    # the named channel's message was consumed for real
    code, out, err = await cli("tail", "meta", "--lookupd", lookupd[0], "--channel", "work",
                               "--idle-exit", "0.3")
    assert (code, out) == (0, ""), err


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_tail_names_the_silent_partitions_after_its_deadline(
        nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("mute", partitions=2)
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    tcp = nsq_cluster.nsqd_tcp_addresses[0]
    nsq_cluster.stall(0)  # the node's TCP port accepts and then says nothing
    try:
        # before the deadline a silent node is not a failure: --idle-exit just ends it
        code, out, err = await cli("tail", "mute", "--lookupd", lookupd, "--idle-exit", "0.3",
                                   "--timeout", "10")
        assert (code, out, err) == (0, "", "")
        code, _, err = await cli("tail", "mute", "--lookupd", lookupd, "-n", "1",
                                 "--timeout", "1")
        # after it: one line naming the node (its connect timeout and the command's
        # deadline are the same second, so either reason may be the one given)
        line = one_line_error(code, err)
        assert "cannot subscribe to 'mute': " in line and tcp in line
        assert line.endswith((f"no answer from {tcp}/0, {tcp}/1 within 1 s",
                              f"connecting to {tcp} took more than 1s"))
    finally:
        nsq_cluster.resume(0)


# -- tail and lookup on classic topics ---------------------------------------------------------


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_classic_tail_and_lookup(nsq_cluster: DevCluster) -> None:
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    # no channel yet: the messages wait in the topic for the first channel, the tail's
    await nsq_cluster.create_topic("cbin", channels=[])
    await publish(nsq_cluster, "cbin", [b"\xff\xfe binary", b"text"])
    code, _, err = await cli("tail", "cbin", "--lookupd", lookupd, "--from", "earliest")
    assert one_line_error(code, err).endswith(
        "--from needs youzan nsqd: classic NSQ channels cannot start elsewhere than where "
        "they are")
    code, out, err = await cli("tail", "cbin", "--lookupd", lookupd, "-n", "2", "--json")
    assert code == 0, err
    got = rows(out)
    assert [r.get("body") for r in got] == [None, "text"]
    assert got[0]["body_base64"] == "//4gYmluYXJ5"
    assert all(r["partition"] is None and r["queue_offset"] is None and
               r["internal_id"] is None for r in got)
    await nsq_cluster.create_topic("cmeta", channels=[])
    await publish(nsq_cluster, "cmeta", [b"hello"])
    code, out, err = await cli("tail", "cmeta", "--lookupd", lookupd, "-n", "1", "--show",
                               "meta")
    assert code == 0, err
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} id [0-9a-f]{16} \| hello", out.strip()), out

    code, out, err = await cli("lookup", "cmeta", "--lookupd", lookupd)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"topic cmeta (classic, access=r) from lookupd {lookupd}"
    assert lines[1].split() == ["node", "http", "version"]
    assert lines[3].split() == [nsq_cluster.nsqd_tcp_addresses[0],
                                nsq_cluster.nsqd_http_addresses[0], "1.3.0"]
    assert not any(line.startswith("meta:") for line in lines)
    code, out, err = await cli("lookup", "cmeta", "--lookupd", lookupd, "--json")
    view = json.loads(out)
    assert (view["youzan"], view["meta"], view["partitions"]) == (False, None, [])
    assert [p["address"] for p in view["producers"]] == nsq_cluster.nsqd_tcp_addresses


# -- lookup ----------------------------------------------------------------------------------


async def test_lookup_needs_a_lookupd() -> None:
    code, _, err = await cli("lookup", "t")
    assert one_line_error(code, err).endswith("lookup needs --lookupd HOST:PORT (or "
                                              "SMARTNSQ_LOOKUPD)")


async def test_lookup_shows_a_partition_without_leader(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("nl", partitions=2, replicas=2, channels=[])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    leader = nsq_cluster.leader_of("nl", 1)
    await nsq_cluster.stop_node(leader)  # a crash: no failover, no leader for partition 1
    code, out, err = await cli("lookup", "nl", "--lookupd", lookupd)
    assert code == 0, err
    lines = out.splitlines()
    assert "meta: 2 partitions, replica 2" in lines[1]
    assert not any(line.startswith("channels:") for line in lines)
    p1 = next(line for line in lines if line.split()[:1] == ["1"])
    assert "(no leader now)" in p1
    p0 = next(line for line in lines if line.split()[:1] == ["0"])
    assert p0.split()[1] == nsq_cluster.node_info(nsq_cluster.leader_of("nl", 0)).tcp_address


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_lookup_of_a_topic_whose_only_leader_is_down(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("down", partitions=1, replicas=2, channels=[])
    await nsq_cluster.stop_node(nsq_cluster.leader_of("down", 0))
    code, out, err = await cli("lookup", "down", "--lookupd",
                               nsq_cluster.lookupd_http_addresses[0])
    assert "does not exist" not in err
    assert code == 0 and "(no leader now)" in out


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_tail_of_a_topic_whose_only_leader_is_down(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("tdown", partitions=1, replicas=2, channels=[])
    await nsq_cluster.stop_node(nsq_cluster.leader_of("tdown", 0))
    code, _, err = await cli("tail", "tdown", "--lookupd",
                             nsq_cluster.lookupd_http_addresses[0], "-n", "1", "--timeout", "2")
    assert code == 1
    assert "does not exist" not in err


@pytest.mark.nsq_cluster(nodes=3, lookupds=1, proxied=True)
async def test_lookup_warns_about_nodes_whose_stats_do_not_answer(
        nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("ws", partitions=1, replicas=2)
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    p = nsq_cluster.state.partition("ws", 0)
    assert p is not None
    replica = next(r for r in p.replicas if r != p.leader)
    index = nsq_cluster.nodes.index(nsq_cluster.node(replica))
    silent = nsq_cluster.nsqd_http_addresses[index]
    await nsq_cluster.proxies[replica].http.refuse()  # its HTTP port is closed to us
    code, out, err = await cli("lookup", "ws", "--lookupd", lookupd, "--timeout", "5")
    assert code == 0, err
    assert f"replicas unknown: no /stats answer from {silent}" in err
    row = next(line for line in out.splitlines() if line.split()[:1] == ["0"])
    assert silent not in row  # its replica could not be read
    code, out, err = await cli("lookup", "ws", "--lookupd", lookupd, "--json")
    assert json.loads(out)["replicas_unknown_on"] == [silent]


# -- top -------------------------------------------------------------------------------------


async def test_top_option_rules() -> None:
    lookupd = f"127.0.0.1:{closed_port()}"
    code, _, err = await cli("top", "--lookupd", lookupd, "--interval", "-1")
    assert one_line_error(code, err).endswith("--interval must be >= 0")
    code, _, err = await cli("top", "--lookupd", lookupd, "--interval", "0")
    assert one_line_error(code, err).endswith("--interval 0 is for --json (one reading)")
    code, _, err = await cli("top", "--lookupd", lookupd, "--json", "--interval", "0",
                             "--timeout", "2")
    assert lookupd.split(":")[1] in one_line_error(code, err)


async def test_top_reads_given_nodes_and_warns_about_dead_ones(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("tg", partitions=3, replicas=2, channels=["a", "b"])
    await publish(nsq_cluster, "tg", [b"m"] * 2, partition=0)
    dead = f"127.0.0.1:{closed_port()}"
    nodes = ",".join([*nsq_cluster.nsqd_http_addresses, dead])
    code, out, err = await cli("top", "tg", "--nsqd-http", nodes, "--json", "--interval", "0",
                               "--channel", "a", "--timeout", "5")
    assert code == 0, err
    got = rows(out)
    assert {r["channel"] for r in got} == {None, "a"}
    # each partition once, read from its leader (the replicas' counters are left out)
    assert sorted(r["partition"] for r in got if r["channel"] == "a") == [0, 1, 2]
    for r in got:
        leader = nsq_cluster.nodes.index(nsq_cluster.leader_of("tg", r["partition"]))
        assert r["leader_http"] == nsq_cluster.nsqd_http_addresses[leader]
    assert next(r for r in got if r["channel"] == "a" and r["partition"] == 0)["depth"] == 2
    [warning] = err.strip().splitlines()
    assert warning.startswith("warning: ") and dead.split(":")[1] in warning


async def test_top_with_no_node_answering(nsq_cluster: DevCluster) -> None:
    dead = [f"127.0.0.1:{closed_port()}" for _ in range(2)]
    code, _, err = await cli("top", "--nsqd-http", dead[0], "--json", "--interval", "0",
                             "--timeout", "3")
    assert dead[0].split(":")[1] in one_line_error(code, err)
    code, _, err = await cli("top", "--nsqd-http", ",".join(dead), "--json", "--interval",
                             "0", "--timeout", "3")
    assert one_line_error(code, err).endswith("(and 1 more nodes failed)")
    code, _, err = await cli("top", "zzz", "--lookupd", nsq_cluster.lookupd_http_addresses[0],
                             "--json", "--interval", "0")
    assert one_line_error(code, err).endswith("topic 'zzz' not found on any node")


async def test_live_top_header_counts_failed_nodes(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("th", partitions=1)
    dead = f"127.0.0.1:{closed_port()}"
    nodes = ",".join([*nsq_cluster.nsqd_http_addresses, dead])
    code, out, err = await cli("top", "th", "--nsqd-http", nodes, "--count", "1",
                               "--interval", "0.1", "--timeout", "5")
    assert code == 0, err
    header = out.split("\x1b[H\x1b[2J")[1].splitlines()[0]
    assert "(1 node(s) failed: " in header and dead.split(":")[1] in header


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_top_when_lookupd_knows_no_node(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.stop_node(0)
    code, _, err = await cli("top", "--lookupd", nsq_cluster.lookupd_http_addresses[0],
                             "--json", "--interval", "0")
    assert one_line_error(code, err).endswith("lookupd knows no nsqd nodes")
