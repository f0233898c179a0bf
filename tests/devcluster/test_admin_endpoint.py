"""The dev cluster's admin endpoint (``AdminServer``), driven in-process over loopback HTTP.

What another process relies on: every fault route does what its name says to the running
cluster and answers JSON naming the node by id and by its ``#`` index; a bad or missing
argument is a 400 whose ``message`` names the argument (and, for nodes, the valid range);
connection faults are refused on a cluster without proxies; ``settle`` fails with a sentence
while faults are still running; ``topic/create`` refuses more replicas than nodes before
asking the servers; and the endpoint never binds beyond loopback.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from nsqd_helpers import RawClient

from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.admin import AdminServer, check_loopback, cluster_status, replicas_error
from smartnsq.devcluster.profile import profile_named

BOUND = 30.0


class Admin:
    """An AdminServer on a started cluster and an HTTP client for it."""

    def __init__(self, cluster: DevCluster, server: AdminServer,
                 http: httpx.AsyncClient) -> None:
        self.cluster = cluster
        self.server = server
        self.http = http

    async def post(self, path: str, **params: Any) -> tuple[int, Any]:
        resp = await self.http.post(f"http://{self.server.address}{path}", params=params)
        return resp.status_code, resp.json()

    async def ok(self, path: str, **params: Any) -> Any:
        status, body = await self.post(path, **params)
        assert status == 200, body
        return body

    async def refused(self, path: str, **params: Any) -> str:
        status, body = await self.post(path, **params)
        assert status == 400, body
        return str(body["message"])

    async def status(self) -> Any:
        resp = await self.http.get(f"http://{self.server.address}/status")
        assert resp.status_code == 200
        return resp.json()


async def admin_of(cluster: DevCluster) -> AsyncIterator[Admin]:
    async with AdminServer(cluster, port=0) as server, \
            httpx.AsyncClient(timeout=BOUND) as http:
        yield Admin(cluster, server, http)


@pytest.fixture
async def admin(nsq_cluster: DevCluster) -> AsyncIterator[Admin]:
    async for a in admin_of(nsq_cluster):
        yield a


# -- pure helpers -------------------------------------------------------------------------------


def test_only_loopback_hosts_are_accepted() -> None:
    for host in ("127.0.0.1", "127.8.9.10", "::1", "localhost"):
        check_loopback(host)
    for host in ("0.0.0.0", "10.0.0.1", "::", "example.com", ""):
        with pytest.raises(ValueError, match="admin host must be a loopback address"):
            check_loopback(host)
    # refused before anything binds (the cluster is not even started)
    with pytest.raises(ValueError, match=re.escape("'0.0.0.0'")):
        AdminServer(DevCluster(nodes=1, lookupds=1), host="0.0.0.0")


def test_replicas_error_says_how_many_nodes_are_needed() -> None:
    assert replicas_error("t", 4, 3, 3) is None
    assert replicas_error("t", 1, 2, 1) == (
        "1 partition x 2 replicas need 2 nodes; the cluster has 1 (lower the replicas of "
        "'t', or start the cluster with --nodes 2)")
    assert "4 partitions x 5 replicas" in (replicas_error("t", 4, 5, 3) or "")


# -- status, routing ---------------------------------------------------------------------------


async def test_status_lists_nodes_lookupds_and_topics(admin: Admin) -> None:
    cluster = admin.cluster
    await cluster.create_topic("st", partitions=2, replicas=2, ordered=True)
    resp = await admin.http.get(f"http://{admin.server.address}/ping")
    assert (resp.status_code, resp.text) == (200, "OK")
    status = await admin.status()
    assert status["mode"] == "youzan" and status["proxied"] is False
    assert status["profile"]["name"] == "off"
    assert [n["index"] for n in status["nodes"]] == [0, 1, 2]
    assert [n["tcp"] for n in status["nodes"]] == cluster.nsqd_tcp_addresses
    assert all(n["alive"] and not n["classic"] and not n["exiting"] for n in status["nodes"])
    assert [lk["http"] for lk in status["lookupds"]] == cluster.lookupd_http_addresses
    assert sum(lk["leader"] for lk in status["lookupds"]) == 1
    parts = status["topics"]["st"]
    assert [p["partition"] for p in parts] == [0, 1]
    for p in parts:
        assert p["leader"] in p["replicas"] and len(p["replicas"]) == 2
        assert p["writable"] and not p["stalled"]
    assert status["busy"] is False
    # the banner's reading leaves the timeline out
    assert cluster_status(cluster, timeline=0)["timeline"] == []


async def test_unknown_paths_and_methods(admin: Admin) -> None:
    base = f"http://{admin.server.address}"
    resp = await admin.http.post(f"{base}/fault/explode")
    assert (resp.status_code, resp.json()) == (404, {"message": "NOT_FOUND"})
    resp = await admin.http.get(f"{base}/fault/kill", params={"node": "0"})
    assert (resp.status_code, resp.json()) == (405, {"message": "METHOD_NOT_ALLOWED"})
    assert all(info.alive for info in map(admin.cluster.node_info, admin.cluster.nodes))


# -- node faults --------------------------------------------------------------------------------


async def test_node_faults_by_index_and_by_id(admin: Admin) -> None:
    cluster = admin.cluster
    ids = [cluster.node_info(n).node_id for n in cluster.nodes]
    assert await admin.ok("/fault/stop", node="2") == {"done": "stop", "node": ids[2],
                                                       "index": 2}
    assert not cluster.node_info(2).alive
    status = await admin.status()
    assert [n["alive"] for n in status["nodes"]] == [True, True, False]
    assert status["timeline"] == []  # a stop has no failover: nothing on the fault clock
    # leaving a node that is down: the cluster's reason, as a 400
    assert "is not running" in await admin.refused("/fault/leave", node="2")
    assert await admin.ok("/fault/start", node=ids[2]) == {"done": "start", "node": ids[2],
                                                           "index": 2}
    assert cluster.node_info(2).alive
    assert (await admin.ok("/fault/kill", node="1"))["index"] == 1
    assert not cluster.node_info(1).alive
    lost = [e for e in (await admin.status())["timeline"] if e["what"] == "node_lost"]
    assert [e["node"] for e in lost] == [ids[1]]
    assert (await admin.ok("/fault/start", node="1"))["done"] == "start"
    assert cluster.node_info(1).alive


async def test_bad_node_arguments_name_the_range(admin: Admin) -> None:
    assert await admin.refused("/fault/kill") == "missing argument: node"
    assert await admin.refused("/fault/kill", node="9") == (
        "node: no node '9' (the cluster's nodes are #0..#2: fault status lists them)")
    assert "no node 'nsqd-bogus'" in await admin.refused("/fault/stop", node="nsqd-bogus")
    assert all(admin.cluster.node_info(n).alive for n in admin.cluster.nodes)


# -- partitions ---------------------------------------------------------------------------------


async def test_move_leader_to_the_next_replica_or_a_given_node(admin: Admin) -> None:
    cluster = admin.cluster
    await cluster.create_topic("ml", partitions=2, replicas=2)
    p0 = cluster.state.partition("ml", 0)
    assert p0 is not None
    old = p0.leader
    other = next(r for r in p0.replicas if r != old)
    body = await admin.ok("/fault/move_leader", topic="ml", partition="0")
    assert body["leader"] == other and p0.leader == other
    assert body["index"] == cluster.nodes.index(cluster.node(other))
    # to a node by its index: that node leads now
    target = next(i for i, n in enumerate(cluster.nodes)
                  if cluster.node_info(n).node_id != other)
    body = await admin.ok("/fault/move_leader", topic="ml", partition="0", to=str(target))
    assert (body["index"], p0.leader) == (target, cluster.node_info(target).node_id)
    assert body == {"topic": "ml", "partition": 0, "leader": p0.leader, "index": target}


async def test_partition_arguments_are_checked(admin: Admin) -> None:
    await admin.cluster.create_topic("pa", partitions=1)
    move = "/fault/move_leader"
    assert await admin.refused(move, partition="0") == "missing argument: topic"
    assert await admin.refused(move, topic="nope", partition="0") == "topic: no topic 'nope'"
    assert await admin.refused(move, topic="pa") == "missing argument: partition"
    assert await admin.refused(move, topic="pa", partition="x") == \
        "partition: not an integer: 'x'"
    assert await admin.refused(move, topic="pa", partition="7") == \
        "partition: no partition pa/7"
    assert await admin.refused(move, topic="pa", partition="0", to="5") == "to: no node '5'"
    writable = "/fault/writable"
    assert await admin.refused(writable, topic="pa", partition="3", writable="true") == \
        "partition: no partition pa/3"
    assert await admin.refused(writable, topic="pa", partition="0", writable="maybe") == \
        "writable: expected true or false, not 'maybe'"
    p = admin.cluster.state.partition("pa", 0)
    assert p is not None and p.writable


async def test_writable_switches_writes_off_and_on(admin: Admin) -> None:
    await admin.cluster.create_topic("wr", partitions=2)
    assert await admin.ok("/fault/writable", topic="wr", partition="1", writable="false") == {
        "topic": "wr", "partition": 1, "writable": False}
    status = await admin.status()
    assert [p["writable"] for p in status["topics"]["wr"]] == [True, False]
    assert (await admin.ok("/fault/writable", topic="wr", partition="1",
                           writable="TRUE"))["writable"] is True
    assert all(p.writable for p in admin.cluster.state.topics["wr"].partitions)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_move_leader_with_no_other_node_answers_no_leader(admin: Admin) -> None:
    await admin.cluster.create_topic("solo", partitions=1)
    assert await admin.ok("/fault/move_leader", topic="solo", partition="0") == {
        "topic": "solo", "partition": 0, "leader": None, "index": None}


# -- lookupds -----------------------------------------------------------------------------------


async def test_lookupd_stop_and_start(admin: Admin) -> None:
    cluster = admin.cluster
    assert await admin.ok("/fault/stop_lookupd", lookupd="1") == {"lookupd": 1}
    assert not cluster.lookupds[1].running
    assert [lk["running"] for lk in (await admin.status())["lookupds"]] == [True, False]
    assert await admin.ok("/fault/start_lookupd", lookupd="1") == {"lookupd": 1}
    assert cluster.lookupds[1].running
    assert await admin.refused("/fault/stop_lookupd", lookupd="2") == "lookupd: no lookupd 2"
    assert await admin.refused("/fault/start_lookupd") == "missing argument: lookupd"
    assert all(lk.running for lk in cluster.lookupds)


# -- connection faults --------------------------------------------------------------------------


async def test_connection_faults_need_a_proxied_cluster(admin: Admin) -> None:
    for action in ("cut", "stall", "resume"):
        assert await admin.refused(f"/fault/{action}") == (
            "connection faults need a proxied cluster: restart it with smartnsq dev-cluster "
            "--proxied")


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_cut_closes_client_connections_of_a_proxied_cluster(admin: Admin) -> None:
    cluster = admin.cluster
    assert (await admin.status())["proxied"] is True
    # an identified client: its connection runs through node #0's proxy
    client = await RawClient.identified(cluster.nsqd_tcp_addresses[0])
    try:
        body = await admin.ok("/fault/cut", node="0")
        assert body == {"cut": 1, "index": 0}
        assert await client.closed()
    finally:
        client.close()
    assert await admin.ok("/fault/cut") == {"cut": 0, "index": None}
    assert await admin.ok("/fault/stall", node="1") == {"done": "stall", "index": 1}
    assert await admin.ok("/fault/resume") == {"done": "resume", "index": None}
    assert "no node '4'" in await admin.refused("/fault/stall", node="4")


# -- settle ------------------------------------------------------------------------------------


async def test_settle_answers_at_once_without_faults(admin: Admin) -> None:
    assert await admin.ok("/fault/settle") == {"settled": True}
    assert await admin.ok("/fault/settle", timeout="1") == {"settled": True}
    assert await admin.refused("/fault/settle", timeout="1.5") == \
        "timeout: not an integer: '1.5'"


async def test_settle_fails_while_a_kill_is_still_failing_over(
        nsq_cluster_factory: Any) -> None:
    cluster = await nsq_cluster_factory(nodes=3, lookupds=1,
                                        profile=profile_named("realistic", 0.05, 0))
    await cluster.create_topic("fo", partitions=1, replicas=2)
    async for admin in admin_of(cluster):
        victim = cluster.leader_of("fo", 0)
        index = cluster.nodes.index(victim)
        await admin.ok("/fault/kill", node=str(index))
        assert (await admin.status())["busy"] is True
        assert await admin.refused("/fault/settle", timeout="0") == \
            "timeout: faults still running after 0.0 s"
        assert await admin.ok("/fault/settle", timeout="30") == {"settled": True}
        status = await admin.status()
        assert status["busy"] is False
        leader = status["topics"]["fo"][0]["leader"]
        assert leader not in (None, cluster.node_info(victim).node_id)
        assert {e["what"] for e in status["timeline"]} >= {"node_lost", "elected"}
        assert all(e["ago"] >= 0 for e in status["timeline"])


# -- topic/create --------------------------------------------------------------------------------


async def test_topic_create_with_flags_and_channels(admin: Admin) -> None:
    body = await admin.ok("/topic/create", topic="made", partitions="2", replicas="2",
                          ordered="true", channel=["a", "b"])
    assert body == {"topic": "made", "partitions": 2, "replicas": 2}
    info = admin.cluster.state.topics["made"]
    assert info.ordered and len(info.partitions) == 2
    assert [len(p.replicas) for p in info.partitions] == [2, 2]
    status = await admin.status()
    assert [p["partition"] for p in status["topics"]["made"]] == [0, 1]
    # a plain topic with the defaults: one partition, one replica
    assert await admin.ok("/topic/create", topic="plain") == {
        "topic": "plain", "partitions": 1, "replicas": 1}


async def test_topic_create_refusals(admin: Admin) -> None:
    assert await admin.refused("/topic/create") == "missing argument: topic"
    assert await admin.refused("/topic/create", topic="big", partitions="4",
                               replicas="5") == (
        "topic big: 4 partitions x 5 replicas need 5 nodes; the cluster has 3 (lower the "
        "replicas of 'big', or start the cluster with --nodes 5)")
    assert await admin.refused("/topic/create", topic="t", partitions="two") == \
        "partitions: not an integer: 'two'"
    assert await admin.refused("/topic/create", topic="t", ext="yes") == \
        "ext: expected true or false, not 'yes'"
    message = await admin.refused("/topic/create", topic="bad topic!")
    assert message.startswith("topic: ")
    assert "big" not in admin.cluster.state.topics
    assert "bad topic!" not in admin.cluster.state.topics


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_classic_topics_take_any_replica_count(admin: Admin) -> None:
    # classic NSQ has no replicas: the youzan node count does not limit the request
    body = await admin.ok("/topic/create", topic="cl", replicas="3")
    assert body == {"topic": "cl", "partitions": 1, "replicas": 3}
    status = await admin.status()
    assert status["mode"] == "classic" and status["nodes"][0]["classic"] is True
