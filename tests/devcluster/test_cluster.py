"""DevCluster lifecycle, topic creation and cluster-level faults, observed with raw clients.

HTTP is observed with httpx, TCP with asyncio streams; what a client sees on the nsqd nodes
after each fault is in test_cluster_nsqd.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from smartnsq.devcluster import DevCluster
from smartnsq.errors import InvalidArgument

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
TIMEOUT = 5.0


def make_cluster(**kwargs: Any) -> DevCluster:
    return DevCluster(**kwargs)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with make_cluster(nodes=3, lookupds=2) as c:
        yield c


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=V1, timeout=TIMEOUT) as c:
        yield c


async def lookup(client: httpx.AsyncClient, cluster: DevCluster, topic: str,
                 access: str = "r", lookupd: int = 0) -> dict[str, Any]:
    resp = await client.get(f"http://{cluster.lookupd_http_addresses[lookupd]}/lookup",
                            params={"topic": topic, "access": access})
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def tcp_of(data: dict[str, Any]) -> dict[str, str]:
    return {pid: f"{p['broadcast_address']}:{p['tcp_port']}"
            for pid, p in data["partitions"].items()}


async def test_lifecycle_addresses_and_refusal_after_stop(client: httpx.AsyncClient) -> None:
    cluster = make_cluster(nodes=2, lookupds=2)
    async with cluster:
        assert len(cluster.nodes) == 2 and len(cluster.lookupds) == 2
        assert len(cluster.nsqd_tcp_addresses) == 2
        for address in cluster.lookupd_http_addresses:
            resp = await client.get(f"http://{address}/ping")
            assert resp.text == "OK"
        listed = (await client.get(f"http://{cluster.lookupd_http_addresses[1]}/listlookup"))
        assert listed.json()["lookupdleader"]["ID"] == cluster.lookupds[0].node_id
        nodes = (await client.get(f"http://{cluster.lookupd_http_addresses[0]}/nodes")).json()
        assert sorted(f"{n['broadcast_address']}:{n['tcp_port']}" for n in nodes["producers"]
                      ) == sorted(cluster.nsqd_tcp_addresses)
        assert "smartnsq dev cluster (youzan)" in cluster.describe()
    for address in [*cluster.lookupd_http_addresses, *cluster.nsqd_http_addresses]:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://{address}/ping")
    host, port = cluster.nsqd_tcp_addresses[0].split(":")
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))


async def test_create_topic_returns_when_writable(cluster: DevCluster,
                                                  client: httpx.AsyncClient) -> None:
    info = await cluster.create_topic("orders", partitions=3, replicas=2, channels=["a", "b"])
    assert info.partition_num == 3 and info.replica == 2 and info.multipart
    data = await lookup(client, cluster, "orders", "w")
    assert set(data["partitions"]) == {"0", "1", "2"}
    assert sorted(data["channels"]) == ["a", "b"]
    assert set(tcp_of(data).values()) <= set(cluster.nsqd_tcp_addresses)
    ordered = await cluster.create_topic("seq", partitions=2, replicas=1, ordered=True)
    assert ordered.ordered
    resp = await client.get(f"http://{cluster.lookupd_http_addresses[1]}/lookup",
                            params={"topic": "seq", "access": "w", "metainfo": "true"})
    assert resp.json()["meta"]["ordered"] is True
    bare = await cluster.create_topic("bare", channels=[])
    assert bare.partition_num == 1
    resp = await client.get(f"http://{cluster.lookupd_http_addresses[0]}/lookup",
                            params={"topic": "bare", "access": "w"})
    assert resp.status_code == 404  # no channel yet: hidden from writers, as on a real cluster


async def test_create_topic_reports_refusals(cluster: DevCluster) -> None:
    with pytest.raises(InvalidArgument, match="topic"):  # checked before anything is sent
        await cluster.create_topic("bad*name")
    with pytest.raises(RuntimeError, match="No node is available"):
        await cluster.create_topic("big", partitions=2, replicas=4)


async def test_stop_node_hides_its_partitions_until_restart(cluster: DevCluster,
                                                            client: httpx.AsyncClient) -> None:
    await cluster.create_topic("t", partitions=3, replicas=1)
    victim = cluster.leader_of("t", 0)
    address = f"{cluster.node_info(victim).broadcast_address}:" \
              f"{cluster.node_info(victim).tcp_port}"
    await cluster.stop_node(victim)
    host, port = address.split(":")
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))
    for access in ("r", "w"):
        assert "0" not in (await lookup(client, cluster, "t", access))["partitions"]
    await cluster.start_node(victim)
    _reader, writer = await asyncio.open_connection(host, int(port))  # same port again
    writer.close()
    assert tcp_of(await lookup(client, cluster, "t", "w"))["0"] == address


async def test_stop_node_with_failover_moves_leadership(cluster: DevCluster,
                                                        client: httpx.AsyncClient) -> None:
    await cluster.create_topic("t", partitions=1, replicas=2)
    old = cluster.leader_of("t", 0)
    await cluster.stop_node(old, failover=True)
    new = cluster.leader_of("t", 0)
    assert new is not old
    data = await lookup(client, cluster, "t", "r")
    assert tcp_of(data)["0"] == cluster.node_info(new).tcp_address


async def test_move_leader_changes_lookups(cluster: DevCluster,
                                           client: httpx.AsyncClient) -> None:
    await cluster.create_topic("t", partitions=1, replicas=2)
    old = cluster.leader_of("t", 0)
    new = cluster.move_leader("t", 0)
    assert new is not old and cluster.leader_of("t", 0) is new
    data = await lookup(client, cluster, "t", "r")
    assert tcp_of(data)["0"] == cluster.node_info(new).tcp_address
    third = next(n for n in cluster.nodes if n is not old and n is not new)
    assert cluster.move_leader("t", 0, to=third) is third
    assert cluster.move_leader("t", 0, to=cluster.nodes.index(old)) is old


async def test_set_writable_hides_partition_from_writers(cluster: DevCluster,
                                                         client: httpx.AsyncClient) -> None:
    await cluster.create_topic("t", partitions=2, replicas=1)
    cluster.set_writable("t", 1, False)
    assert set((await lookup(client, cluster, "t", "w"))["partitions"]) == {"0"}
    assert set((await lookup(client, cluster, "t", "r"))["partitions"]) == {"0", "1"}
    cluster.set_writable("t", 1, True)
    assert set((await lookup(client, cluster, "t", "w"))["partitions"]) == {"0", "1"}


async def test_stop_lookupd_refuses_and_leadership_passes(cluster: DevCluster,
                                                          client: httpx.AsyncClient) -> None:
    first, second = cluster.lookupd_http_addresses
    await cluster.stop_lookupd(0)
    with pytest.raises(httpx.ConnectError):
        await client.get(f"http://{first}/ping")
    listed = (await client.get(f"http://{second}/listlookup")).json()
    assert listed["lookupdleader"]["HttpPort"] == second.split(":")[1]
    assert len(listed["lookupdnodes"]) == 1
    await cluster.create_topic("after", partitions=1)  # goes to the new leader
    await cluster.start_lookupd(0)
    assert cluster.lookupd_http_addresses[0] == first
    assert (await client.get(f"http://{first}/ping")).text == "OK"
    resp = await client.post(f"http://{first}/topic/create",
                             params={"topic": "x", "partition_num": "1", "replicator": "1"})
    assert resp.json() == {"message": "E_FAILED_ON_NOT_LEADER"}  # it came back as follower


async def test_proxied_cluster_advertises_proxies_and_injects_faults(
        client: httpx.AsyncClient) -> None:
    async with make_cluster(nodes=2, lookupds=1, proxied=True) as cluster:
        await cluster.create_topic("t", partitions=2, replicas=1)
        data = await lookup(client, cluster, "t", "w")
        advertised = set(tcp_of(data).values())
        assert advertised == set(cluster.nsqd_tcp_addresses)
        direct = {cluster.node_info(n).tcp_address for n in cluster.nodes}
        assert not advertised & direct
        # the faults themselves, seen by a raw client: test_cluster_nsqd.py


async def test_connection_faults_need_proxied(cluster: DevCluster) -> None:
    with pytest.raises(RuntimeError, match="proxied=True"):
        cluster.cut_connections()


async def test_classic_cluster(client: httpx.AsyncClient) -> None:
    async with make_cluster(nodes=2, lookupds=1, mode="classic") as cluster:
        assert all(cluster.node_info(n).classic for n in cluster.nodes)
        address = cluster.lookupd_http_addresses[0]
        assert (await client.get(f"http://{address}/listlookup")).status_code == 404
        assert (await client.get(f"http://{address}/info")).json() == {"version": "1.3.0"}
        resp = await client.get(f"http://{address}/lookup", params={"topic": "nope"})
        assert resp.status_code == 404
        await cluster.create_topic("legacy", channels=[])
        data = (await client.get(f"http://{address}/lookup", params={"topic": "legacy"})).json()
        assert "partitions" not in data
        assert sorted(f"{p['broadcast_address']}:{p['tcp_port']}" for p in data["producers"]
                      ) == sorted(cluster.nsqd_tcp_addresses)


async def test_mixed_cluster_has_both_kinds(client: httpx.AsyncClient) -> None:
    async with make_cluster(nodes=2, lookupds=1, classic_nodes=1) as cluster:
        assert cluster.mode == "mixed"
        assert len(cluster.youzan_nodes) == 2 and len(cluster.classic_nodes) == 1
        nodes = (await client.get(f"http://{cluster.lookupd_http_addresses[0]}/nodes")).json()
        versions = sorted(n["version"] for n in nodes["producers"])
        assert versions == ["0.3.7-HA.1.13.0", "0.3.7-HA.1.13.0", "1.3.0"]


async def test_pytest_fixture_gives_a_started_cluster(nsq_cluster: DevCluster,
                                                      client: httpx.AsyncClient) -> None:
    assert len(nsq_cluster.nodes) == 3 and len(nsq_cluster.lookupds) == 2
    for address in nsq_cluster.lookupd_http_addresses:
        assert (await client.get(f"http://{address}/ping")).text == "OK"


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_pytest_marker_shapes_the_fixture(nsq_cluster: DevCluster) -> None:
    assert len(nsq_cluster.nodes) == 1 and len(nsq_cluster.lookupds) == 1


async def test_pytest_factory_fixture(nsq_cluster_factory: Any) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic")
    assert cluster.mode == "classic" and len(cluster.nodes) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mode"):
        DevCluster(mode="nope")
    with pytest.raises(ValueError):
        DevCluster(nodes=-1)


async def test_a_stopped_cluster_restarts_on_the_same_addresses(
        client: httpx.AsyncClient) -> None:
    cluster = make_cluster(nodes=1, lookupds=1, proxied=True)
    async with cluster:
        await cluster.create_topic("t")
        addresses = (cluster.lookupd_http_addresses, cluster.nsqd_tcp_addresses)
    async with cluster:
        assert (cluster.lookupd_http_addresses, cluster.nsqd_tcp_addresses) == addresses
        assert len(cluster.nodes) == 1
        assert set((await lookup(client, cluster, "t", "w"))["partitions"]) == {"0"}


async def test_command_line_run_prints_addresses(capsys: pytest.CaptureFixture[str],
                                                 client: httpx.AsyncClient) -> None:
    from smartnsq.cli.devcluster import build_parser, run

    args = build_parser().parse_args(["--nodes", "2", "--lookupds", "1", "--topic", "demo:2",
                                      "--channel", "c1"])
    stop = asyncio.Event()

    def factory(**kwargs: Any) -> DevCluster:
        return make_cluster(**kwargs)

    task = asyncio.create_task(run(args, stop, make_cluster=factory))
    out = ""
    while "running" not in out:
        await asyncio.sleep(0.01)  # polling the printed output: run() has no other signal
        assert not task.done()
        out += capsys.readouterr().out
    values = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("NS"))
    assert len(values["NSQD_TCP"].split(",")) == 2
    resp = await client.get(f"http://{values['NSQLOOKUPD_HTTP']}/lookup",
                            params={"topic": "demo", "access": "w"})
    assert set(resp.json()["partitions"]) == {"0", "1"} and resp.json()["channels"] == ["c1"]
    stop.set()
    await asyncio.wait_for(task, TIMEOUT)


def test_command_line_rejects_bad_topic_spec(capsys: pytest.CaptureFixture[str]) -> None:
    from smartnsq.cli.devcluster import main

    assert main(["--topic", "a:b:c:d"]) == 2  # a usage error (docs/cli.md), no traceback
    assert "NAME[:PARTITIONS[:REPLICAS]]" in capsys.readouterr().err
