"""nsqlookupd behaviour beyond the captures: cluster changes seen through lookups.

The cluster is a ClusterState built by hand (no nsqd runs), so each test states exactly which
node leads what; lookupds are queried over real HTTP with httpx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from smartnsq.devcluster.lookupd import Lookupd
from smartnsq.devcluster.state import ClusterState, NodeInfo

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


def make_state(youzan: int = 3, classic: int = 0) -> ClusterState:
    state = ClusterState()
    for i in range(youzan + classic):
        port = 20000 + 10 * i
        is_classic = i >= youzan
        node_id = f"127.0.0.1:{port}" if is_classic else f"127.0.0.1:{port + 2}:{port}:{i}"
        state.nodes[node_id] = NodeInfo(node_id, "127.0.0.1", port, port + 1, f"host{i}",
                                        classic=is_classic)
    return state


def node_ids(state: ClusterState) -> list[str]:
    return list(state.nodes)


class Cluster:
    def __init__(self, state: ClusterState, lookupds: list[Lookupd],
                 client: httpx.AsyncClient) -> None:
        self.state = state
        self.lookupds = lookupds
        self.client = client

    async def get(self, path: str, lookupd: int = 0, **params: str) -> httpx.Response:
        return await self.client.get(f"http://{self.lookupds[lookupd].http_address}{path}",
                                     params=params, headers=V1)

    async def post(self, path: str, lookupd: int = 0, **params: str) -> httpx.Response:
        return await self.client.post(f"http://{self.lookupds[lookupd].http_address}{path}",
                                      params=params)

    async def lookup(self, topic: str, lookupd: int = 0, **params: str) -> dict[str, Any]:
        resp = await self.get("/lookup", lookupd, topic=topic, **params)
        assert resp.status_code == 200, resp.text
        data: dict[str, Any] = resp.json()
        return data

    def channel(self, topic: str, partition: int, name: str = "ch") -> None:
        p = self.state.partition(topic, partition)
        assert p is not None
        p.channels[name] = object()


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    state = make_state(classic=1)
    lookupds = [Lookupd(state, name=f"l{i}") for i in range(2)]
    for lookupd in lookupds:
        await lookupd.start()
    async with httpx.AsyncClient(timeout=5) as client:
        yield Cluster(state, lookupds, client)
    for lookupd in lookupds:
        await lookupd.stop()


def leaders(data: dict[str, Any]) -> dict[str, int]:
    return {pid: peer["tcp_port"] for pid, peer in data["partitions"].items()}


async def test_first_lookupd_leads_and_followers_refuse_topic_create(cluster: Cluster) -> None:
    assert cluster.lookupds[0].is_leader and not cluster.lookupds[1].is_leader
    resp = await cluster.post("/topic/create", 1, topic="t", partition_num="1", replicator="1")
    assert (resp.status_code, resp.json()) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})
    resp = await cluster.post("/topic/create", 0, topic="t", partition_num="1", replicator="1")
    assert resp.status_code == 200 and resp.content == b""
    # both lookupds read the same cluster state
    for i in (0, 1):
        assert set((await cluster.lookup("t", i))["partitions"]) == {"0"}


async def test_topic_create_is_idempotent_and_validates(cluster: Cluster) -> None:
    ok = {"topic": "t", "partition_num": "2", "replicator": "1"}
    assert (await cluster.post("/topic/create", **ok)).status_code == 200
    assert (await cluster.post("/topic/create", **ok)).status_code == 200
    cases = [
        ({}, "MISSING_ARG_TOPIC"),
        ({"topic": "t2"}, "MISSING_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "t2", "partition_num": "0", "replicator": "1"},
         "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "t2", "partition_num": "256", "replicator": "1"},
         "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "t2", "partition_num": "1"}, "MISSING_ARG_TOPIC_REPLICATOR"),
        ({"topic": "t2", "partition_num": "1", "replicator": "6"},
         "INVALID_ARG_TOPIC_REPLICATOR"),
        ({"topic": "t2", "partition_num": "4", "replicator": "1"},
         "ErrType:9 ErrCode:1 : No node is available for topic"),
    ]
    for params, message in cases:
        resp = await cluster.post("/topic/create", **params)
        assert (resp.status_code, resp.json()) == (400, {"message": message}), params
    resp = await cluster.post("/topic/create", topic="t2", partition_num="4", replicator="1",
                              multipart="true")
    assert resp.status_code == 200
    assert cluster.state.topics["t2"].partition_num == 4


async def test_write_lookup_needs_a_channel_per_partition(cluster: Cluster) -> None:
    cluster.state.create_topic("t", 2, 1)
    resp = await cluster.get("/lookup", topic="t", access="w")
    assert resp.status_code == 404
    assert resp.json() == {"message": "Topic has no channel, should init at least one for the "
                                      "new topic"}
    assert set((await cluster.lookup("t", access="r"))["partitions"]) == {"0", "1"}
    cluster.channel("t", 1)
    data = await cluster.lookup("t", access="w")
    assert set(data["partitions"]) == {"1"} and data["channels"] == ["ch"]
    cluster.channel("t", 0)
    assert set((await cluster.lookup("t", access="w"))["partitions"]) == {"0", "1"}


async def test_moved_leader_is_what_lookups_name(cluster: Cluster) -> None:
    cluster.state.create_topic("t", 1, 2)
    cluster.channel("t", 0)
    before = leaders(await cluster.lookup("t", access="w"))
    new = cluster.state.move_leader("t", 0)
    after = leaders(await cluster.lookup("t", access="w"))
    assert before != after
    assert after["0"] == cluster.state.nodes[new or ""].tcp_port


async def test_unwritable_partition_hidden_from_writers_only(cluster: Cluster) -> None:
    cluster.state.create_topic("t", 2, 1)
    cluster.channel("t", 0)
    cluster.channel("t", 1)
    cluster.state.set_writable("t", 1, False)
    assert set((await cluster.lookup("t", access="w"))["partitions"]) == {"0"}
    assert set((await cluster.lookup("t", access="r"))["partitions"]) == {"0", "1"}
    cluster.state.set_writable("t", 1, True)
    assert set((await cluster.lookup("t", access="w"))["partitions"]) == {"0", "1"}


async def test_dead_leader_leaves_its_partition_without_leader(cluster: Cluster) -> None:
    info = cluster.state.create_topic("t", 2, 1)
    cluster.channel("t", 0)
    cluster.channel("t", 1)
    dead = cluster.state.nodes[info.partitions[0].leader or ""]
    dead.alive = False
    for access in ("r", "w"):
        data = await cluster.lookup("t", access=access)
        assert set(data["partitions"]) == {"1"}, access
        assert dead.tcp_port not in [p["tcp_port"] for p in data["producers"]]
    nodes = (await cluster.get("/nodes")).json()["producers"]
    assert dead.tcp_port not in [n["tcp_port"] for n in nodes]
    dead.alive = True
    assert set((await cluster.lookup("t", access="r"))["partitions"]) == {"0", "1"}


async def test_tombstoned_node_hidden_from_writers(cluster: Cluster) -> None:
    info = cluster.state.create_topic("t", 1, 1)
    cluster.channel("t", 0)
    node = cluster.state.nodes[info.partitions[0].leader or ""]
    resp = await cluster.post("/topic/tombstone", topic="t",
                              node=f"{node.broadcast_address}:{node.http_port}")
    assert resp.status_code == 200
    assert (await cluster.lookup("t", access="w"))["partitions"] == {}
    assert set((await cluster.lookup("t", access="r"))["partitions"]) == {"0"}
    nodes = (await cluster.get("/nodes")).json()["producers"]
    entry = next(n for n in nodes if n["tcp_port"] == node.tcp_port)
    assert entry["tombstones"] == [True] and entry["topics"] == ["t"]
    assert entry["partitions"] == {"t": ["0"]}


async def test_classic_node_appears_in_producers_only(cluster: Cluster) -> None:
    classic = next(n for n in cluster.state.nodes.values() if n.classic)
    from smartnsq.devcluster.state import PartitionInfo, TopicInfo

    info = TopicInfo("legacy", 0, 0, classic=True)
    part = PartitionInfo("legacy", 0, classic.node_id, [classic.node_id])
    part.channels["c"] = object()
    info.partitions.append(part)
    cluster.state.topics["legacy"] = info
    data = await cluster.lookup("legacy", access="r", metainfo="true")
    assert data["partitions"] == {}
    assert [p["tcp_port"] for p in data["producers"]] == [classic.tcp_port]
    assert data["producers"][0]["version"] == "1.3.0"
    assert data["producers"][0]["distributed_id"] == ""
    assert data["meta"]["partition_num"] == 0
    # a youzan lookupd always treats classic peers as tombstoned: writers do not see them
    data = await cluster.lookup("legacy", access="w")
    assert data["producers"] == [] and data["partitions"] == {}
    nodes = (await cluster.get("/nodes")).json()["producers"]
    entry = next(n for n in nodes if n["tcp_port"] == classic.tcp_port)
    assert entry["partitions"] == {"legacy": ["-11"]} and entry["tombstones"] == [True]


async def test_lookup_envelope_without_accept_header(cluster: Cluster) -> None:
    url = f"http://{cluster.lookupds[0].http_address}/lookup"
    resp = await cluster.client.get(url, params={"topic": "nope", "access": "w"})
    assert resp.status_code == 500
    assert resp.json() == {"status_code": 500, "status_txt": "Key not found", "data": None}
    assert "x-nsq-content-type" not in resp.headers
    resp = await cluster.client.get(url, params={"topic": "nope"})
    assert resp.json() == {"status_code": 200, "status_txt": "OK",
                           "data": {"channels": [], "partitions": {}, "producers": []}}


async def test_listlookup_follows_the_leader(cluster: Cluster) -> None:
    data = (await cluster.get("/listlookup", 1)).json()
    assert data["lookupdleader"]["ID"] == cluster.lookupds[0].node_id
    assert len(data["lookupdnodes"]) == 2
    await cluster.lookupds[0].stop()
    cluster.state.lookupd_leader = cluster.lookupds[1].node_id
    data = (await cluster.get("/listlookup", 1)).json()
    assert data["lookupdleader"]["ID"] == cluster.lookupds[1].node_id
    assert [n["ID"] for n in data["lookupdnodes"]] == [cluster.lookupds[1].node_id]
    assert cluster.lookupds[1].is_leader


async def test_stopped_lookupd_refuses_and_restarts_on_same_port(cluster: Cluster) -> None:
    lookupd = cluster.lookupds[1]
    port = lookupd.http_port
    await lookupd.stop()
    with pytest.raises(httpx.ConnectError):
        await cluster.get("/ping", 1)
    await lookupd.start()
    assert lookupd.http_port == port
    resp = await cluster.get("/ping", 1)
    assert resp.status_code == 200 and resp.text == "OK"


async def test_topics_meta_info_channels_and_delete(cluster: Cluster) -> None:
    cluster.state.create_topic("t", 2, 1, ordered=True)
    cluster.state.create_topic("e", 1, 1, ext=True)
    cluster.channel("t", 0, "a")
    cluster.channel("t", 1, "b")
    data = (await cluster.get("/topics", metaInfo="true")).json()
    assert data["topics"] == ["t", "e"]
    assert data["meta_info"][0]["topic_name"] == "t" and data["meta_info"][0]["ordered"]
    assert data["meta_info"][1]["extend_support"]
    assert (await cluster.get("/channels", topic="t")).json() == {"channels": ["a", "b"]}
    assert (await cluster.get("/channels", topic="t", partition="1")).json() == {
        "channels": ["b"]}
    resp = await cluster.post("/topic/delete", topic="t", partition="0")
    assert resp.json() == {"message": "REMOVE_SINGLE_PARTITION_NOT_ALLOWED"}
    assert (await cluster.post("/topic/delete", topic="t", partition="**")).status_code == 200
    assert (await cluster.get("/topics")).json() == {"topics": ["e"]}


async def test_channel_create_registers_allowed_channels(cluster: Cluster) -> None:
    cluster.state.create_topic("open", 1, 1)
    cluster.state.create_topic("closed", 1, 1, disable_channel_auto_create=True)
    resp = await cluster.post("/channel/create", topic="open", channel="c")
    assert resp.json() == {"message": "channel auto create NOT disabled in topic open"}
    resp = await cluster.post("/channel/create", topic="closed", channel="c")
    assert resp.status_code == 200
    resp = await cluster.post("/channel/create", topic="closed", channel="c")
    assert resp.json() == {"message": "channel c already registered"}
    assert getattr(cluster.state.topics["closed"], "registered_channels", None) == ["c"]


async def test_keep_alive_serves_many_requests_on_one_connection(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=f"http://{cluster.lookupds[0].http_address}",
                                 limits=httpx.Limits(max_connections=1)) as client:
        for _ in range(20):
            assert (await client.get("/ping")).text == "OK"


async def test_classic_lookupd_has_no_listlookup_and_404s_unknown_topics() -> None:
    state = make_state(youzan=0, classic=1)
    lookupd = Lookupd(state, classic=True)
    await lookupd.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{lookupd.http_address}") as client:
            resp = await client.get("/listlookup")
            assert (resp.status_code, resp.json()) == (404, {"message": "NOT_FOUND"})
            resp = await client.get("/lookup", params={"topic": "x"})
            assert (resp.status_code, resp.json()) == (404, {"message": "TOPIC_NOT_FOUND"})
            assert (await client.post("/topic/create", params={"topic": "x"})).status_code == 200
            resp = await client.get("/lookup", params={"topic": "x"})
            assert resp.status_code == 200 and resp.json()["channels"] == []
            assert (await client.get("/info")).json() == {"version": "1.3.0"}
    finally:
        await lookupd.stop()
