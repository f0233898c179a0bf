"""``smartnsq dev-cluster fault ...`` against an admin endpoint served in this process, and the
dev-cluster command's own refusals.

What an operator relies on: each fault action answers one sentence naming the node by its
``#`` (and id), ``status`` draws the cluster as tables (state words such as "not writable",
"leaving", "stalled", a fault timeline whose node ids are shown as ``#`` numbers), a refusal is
one line on stderr with exit 1, an unreachable or odd endpoint says what to check, and a bad
argument stops the command with exit 2 before anything starts. The commands run in a worker
thread (``main`` runs its own event loop) while the cluster serves on the test's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support import closed_port

from smartnsq.cli import main
from smartnsq.cli.devcluster import render_status
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.admin import AdminServer


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEVCLUSTER_ADMIN", raising=False)
    monkeypatch.delenv("SMARTNSQ_LOOKUPD", raising=False)


async def smartnsq(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(main, list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


class Endpoint:
    def __init__(self, cluster: DevCluster, address: str) -> None:
        self.cluster = cluster
        self.address = address

    def id(self, index: int) -> str:
        return self.cluster.node_info(index).node_id

    async def fault(self, *argv: str) -> tuple[int, str, str]:
        return await smartnsq("dev-cluster", "fault", "--admin", self.address, *argv)

    async def said(self, *argv: str) -> str:
        """The one line a successful action prints."""
        code, out, err = await self.fault(*argv)
        assert code == 0, err
        assert err == ""
        lines = out.strip().splitlines()
        assert len(lines) == 1, out
        return lines[0]

    async def refused(self, *argv: str) -> str:
        code, out, err = await self.fault(*argv)
        assert code == 1, (out, err)
        assert out == "" and "Traceback" not in err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        return lines[0]


@pytest.fixture
async def endpoint(nsq_cluster: DevCluster) -> AsyncIterator[Endpoint]:
    async with AdminServer(nsq_cluster) as server:
        yield Endpoint(nsq_cluster, server.address)


# -- fault actions answer in sentences ----------------------------------------------------------


async def test_node_actions_name_the_node(endpoint: Endpoint) -> None:
    cluster = endpoint.cluster
    assert await endpoint.said("stop", "#2") == f"stopped node #2 ({endpoint.id(2)}) (no failover)"
    assert not cluster.node_info(2).alive
    assert await endpoint.said("start", endpoint.id(2)) == f"started node #2 ({endpoint.id(2)})"
    assert cluster.node_info(2).alive
    assert await endpoint.said("leave", "1") == (
        f"node #1 ({endpoint.id(1)}) is leaving: its partitions are handed over, then it stops")
    assert await endpoint.said("settle", "--within", "30") == \
        "settled: every fault sequence has ended"
    assert not cluster.node_info(1).alive
    assert await endpoint.said("start", "1") == f"started node #1 ({endpoint.id(1)})"
    line = await endpoint.said("kill", "0")
    assert line.startswith(f"killed node #0 ({endpoint.id(0)}); its partitions fail over")
    assert await endpoint.said("start", "0") == f"started node #0 ({endpoint.id(0)})"
    assert all(cluster.node_info(i).alive for i in range(3))


async def test_partition_lookupd_and_topic_actions(endpoint: Endpoint) -> None:
    cluster = endpoint.cluster
    assert await endpoint.said("create-topic", "pt:2:2:ordered", "--channel", "a",
                               "--channel", "b") == \
        "created topic pt (2 partitions x 2 replicas)"
    assert cluster.state.topics["pt"].ordered
    p0 = cluster.state.partition("pt", 0)
    assert p0 is not None
    other = next(r for r in p0.replicas if r != p0.leader)
    index = cluster.nodes.index(cluster.node(other))
    assert await endpoint.said("move-leader", "pt", "0") == \
        f"pt/0: leader is now node #{index} ({other})"
    assert p0.leader == other
    assert await endpoint.said("writable", "pt", "1", "false") == "pt/1 is not writable now"
    code, out, err = await endpoint.fault("status")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.split()[:2] == ["pt", "1"])
    assert row.rstrip().endswith("not writable")
    assert "leader_moved" not in out  # a state change, not a fault sequence
    assert await endpoint.said("writable", "pt", "1", "true") == "pt/1 is writable now"
    assert await endpoint.said("stop-lookupd", "1") == "stopped lookupd #1"
    code, out, _ = await endpoint.fault("status")
    assert any(line.split()[:1] == ["#1"] and "stopped" in line for line in out.splitlines())
    assert await endpoint.said("start-lookupd", "1") == "started lookupd #1"
    assert all(lk.running for lk in cluster.lookupds)


async def test_status_json_for_scripts(endpoint: Endpoint) -> None:
    code, out, err = await endpoint.fault("--json", "status")
    assert code == 0, err
    status = json.loads(out)
    assert out.startswith("{\n")  # status is indented for people reading it
    assert [n["id"] for n in status["nodes"]] == [endpoint.id(i) for i in range(3)]
    code, out, err = await endpoint.fault("writable", "nope", "0", "true", "--json")
    assert (code, out) == (1, "")
    assert err.strip() == "fault writable: topic: no topic 'nope'"
    await endpoint.cluster.create_topic("js")
    code, out, err = await endpoint.fault("writable", "js", "0", "true", "--json")
    assert code == 0 and json.loads(out) == {"topic": "js", "partition": 0, "writable": True}
    assert "\n" not in out.rstrip("\n")  # one line


async def test_refusals_are_one_line(endpoint: Endpoint) -> None:
    assert await endpoint.refused("stall") == (
        "fault stall: connection faults need a proxied cluster: restart it with smartnsq "
        "dev-cluster --proxied")
    assert await endpoint.refused("move-leader", "nope", "0") == \
        "fault move-leader: topic: no topic 'nope'"
    assert await endpoint.refused("stop-lookupd", "4") == \
        "fault stop-lookupd: lookupd: no lookupd 4"
    assert await endpoint.refused("create-topic", "big:2:4") == (
        "fault create-topic: topic big: 2 partitions x 4 replicas need 4 nodes; the cluster "
        "has 3 (lower the replicas of 'big', or start the cluster with --nodes 4)")
    assert "big" not in endpoint.cluster.state.topics


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_move_leader_without_another_node(endpoint: Endpoint) -> None:
    await endpoint.cluster.create_topic("one")
    assert await endpoint.said("move-leader", "one", "0") == \
        "one/0: no other replica to move the leader to"


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, proxied=True)
async def test_connection_actions_on_a_proxied_cluster(endpoint: Endpoint) -> None:
    assert await endpoint.said("cut") == "cut 0 connection(s) to every node"
    assert await endpoint.said("stall", "#1") == "stalled connections to node #1"
    assert await endpoint.said("resume") == "resumed connections to every node"
    code, out, _ = await endpoint.fault("status")
    assert code == 0 and out.startswith("dev cluster: youzan, proxied, profile off x1")


# -- the endpoint is missing, unreachable or odd ----------------------------------------------


async def test_no_admin_address_is_a_usage_error() -> None:
    code, _, err = await smartnsq("dev-cluster", "fault", "status")
    assert code == 2
    assert "--admin HOST:PORT is required (or set $DEVCLUSTER_ADMIN" in err


async def test_bad_arguments_stop_before_any_request() -> None:
    address = f"127.0.0.1:{closed_port()}"
    code, _, err = await smartnsq("dev-cluster", "fault", "--admin", address, "create-topic",
                                  "t:0")
    assert code == 2 and "partitions and replicas must be >= 1" in err
    code, _, err = await smartnsq("dev-cluster", "fault", "--admin", "192.168.1.1:80",
                                  "status")
    assert code == 2 and "must be a loopback address" in err


async def test_unreachable_endpoint_says_what_to_check() -> None:
    address = f"127.0.0.1:{closed_port()}"
    code, out, err = await smartnsq("dev-cluster", "fault", "--admin", address, "status",
                                    "--timeout", "5")
    assert (code, out) == (1, "")
    [line] = err.strip().splitlines()
    assert line.startswith(f"fault status: cannot reach the admin endpoint {address} (")
    assert line.endswith("is the dev cluster running? (its banner prints DEVCLUSTER_ADMIN)")


async def test_an_answer_that_is_not_json_is_shown_as_text() -> None:
    """Something else on the port (a proxy's error page): its text, as the refusal."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = b"upstream went away"
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        code, out, err = await smartnsq("dev-cluster", "fault", "--admin",
                                        f"127.0.0.1:{port}", "kill", "0")
    assert (code, out) == (1, "")
    assert err.strip() == "fault kill: upstream went away"


async def test_a_closed_reader_ends_status_quietly(endpoint: Endpoint) -> None:
    """``fault status | head -1``: the reader goes away; the command exits 0, no traceback."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    out = open(write_fd, "w", buffering=1)  # noqa: SIM115 - closed below
    err = io.StringIO()
    try:
        code = await asyncio.to_thread(main, ["dev-cluster", "fault", "--admin",
                                              endpoint.address, "status"],
                                       stdout=out, stderr=err)
    finally:
        with contextlib.suppress(BrokenPipeError):
            out.close()
    assert code == 0
    assert "Traceback" not in err.getvalue()


# -- the dev-cluster command's refusals --------------------------------------------------------


async def test_topic_counts_must_be_ascii_digits() -> None:
    code, out, err = await smartnsq("dev-cluster", "--topic", "t:\u00b2")
    assert (code, out) == (2, "")
    assert err.strip().startswith("smartnsq dev-cluster: error: bad --topic 't:\u00b2': "
                                  "expected NAME[:PARTITIONS[:REPLICAS]]")


async def test_dev_cluster_refusals_before_starting() -> None:
    code, out, err = await smartnsq("dev-cluster", "--host", "10.1.2.3")
    assert (code, out) == (2, "")
    assert err.strip() == ("smartnsq dev-cluster: error: admin host must be a loopback "
                           "address, not '10.1.2.3'")
    code, _, err = await smartnsq("dev-cluster", "--time-scale", "0")
    assert code == 2 and "scale must be > 0" in err
    # classic NSQ has no replicas: only the host is refused here, not the topic
    code, _, err = await smartnsq("dev-cluster", "--mode", "classic", "--topic", "t:1:5",
                                  "--host", "10.1.2.3")
    assert code == 2 and "loopback" in err and "replicas" not in err


async def test_a_port_in_use_fails_the_cluster_in_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = await smartnsq("dev-cluster", "--nodes", "1", "--lookupds", "1",
                                        "--nsqd-tcp-port", str(port))
    assert code == 1 and "running" not in out
    [line] = err.strip().splitlines()
    assert line.startswith("dev cluster failed: ") and str(port) in line


# -- status rendering --------------------------------------------------------------------------


def status_of(**over: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "mode": "mixed", "proxied": True, "busy": True,
        "profile": {"name": "realistic", "scale": 0.05},
        "nodes": [
            {"index": 0, "id": "n-a", "tcp": "127.0.0.1:1", "http": "127.0.0.1:2",
             "alive": True, "classic": False, "exiting": True},
            {"index": 1, "id": "n-b", "tcp": "127.0.0.1:3", "http": "127.0.0.1:4",
             "alive": False, "classic": False, "exiting": False},
            {"index": 2, "id": "n-c", "tcp": "127.0.0.1:5", "http": "127.0.0.1:6",
             "alive": True, "classic": True, "exiting": False}],
        "lookupds": [{"index": 0, "http": "127.0.0.1:7", "running": True, "leader": True}],
        "topics": {"t": [
            {"partition": 0, "leader": "n-a", "replicas": ["n-a", "n-b"], "writable": False,
             "leader_ready": False, "stalled": True},
            {"partition": 1, "leader": None, "replicas": [], "writable": True,
             "leader_ready": True, "stalled": False}]},
        "timeline": [{"at": 1.0, "ago": 2.5, "what": "isr_shrunk", "topic": "t",
                      "partition": 0, "isr": ["n-a", "n-x"]},
                     {"at": 2.0, "ago": 1.25, "what": "node_lost", "node": "n-b"}],
    }
    status.update(over)
    return status


def test_render_status_shows_every_state() -> None:
    text = render_status(status_of())
    lines = text.splitlines()
    assert lines[0] == ("dev cluster: mixed, proxied, profile realistic x0.05 (faults still "
                        "running: fault settle waits for them)")
    nodes = lines[lines.index("nodes (fault commands take the #)") + 1:lines.index("lookupds")]
    node_rows = {line.split()[0]: line for line in nodes if line.startswith("  #")}
    assert "alive, leaving" in node_rows["#0"]
    assert "down" in node_rows["#1"]
    assert "alive, classic" in node_rows["#2"]
    assert "running, leader" in text
    p0 = next(line for line in lines if line.split()[:2] == ["t", "0"])
    assert p0.split()[2:5] == ["#0", "#0", "#1"]
    assert p0.rstrip().endswith("not writable, stalled, leader starting")
    p1 = next(line for line in lines if line.split()[:2] == ["t", "1"])
    assert p1.split()[2:] == ["(none)", "-", "ok"]
    assert "fault timeline (last 2)" in text
    shrunk = next(line for line in lines if "isr_shrunk" in line)
    # node ids become their #, ids the cluster does not know stay as they are
    assert shrunk.split(None, 2)[2] == "topic t, partition 0, isr #0 n-x"
    lost = next(line for line in lines if "node_lost" in line)
    assert lost.split() == ["1.25s", "node_lost", "node", "#1"]


def test_render_status_of_a_quiet_cluster() -> None:
    text = render_status(status_of(proxied=False, busy=False, topics={}, timeline=[]))
    assert text.splitlines()[0] == "dev cluster: mixed, profile realistic x0.05"
    assert "topics" not in text
    assert text.splitlines()[-1] == "fault timeline: nothing happened yet"
    assert "fault timeline" not in render_status(status_of(), timeline=False)
