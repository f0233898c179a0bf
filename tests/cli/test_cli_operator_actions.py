"""``smartnsq topic``, ``channel`` and ``message``: the operator's actions from the command line.

Each runs in-process against a dev cluster and is checked against the servers' own answers
(``/stats``, ``/lookup``) through ``smartnsq.admin``; the refusals are one line on stderr
with status 1 (2 for argparse's usage errors), the results one line or one ``--json`` object.
"""

from __future__ import annotations

import json

import pytest
from support import cli, closed_port, rows

from smartnsq import Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.devcluster import DevCluster

pytestmark = pytest.mark.nsq_cluster(nodes=3, lookupds=2)


def one_line_error(code: int, err: str) -> str:
    assert code == 1, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


async def _channel_state(cluster: DevCluster, topic: str, partition: int) -> tuple[bool, bool,
                                                                                    int]:
    async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
        view = await admin.lookup(topic)
        leader = view.leader(partition)
        assert leader is not None
        stats = await admin.stats(leader.http_address, topic, "ch", partition=partition)
    entry = stats.topic(topic, partition)
    assert entry is not None
    channel = entry.channel("ch")
    assert channel is not None
    return channel.paused, channel.skipped, channel.depth


async def test_topic_create_expand_and_delete(nsq_cluster: DevCluster) -> None:
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, out, err = await cli("topic", "create", "ops", "--partitions", "2", "--channel", "ch",
                               "--lookupd", lookupd, "--json")
    assert code == 0, err
    created = json.loads(out)
    assert (created["done"], created["leaders"], created["writable"]) == (True, [0, 1], [0, 1])
    code, out, err = await cli("topic", "expand", "ops", "--partitions", "3",
                               "--lookupd", lookupd)
    assert code == 0, err
    assert out.startswith("expanded ops to 3 partitions")
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        view = await admin.lookup("ops")
    assert view.meta is not None and view.meta.partition_num == 3
    assert set(view.partitions) == {0, 1, 2}
    code, _, err = await cli("topic", "expand", "ops", "--partitions", "2", "--lookupd", lookupd)
    assert "the partition number can not be reduced" in one_line_error(code, err)
    code, _, err = await cli("topic", "expand", "ops", "--lookupd", lookupd)
    assert one_line_error(code, err).endswith("topic expand needs --partitions N (the new "
                                              "partition count)")
    code, out, err = await cli("topic", "delete", "ops", "--lookupd", lookupd, "--json")
    assert (code, json.loads(out)) == (0, {"action": "delete", "topic": "ops"}), err
    code, _, err = await cli("channel", "pause", "ops", "ch", "--lookupd", lookupd)
    assert "topic 'ops' does not exist" in one_line_error(code, err)


async def test_channel_actions_report_where_they_went(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("opc", partitions=2, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    code, out, err = await cli("channel", "pause", "opc", "ch", "--lookupd", lookupd, "--json")
    assert code == 0, err
    paused = json.loads(out)
    assert sorted(t["partition"] for t in paused["targets"]) == [0, 1]
    assert (await _channel_state(nsq_cluster, "opc", 1))[0]
    code, out, err = await cli("channel", "unpause", "opc", "ch", "--partition", "1",
                               "--lookupd", lookupd)
    assert code == 0 and out.startswith("unpaused channel ch of opc: p1 on "), err
    assert not (await _channel_state(nsq_cluster, "opc", 1))[0]
    assert (await _channel_state(nsq_cluster, "opc", 0))[0]
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
        await producer.publish_many("opc", [b"a", b"b"], partition=0)
    assert (await _channel_state(nsq_cluster, "opc", 0))[2] == 2
    for action in ("unpause", "empty", "skip"):
        code, _, err = await cli("channel", action, "opc", "ch", "--lookupd", lookupd)
        assert code == 0, err
    assert (await _channel_state(nsq_cluster, "opc", 0)) == (False, True, 0)
    for action in ("unskip", "empty-delayed", "requeue-delayed"):
        code, out, err = await cli("channel", action, "opc", "ch", "--lookupd", lookupd)
        assert code == 0, err
    code, out, err = await cli("channel", "setoffset", "opc", "ch", "earliest",
                               "--partition", "0", "--lookupd", lookupd, "--json")
    assert code == 0, err
    assert json.loads(out)["position"] == "earliest"
    assert (await _channel_state(nsq_cluster, "opc", 0)) == (False, False, 2)
    code, _, err = await cli("channel", "pause", "opc", "nochan", "--lookupd", lookupd)
    assert "CHANNEL_NOT_FOUND" in one_line_error(code, err)


async def test_channel_refusals_before_anything_is_dialled() -> None:
    lookupd = f"127.0.0.1:{closed_port()}"
    code, _, err = await cli("channel", "setoffset", "t", "ch", "--lookupd", lookupd)
    assert "channel setoffset needs a POSITION" in one_line_error(code, err)
    code, _, err = await cli("channel", "setoffset", "t", "ch", "where:1", "--lookupd", lookupd)
    assert "bad POSITION 'where:1'" in one_line_error(code, err)
    code, _, err = await cli("channel", "pause", "t", "ch", "extra", "--lookupd", lookupd)
    assert "channel pause takes no POSITION" in one_line_error(code, err)
    code, _, err = await cli("channel", "pause", "t", "no spaces", "--lookupd", lookupd)
    assert "bad channel name 'no spaces'" in one_line_error(code, err)
    code, _, err = await cli("channel", "pause", "t", "ch")
    assert "needs --lookupd" in one_line_error(code, err)
    code, _, err = await cli("channel", "frobnicate", "t", "ch")
    assert code == 2 and "invalid choice" in err


async def test_message_get_by_id_offset_and_count(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("opm", partitions=2, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    async with Producer(lookupd=nsq_cluster.lookupd_http_addresses) as producer:
        receipts = [await producer.publish("opm", b"body %d" % i, partition=1,
                                           trace_id=70 + i) for i in range(3)]
    last = receipts[-1]
    code, out, err = await cli("message", "get", "opm", "--id", str(last.internal_id),
                               "--lookupd", lookupd, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert (got["body"], got["trace_id"], got["partition"], got["queue_offset"]) == (
        "body 2", 72, 1, last.queue_offset)
    code, out, err = await cli("message", "get", "opm", "--offset", str(last.queue_offset),
                               "--partition", "1", "--lookupd", lookupd, "--json")
    assert code == 0 and rows(out)[0]["id"] == last.internal_id, err
    code, out, err = await cli("message", "get", "opm", "--count", "1", "--partition", "1",
                               "--lookupd", lookupd)
    assert code == 0, err
    meta, body = out.splitlines()
    assert meta.startswith(f"opm p1 id {receipts[0].internal_id} offset 0 count 1 trace 70")
    assert body == "body 0"
    code, _, err = await cli("message", "get", "opm", "--count", "1", "--lookupd", lookupd)
    assert "--partition: a search by count needs the partition" in one_line_error(code, err)
    code, _, err = await cli("message", "get", "opm", "--count", "9", "--partition", "1",
                             "--lookupd", lookupd)
    assert "INTERNAL_ERROR" in one_line_error(code, err)
    code, _, err = await cli("message", "finish", "opm", "ch", "--id", str(last.internal_id),
                             "--lookupd", lookupd)
    assert "Message ID not in flight" in one_line_error(code, err)
    code, _, err = await cli("message", "finish", "opm", "--id", "1", "--lookupd", lookupd)
    assert one_line_error(code, err).endswith("message finish needs CHANNEL and --id ID")


async def test_topic_tombstone_and_classic_topic_pause(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("opt", partitions=2, channels=["ch"])
    lookupds = nsq_cluster.lookupd_http_addresses
    async with AsyncAdmin(lookupds) as admin:
        leader = (await admin.lookup("opt")).leader(0)
    assert leader is not None
    code, out, err = await cli("topic", "tombstone", "opt", "--node", leader.http_address,
                               "--lookupd", ",".join(lookupds), "--json")
    assert code == 0, err
    assert sorted(json.loads(out)["lookupds"]) == sorted(lookupds)
    async with AsyncAdmin(lookupds) as admin:
        assert 0 not in (await admin.lookup("opt", "w")).leaders()
    code, _, err = await cli("topic", "tombstone", "opt", "--node", leader.http_address,
                             "--restore", "--lookupd", ",".join(lookupds))
    assert code == 0, err
    code, _, err = await cli("topic", "tombstone", "opt", "--lookupd", lookupds[0])
    assert "needs --node" in one_line_error(code, err)
    code, _, err = await cli("topic", "pause", "opt", "--lookupd", lookupds[0])
    assert "NOT_FOUND" in one_line_error(code, err)  # youzan nsqd has no /topic/pause


async def test_classic_topic_pause(nsq_cluster_factory: object) -> None:
    cluster = await nsq_cluster_factory(mode="classic", nodes=1, lookupds=1)  # type: ignore[operator]
    await cluster.create_topic("opk", channels=["ch"])
    lookupd = cluster.lookupd_http_addresses[0]
    code, out, err = await cli("topic", "pause", "opk", "--lookupd", lookupd, "--json")
    assert code == 0, err
    assert json.loads(out)["targets"] == [{"partition": None,
                                           "node": cluster.nsqd_http_addresses[0]}]
    code, out, err = await cli("topic", "unpause", "opk",
                               "--nsqd-http", cluster.nsqd_http_addresses[0])
    assert code == 0 and out.startswith("unpaused opk: "), err
    code, _, err = await cli("topic", "expand", "opk", "--partitions", "2", "--lookupd", lookupd)
    assert "classic" in one_line_error(code, err)


async def test_completion_knows_the_new_commands() -> None:
    code, out, _ = await cli("completion", "bash")
    assert code == 0
    for word in ("topic", "channel", "message", "empty-delayed", "requeue-delayed", "expand",
                 "tombstone", "--delayed-channel"):
        assert word in out
