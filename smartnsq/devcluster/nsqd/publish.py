"""The publish family of the dev cluster's nsqd, youzan and classic (docs/protocol.md §3.7).

Each command is a generator: it yields what it wants to read next (``READ_INT32`` or a byte
count) and receives it, so its checks run in the real server's order relative to the reads.
youzan (``#preparePub``, ``#internalPubExtAndTrace``, ``#internalMPUBEXTAndTrace``): partition
token, length, size limits, topic-partition held by this node (``E_TOPIC_NOT_EXIST``, fatal,
before the body), ordered topics need a partition, auth, then the body; ext and trace rules;
the write finally fails softly (``E_FAILED_ON_NOT_LEADER``/``_NOT_WRITABLE``) on a replica or a
partition closed for writes. Classic 1.3 creates topics on first use and adds DPUB.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Generator
from struct import Struct
from typing import Any, Final

from ...protocol.responses import PublishReceipt, encode_publish_receipt
from ...protocol.validate import MAX_NAME_LENGTH
from ..state import BatchItem, ClusterState, PartitionInfo, TopicInfo
from .error_frames import GoParseError, fatal, go_atoi, go_base10, go_quote, nonfatal
from .options import Settings
from .view import NodeView

__all__ = ["HOLD", "READ_INT32", "PublishCommands", "valid_name"]

READ_INT32: Final = -1
HOLD: Final = -2  # wait until the partition's stall is over (``PartitionInfo.stalled_until``)
OK: Final = b"OK"
TRACE_ID_KEY: Final = "##trace_id"
DISPATCH_TAG_KEY: Final = "##client_dispatch_tag"
ZAN_TEST_KEY: Final = "zan_test"

_U16: Final = Struct(">H")
_U64: Final = Struct(">Q")
_DIGITS: Final = re.compile(r"[0-9]+")
_MAX_UINT64: Final = (1 << 64) - 1
_NAME_CHARS: Final = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               b"0123456789._-")
_EPHEMERAL: Final = b"#ephemeral"

Reads = Generator[int, Any, Any]


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _header(raw: bytes) -> Any:
    """The ext JSON, parsed as go-simplejson would (any JSON value)."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise nonfatal("E_INVALID_JSON_HEADER", "fail to parse json header") from None


def _trace_id(header: Any) -> int | None:
    """``##trace_id`` as youzan reads it: a decimal uint64 in a JSON string."""
    if not isinstance(header, dict) or TRACE_ID_KEY not in header:
        return None
    value = header[TRACE_ID_KEY]
    if not isinstance(value, str):
        raise nonfatal("INVALID_TRACE_ID", "passin trace id should be string")
    if _DIGITS.fullmatch(value) is None or int(value) > _MAX_UINT64:
        raise nonfatal("INVALID_TRACE_ID", "invalid trace id")
    return int(value)


def _tag(header: Any) -> str:
    if isinstance(header, dict):
        tag = header.get(DISPATCH_TAG_KEY)
        if isinstance(tag, str):
            return tag
    return ""


def _only_internal(header: Any) -> bool:
    """youzan's ``canIgnoreJsonHeader`` after ``filterIllegalZanTestHeader``."""
    if not isinstance(header, dict):
        return True
    for key, value in header.items():
        if key == ZAN_TEST_KEY and value not in (True, "true", "True", "1", "t", "T", "TRUE"):
            continue
        if not key.startswith("##"):
            return False
    return True


class PublishCommands:
    """PUB, PUB_TRACE, PUB_EXT, MPUB, MPUB_TRACE, MPUB_EXT (youzan); PUB, MPUB, DPUB (classic).

    A mixin of :class:`~smartnsq.devcluster.nsqd.tcp.NsqdConnection`.
    """

    node: NodeView
    state: ClusterState
    opts: Settings

    def _check_auth(self, cmd: str, topic: str, channel: str) -> None:
        raise NotImplementedError

    _hold_on: PartitionInfo | None
    pub_stats: dict[tuple[str, int], list[int]]

    def _count_pub(self, p: PartitionInfo, messages: int) -> None:
        """What /stats lists while this client is connected (youzan ``client_pub_stats``,
        classic ``producers``): messages it published to the partition, and when it last did."""
        entry = self.pub_stats.setdefault((p.topic, p.partition), [0, 0, 0])
        entry[0] += messages
        entry[2] = int(time.time())

    def _writable(self, p: PartitionInfo) -> None:
        raise NotImplementedError

    def _await_writable(self, p: PartitionInfo) -> Reads:
        """A stalled partition's leader answers nothing until the stall ends, then checks."""
        if p.stalled():
            self._hold_on = p
            yield HOLD
            self._hold_on = None
        self._writable(p)

    # -- youzan ---------------------------------------------------------------------------------

    def cmd_pub(self, params: list[bytes]) -> Reads:
        return self._youzan_pub(params, trace=False, ext=False)

    def cmd_pub_trace(self, params: list[bytes]) -> Reads:
        return self._youzan_pub(params, trace=True, ext=False)

    def cmd_pub_ext(self, params: list[bytes]) -> Reads:
        return self._youzan_pub(params, trace=False, ext=True)

    def cmd_mpub(self, params: list[bytes]) -> Reads:
        return self._youzan_mpub(params, trace=False, ext=False)

    def cmd_mpub_trace(self, params: list[bytes]) -> Reads:
        return self._youzan_mpub(params, trace=True, ext=False)

    def cmd_mpub_ext(self, params: list[bytes]) -> Reads:
        return self._youzan_mpub(params, trace=False, ext=True)

    def _prepare(self, params: list[bytes], max_size: int, mpub: bool) -> Reads:
        """youzan's ``preparePub``: returns (partition, topic, body length)."""
        if len(params) < 2:
            raise fatal("E_INVALID", "insufficient number of parameters")
        topic = _text(params[1])
        partition = -1
        if len(params) == 3:  # the partition only counts as the third of exactly 3 tokens
            try:
                partition = go_atoi(params[2])
            except GoParseError as exc:
                raise fatal("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        given = partition
        if partition == -1:
            partition = self.node.default_partition(topic)
        size = yield READ_INT32
        if size <= 0:
            raise fatal("E_BAD_BODY", f"invalid body size {size}")
        if size > max_size:
            if mpub:
                raise fatal("E_BAD_BODY", f"body too big {size} > {max_size}")
            raise fatal("E_BAD_MESSAGE", f"message too big {size} > {max_size}")
        p = self.node.held_partition(topic, partition)
        info = self.state.topics.get(topic)
        if p is None or info is None:
            raise fatal("E_TOPIC_NOT_EXIST")
        if given == -1 and info.ordered:
            raise fatal("E_BAD_PARTITION", f"topic partition is not valid for multi partition: "
                                           f"{given}")
        self._check_auth("PUB", topic, "")
        return p, info, size

    def _ext_part(self, info: TopicInfo, raw: bytes) -> tuple[int | None, bytes | None, str]:
        """Checks of one JSON header: (trace id or None, ext to store, dispatch tag)."""
        header = _header(raw)
        trace_id = _trace_id(header)
        if not info.ext:
            if self.opts.allow_ext_compatible and _only_internal(header):
                return trace_id, None, ""
            raise nonfatal("E_EXT_NOT_SUPPORT", f"ext content not supported in topic "
                                                f"{info.name}")
        return trace_id, raw, _tag(header)

    def _youzan_pub(self, params: list[bytes], *, trace: bool, ext: bool) -> Reads:
        p, info, size = yield from self._prepare(params, self.opts.max_msg_size, False)
        if trace and size <= 8:
            raise fatal("E_BAD_BODY", f"invalid body size {size} with trace id enabled")
        if ext and size <= 2:
            raise fatal("E_BAD_BODY", f"invalid body size {size} with ext json header enabled")
        body: bytes = yield size
        trace_id = 0
        traced = False
        stored_ext: bytes | None = None
        tag = ""
        if trace:
            trace_id = _U64.unpack_from(body)[0]
            traced = True
            body = body[8:]
        elif ext:
            (length,) = _U16.unpack_from(body)
            if size <= 2 + length:
                raise fatal("E_BAD_BODY", f"invalid body size {size} in ext json header "
                                          f"content length")
            found, stored_ext, tag = self._ext_part(info, body[2:2 + length])
            if found is not None:
                trace_id, traced = found, True
            body = body[2 + length:]
        yield from self._await_writable(p)
        msg = p.log.append(body, trace_id, stored_ext, ext_topic=info.ext, tag=tag)
        p.count_size(len(body))
        self._count_pub(p, 1)
        if traced:
            return encode_publish_receipt(PublishReceipt(msg.internal_id, trace_id,
                                                         msg.queue_offset, msg.raw_size))
        return OK

    def _youzan_mpub(self, params: list[bytes], *, trace: bool, ext: bool) -> Reads:
        opts = self.opts
        p, info, _ = yield from self._prepare(params, opts.max_body_size, True)
        count = yield READ_INT32
        if count <= 0 or count > (opts.max_body_size - 4) // 5:
            raise fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
        max_msg = opts.max_msg_size
        items: list[BatchItem] = []
        for i in range(count):
            size = yield READ_INT32
            if size <= 0:
                raise fatal("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
            if size > max_msg:
                raise fatal("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg}")
            data: bytes = yield size
            trace_id = 0
            stored_ext: bytes | None = None
            tag = ""
            if trace:
                if size <= 8:
                    raise fatal("E_BAD_MESSAGE",
                                f"MPUB invalid message({i}) body size {size} for tracing")
                trace_id = _U64.unpack_from(data)[0]
                data = data[8:]
            elif ext:
                length = _U16.unpack_from(data)[0] if size >= 2 else size
                if size <= 2 + length:
                    raise fatal("E_BAD_BODY", f"invalid body size {size} in ext json header "
                                              f"content length")
                if length > 0:
                    found, stored_ext, tag = self._ext_part(info, data[2:2 + length])
                    trace_id = found or 0
                data = data[2 + length:]
            items.append((data, trace_id, stored_ext, tag))
            if p.leader == self.node.node_id:
                p.count_size(len(data))  # the leader counts as it reads, as the real one does
        yield from self._await_writable(p)
        msgs = p.log.append_batch(items, ext_topic=info.ext)
        self._count_pub(p, len(msgs))
        if trace:
            first = msgs[0]
            return encode_publish_receipt(PublishReceipt(
                first.internal_id, 0, first.queue_offset, sum(m.raw_size for m in msgs)))
        return OK

    # -- classic --------------------------------------------------------------------------------

    def _classic_topic(self, params: list[bytes], cmd: str, wanted: int,
                       bad_topic: str = "{cmd} topic name {name} is not valid") -> str:
        if len(params) < wanted:
            raise fatal("E_INVALID", f"{cmd} insufficient number of parameters")
        if not valid_name(params[1]):
            raise fatal("E_BAD_TOPIC", bad_topic.format(cmd=cmd, name=go_quote(params[1])))
        return _text(params[1])

    def _classic_body(self, cmd: str) -> Reads:
        max_msg = self.opts.max_msg_size
        size = yield READ_INT32
        if size <= 0:
            raise fatal("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
        if size > max_msg:
            raise fatal("E_BAD_MESSAGE", f"{cmd} message too big {size} > {max_msg}")
        body: bytes = yield size
        return body

    def cmd_classic_pub(self, params: list[bytes]) -> Reads:
        topic = self._classic_topic(params, "PUB", 2)
        body = yield from self._classic_body("PUB")
        self._check_auth("PUB", topic, "")
        p = self.node.classic_partition(topic)
        p.log.append(body)
        self._count_pub(p, 1)
        return OK

    def cmd_classic_dpub(self, params: list[bytes]) -> Reads:
        topic = self._classic_topic(params, "DPUB", 3)
        try:
            delay_ms = go_base10(params[2])
        except GoParseError:
            raise fatal("E_INVALID", b"DPUB could not parse timeout " + params[2]) from None
        max_req = self.opts.max_req_timeout
        if delay_ms > max_req:
            raise fatal("E_INVALID", f"DPUB timeout {delay_ms} out of range 0-{max_req}")
        body = yield from self._classic_body("DPUB")
        self._check_auth("DPUB", topic, "")
        deliver_after = time.monotonic() + delay_ms / 1000 if delay_ms else 0.0
        p = self.node.classic_partition(topic)
        p.log.append(body, deliver_after=deliver_after)
        self._count_pub(p, 1)
        return OK

    def cmd_classic_mpub(self, params: list[bytes]) -> Reads:
        # classic 1.3 prints the code twice here (sic)
        topic = self._classic_topic(params, "MPUB", 2,
                                    "E_BAD_TOPIC {cmd} topic name {name} is not valid")
        self._check_auth("MPUB", topic, "")
        p = self.node.classic_partition(topic)
        opts = self.opts
        size = yield READ_INT32
        if size <= 0:
            raise fatal("E_BAD_BODY", f"MPUB invalid body size {size}")
        if size > opts.max_body_size:
            raise fatal("E_BAD_BODY", f"MPUB body too big {size} > {opts.max_body_size}")
        count = yield READ_INT32
        if count <= 0 or count > (opts.max_body_size - 4) // 5:
            raise fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
        items: list[BatchItem] = []
        for i in range(count):
            n = yield READ_INT32
            if n <= 0:
                raise fatal("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {n}")
            if n > opts.max_msg_size:
                raise fatal("E_BAD_MESSAGE", f"MPUB message too big {n} > {opts.max_msg_size}")
            data: bytes = yield n
            items.append((data, 0, None, ""))
        p.log.append_batch(items)
        self._count_pub(p, len(items))
        return OK


def valid_name(name: bytes) -> bool:
    """``^[.a-zA-Z0-9_-]+(#ephemeral)?$``, 1..64 bytes (docs/protocol.md §3.5)."""
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        return False
    if name.endswith(_EPHEMERAL):
        name = name[:-len(_EPHEMERAL)]
    return bool(name) and all(b in _NAME_CHARS for b in name)
