"""Replay of the real servers' TCP captures against the dev cluster's nsqd, byte for byte.

Each selected ``tcp_*.txt`` is replayed on a freshly built copy of the captured cluster (the
same topics, leaders and replicas; the captured ports mapped to ours): every SEND is written
as captured, every RECV must come back identical, except what the servers derive from clocks
(message timestamps, and classic's time-based message ids, which later SENDs are rewritten to
use), and every "closed by server" must be an EOF. Files whose exchanges interleave several
open connections, depend on timing or carry compressed/encrypted bytes are covered by the
behaviour tests instead (test_nsqd_youzan.py, test_nsqd_classic.py, test_nsqd_streams.py).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import pytest
import trustme
from nsqd_helpers import FIXTURES, TIMEOUT, Nodes, Step, load_tcp_capture

from smartnsq.devcluster.nsqd.node import NsqdNode
from smartnsq.devcluster.state import ClusterState, PartitionInfo, TopicInfo

YOUZAN_FILES = ["tcp_01_identify.txt", "tcp_08_err_pub_not_leader.txt",
                "tcp_09_err_sub_not_leader.txt", "tcp_10_err_pub_topic_not_exist.txt",
                "tcp_11_err_invalid_topic_name.txt", "tcp_13_ordered_sub_errors.txt",
                "tcp_16_pub_ext_to_nonext_topic.txt"]
CLASSIC_FILES = [
    "tcp_01_identify_feature_negotiation.txt", "tcp_02_identify_no_feature_negotiation.txt",
    "tcp_03_pub.txt", "tcp_04_mpub.txt", "tcp_06_pub_with_partition_token.txt",
    "tcp_07_sub_with_partition_token.txt", "tcp_09_nop.txt", "tcp_11_cls.txt",
    "tcp_12_err_bad_topic.txt", "tcp_13_err_fin_failed_nonfatal.txt",
    "tcp_14_err_rdy_too_high.txt", "tcp_15_err_sub_twice.txt",
    "tcp_16_err_unknown_cmd_sub_ordered.txt", "tcp_17_err_unknown_cmd_pub_trace.txt",
    "tcp_18_err_body_too_large.txt", "tcp_22_auth_success.txt",
    "tcp_23_auth_unauthorized_topic.txt", "tcp_24_auth_first.txt", "tcp_25_auth_errors.txt",
    "tcp_26_bad_magic.txt", "tcp_27_pub_without_identify.txt",
    "tcp_28_identify_twice_and_bad_values.txt", "tcp_29_identify_tls_not_configured.txt",
]
# messages the classic captures published beforehand without recording it
CLASSIC_SETUP = {"tcp_07_sub_with_partition_token.txt": ("cl_subpart", b"for-sub-part"),
                 "tcp_11_cls.txt": ("cl_cls", b"cls-msg")}
CLASSIC_AUTH = {
    "goodsecret": {"identity": "x", "identity_url": "",
                   "authorizations": [{"topic": "^allowed_.*$", "channels": [".*"],
                                       "permissions": ["subscribe", "publish"]}]},
    "noperms": {"identity": "x", "authorizations": []},
}


def _place(state: ClusterState, name: str, layout: list[tuple[str, list[str]]],
           **flags: bool) -> TopicInfo:
    """A topic with the captured leaders and replicas."""
    info = TopicInfo(name, len(layout), len(layout[0][1]), **flags)
    info.partitions = [PartitionInfo(name, pid, leader, replicas)
                       for pid, (leader, replicas) in enumerate(layout)]
    state.topics[name] = info
    return info


@pytest.fixture
async def youzan_cluster() -> AsyncIterator[tuple[Nodes, dict[int, NsqdNode]]]:
    """The captured youzan cluster: nsqd at 14150, 24150, 34150 and their topics."""
    state = ClusterState()
    nodes = [NsqdNode(state, name=f"nsqd-{i}") for i in range(3)]
    for node in nodes:
        await node.start()
    a, b, c = (n.node_id for n in nodes)
    topics = [_place(state, "test_p2r2", [(a, [a, b]), (b, [b, c])], multipart=True),
              _place(state, "test_ordered", [(b, [b]), (c, [c])], ordered=True,
                     multipart=True),
              _place(state, "test_ext", [(a, [a, b])], ext=True)]
    for info, channel in zip(topics, ("ch1", "och", "ech"), strict=True):
        for p in info.partitions:
            next(n for n in nodes if n.node_id == p.leader).channel(p, info, channel)
    try:
        yield Nodes(state, nodes), {14150: nodes[0], 24150: nodes[1], 34150: nodes[2]}
    finally:
        for node in nodes:
            await node.stop()


@pytest.fixture
async def classic_cluster() -> AsyncIterator[tuple[Nodes, dict[int, NsqdNode]]]:
    """nsqd-A (34450, TLS configured) and nsqd-B (34480, auth), classic 1.3."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("localhost").configure_cert(server)
    state = ClusterState()
    a = NsqdNode(state, classic=True, name="nsqd-A", tls=server)
    b = NsqdNode(state, classic=True, name="nsqd-B", auth=CLASSIC_AUTH)
    for node in (a, b):
        await node.start()
    try:
        yield Nodes(state, [a, b]), {34450: a, 34480: b}
    finally:
        for node in (a, b):
            await node.stop()


class Replay:
    """Runs a capture's steps; maps captured message ids to the ones our server made."""

    def __init__(self, ports: dict[int, NsqdNode], *, classic: bool) -> None:
        self.ports = ports
        self.classic = classic
        self.ids: dict[bytes, bytes] = {}
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def run(self, steps: list[Step]) -> None:
        try:
            for step in steps:
                await getattr(self, f"_{step.kind}")(step)
        finally:
            for writer in self.writers:
                writer.close()

    async def _connect(self, step: Step) -> None:
        node = self.ports[step.port]
        self.reader, self.writer = await asyncio.open_connection(node.host, node.tcp_port)
        self.writers.append(self.writer)

    async def _send(self, step: Step) -> None:
        assert self.writer is not None
        data = step.data
        for captured, ours in self.ids.items():
            data = data.replace(captured, ours)
        self.writer.write(data)

    async def _frame(self) -> bytes:
        assert self.reader is not None
        head = await asyncio.wait_for(self.reader.readexactly(4), TIMEOUT)
        size = int.from_bytes(head, "big")
        return head + await asyncio.wait_for(self.reader.readexactly(size), TIMEOUT)

    async def _recv(self, step: Step) -> None:
        expected = step.data
        got = await self._frame()
        if expected[4:8] != b"\x00\x00\x00\x02":
            assert got == expected, f"{step.text}\n  got {got!r}"
            return
        # a message: the timestamp (and a classic id) comes from the server's clock
        id_end = 34
        assert (got[:8], got[16:18], got[id_end:]) == \
            (expected[:8], expected[16:18], expected[id_end:]), step.text
        if self.classic:
            self.ids[expected[18:id_end]] = got[18:id_end]
        else:
            assert got[18:id_end] == expected[18:id_end], step.text

    async def _closed(self, step: Step) -> None:
        assert self.reader is not None
        try:
            rest = await asyncio.wait_for(self.reader.read(65536), TIMEOUT)
        except ConnectionResetError:
            rest = b""
        assert rest == b"", f"{step.text}: still open, got {rest!r}"


@pytest.mark.parametrize("name", YOUZAN_FILES)
async def test_youzan_capture(youzan_cluster: tuple[Nodes, dict[int, NsqdNode]],
                              name: str) -> None:
    _, ports = youzan_cluster
    await Replay(ports, classic=False).run(load_tcp_capture(FIXTURES / "youzan" / name))


@pytest.mark.parametrize("name", CLASSIC_FILES)
async def test_classic_capture(classic_cluster: tuple[Nodes, dict[int, NsqdNode]],
                               name: str) -> None:
    nodes, ports = classic_cluster
    if name in CLASSIC_SETUP:
        topic, body = CLASSIC_SETUP[name]
        nodes.nodes[0].classic_partition(topic).log.append(body)
    await Replay(ports, classic=True).run(load_tcp_capture(FIXTURES / "classic" / name))
