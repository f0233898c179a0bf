"""The dev cluster's answers to the operator's endpoints, byte for byte as the real servers gave
them (youzan 0.3.7-HA.1.13.0 and classic 1.3.0, asked directly: docs/admin.md), with httpx
(a client independent of ours): the statuses and messages of the refusals, which the clients
and the CLI pass on to operators."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from smartnsq.admin import Admin, AsyncAdmin
from smartnsq.devcluster import DevCluster

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


async def _post(address: str, path: str, **params: str) -> tuple[int, str]:
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"http://{address}{path}", params=params, headers=V1)
    return answer.status_code, answer.text


async def _get(address: str, path: str, **params: str) -> tuple[int, str]:
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://{address}{path}", params=params, headers=V1)
    return answer.status_code, answer.text


@pytest.mark.nsq_cluster(nodes=2, lookupds=2)
async def test_youzan_nsqd_answers_as_measured(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("ep", partitions=1, replicas=2, channels=["ch"])
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        leader = (await admin.lookup("ep")).leader(0)
    assert leader is not None
    replica = next(a for a in nsq_cluster.nsqd_http_addresses if a != leader.http_address)
    args = {"topic": "ep", "channel": "ch", "partition": "0"}
    for path in ("/channel/pause", "/channel/unpause", "/channel/skip", "/channel/unskip"):
        assert await _post(replica, path, **args) == (500, '{"message":"INTERNAL_ERROR"}')
        assert await _post(leader.http_address, path, **args) == (200, "")
    for path in ("/channel/empty", "/channel/emptydelayed", "/channel/requeuedelayed"):
        assert await _post(replica, path, **args) == (400,
                                                      '{"message":"E_FAILED_ON_NOT_LEADER"}')
        assert await _post(leader.http_address, path, **args) == (200, "")
        assert await _post(leader.http_address, path, **{**args, "channel": "no"}) == (
            404, '{"message":"CHANNEL_NOT_FOUND"}')
        assert await _post(leader.http_address, path, **{**args, "topic": "no"}) == (
            404, '{"message":"E_TOPIC_NOT_EXIST"}')
    finish = "/message/finish"
    assert await _post(leader.http_address, finish, **args) == (
        400, '{"message":"INVALID_REQUEST"}')
    assert await _post(leader.http_address, finish, **args, msgid="12345") == (
        500, '{"message":"ErrType:7 ErrCode:0 : Message ID not in flight"}')
    assert await _post(replica, finish, **args, msgid="1") == (
        400, '{"message":"E_FAILED_ON_NOT_LEADER"}')
    get = "/message/get"
    assert await _get(leader.http_address, get, topic="ep", search_mode="virtual_offset",
                      search_pos="1") == (
        400, '{"message":"strconv.Atoi: parsing \\"\\": invalid syntax"}')
    assert await _get(leader.http_address, get, topic="ep", search_mode="id",
                      search_pos="7", delayed_queue="true") == (
        400, '{"message":"delayed queue search channel must be given"}')
    assert await _get(leader.http_address, get, topic="ep", search_mode="id", search_pos="7",
                      delayed_queue="true", channel="ch") == (
        404, '{"message":"no message found in delayed queue"}')
    assert await _get(leader.http_address, get, topic="no", search_mode="count",
                      search_pos="1", partition="0") == (
        400, '{"message":"topic does not exist"}')
    assert await _post(leader.http_address, "/topic/pause", topic="ep") == (
        404, '{"message":"NOT_FOUND"}')


@pytest.mark.nsq_cluster(nodes=2, lookupds=2)
async def test_youzan_lookupd_expand_and_tombstone(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("ex", partitions=2, channels=["ch"])
    leader = nsq_cluster.leader_lookupd
    assert leader is not None
    other = next(a for a in nsq_cluster.lookupd_http_addresses if a != leader.http_address)
    path = "/topic/partition/expand"
    assert await _post(other, path, topic="ex", partition_num="3") == (
        500, '{"message":"Not nsqlookup leader"}')
    at = leader.http_address
    assert await _post(at, path, topic="ex") == (
        400, '{"message":"MISSING_ARG_TOPIC_PARTITION_NUM"}')
    assert await _post(at, path, topic="ex", partition_num="x") == (
        400, '{"message":"INVALID_ARG_TOPIC_PARTITION_NUM"}')
    assert await _post(at, path, partition_num="2") == (400, '{"message":"MISSING_ARG_TOPIC"}')
    assert await _post(at, path, topic="no", partition_num="3") == (
        500, '{"message":"topic is not created"}')
    assert await _post(at, path, topic="ex", partition_num="1") == (
        500, '{"message":"the partition number can not be reduced"}')
    assert await _post(at, path, topic="ex", partition_num="3") == (
        500, '{"message":"ErrType:9 ErrCode:1 : No node is available for topic"}')
    assert await _post(at, path, topic="ex", partition_num="2") == (200, "")
    # a tombstone is the lookupd's own: the other lookupd still lists the node for writers
    async with AsyncAdmin([at]) as admin:
        node = (await admin.lookup("ex")).leader(0)
    assert node is not None
    assert await _post(at, "/topic/tombstone", topic="ex", node=node.http_address) == (200, "")
    async with AsyncAdmin([at]) as mine, AsyncAdmin([other]) as theirs:
        assert 0 not in (await mine.lookup("ex", "w")).leaders()
        assert 0 in (await theirs.lookup("ex", "w")).leaders()
    assert await _post(at, "/topic/tombstone", topic="ex") == (
        400, '{"message":"MISSING_ARG_NODE"}')


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_classic_topic_pause_answers_as_measured(nsq_cluster: DevCluster) -> None:
    await nsq_cluster.create_topic("cp", channels=["ch"])
    node = nsq_cluster.nsqd_http_addresses[0]
    assert await _post(node, "/topic/pause", topic="cp") == (200, "")
    stats = (await _get(node, "/stats", format="json", topic="cp"))[1]
    assert '"paused":true' in stats.replace(" ", "")
    assert await _post(node, "/topic/unpause", topic="cp") == (200, "")
    assert await _post(node, "/topic/pause", topic="no") == (404, '{"message":"TOPIC_NOT_FOUND"}')
    assert await _post(node, "/topic/pause") == (400, '{"message":"MISSING_ARG_TOPIC"}')
    assert await _post(node, "/channel/skip", topic="cp", channel="ch") == (
        404, '{"message":"NOT_FOUND"}')


async def test_the_blocking_admin_forwards_the_actions(nsq_cluster: DevCluster) -> None:
    """``Admin`` runs each action on its loop thread with the async call's own result."""
    await nsq_cluster.create_topic("bl", partitions=2, channels=["ch"])
    lookupd = nsq_cluster.lookupd_http_addresses

    def week() -> tuple[object, ...]:
        with Admin(lookupd, timeout=5) as admin:
            paused = admin.pause_channel("bl", "ch", partition=1)
            admin.unpause_channel("bl", "ch")
            admin.skip_channel("bl", "ch")
            admin.unskip_channel("bl", "ch")
            admin.empty_channel("bl", "ch")
            admin.empty_delayed("bl", "ch")
            admin.requeue_delayed("bl", "ch")
            leader = admin.expand_topic("bl", 3)
            node = admin.lookup("bl").leader(0)
            assert node is not None
            told = admin.tombstone("bl", node.http_address)
            admin.tombstone("bl", node.http_address, restore=True)
            return paused, leader, told

    paused, leader, told = await asyncio.wait_for(asyncio.to_thread(week), 30)
    assert isinstance(paused, tuple) and [pid for pid, _ in paused] == [1]
    assert nsq_cluster.leader_lookupd is not None
    assert leader == nsq_cluster.leader_lookupd.http_address
    assert set(told) == set(lookupd)  # type: ignore[call-overload]


async def test_setoffset_on_a_partition_never_written(nsq_cluster: DevCluster) -> None:
    """Measured: until a partition holds a message, every setoffset but ``special:-1`` is
    ``500 commit log end of file`` (so ``channel setoffset ... earliest`` on a new topic)."""
    await nsq_cluster.create_topic("nw", partitions=1, channels=["ch"])
    async with AsyncAdmin(nsq_cluster.lookupd_http_addresses) as admin:
        leader = (await admin.lookup("nw")).leader(0)
    assert leader is not None
    async with httpx.AsyncClient() as client:
        url = f"http://{leader.http_address}/channel/setoffset"
        params = {"topic": "nw", "channel": "ch", "partition": "0"}
        for body, status in ((b"msgcount:0", 500), (b"virtual_queue:0", 500),
                             (b"timestamp:0", 500), (b"special:-1", 200)):
            answer = await client.post(url, params=params, content=body, headers=V1)
            assert answer.status_code == status, body
            if status == 500:
                assert answer.text == '{"message":"commit log end of file"}'
