"""nsqd's HTTP API in the dev cluster (docs/protocol.md §7 and the ``http_nsqd_*`` captures).

youzan (``YS nsqdserver/http.go``): ``/ping``, ``/info``, ``/stats``, ``/pub``, ``/pub_ext``,
``/pubtrace``, ``/mpub``, ``/channel/{create,delete,empty,pause,unpause,skip,unskip,setoffset,
setorder,emptydelayed,requeuedelayed}``, ``/message/{get,finish}``,
with youzan's argument rules (``partition`` defaults to the partition this node leads) and its
statuses (404 ``E_TOPIC_NOT_EXIST``, 400 ``E_FAILED_ON_NOT_LEADER``...). Classic 1.3: the same
reads plus ``/topic/{create,delete,empty,pause,unpause}``, topics created on first use, never a
wrapped answer. A channel's delivery is held while any of its holds is on (paused, skipped,
its classic topic paused); ``/stats`` reports each hold as the real server does. The dev
cluster keeps no disk delayed queue (youzan's ``delayed_queue_count`` is 0), so the delayed
queue's actions answer as on an empty one. The rendering (wrapped or bare, headers) is the
HTTP server's job, chosen per route style.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import re
import time
import urllib.parse
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from struct import Struct
from typing import Any, Final

from ..httpserver import NEGOTIATE, PLAIN, V1, HTTPError, HTTPServer, Request, Response
from ..state import BatchItem, PartitionInfo, TopicInfo
from .channels import Channel
from .error_frames import GoParseError, go_atoi
from .publish import DISPATCH_TAG_KEY, TRACE_ID_KEY, valid_name
from .view import NodeView, start_index

_ID_PARTITION: Final = 50  # a youzan internal id carries its partition in its top bits

__all__ = ["NsqdHTTP"]

_U32: Final = Struct(">i")
_DIGITS: Final = re.compile(r"[0-9]+")
_OFFSET_KINDS: Final = ("timestamp", "virtual_queue", "msgcount", "special")
_ZERO_TIME: Final = "1970-01-01 00:00:00 +0000 UTC"
_E2E: Final = {"count": 0, "percentiles": None}

Route = Callable[[Request], Awaitable[Any]]


def _go_time(ns: int) -> str:
    """Go's ``time.Time.String()`` in UTC (fraction without trailing zeros)."""
    if ns <= 0:
        return _ZERO_TIME
    seconds, nanos = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    return text + " +0000 UTC"


def _first_unconfirmed(channel: Channel, messages: list[Any]) -> int:
    """The index of the oldest message of the channel not finished yet (in flight, requeued,
    deferred or unread)."""
    offsets = [entry.msg.queue_offset
               for consumer in [*channel.consumers, *channel.lingering]
               for entry in consumer.in_flight.values()]
    offsets += [entry.msg.queue_offset for queue in channel.queues.values() for entry in queue]
    offsets += [entry.msg.queue_offset for _, _, entry in channel.deferred]
    first = min(channel.cursor, len(messages))
    if offsets:
        lowest = min(offsets)
        first = min(first, bisect.bisect_left(messages, lowest,
                                              key=lambda m: m.queue_offset))
    return first


def _write_histogram(p: PartitionInfo) -> list[int]:
    """``msg_write_latency_stats``: one count per written message; a dev cluster writes to
    memory, so every write falls in the fastest bucket."""
    return [len(p.log)] + [0] * 15


class NsqdHTTP:
    """The HTTP server of one node; routes depend on the node's flavour."""

    def __init__(self, node: NodeView, port: int = 0) -> None:
        self.node = node
        self.server = HTTPServer(node.host, port, classic=node.classic, name=f"{node.name}-http")
        # channel -> its holds ("pause", "skip", "topic"); delivery waits while any is on
        self._holds: weakref.WeakKeyDictionary[Channel, set[str]] = weakref.WeakKeyDictionary()
        self._paused_topics: set[str] = set()  # classic /topic/pause
        r = self.server.route
        r("GET", "/ping", self._ping, PLAIN)
        r("GET", "/info", self._info, NEGOTIATE)
        r("GET", "/stats", self._stats, NEGOTIATE)
        r("POST", "/pub", self._pub, NEGOTIATE)
        r("POST", "/mpub", self._mpub, NEGOTIATE)
        if node.classic:
            r("POST", "/topic/create", self._classic_topic_create, V1)
            r("POST", "/topic/delete", self._classic_topic_delete, V1)
            r("POST", "/topic/empty", self._classic_topic_empty, V1)
            r("POST", "/channel/create", self._classic_channel_create, V1)
            r("POST", "/channel/delete", self._classic_channel_delete, V1)
            r("POST", "/channel/empty", self._classic_channel_empty, V1)
            r("POST", "/channel/pause", self._classic_channel_pause, V1)
            r("POST", "/channel/unpause", self._classic_channel_pause, V1)
            r("POST", "/topic/pause", self._classic_topic_pause, V1)
            r("POST", "/topic/unpause", self._classic_topic_pause, V1)
        else:
            r("POST", "/pub_ext", self._pub_ext, NEGOTIATE)
            r("POST", "/pubtrace", self._pubtrace, V1)
            r("POST", "/channel/create", self._channel_create, V1)
            r("POST", "/channel/delete", self._channel_delete, V1)
            r("POST", "/channel/empty", self._channel_empty, V1)
            r("POST", "/channel/pause", self._channel_pause, V1)
            r("POST", "/channel/unpause", self._channel_pause, V1)
            r("POST", "/channel/skip", self._channel_skip, V1)
            r("POST", "/channel/unskip", self._channel_skip, V1)
            r("POST", "/channel/emptydelayed", self._channel_delayed, V1)
            r("POST", "/channel/requeuedelayed", self._channel_delayed, V1)
            r("POST", "/message/finish", self._message_finish, V1)
            r("POST", "/channel/setoffset", self._channel_setoffset, V1)
            r("POST", "/channel/setorder", self._channel_setorder, V1)
            r("GET", "/message/get", self._message_get, V1)

    @property
    def port(self) -> int:
        return self.server.port

    async def start(self) -> int:
        return await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    # -- shared ---------------------------------------------------------------------------------

    async def _ping(self, req: Request) -> str:
        return "OK"

    async def _info(self, req: Request) -> dict[str, Any]:
        node = self.node
        info: dict[str, Any] = {
            "version": node.version,
            "broadcast_address": node.host,
            "hostname": node.hostname,
            "http_port": node.http_port,
            "tcp_port": node.tcp_port,
            "start_time": node.start_time,
        }
        if node.classic:
            opts = node.options
            info.update({
                "max_heartbeat_interval": opts.max_heartbeat_interval * 1_000_000,
                "max_output_buffer_size": opts.max_output_buffer_size,
                "max_output_buffer_timeout": opts.max_output_buffer_timeout * 1_000_000,
                "max_deflate_level": opts.max_deflate_level,
            })
        else:
            info["ha_support"] = True
        return info

    async def _pub(self, req: Request) -> Any:
        if self.node.classic:
            return self._classic_pub(req)
        await self._stall(req)
        return self._youzan_pub(req, trace=False, ext=False)

    async def _pubtrace(self, req: Request) -> Any:
        await self._stall(req)
        return self._youzan_pub(req, trace=True, ext=False)

    async def _pub_ext(self, req: Request) -> Any:
        await self._stall(req)
        return self._youzan_pub(req, trace=False, ext=True)

    async def _mpub(self, req: Request) -> Any:
        if self.node.classic:
            return self._classic_mpub(req)
        await self._stall(req)
        return self._youzan_mpub(req)

    async def _stall(self, req: Request) -> None:
        """A stalled partition's leader answers a publish only once the stall is over."""
        try:
            p, _ = self._held(req)
        except HTTPError:
            return  # the publish itself reports it
        while p.stalled():
            await asyncio.sleep(p.stalled_until - time.monotonic())

    def _bodies(self, req: Request) -> list[bytes]:
        """``/mpub`` bodies: ``binary`` framing or one message per line (empty lines dropped)."""
        opts = self.node.options
        if req.has_arg("binary"):
            return _binary_mpub(req.body, opts.max_msg_size, opts.max_body_size)
        bodies = []
        for line in req.body.split(b"\n"):
            if not line:
                continue
            if len(line) > opts.max_msg_size:
                raise HTTPError(413, "MSG_TOO_BIG")
            bodies.append(line)
        return bodies

    # -- youzan ---------------------------------------------------------------------------------

    def _topic_args(self, req: Request) -> tuple[str, int]:
        """``GetTopicPartitionArgs``; the partition defaults to the one this node leads."""
        topic = req.arg("topic")
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not valid_name(topic.encode()):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        text = req.arg("partition")
        partition = -1
        if text:
            try:
                partition = go_atoi(text.encode())
            except GoParseError as exc:
                raise HTTPError(400, str(exc)) from None
        if partition == -1:
            partition = self.node.default_partition(topic)
        return topic, partition

    def _held(self, req: Request) -> tuple[PartitionInfo, TopicInfo]:
        topic, partition = self._topic_args(req)
        p = self.node.held_partition(topic, partition)
        info = self.node.state.topics.get(topic)
        if p is None or info is None:
            raise HTTPError(404, "E_TOPIC_NOT_EXIST")
        return p, info

    def _channel_args(self, req: Request) -> tuple[PartitionInfo, TopicInfo, str]:
        p, info = self._held(req)
        name = req.arg("channel")
        if not name:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not valid_name(name.encode()):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return p, info, name

    def _leader(self, p: PartitionInfo) -> None:
        if not p.serving(self.node.node_id):
            raise HTTPError(400, "E_FAILED_ON_NOT_LEADER")

    def _existing(self, p: PartitionInfo, name: str) -> Channel:
        channel = p.channels.get(name)
        if not isinstance(channel, Channel) or channel.closed:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    def _youzan_pub(self, req: Request, *, trace: bool, ext: bool) -> Any:
        opts = self.node.options
        if len(req.body) > opts.max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not req.body:
            raise HTTPError(406, "MSG_EMPTY")
        try:
            p, info = self._held(req)
        except HTTPError:
            raise HTTPError(404, "E_TOPIC_NOT_EXIST") from None
        self._leader(p)
        trace_text = req.arg("trace_id")
        traced = False
        trace_id = 0
        if trace:
            if _DIGITS.fullmatch(trace_text) is None or int(trace_text) >= 1 << 64:
                raise HTTPError(400, "INVALID_TRACE_ID")
            trace_id, traced = int(trace_text), True
        stored: bytes | None = None
        tag = ""
        if ext:
            header = self._ext_header(req)
            found = header.get(TRACE_ID_KEY)
            if TRACE_ID_KEY in header:
                if not isinstance(found, str) or _DIGITS.fullmatch(found) is None \
                        or int(found) >= 1 << 64:
                    raise HTTPError(400, "INVALID_TRACE_ID")
                trace_text, trace_id, traced = found, int(found), True
            tag_value = header.get(DISPATCH_TAG_KEY)
            tag = tag_value if isinstance(tag_value, str) else ""
            # Go re-marshals the map: keys sorted, compact
            stored = json.dumps(header, separators=(",", ":"), sort_keys=True,
                                ensure_ascii=False).encode()
            if not info.ext:
                if not opts.allow_ext_compatible:
                    raise HTTPError(400, "E_EXT_NOT_SUPPORT")
                stored, tag = None, ""
        if not p.writable:
            raise HTTPError(400, "E_FAILED_ON_NOT_WRITABLE")
        msg = p.log.append(req.body, trace_id, stored if info.ext else None, ext_topic=info.ext,
                           tag=tag)
        p.count_size(len(req.body))
        if traced:
            return {"status": "OK", "id": msg.internal_id, "trace_id": trace_text,
                    "queue_offset": msg.queue_offset, "rawsize": msg.raw_size}
        return "OK"

    @staticmethod
    def _ext_header(req: Request) -> dict[str, Any]:
        text = req.arg("ext")
        if not text:
            raise HTTPError(400, "E_INVALID_JSON_HEADER")
        try:
            header = json.loads(urllib.parse.unquote(text))
        except ValueError:
            raise HTTPError(400, "E_INVALID_JSON_HEADER") from None
        if not isinstance(header, dict):
            raise HTTPError(400, "E_INVALID_JSON_HEADER")
        for name, value in req.header_list:
            if name.startswith("x-nsqext-"):
                header[name[len("x-nsqext-"):]] = value
        return header

    def _youzan_mpub(self, req: Request) -> str:
        opts = self.node.options
        if len(req.body) > opts.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        p, info = self._held(req)
        bodies = self._bodies(req)
        self._leader(p)
        if not p.writable:
            raise HTTPError(400, "E_FAILED_ON_NOT_WRITABLE")
        items: list[BatchItem] = [(body, 0, None, "") for body in bodies]
        if items:
            p.log.append_batch(items, ext_topic=info.ext)
            for body in bodies:
                p.count_size(len(body))
        return "OK"

    async def _channel_create(self, req: Request) -> None:
        p, info, name = self._channel_args(req)
        self._leader(p)
        self.node.channel(p, info, name)

    async def _channel_delete(self, req: Request) -> None:
        p, _, name = self._channel_args(req)
        self._leader(p)
        self._delete_channel(p, name)

    async def _channel_empty(self, req: Request) -> None:
        p, _, name = self._channel_args(req)
        channel = self._existing(p, name)
        self._leader(p)
        channel.empty()

    async def _channel_pause(self, req: Request) -> None:
        p, _, name = self._channel_args(req)
        channel = self._existing(p, name)
        if not p.serving(self.node.node_id):
            raise HTTPError(500, "INTERNAL_ERROR")  # a replica cannot sync the state change
        self._hold(channel, "pause", req.path.endswith("/pause"))

    async def _channel_skip(self, req: Request) -> None:
        """``/channel/{skip,unskip}``: both move the channel to the end of the queue (what
        was published while skipped is dropped), skip then holds its delivery."""
        p, _, name = self._channel_args(req)
        channel = self._existing(p, name)
        if not p.serving(self.node.node_id):
            raise HTTPError(500, "INTERNAL_ERROR")
        self._hold(channel, "skip", req.path.endswith("/skip"))
        channel.reset_to(len(p.log))

    async def _channel_delayed(self, req: Request) -> None:
        p, _, name = self._channel_args(req)
        self._existing(p, name)
        self._leader(p)

    async def _message_finish(self, req: Request) -> None:
        p, _, name = self._channel_args(req)
        channel = self._existing(p, name)
        text = req.arg("msgid")
        if _DIGITS.fullmatch(text.lstrip("-")) is None or len(text) > 19:
            raise HTTPError(400, "INVALID_REQUEST")
        self._leader(p)
        key = int(text)
        for consumer in [*channel.consumers, *channel.lingering]:
            if key in consumer.in_flight and channel.finish(consumer, key):
                return
        raise HTTPError(500, "ErrType:7 ErrCode:0 : Message ID not in flight")

    async def _channel_setoffset(self, req: Request) -> None:
        p, _, name = self._channel_args(req)
        channel = self._existing(p, name)
        if not req.body:
            raise HTTPError(406, "MSG_EMPTY")
        parts = req.body.split(b":")
        if len(parts) != 2 or parts[0].decode("latin-1") not in _OFFSET_KINDS:
            raise HTTPError(400, "invalid consume offset:" + req.body.decode("latin-1"))
        try:
            value = go_atoi(parts[1])
        except GoParseError as exc:
            raise HTTPError(400, str(exc).replace("strconv.Atoi", "strconv.ParseInt")) from None
        self._leader(p)
        if p.log.end_offset == 0 and parts[0] != b"special":
            # measured: a partition never written to has no commit log to search yet
            raise HTTPError(500, "commit log end of file")
        try:
            channel.reset_to(start_index(channel, parts[0].decode(), value))
        except ValueError as exc:
            raise HTTPError(500, str(exc)) from None

    async def _message_get(self, req: Request) -> dict[str, Any]:
        """``/message/get``: one stored message by count, queue offset or internal id (whose
        top bits name the partition; the other two need ``partition``)."""
        text = req.arg("search_pos")
        if _DIGITS.fullmatch(text) is None or int(text) >= 1 << 63:
            raise HTTPError(400, f"strconv.ParseInt: parsing {json.dumps(text)}: "
                                 f"invalid syntax")
        pos = int(text)
        mode = req.arg("search_mode")
        if mode == "id":
            partition = (pos >> _ID_PARTITION) & 0x3FF
        else:
            try:
                partition = go_atoi(req.arg("partition").encode())
            except GoParseError as exc:
                raise HTTPError(400, str(exc)) from None
        topic = req.arg("topic")
        p = self.node.held_partition(topic, partition) if topic else None
        if p is None or topic not in self.node.state.topics:
            raise HTTPError(400, "topic does not exist")
        if req.arg("delayed_queue") == "true":
            if mode != "id":
                raise HTTPError(400, "delayed queue search mode must be id")
            if not req.arg("channel"):
                raise HTTPError(400, "delayed queue search channel must be given")
            raise HTTPError(404, "no message found in delayed queue")
        if mode not in ("id", "count", "virtual_offset"):
            raise HTTPError(400, "search mode should be one of id/count/virtual_offset")
        messages = p.log.messages[p.log.retained:]
        if not messages:
            raise HTTPError(404, "commit log end of file")
        if mode == "count":  # the message that brings the count past pos (the first for 0)
            index = max(pos, 1) - 1
        elif mode == "virtual_offset":
            index = bisect.bisect_left(messages, pos, key=lambda m: m.queue_offset)
        else:
            index = bisect.bisect_left(messages, pos, key=lambda m: m.internal_id)
        if index >= len(messages):
            raise HTTPError(500, "INTERNAL_ERROR")
        msg = messages[index]
        want_ext = req.arg("needext") == "true" and msg.ext is not None
        return {"id": msg.internal_id, "trace_id": msg.trace_id,
                "body": msg.body.decode("utf-8", "replace"), "timestamp": msg.timestamp,
                "attempts": 0, "offset": msg.queue_offset,
                "queue_cnt_index": p.log.retained + index + 1,
                "ext": msg.ext.decode("utf-8", "replace") if want_ext and msg.ext else ""}

    async def _channel_setorder(self, req: Request) -> None:
        p, _, name = self._channel_args(req)
        channel = self._existing(p, name)
        order = req.arg("order")
        if order not in ("true", "false"):
            raise HTTPError(400, "INVALID_OPTION")
        if order == "false" and channel.ordered and not channel.topic_ordered:
            self._drop_consumers(channel)  # youzan disconnects the channel's clients
        channel.set_ordered(order == "true")

    # -- classic --------------------------------------------------------------------------------

    def _classic_topic(self, req: Request, *, create: bool = True) -> PartitionInfo | None:
        if not req.has_arg("topic"):
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = req.arg("topic")
        if not valid_name(topic.encode()):
            raise HTTPError(400, "INVALID_TOPIC")
        if create:
            return self.node.classic_partition(topic)
        return self.node.state.classic_partition(topic, self.node.node_id, create=False)

    def _classic_channel_name(self, req: Request) -> str:
        if not req.has_arg("channel"):
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        name = req.arg("channel")
        if not valid_name(name.encode()):
            raise HTTPError(400, "INVALID_CHANNEL")
        return name

    def _classic_pub(self, req: Request) -> str:
        opts = self.node.options
        if len(req.body) > opts.max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not req.body:
            raise HTTPError(400, "MSG_EMPTY")
        p = self._classic_topic(req)
        assert p is not None
        deliver_after = 0.0
        if req.has_arg("defer"):
            text = req.arg("defer")
            try:
                delay = int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else None
            except ValueError:
                delay = None
            if delay is None or not 0 <= delay <= opts.max_req_timeout:
                raise HTTPError(400, "INVALID_DEFER")
            if delay:
                deliver_after = time.monotonic() + delay / 1000
        p.log.append(req.body, deliver_after=deliver_after)
        return "OK"

    def _classic_mpub(self, req: Request) -> str:
        if len(req.body) > self.node.options.max_body_size:
            raise HTTPError(413, "BODY_TOO_BIG")
        p = self._classic_topic(req)
        assert p is not None
        items: list[BatchItem] = [(body, 0, None, "") for body in self._bodies(req)]
        if items:
            p.log.append_batch(items)
        return "OK"

    async def _classic_topic_create(self, req: Request) -> None:
        self._classic_topic(req)

    async def _classic_topic_delete(self, req: Request) -> None:
        p = self._classic_topic(req, create=False)
        if p is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        for name in list(p.channels):
            self._delete_channel(p, name)
        self.node.state.drop_classic_partition(p.topic, self.node.node_id)

    async def _classic_topic_empty(self, req: Request) -> None:
        p = self._classic_topic(req, create=False)
        if p is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        p.log.claimed = len(p.log)

    def _classic_channel(self, req: Request) -> tuple[PartitionInfo, str]:
        p = self._classic_topic(req, create=False)
        name = self._classic_channel_name(req)
        if p is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return p, name

    async def _classic_channel_create(self, req: Request) -> None:
        p = self._classic_topic(req)
        assert p is not None
        self.node.channel(p, None, self._classic_channel_name(req))

    async def _classic_channel_delete(self, req: Request) -> None:
        p, name = self._classic_channel(req)
        if not isinstance(p.channels.get(name), Channel):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        self._delete_channel(p, name)

    async def _classic_channel_empty(self, req: Request) -> None:
        p, name = self._classic_channel(req)
        self._existing(p, name).empty()

    async def _classic_channel_pause(self, req: Request) -> None:
        p, name = self._classic_channel(req)
        self._hold(self._existing(p, name), "pause", req.path.endswith("/pause"))

    async def _classic_topic_pause(self, req: Request) -> None:
        """``/topic/{pause,unpause}``: the topic stops giving messages to its channels."""
        p = self._classic_topic(req, create=False)
        if p is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        paused = req.path.endswith("/pause")
        (self._paused_topics.add if paused else self._paused_topics.discard)(p.topic)
        for channel in self._channels(p, ""):
            self._hold(channel, "topic", paused)

    # -- channel operations -------------------------------------------------------------------

    def _drop_consumers(self, channel: Channel) -> None:
        for conn in list(self.node.connections):
            if conn.channel is channel:
                conn.close()

    def _delete_channel(self, p: PartitionInfo, name: str) -> None:
        channel = p.channels.pop(name, None)
        if isinstance(channel, Channel):
            self._drop_consumers(channel)
            channel.close()

    def _hold(self, channel: Channel, hold: str, on: bool) -> None:
        holds = self._holds.setdefault(channel, set())
        (holds.add if on else holds.discard)(hold)
        channel.paused = bool(holds)
        if not holds:
            channel.schedule_pump()

    def _held_by(self, channel: Channel, hold: str) -> bool:
        return hold in self._holds.get(channel, ())

    # -- /stats ---------------------------------------------------------------------------------

    async def _stats(self, req: Request) -> Any:
        node = self.node
        topic_filter = req.arg("topic")
        channel_filter = req.arg("channel")
        if node.classic:
            parts = [p for p in node.state.classic_partitions(node.node_id)
                     if not topic_filter or p.topic == topic_filter]
        else:
            parts = self._youzan_parts(topic_filter, req.arg("partition"),
                                       req.arg("leaderOnly") == "true")
        if req.arg("format") != "json":
            return Response(200, self._stats_text(parts).encode(),
                            [("Content-Type", "text/plain; charset=utf-8")], chunked=True)
        filtered = bool(topic_filter)
        if node.classic:
            topics = [self._classic_topic_stats(p, channel_filter) for p in parts]
            return {"version": node.version, "health": "OK", "start_time": node.start_time,
                    "topics": topics, "memory": _MEMORY,
                    "producers": self._classic_producers(topic_filter) or None}
        topics = [self._youzan_topic_stats(p, channel_filter, filtered) for p in parts]
        return {"version": node.version, "health": "OK", "start_time": node.start_time,
                "topics": topics}

    def _youzan_parts(self, topic: str, partition: str, leader_only: bool) -> list[PartitionInfo]:
        node = self.node
        out = []
        for name in sorted(node.state.topics):
            if topic and name != topic:
                continue
            for p in node.state.held_by(node.node_id, name):
                if partition and str(p.partition) != partition:
                    continue
                if leader_only and p.leader != node.node_id:
                    continue
                out.append(p)
        return out

    def _clients(self, channel: Channel) -> list[dict[str, Any]]:
        out = []
        for conn in sorted(self.node.connections, key=lambda c: c.remote):
            consumer = conn.consumer
            if conn.channel is not channel or consumer is None:
                continue
            client_id, hostname = self._names(conn)
            stats = {
                "client_id": client_id, "hostname": hostname, "version": "V2",
                "remote_address": conn.remote, "state": conn.client_state,
                "ready_count": consumer.rdy, "in_flight_count": len(consumer.in_flight),
                "message_count": consumer.stats[0], "finish_count": consumer.stats[1],
                "requeue_count": consumer.stats[2], "connect_ts": conn.connect_time,
                "sample_rate": conn.sample_rate, "deflate": conn.deflate,
                "snappy": conn.snappy, "user_agent": conn.user_agent, "tls": conn.tls,
                "tls_cipher_suite": "", "tls_version": "", "tls_negotiated_protocol": "",
                "tls_negotiated_protocol_is_mutual": False,
            }
            identity = conn.identity
            if identity is not None:  # nsqd's omitempty fields: only for an authed client
                stats["authed"] = True
                if identity.identity:
                    stats["auth_identity"] = identity.identity
                if identity.identity_url:
                    stats["auth_identity_url"] = identity.identity_url
            if not self.node.classic:
                stats["timeout_count"] = consumer.stats[3]
                stats["desired_tag"] = conn.desired_tag
                stats.update({
                    "name": stats["client_id"], "deferred_count": 0,
                    "output_buffer_size": conn.asked_buffer_size or 4096,
                    "output_buffer_timeout": conn.output_buffer_timeout * 1_000_000,
                    "msg_timeout": conn.msg_timeout * 1_000_000,
                    "ext_filter": conn.ext_filter_spec, "limited_rdy": 50000,
                })
            out.append(stats)
        return out

    def _classic_producers(self, topic: str) -> list[dict[str, Any]]:
        """Classic /stats ``producers``: every connected client that published, with its
        counts for ``topic`` (all topics without a filter; no ``pub_counts`` when none)."""
        out = []
        for conn in sorted(self.node.connections, key=lambda c: c.remote):
            published = getattr(conn, "pub_stats", {})
            if not published:
                continue
            counts = [{"topic": name, "count": entry[0]}
                      for (name, _), entry in sorted(published.items())
                      if not topic or name == topic]
            client_id, hostname = self._names(conn)
            entry: dict[str, Any] = {
                "client_id": client_id, "hostname": hostname, "version": "V2",
                "remote_address": conn.remote, "state": conn.client_state, "ready_count": 0,
                "in_flight_count": 0, "message_count": 0, "finish_count": 0,
                "requeue_count": 0, "connect_ts": conn.connect_time,
                "sample_rate": conn.sample_rate, "deflate": conn.deflate,
                "snappy": conn.snappy, "user_agent": conn.user_agent,
                "tls": conn.tls, "tls_cipher_suite": "", "tls_version": "",
                "tls_negotiated_protocol": "", "tls_negotiated_protocol_is_mutual": False,
            }
            if counts:
                entry["pub_counts"] = counts
            out.append(entry)
        return out

    def _names(self, conn: Any) -> tuple[str, str]:
        """(client_id, hostname) as /stats shows them: what IDENTIFY said, or before an
        IDENTIFY the remote address (youzan) or its host (classic)."""
        if conn._identified:
            return conn.client_id, conn.hostname
        name = conn.remote.rsplit(":", 1)[0] if self.node.classic else conn.remote
        return name, name

    def _pub_stats(self, p: PartitionInfo) -> list[dict[str, Any]]:
        """The connected clients that published to the partition (TCP only)."""
        out = []
        for conn in sorted(self.node.connections, key=lambda c: c.remote):
            entry = getattr(conn, "pub_stats", {}).get((p.topic, p.partition))
            if entry is not None:
                out.append({"remote_address": conn.remote, "user_agent": conn.user_agent,
                            "protocol": "tcp", "pub_count": entry[0], "err_count": entry[1],
                            "last_pub_ts": entry[2]})
        return out

    def _channels(self, p: PartitionInfo, only: str) -> list[Channel]:
        return [c for name, c in sorted(p.channels.items())
                if isinstance(c, Channel) and not c.closed and (not only or name == only)]

    def _youzan_topic_stats(self, p: PartitionInfo, only: str, filtered: bool
                            ) -> dict[str, Any]:
        info = self.node.state.topics.get(p.topic)
        ordered = bool(info and info.ordered)
        multipart = bool(info and info.multipart and not info.ordered)
        channels = []
        listed = filtered
        if only and not self._channels(p, only):
            # the real nsqd lists every channel when the named one does not exist (with a
            # null client list each)
            only, listed = "", False
        for channel in self._channels(p, only):
            clients = self._clients(channel)
            messages = p.log.messages
            # youzan measures a channel from its confirmed position: every message not yet
            # finished counts, in flight ones included
            first = _first_unconfirmed(channel, messages)
            waiting = len(messages) - first
            if waiting and first < len(messages):
                depth_ts = messages[first].timestamp
            elif first > 0 and messages and channel.finish_count:
                # caught up: the last message it confirmed (none yet: zero)
                depth_ts = messages[min(first, len(messages)) - 1].timestamp
            else:
                depth_ts = 0
            depth_size = sum(m.raw_size for m in messages[first:])
            # what the channel's reader has not taken from the backend yet (it holds one)
            backlogs = max(0, waiting - channel.in_flight - 1)
            finished = [channel.finish_count] + [0] * 11
            channels.append({
                "channel_name": channel.name, "backlogs": backlogs, "depth": waiting,
                "depth_size": depth_size, "depth_ts": _go_time(depth_ts),
                "depth_ts_nano": depth_ts, "backend_depth": waiting,
                "hourly_subsize": 0, "in_flight_count": channel.in_flight,
                "deferred_count": channel.deferred_count, "deferred_from_delay_count": 0,
                # youzan counts the messages up to the channel's end, as the topic does
                "message_count": len(p.log), "requeue_count": channel.requeue_count,
                "timeout_count": channel.timeout_count,
                "clients": clients if clients or listed else None,
                "client_num": len(clients), "paused": self._held_by(channel, "pause"),
                "skipped": self._held_by(channel, "skip"),
                "zan_test_skipped": False, "delayed_queue_count": 0,
                "delayed_queue_recent": _ZERO_TIME, "delayed_queue_recent_nano": 0,
                "e2e_processing_latency": _E2E, "msg_consume_latency_stats": finished,
                "msg_delivery_latency_stats": list(finished),
            })
        statsd = f"{p.topic}.{p.partition}" if ordered or multipart else p.topic
        publishers = self._pub_stats(p)
        return {
            "topic_name": p.topic, "topic_full_name": f"{p.topic}-{p.partition}",
            "topic_partition": str(p.partition), "channels": channels,
            "channel_num": len(self._channels(p, "")), "depth": p.log.end_offset,
            "backend_depth": p.log.end_offset, "backend_start": p.log.start_offset,
            "message_count": len(p.log), "is_leader": p.leader == self.node.node_id,
            "hourly_pubsize": 0,
            "client_pub_stats": publishers or ([] if filtered else None),
            "client_num": len(publishers),  # youzan counts a topic's publishers here
            "msg_size_stats": list(p.size_stats), "msg_write_latency_stats": _write_histogram(p),
            "is_multi_ordered": ordered, "is_multi_part": multipart,
            "is_ext": bool(info and info.ext),
            "is_channel_auto_create_disabled": bool(info and info.disable_channel_auto_create),
            "statsd_name": statsd, "pub_failed_cnt": 0, "e2e_processing_latency": _E2E,
        }

    def _classic_topic_stats(self, p: PartitionInfo, only: str) -> dict[str, Any]:
        channels = []
        for channel in self._channels(p, only):
            clients = self._clients(channel)
            channels.append({
                "channel_name": channel.name, "depth": channel.depth, "backend_depth": 0,
                "in_flight_count": channel.in_flight,
                "deferred_count": channel.deferred_count,
                "message_count": channel.message_count, "requeue_count": channel.requeue_count,
                "timeout_count": channel.timeout_count, "client_count": len(clients),
                "clients": clients, "paused": self._held_by(channel, "pause"),
                "e2e_processing_latency": _E2E,
            })
        waiting = 0 if any(isinstance(c, Channel) for c in p.channels.values()) \
            else len(p.log) - p.log.claimed
        return {
            "topic_name": p.topic, "channels": channels, "depth": waiting,
            "backend_depth": 0, "message_count": len(p.log),
            "message_bytes": sum(len(m.body) for m in p.log.messages),
            "paused": p.topic in self._paused_topics,
            "e2e_processing_latency": _E2E,
        }

    def _stats_text(self, parts: list[PartitionInfo]) -> str:
        node = self.node
        start = datetime.fromtimestamp(node.start_time, timezone.utc)
        lines = [f"nsqd v{node.version} (smartnsq dev cluster)",
                 f"start_time {start.strftime('%Y-%m-%dT%H:%M:%SZ')}",
                 f"uptime {int(time.time()) - node.start_time}s", "", "Health: OK", "",
                 "Topics:" if parts else "Topics: None"]
        for p in parts:
            name = p.topic if node.classic else f"{p.topic}-{p.partition}"
            lines.append(f"   [{name:<15}] depth: {len(p.log) - p.log.claimed:<5} "
                         f"be-depth: 0     msgs: {len(p.log):<8} e2e%: ")
            for channel in self._channels(p, ""):
                lines.append(
                    f"      [{channel.name:<25}] depth: {channel.depth:<5} be-depth: 0     "
                    f"inflt: {channel.in_flight:<4} def: {channel.deferred_count:<4} "
                    f"re-q: {channel.requeue_count:<5} timeout: {channel.timeout_count:<5} "
                    f"msgs: {channel.message_count:<8} e2e%: ")
            lines.append("")
        lines.append("Producers: None")
        return "\n".join(lines) + "\n"


_MEMORY: Final = {"heap_objects": 0, "heap_idle_bytes": 0, "heap_in_use_bytes": 0,
                  "heap_released_bytes": 0, "gc_pause_usec_100": 0, "gc_pause_usec_99": 0,
                  "gc_pause_usec_95": 0, "next_gc_bytes": 0, "gc_total_runs": 0}


def _binary_mpub(body: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """``readMPUB`` over an HTTP body; its error codes become 413 ``<CODE without E_>``."""
    if len(body) < 4:
        raise HTTPError(413, "BAD_BODY")
    (count,) = _U32.unpack_from(body)
    if count <= 0 or count > (max_body - 4) // 5:
        raise HTTPError(413, "BAD_BODY")
    pos = 4
    out = []
    for _ in range(count):
        if pos + 4 > len(body):
            raise HTTPError(413, "BAD_MESSAGE")
        (size,) = _U32.unpack_from(body, pos)
        pos += 4
        if size <= 0 or size > max_msg or pos + size > len(body):
            raise HTTPError(413, "BAD_MESSAGE")
        out.append(body[pos:pos + size])
        pos += size
    return out
