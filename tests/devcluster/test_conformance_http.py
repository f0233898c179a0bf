"""Every nsqlookupd HTTP capture replayed against the dev cluster's lookupd.

The captured clusters are rebuilt in a ClusterState with the captured nodes' ports, ids and
hostnames (nothing listens there; lookupd only reports them), so bodies compare field by field:
equal everywhere except the ``id``/``remote_address`` of peers, which are the nsqd's ephemeral
outbound ports, and the order of lists the real server builds from Go maps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from smartnsq.devcluster.lookupd import Lookupd
from smartnsq.devcluster.state import (
    ClusterState,
    NodeInfo,
    PartitionInfo,
    TopicInfo,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
V1_ACCEPT = "application/vnd.nsq; version=1.0"


# -- capture files ------------------------------------------------------------------------------


@dataclass
class Capture:
    name: str
    method: str
    target: str  # path + query
    v1: bool
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes


def load_capture(path: Path) -> Capture:
    """Read the request line out of the ``#`` comments and the raw response after them."""
    text = path.read_text()
    lines = text.split("\n")
    comments = [line for line in lines if line.startswith("#")]
    url = next(m.group(0) for line in comments
               if (m := re.search(r"https?://\S+", line)) is not None)
    method = "GET"
    for line in comments:
        m = re.search(r"(?:-X |^# )(GET|POST|PUT)\b", line)
        if m:
            method = m.group(1)
            break
    header_text = " ".join(comments)
    v1 = V1_ACCEPT in header_text and "no Accept" not in header_text
    target = url.split("://", 1)[1]
    target = target[target.index("/"):]
    start = next(i for i, line in enumerate(lines) if line.startswith("HTTP"))
    status = int(lines[start].split()[1])
    headers: dict[str, str] = {}
    i = start + 1
    while lines[i].strip():
        key, _, value = lines[i].partition(":")
        headers[key.strip().lower()] = value.strip()
        i += 1
    body = "\n".join(lines[i + 1:]).strip("\n").encode()
    return Capture(path.name, method, target, v1, status, headers, body)


def captures(flavour: str, pattern: str) -> list[Path]:
    return sorted((FIXTURES / flavour).glob(pattern))


# -- the captured clusters ----------------------------------------------------------------------

CHANNEL = object()  # lookupd only looks at channel names


def youzan_node(n: int) -> NodeInfo:
    port = 4150 + 10000 * n
    return NodeInfo(node_id=f"127.0.0.1:{port + 100}:{port}:{n}", broadcast_address="127.0.0.1",
                    tcp_port=port, http_port=port + 1, hostname="vm")


def add_topic(state: ClusterState, name: str, leaders: list[int], replica: int,
              channels: list[list[str]], **flags: bool) -> TopicInfo:
    info = TopicInfo(name, len(leaders), replica, **flags)
    nodes = list(state.nodes)
    for pid, leader in enumerate(leaders):
        p = PartitionInfo(name, pid, nodes[leader - 1], [nodes[leader - 1]])
        p.channels = dict.fromkeys(channels[pid], CHANNEL)
        info.partitions.append(p)
    state.topics[name] = info
    return info


def youzan_state(stage: str) -> ClusterState:
    """The youzan capture cluster; ``stage`` picks which channels existed at capture time."""
    state = ClusterState()
    for n in (1, 2, 3):
        node = youzan_node(n)
        state.nodes[node.node_id] = node
    before = stage == "before_channel"
    late = stage == "late"  # 10:58:08 captures: ch2 and the second ordered channel exist
    p2r2 = [[], []] if before else [["ch1", "ch2"], ["ch1", "ch2"]] if late else [["ch1"],
                                                                                   ["ch1"]]
    add_topic(state, "test_p2r2", [1, 2], 2, p2r2, multipart=True)
    add_topic(state, "test_p3r1", [1, 3, 2], 1, [["default"]] * 3)
    add_topic(state, "test_ordered", [2, 3], 2, [["och"], ["och"] if late else []],
              ordered=True)
    add_topic(state, "test_ext", [1], 2, [["ech"]], ext=True)
    return state


def classic_state() -> ClusterState:
    state = ClusterState()
    node = NodeInfo(node_id="127.0.0.1:34450", broadcast_address="127.0.0.1", tcp_port=34450,
                    http_port=34451, hostname="vm", classic=True)
    state.nodes[node.node_id] = node
    names = ["cl_subpart", "cl_finfail", "cl_rdy", "cl_cls", "cl_snappy", "cl_deflate",
             "cl_topic", "cl_dpub", "cl_flow", "cl_created"]
    for name in names:
        info = TopicInfo(name, 0, 0, classic=True)
        p = PartitionInfo(name, 0, node.node_id, [node.node_id])
        if name == "cl_topic":
            p.channels = {"ch1": CHANNEL, "ch_noid": CHANNEL}
        info.partitions.append(p)
        state.topics[name] = info
    return state


def stage_of(name: str) -> str:
    if "before_channel" in name:
        return "before_channel"
    if name in ("http_lookup_p2r2_r_v1.txt", "http_lookup_p2r2_w_v1.txt",
                "http_lookup_p2r2_w_metainfo_v1.txt", "http_lookup_p2r2_w_partition1_v1.txt",
                "http_lookup_ordered_r_v1.txt", "http_lookup_ordered_w_metainfo_v1.txt",
                "http_lookup_ext_w_metainfo_v1.txt", "http_lookup_nonexistent_r_v1.txt",
                "http_lookup_nonexistent_w_metainfo_v1.txt"):
        return "mid"
    return "late"


# -- comparison ---------------------------------------------------------------------------------

ADDRESS = re.compile(r"^127\.0\.0\.1:\d+$")


def normalise(value: Any) -> Any:
    """Blank the ephemeral peer addresses and sort lists Go builds from maps."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("id", "remote_address"):
                assert isinstance(item, str) and ADDRESS.match(item), (key, item)
                out[key] = "<addr>"
            else:
                out[key] = normalise(item)
        return out
    if isinstance(value, list):
        items = [normalise(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    return value


def assert_same_response(resp: httpx.Response, cap: Capture) -> None:
    assert resp.status_code == cap.status, (cap.name, resp.content)
    for header in ("content-type", "x-nsq-content-type"):
        assert resp.headers.get(header) == cap.headers.get(header), (cap.name, header)
    if cap.headers.get("content-type", "").startswith("application/json"):
        assert normalise(resp.json()) == normalise(json.loads(cap.body)), cap.name
        # byte-exact where nothing is ephemeral (addresses) or random (topic order)
        if not any(key in cap.body for key in (b'"id"', b"remote_address", b'"topics"')):
            assert resp.content == cap.body, cap.name
    else:
        assert resp.content == cap.body, cap.name


def request_kwargs(cap: Capture) -> dict[str, Any]:
    return {"headers": {"Accept": V1_ACCEPT} if cap.v1 else {}}


# -- youzan -------------------------------------------------------------------------------------

YOUZAN_LOOKUP = [p for p in captures("youzan", "http_lookup*.txt")
                 if "listlookup" not in p.name]


@pytest.mark.parametrize("path", YOUZAN_LOOKUP, ids=lambda p: p.name)
async def test_youzan_lookupd_capture(path: Path) -> None:
    cap = load_capture(path)
    state = youzan_state(stage_of(cap.name))
    lookupd = Lookupd(state)
    await lookupd.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{lookupd.http_address}") as client:
            resp = await client.request(cap.method, cap.target, **request_kwargs(cap))
        assert_same_response(resp, cap)
    finally:
        await lookupd.stop()


@pytest.mark.parametrize("path", captures("youzan", "http_lookupd_listlookup*.txt"),
                         ids=lambda p: p.name)
async def test_youzan_listlookup_capture(path: Path) -> None:
    cap = load_capture(path)
    state = youzan_state("late")
    leader, follower = Lookupd(state), Lookupd(state)
    await leader.start()
    await follower.start()
    try:
        target = follower if "nonleader" in cap.name else leader
        async with httpx.AsyncClient(base_url=f"http://{target.http_address}") as client:
            resp = await client.get(cap.target, **request_kwargs(cap))
        assert resp.status_code == cap.status
        for header in ("content-type", "x-nsq-content-type"):
            assert resp.headers.get(header) == cap.headers.get(header)
        got, want = resp.json(), json.loads(cap.body)
        if not cap.v1:
            assert {k: v for k, v in got.items() if k != "data"} == {
                k: v for k, v in want.items() if k != "data"}
            got, want = got["data"], want["data"]
        assert list(got) == list(want)
        assert set(got["lookupdleader"]) == set(want["lookupdleader"])
        assert got["lookupdleader"]["ID"] == leader.node_id
        assert got["lookupdleader"]["HttpPort"] == str(leader.http_port)
        assert sorted(n["ID"] for n in got["lookupdnodes"]) == sorted(
            [leader.node_id, follower.node_id])
        for node in got["lookupdnodes"]:
            assert list(node) == list(want["lookupdnodes"][0])
            for key, value in node.items():
                assert type(value) is type(want["lookupdnodes"][0][key]), key
            assert node["ID"] == "{}:{}:{}:nsqlookup".format(
                node["NodeIP"], node["RpcPort"], node["TcpPort"])
    finally:
        await leader.stop()
        await follower.stop()


@pytest.mark.parametrize("path", captures("youzan", "http_lookupd_[cinpt]*.txt"),
                         ids=lambda p: p.name)
async def test_youzan_lookupd_endpoint_capture(path: Path) -> None:
    cap = load_capture(path)
    lookupd = Lookupd(youzan_state("late"))
    await lookupd.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{lookupd.http_address}") as client:
            resp = await client.request(cap.method, cap.target, **request_kwargs(cap))
        if cap.name == "http_lookupd_ping.txt":
            assert resp.status_code == 200 and resp.content == b"OK"
            assert resp.headers["content-type"] == cap.headers["content-type"]
            assert "x-nsq-content-type" not in resp.headers
            return
        assert_same_response(resp, cap)
    finally:
        await lookupd.stop()


@pytest.mark.parametrize("path", captures("youzan", "http_topic_create*.txt"),
                         ids=lambda p: p.name)
async def test_youzan_topic_create_capture(path: Path) -> None:
    cap = load_capture(path)
    state = ClusterState()
    for n in (1, 2, 3):
        node = youzan_node(n)
        state.nodes[node.node_id] = node
    leader, follower = Lookupd(state), Lookupd(state)
    await leader.start()
    await follower.start()
    state.lookupd_leader = leader.node_id
    try:
        target = follower if "nonleader" in cap.name else leader
        async with httpx.AsyncClient(base_url=f"http://{target.http_address}") as client:
            resp = await client.request(cap.method, cap.target)
        assert resp.status_code == cap.status
        assert resp.content == cap.body
        assert resp.headers.get("content-type") == cap.headers.get("content-type")
        assert resp.headers.get("x-nsq-content-type") == cap.headers.get("x-nsq-content-type")
        topic = httpx.URL(cap.target).params["topic"]
        assert (topic in state.topics) == (cap.status == 200)
        if cap.status == 200:
            info = state.topics[topic]
            params = httpx.URL(cap.target).params
            assert info.partition_num == int(params["partition_num"])
            assert info.replica == int(params["replicator"])
            assert info.ordered == (params.get("orderedmulti") == "true")
            assert info.ext == (params.get("extend") == "true")
    finally:
        await leader.stop()
        await follower.stop()


# -- classic ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", captures("classic", "http_lookupd_*.txt"),
                         ids=lambda p: p.name)
async def test_classic_lookupd_capture(path: Path) -> None:
    cap = load_capture(path)
    lookupd = Lookupd(classic_state(), classic=True)
    await lookupd.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://{lookupd.http_address}") as client:
            resp = await client.request(cap.method, cap.target, **request_kwargs(cap))
        assert_same_response(resp, cap)
        if cap.name.startswith("http_lookupd_ping"):
            assert "x-nsq-content-type" not in resp.headers
    finally:
        await lookupd.stop()


def test_every_lookupd_capture_is_replayed() -> None:
    """A new capture file must not go untested."""
    youzan = {p.name for p in captures("youzan", "http_lookup*.txt")}
    youzan |= {p.name for p in captures("youzan", "http_topic_*.txt")}
    covered = {p.name for p in YOUZAN_LOOKUP}
    covered |= {p.name for p in captures("youzan", "http_lookupd_listlookup*.txt")}
    covered |= {p.name for p in captures("youzan", "http_lookupd_[cinpt]*.txt")}
    covered |= {p.name for p in captures("youzan", "http_topic_create*.txt")}
    assert youzan <= covered
    assert len(captures("classic", "http_lookupd_*.txt")) == 18


def test_capture_loader_reads_both_formats() -> None:
    cap = load_capture(FIXTURES / "youzan" / "http_lookup_p2r2_w_metainfo_v0_noaccept.txt")
    assert (cap.method, cap.v1, cap.status) == ("GET", False, 200)
    assert cap.target == "/lookup?topic=test_p2r2&access=w&metainfo=true"
    cap = load_capture(FIXTURES / "classic" / "http_lookupd_lookup_v1.txt")
    assert (cap.method, cap.v1, cap.status) == ("GET", True, 200)
    cap = load_capture(FIXTURES / "youzan" / "http_topic_create_ext.txt")
    assert (cap.method, cap.status, cap.body) == ("POST", 200, b"")
