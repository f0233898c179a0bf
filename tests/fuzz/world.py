"""The world the stateful fuzz drives: a dev cluster, hostile peers and the public API's clients.

Both drivers share it: the seeded hypothesis state machine run by the plain test command
(``test_api_statemachine.py``) and the long run (``bench/fuzz.py``). Every operation is a
public call (or a fault) made with arguments the driver chose; it never raises, it records:

* ``violations``: what broke an invariant (an exception outside ``smartnsq.errors``, one that
  names nothing, a call that ended past its timeout plus :data:`SLACK`, a FIN of a message
  whose handler had not returned, an acknowledged publish never handled, a key's order
  broken, a task, socket or thread left after close);
* counts of steps, calls, faults fired and outcomes, for the long run's report.

Why one thread for the cluster: the ``smartnsq.sync`` facade blocks its caller, so the
cluster, the hostile peers and the async clients live on a loop of their own (``world``
thread) and the driver's thread submits to it; the sync clients get a ``LoopThread`` of their
own, stopped at the end so the thread check sees it go.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import smartnsq.sync
from smartnsq import Consumer, Producer, errors
from smartnsq.devcluster.cluster import DevCluster
from smartnsq.devcluster.nsqd import channels as dev_channels
from smartnsq.testing.hostile import (
    DripLookupd,
    FakeLookupd,
    HugeLookupd,
    SilentLookupd,
    SilentNsqd,
    StallingNsqd,
    _Nsqd,
    frame,
    lookup_answer,
)
from smartnsq.transport.loop_thread import LoopThread

log = logging.getLogger("smartnsq.fuzz")

#: how far past its own timeout a call may end before it counts as an overrun: the loaded
#: 2-core machine's scheduling (7 processes share it) plus one event-loop turn of the client
SLACK = 1.0

TOPICS = ("fz_plain", "fz_ordered", "fz_ext")
PARTITIONS = 2
CHANNEL = "fuzz"
KEYS = ("k0", "k1", "k2")
HOSTILE = ("dead", "silent", "drip", "huge", "silent_nsqd", "stall_nsqd", "fatal_nsqd")
HOSTILE_CALLS = ("publish", "keyed", "routes", "entered", "sync_publish", "sync_routes",
                 "consumer")
FAULTS = ("kill", "leave", "stop_lookupd", "cut", "stall", "not_writable", "move_leader",
          "heal")
PUBLISH_KINDS = ("publish", "nowait", "many", "sync", "sync_many")
PINS = ("key", "partition", "none")
# mostly ordinary deadlines; a few short, expired (1 us) and one invalid (0) among them.
# Each list starts with the common case: hypothesis's simplest example takes first entries.
TIMEOUTS = (3.0, 3.0, 3.0, 3.0, 0.5, 0.05, 1e-6, 0.0)
HEADERS = (False, False, True)
HANDLERS = ("ok", "raise", "hang")
# inputs of the wrong type or range to every kind of public call: each must be refused with a
# documented error (InvalidArgument naming the field; ClientClosed after close), nothing left
BAD_INPUTS = ("timeout_str", "timeout_inf", "bodies_none", "bodies_bytes", "lookupd_int",
              "config_int", "loop_thread_int", "close_timeout_str", "sync_after_close",
              "sync_timeout_huge", "partition_2000", "key_float")
# peers that are wrong in a way a deadline alone does not show: a Consumer reading a healthy
# node beside one answering garbage, a lookupd listing more partitions than the one partition
# limit allows, an nsqd answering IDENTIFY without TLS
WRONG_PEERS = ("garbled_beside", "many_partitions_routes", "many_partitions_consumer",
               "tls_strip", "tls_strip_sync")
#: the topic the ``garbled_beside`` consumer reads (its own: its messages are not the world's)
SIDE_TOPIC = "fz_side"


@dataclasses.dataclass
class Counts:
    """What a run did, for the report."""

    steps: int = 0
    calls: int = 0
    faults: int = 0
    acked: int = 0
    handled: int = 0
    errors: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    fault_kinds: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    samples: dict[str, str] = dataclasses.field(default_factory=dict)  # first text per type

    def format(self) -> str:
        errs = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.fault_kinds.items())) or "none"
        return (f"steps {self.steps}, calls {self.calls}, acknowledged publishes "
                f"{self.acked} (messages handled {self.handled}), faults fired {self.faults} "
                f"({kinds}); documented errors: {errs}")


class FatalAfterIdentifyNsqd(_Nsqd):
    """An nsqd writing its IDENTIFY answer and a fatal ``E_INVALID`` in one write, then
    closing (``open()`` once returned an already-closed connection)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await reader.readexactly(4) != b"  V2":
            return
        await self.read_command(reader)
        answer = {"max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000,
                  "msg_timeout": 60000, "tls_v1": False, "deflate": False, "snappy": False,
                  "sample_rate": 0, "auth_required": False, "output_buffer_size": 16384,
                  "output_buffer_timeout": 250, "max_deflate_level": 6}
        writer.write(frame(json.dumps(answer).encode())
                     + frame(b"E_INVALID cannot go on", 1))
        await writer.drain()


class GarbledNsqd(_Nsqd):
    """An nsqd answering IDENTIFY with a well-framed HTML page (no NSQ answer), then reading
    until the client goes: one node's ``ProtocolError``, not the configuration's."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        await self.read_command(reader)
        writer.write(frame(b"<html><body><h1>400 Bad Request</h1></body></html>"))
        await writer.drain()
        while await reader.read(65536):
            pass


class PlainNsqd(_Nsqd):
    """An nsqd answering IDENTIFY with ``tls_v1: false`` whatever was asked (a server without
    TLS, or TLS stripped on the way), then reading until the client goes."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.handshake(reader, writer, tls_v1=False)
        while await reader.read(65536):
            pass


def many_partitions(count: int, address: str) -> dict[str, Any]:
    """A well-formed youzan lookup answer listing ``count`` partitions, every one led by the
    node at ``address`` (a refusing port: no other loopback service is dialled)."""
    port = int(address.rsplit(":", 1)[1])
    answer = lookup_answer(count, tcp_port=port, http_port=port)
    node = answer["partitions"]["0"]
    answer["partitions"] = {str(i): node for i in range(count)}
    answer["producers"] = [node]
    return answer


async def _turns(n: int) -> None:
    """``n`` turns of the loop: the callbacks already scheduled run, nothing is waited for."""
    for _ in range(n):
        await asyncio.sleep(0)


def _sockets() -> int:
    """Open sockets of this process (Linux: /proc/self/fd)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                n += 1
    return n


def _causes(exc: BaseException) -> str:
    """The text of an error and of its causes (a Timeout carries the last attempt's)."""
    out = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < 8:
        out.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return " | ".join(out)


def names_something(exc: BaseException, topic: str | None, peers: list[str]) -> bool:
    """Whether a documented error says what it concerns: the field (``InvalidArgument``),
    the topic, or a peer's address; a closed client's error names the client."""
    if isinstance(exc, errors.InvalidArgument):
        return bool(exc.field)
    if isinstance(exc, errors.ServerError):
        # the server's own code and text; the peer is not part of it (an open point: a
        # handshake's fatal error does not say which nsqd sent it)
        return bool(exc.code)
    text = str(exc)
    if isinstance(exc, errors.ClientClosed):
        return "closed" in text
    if topic and topic in text:
        return True
    return any(p in text for p in peers) or "127.0.0.1" in text


class World:
    """One dev cluster (3 youzan nodes behind proxies, 2 lookupds), three topics, hostile
    peers, a long-lived async and sync Producer, and up to two Consumers at a time."""

    def __init__(self, *, label: str = "") -> None:
        self.label = label
        self.violations: list[str] = []
        self.counts = Counts()
        self._baseline_threads = {t.ident for t in threading.enumerate()}
        self._baseline_sockets = _sockets()
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_error)
        self._thread = threading.Thread(target=self._loop.run_forever, name="fuzz-world",
                                        daemon=True)
        self._thread.start()
        self._sync_loop = LoopThread()
        self.cluster: DevCluster | None = None
        self._peers: dict[str, Any] = {}
        self._dead = ""
        # bookkeeping of messages: body -> (topic, key or None, seq)
        self._seq = 0
        self.acked: dict[bytes, tuple[str, str | None, int]] = {}
        self.handled: set[bytes] = set()  # bodies whose handler returned (before FIN)
        self.first_handled: dict[tuple[str, str], list[int]] = defaultdict(list)
        self._failed_once: set[bytes] = set()
        self._release = threading.Event()  # frees hanging handlers at the end
        self.consumers: list[tuple[str, Any, str]] = []  # (kind, consumer, topic)
        self.down: dict[str, Any] = {}  # fault kind -> what to undo
        self._original_finish = dev_channels.Channel.finish
        self._run(self._start(), 60.0)

    # -- plumbing ------------------------------------------------------------------------------

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A task's or future's error nobody read is a client bug (what the caller got was
        something else, or nothing); other reports (a peer's failed handshake) are logged."""
        message = str(context.get("message", ""))
        if "never retrieved" in message:
            self.violations.append(f"unretrieved: {message}: {context.get('exception')!r}")
        else:
            log.debug("loop report: %s", message)

    def _run(self, coro: Coroutine[Any, Any, Any], guard: float) -> Any:
        """Run ``coro`` on the world's loop; a call past ``guard`` is a hang (recorded)."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        # not result(guard): the call's own Timeout is a TimeoutError too
        concurrent.futures.wait([future], guard)
        if not future.done():
            future.cancel()
            self.violations.append(f"hang: {coro.__qualname__} still running after {guard}s")
            return None
        return future.result()

    def _peers_addresses(self) -> list[str]:
        out = [self._dead, *(p.address for p in self._peers.values())]
        if self.cluster is not None:
            out += self.cluster.lookupd_http_addresses + self.cluster.nsqd_tcp_addresses
        return out

    def _outcome(self, what: str, started: float, timeout: float | None,
                 exc: BaseException | None, topic: str | None = None,
                 valid: bool | None = True) -> None:
        """Check one call's ending: documented error naming something, within its deadline;
        ``valid``: the arguments were good (``InvalidArgument`` is then wrong), bad (only
        ``InvalidArgument`` is right), or ``None`` (either)."""
        self.counts.calls += 1
        if valid is True and isinstance(exc, errors.InvalidArgument):
            self.violations.append(f"rejected: {what} refused valid arguments: {exc}")
        if valid is False and not isinstance(exc, errors.InvalidArgument):
            self.violations.append(f"accepted: {what} took invalid arguments: {exc!r}")
        elapsed = time.monotonic() - started
        if timeout is not None and elapsed > timeout + SLACK:
            self.violations.append(f"overrun: {what} took {elapsed:.2f}s, timeout {timeout}s"
                                   f" (+{SLACK}s slack)")
        if exc is None:
            return
        if not isinstance(exc, errors.NSQError):
            self.violations.append(f"undocumented: {what} raised {type(exc).__name__}: {exc}")
            return
        if type(exc).__name__.startswith("_"):
            self.violations.append(f"private: {what} raised the private {type(exc).__name__}"
                                   f": {exc}")
        self.counts.errors[type(exc).__name__] += 1
        self.counts.samples.setdefault(type(exc).__name__, f"{what}: {exc}"[:300])
        if not names_something(exc, topic, self._peers_addresses()):
            self.violations.append(f"unnamed: {what} raised {type(exc).__name__} naming "
                                   f"nothing: {exc}")

    async def _start(self) -> None:
        world = self

        def finish(channel: Any, consumer: Any, key: int) -> bool:
            entry = consumer.in_flight.get(key)
            if entry is not None and entry.msg.body.startswith(b"fz|") \
                    and entry.msg.body not in world.handled:
                world.violations.append(f"FIN before the handler succeeded: {entry.msg.body!r}")
            return world._original_finish(channel, consumer, key)

        dev_channels.Channel.finish = finish  # type: ignore[method-assign]
        self.cluster = cluster = DevCluster(nodes=3, lookupds=2, proxied=True)
        await cluster.start()
        await cluster.create_topic("fz_plain", PARTITIONS, 2, channels=(CHANNEL,))
        await cluster.create_topic("fz_ordered", PARTITIONS, 2, ordered=True,
                                   channels=(CHANNEL,))
        await cluster.create_topic("fz_ext", PARTITIONS, 2, ext=True, channels=(CHANNEL,))
        await cluster.create_topic(SIDE_TOPIC, 1, 2, channels=(CHANNEL,))
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        self._dead = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        server.close()
        await server.wait_closed()
        self._peers = {"silent": SilentLookupd(), "drip": DripLookupd(interval=0.2),
                       "huge": HugeLookupd(size=8 * 1024 * 1024),
                       "silent_nsqd": SilentNsqd(), "stall_nsqd": StallingNsqd(),
                       "fatal_nsqd": FatalAfterIdentifyNsqd(), "garbled_nsqd": GarbledNsqd(),
                       "plain_nsqd": PlainNsqd(),
                       "partitions": FakeLookupd(many_partitions(2000, self._dead))}
        for peer in self._peers.values():
            await peer.__aenter__()
        self.producer = Producer(lookupd=cluster.lookupd_http_addresses, timeout=3.0)
        self.sync_producer = smartnsq.sync.Producer(
            lookupd=cluster.lookupd_http_addresses, timeout=3.0, loop_thread=self._sync_loop)
        self._sync_loop.loop.call_soon_threadsafe(
            self._sync_loop.loop.set_exception_handler, self._loop_error)

    # -- publishing -----------------------------------------------------------------------------

    def _body(self, topic: str, key: str | None) -> bytes:
        self._seq += 1
        return f"fz|{topic}|{key}|{self._seq}".encode()

    def publish(self, kind: str, topic: str, pin: str, key: str, partition: int,
                traced: bool, headers: bool, timeout: float) -> None:
        """One publish call of ``kind`` (async, nowait, batch, sync, sync batch)."""
        self.counts.steps += 1
        args: dict[str, Any] = {"timeout": timeout}
        the_key = key if pin == "key" else None
        if pin == "key":
            args["sharding_key"] = key
        elif pin == "partition":
            args["partition"] = partition
        batch = kind in ("many", "sync_many")
        if traced:
            args["trace_id"] = self._seq + 1
        if headers:
            args["headers"] = {"fz": "1"}
        bodies = [self._body(topic, the_key) for _ in range(3 if batch else 1)]
        what = f"{kind}({topic!r}, {pin}, traced={traced}, headers={headers}, timeout={timeout})"
        # the topic's meta (ordered, ext) is known only from its routes: an expired deadline
        # or a fault may end the call first, so those are judged only in calm conditions
        valid: bool | None = timeout != 0.0
        if valid and ((headers and topic != "fz_ext") or (pin == "none" and topic == "fz_ordered")):
            valid = False if timeout >= 3.0 and not self.down else None
        started = time.monotonic()
        exc: BaseException | None = None
        try:
            if kind == "sync":
                self.sync_producer.publish(topic, bodies[0], **args)
            elif kind == "sync_many":
                self.sync_producer.publish_many(topic, bodies, **args)
            else:
                self._run(self._publish_async(kind, topic, bodies, args), timeout + 30)
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        self._outcome(what, started, timeout, exc, topic, valid)
        if exc is not None and set(self.down) == {"not_writable"} \
                and self.down["not_writable"] == (topic, partition) and pin == "partition" \
                and "has no leader" in _causes(exc):
            self.violations.append(f"misnamed: {what} on a partition that has a leader but "
                                   f"takes no writes: {exc}")
        if exc is None and not any(v.startswith("hang") for v in self.violations):
            for body in bodies:
                self.acked[body] = (topic, the_key, int(body.rsplit(b"|", 1)[1]))
            self.counts.acked += len(bodies)

    async def _publish_async(self, kind: str, topic: str, bodies: list[bytes],
                             args: dict[str, Any]) -> None:
        if kind == "publish":
            await self.producer.publish(topic, bodies[0], **args)
        elif kind == "nowait":
            await self.producer.publish_nowait(topic, bodies[0], **args)
        else:
            await self.producer.publish_many(topic, bodies, **args)

    def routes(self, topic: str, timeout: float, sync: bool) -> None:
        """``Producer.routes`` on the healthy cluster (async or the facade)."""
        self.counts.steps += 1
        started = time.monotonic()
        exc: BaseException | None = None
        try:
            if sync:
                self.sync_producer.routes(topic, timeout=timeout)
            else:
                self._run(self.producer.routes(topic, timeout=timeout), timeout + 30)
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        self._outcome(f"routes({topic!r}, sync={sync})", started, timeout, exc, topic,
                      timeout != 0.0)

    def publish_unwritable(self, topic: str, partition: int, sync: bool) -> None:
        """A partition made not writable (its leader up), then a publish pinned to it: the
        error must say it takes no writes, not that it has no leader. Healed afterwards."""
        self.counts.steps += 1
        if self.down:
            return
        self.fault("not_writable", 0, topic, partition)
        key = KEYS[0]
        # 3 s: time for the read lookup that tells "not writable" from "no leader" (with
        # 0.5 s the long run once saw "has no leader" here: an open point of the message)
        self.publish("sync" if sync else "publish", topic, "partition", key, partition, False,
                     False, 3.0)
        self.fault("heal", 0, topic, partition)

    # -- hostile peers --------------------------------------------------------------------------

    def hostile(self, peer: str, call: str, timeout: float) -> None:
        """A fresh client against one hostile (or dead) peer: the call must end, with a
        documented error, within its timeout; then it closes and leaves nothing behind."""
        self.counts.steps += 1
        address = self._dead if peer == "dead" else self._peers[peer].address
        nsqd = peer.endswith("_nsqd")
        where = {"nsqd": [address]} if nsqd else {"lookupd": [address]}
        what = f"{call} against a {peer} peer (timeout={timeout})"
        started = time.monotonic()
        exc: BaseException | None = None
        budget = timeout
        try:
            if call.startswith("sync"):
                self._hostile_sync(where, call, timeout)
            elif call == "consumer" and not nsqd:
                budget = max(timeout, 0.1)
                self._run(self._doomed_consumer(address, budget), budget + 30)
            else:
                self._run(self._hostile_async(where, call, timeout), timeout + 30)
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        self._outcome(what, started, budget, exc, "fz_plain")
        if exc is None and peer != "drip":
            self.violations.append(f"{what} succeeded against a peer that cannot answer")

    def _hostile_sync(self, where: dict[str, list[str]], call: str, timeout: float) -> None:
        p = smartnsq.sync.Producer(**where, loop_thread=self._sync_loop, timeout=timeout)
        try:
            if call == "sync_routes" and "lookupd" in where:
                p.routes("fz_plain", timeout=timeout)
            else:
                p.publish("fz_plain", b"x", timeout=timeout)
        finally:
            started = time.monotonic()
            p.close()
            self._outcome("sync Producer.close() after a hostile peer", started,
                          p.config.drain_timeout, None)

    async def _hostile_async(self, where: dict[str, list[str]], call: str,
                             timeout: float) -> None:
        p = Producer(**where, timeout=timeout)
        try:
            if call == "entered":  # ``async with``: entering counts against the call's time
                await p.__aenter__()
                await p.publish("fz_plain", b"x", timeout=timeout)
            elif call == "routes" and "lookupd" in where:
                await p.routes("fz_plain", timeout=timeout)
            elif call == "keyed":
                await p.publish("fz_plain", b"x", sharding_key="k", timeout=timeout)
            else:
                await p.publish("fz_plain", b"x", timeout=timeout)
        finally:
            started = time.monotonic()
            await p.close(timeout=1.0)
            self._outcome("Producer.close(timeout=1) after a hostile peer", started, 1.0, None)

    async def _doomed_consumer(self, address: str, timeout: float) -> None:
        """A Consumer with ``discovery_timeout`` whose only lookupd cannot answer: ``join()``
        raises the last cause within that time."""
        c = Consumer("fz_plain", CHANNEL, lookupd=[address], handler=lambda m: None,
                     discovery_timeout=max(timeout, 0.1))
        try:
            await c.start()
            await c.join()
        finally:
            started = time.monotonic()
            await c.close(timeout=1.0)
            self._outcome("Consumer.close(timeout=1) after discovery failed", started, 1.0,
                          None)

    def wrong_peer(self, case: str) -> None:
        """A peer wrong in a way a deadline alone does not show (``WRONG_PEERS``): the call
        must end as documented, not merely within its deadline."""
        self.counts.steps += 1
        if case == "garbled_beside":
            if self.down:  # the healthy node must be up and taking writes
                return
            self._run(self._garbled_beside(), 40.0)
            return
        what = f"{case} (timeout=3.0)"
        started = time.monotonic()
        exc: BaseException | None = None
        try:
            if case == "tls_strip_sync":
                self._tls_strip_sync()
            else:
                self._run(self._wrong_async(case), 40.0)
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        self._outcome(what, started, 3.0, exc, "fz_plain")
        elapsed = time.monotonic() - started
        if case.startswith("tls_strip"):
            # refused at once, as a refused certificate is: retrying meets the same answer
            if not isinstance(exc, errors.SecurityError) or elapsed > 1.5:
                self.violations.append(f"misnamed: {what} against an nsqd without TLS ended "
                                       f"after {elapsed:.2f}s with {exc!r}, not a "
                                       "SecurityError at once")
        elif exc is None:
            self.violations.append(f"{what} succeeded against a lookupd listing 2000 "
                                   "partitions (the limit is 0..1023)")
        elif case == "many_partitions_routes" and "2000" not in _causes(exc):
            self.violations.append(f"misnamed: {what} does not say the answer listed 2000 "
                                   f"partitions: {_causes(exc)}")

    async def _wrong_async(self, case: str) -> None:
        if case == "tls_strip":
            p = Producer(nsqd=[self._peers["plain_nsqd"].address], timeout=3.0,
                         tls=ssl.create_default_context(ssl.Purpose.SERVER_AUTH))
            try:
                await p.publish("fz_plain", b"x", timeout=3.0)
            finally:
                await p.close(timeout=1.0)
        elif case == "many_partitions_routes":
            p = Producer(lookupd=[self._peers["partitions"].address], timeout=3.0)
            try:
                await p.routes("fz_plain", timeout=3.0)
            finally:
                await p.close(timeout=1.0)
        else:
            # discovery failing continuously for 0.5 s ends the consumer, with the last cause
            sockets = _sockets()
            c = Consumer("fz_plain", CHANNEL, lookupd=[self._peers["partitions"].address],
                         handler=lambda m: None, discovery_timeout=0.5)
            try:
                await c.start()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(c.join(), 2.0)
                opened = _sockets() - sockets
                if opened > 50:
                    self.violations.append(f"{case}: the consumer opened {opened} sockets "
                                           "for a lookup answer past the partition limit")
            finally:
                await c.close(timeout=1.0)

    def _tls_strip_sync(self) -> None:
        p = smartnsq.sync.Producer(nsqd=[self._peers["plain_nsqd"].address], timeout=3.0,
                                   tls=ssl.create_default_context(ssl.Purpose.SERVER_AUTH),
                                   loop_thread=self._sync_loop)
        try:
            p.publish("fz_plain", b"x", timeout=3.0)
        finally:
            p.close()

    async def _garbled_beside(self) -> None:
        """A Consumer given a healthy node and one answering garbage: the garbage costs only
        that node (retried with back-off); the healthy node's messages arrive and the
        consumer is not ended (it once got 0 of 5 and ``join()`` raised)."""
        assert self.cluster is not None
        leader = self.cluster.leader_of(SIDE_TOPIC, 0)
        if leader is None:
            return
        healthy = self.cluster.node_info(leader).tcp_address
        garbled = self._peers["garbled_nsqd"]
        got = asyncio.Event()
        body = f"side|{self._seq}".encode()
        self._seq += 1

        async def handler(msg: Any) -> None:
            if bytes(msg.body) == body:
                got.set()

        what = "Consumer(nsqd=[healthy, garbled])"
        started = time.monotonic()
        exc: BaseException | None = None
        c = Consumer(SIDE_TOPIC, CHANNEL, nsqd=[healthy, garbled.address], handler=handler,
                     reconnect_delay=0.05, reconnect_delay_max=0.1, connect_timeout=1.0)
        try:
            await c.start()
            await self.producer.publish(SIDE_TOPIC, body, timeout=3.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(got.wait(), 5.0)
            if not got.is_set():
                self.violations.append(f"{what}: the healthy node's message did not arrive in"
                                       f" 5s (consumer ended: {c.closed}, last error "
                                       f"{getattr(c, 'last_error', None)!r})")
            if c.closed:
                self.violations.append(f"{what}: one node's garbage ended the consumer")
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        finally:
            await c.close(timeout=1.0)
        try:  # ended by close(), not by the garbled node's answer
            await asyncio.wait_for(c.join(), 1.0)
        except errors.NSQError as e:
            self.violations.append(f"{what}: join() raised the garbled node's {e!r}")
        self._outcome(what, started, None, exc, SIDE_TOPIC)

    def bad_input(self, case: str) -> None:
        """One public call with a bad argument: a documented error, at once."""
        self.counts.steps += 1
        started = time.monotonic()
        exc: BaseException | None = None
        try:
            if case.startswith("sync"):
                self._bad_sync(case)
            else:
                self._run(self._bad_async(case), 30.0)
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        budget = None if case == "sync_timeout_huge" else 5.0  # that one may retry at length
        self._outcome(f"bad input {case}", started, budget, exc, "fz_plain", valid=None)
        if case == "sync_timeout_huge":  # a valid, very long deadline: fine, or documented
            return
        if exc is None:
            self.violations.append(f"accepted: bad input {case} raised nothing")
        elif case == "sync_after_close" and not isinstance(exc, errors.ClientClosed):
            self.violations.append(f"misnamed: bad input {case} raised {exc!r}")
        elif case != "sync_after_close" and not isinstance(exc, errors.InvalidArgument):
            self.violations.append(f"misnamed: bad input {case} raised {exc!r}, not "
                                   "InvalidArgument")

    def _bad_sync(self, case: str) -> None:
        assert self.cluster is not None
        if case == "sync_after_close":
            p = smartnsq.sync.Producer(lookupd=self.cluster.lookupd_http_addresses,
                                       loop_thread=self._sync_loop)
            p.close()
            p.publish("fz_plain", b"x")
        else:
            # a valid, very long deadline: with a fault down it would wait for the next
            # step's heal, which never comes while it waits; so the cluster is healed first
            self._run(self._heal(), 40.0)
            self.sync_producer.publish("fz_plain", b"x", timeout=1e10)

    async def _bad_async(self, case: str) -> None:
        assert self.cluster is not None
        lookupd = self.cluster.lookupd_http_addresses
        bad: Any = {"timeout_str": "5", "timeout_inf": float("inf")}
        if case in bad:
            await self.producer.publish("fz_plain", b"x", timeout=bad[case])
        elif case in ("bodies_none", "bodies_bytes"):
            await self.producer.publish_many("fz_plain", None if case == "bodies_none"
                                             else b"abc")
        elif case == "partition_2000":
            await self.producer.publish("fz_plain", b"x", partition=2000)
        elif case == "key_float":
            await self.producer.publish("fz_plain", b"x", sharding_key=1.5)  # type: ignore[arg-type]
        elif case == "close_timeout_str":
            p = Producer(lookupd=lookupd)
            try:
                with contextlib.suppress(errors.NSQError):  # connected if it can: a fault
                    await p.publish("fz_plain", b"x", timeout=3.0)  # may be down now
                await p.close(timeout="1")  # type: ignore[arg-type]
            finally:
                await p.close(timeout=1.0)
        elif case == "loop_thread_int":
            smartnsq.sync.Producer(lookupd=lookupd, loop_thread=5)  # type: ignore[arg-type]
        else:
            Producer(lookupd=5 if case == "lookupd_int" else lookupd,  # type: ignore[arg-type]
                     config=5 if case == "config_int" else None)  # type: ignore[arg-type]

    # -- consumers ------------------------------------------------------------------------------

    def _record(self, msg: Any) -> None:
        body = bytes(msg.body)
        if not body.startswith(b"fz|"):
            # another call's body (a bad input's b"x" the cluster took): not the world's, and
            # a handler failing on it would back the whole consumer off, starving the drain
            return
        if body not in self.handled:
            parts = body.decode().split("|")
            if parts[2] != "None":
                self.first_handled[(parts[1], parts[2])].append(int(parts[3]))
        self.handled.add(body)

    def _behave(self, mode: str, msg: Any) -> bool:
        """True: hang; raises for ``raise``; False: succeed. Only a message's first delivery
        misbehaves, so every message is handled in the end."""
        body = bytes(msg.body)
        if mode == "ok" or body in self._failed_once:
            return False
        self._failed_once.add(body)
        if mode == "raise":
            raise RuntimeError("the handler failed (fuzz)")
        return True

    def consumer_start(self, topic: str, mode: str, sync: bool) -> None:
        """Start a Consumer (async or sync facade) on the fuzz channel, handler ``mode``."""
        self.counts.steps += 1
        if len(self.consumers) >= 2:
            return
        assert self.cluster is not None
        lookupd = self.cluster.lookupd_http_addresses
        opts = {"max_in_flight": 5, "msg_timeout": 2.0}
        started = time.monotonic()
        exc: BaseException | None = None
        try:
            if sync:
                def handler(msg: Any) -> None:
                    if self._behave(mode, msg):
                        self._release.wait(3.0)
                    self._record(msg)

                c: Any = smartnsq.sync.Consumer(topic, CHANNEL, lookupd=lookupd,
                                                handler=handler, loop_thread=self._sync_loop,
                                                **opts)
            else:
                release = asyncio.Event()

                async def ahandler(msg: Any) -> None:
                    if self._behave(mode, msg):
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(release.wait(), 3.0)
                    self._record(msg)

                c = self._run(self._start_consumer(topic, ahandler, opts), 30.0)
            if c is not None:
                self.consumers.append(("sync" if sync else "async", c, topic))
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        self._outcome(f"Consumer({topic!r}, {mode}, sync={sync}).start", started, 10.0, exc,
                      topic)

    async def _start_consumer(self, topic: str, handler: Callable[[Any], Awaitable[None]],
                              opts: dict[str, Any]) -> Consumer:
        assert self.cluster is not None
        c = Consumer(topic, CHANNEL, lookupd=self.cluster.lookupd_http_addresses,
                     handler=handler, **opts)
        await c.start()
        return c

    def consumer_close(self, index: int, timeout: float) -> None:
        """Close one running Consumer within ``timeout``; join() then returns at once."""
        self.counts.steps += 1
        if not self.consumers:
            return
        kind, c, topic = self.consumers.pop(index % len(self.consumers))
        started = time.monotonic()
        exc: BaseException | None = None
        try:
            if kind == "sync":
                c.close(timeout=timeout)
                c.run(timeout=1.0)
            else:
                self._run(self._close_consumer(c, timeout), timeout + 30)
        except BaseException as e:  # every escape, CancelledError too, is judged
            exc = e
        self._outcome(f"{kind} Consumer({topic!r}).close(timeout={timeout})", started,
                      timeout, exc, topic)

    async def _close_consumer(self, c: Consumer, timeout: float) -> None:
        await c.close(timeout=timeout)
        await asyncio.wait_for(c.join(), 1.0)

    # -- faults ---------------------------------------------------------------------------------

    def fault(self, kind: str, node: int, topic: str, partition: int) -> None:
        """Fire one fault (at most one node down at a time, so a replica always holds the
        data), or ``heal`` every one."""
        self.counts.steps += 1
        if kind != "heal" and kind in self.down:
            return
        if kind in ("kill", "leave") and ("kill" in self.down or "leave" in self.down):
            return
        self.counts.faults += 1
        self.counts.fault_kinds[kind] += 1
        self._run(self._fault(kind, node, topic, partition), 30.0)

    async def _fault(self, kind: str, node: int, topic: str, partition: int) -> None:
        cluster = self.cluster
        assert cluster is not None
        if kind == "heal":
            await self._heal()
        elif kind == "kill":
            await cluster.kill_node(node)
            self.down[kind] = node
        elif kind == "leave":
            await cluster.leave_node(node)
            self.down[kind] = node
        elif kind == "stop_lookupd":
            await cluster.stop_lookupd(node % 2)
            self.down[kind] = node % 2
        elif kind == "cut":
            cluster.cut_connections(node)
        elif kind == "stall":
            cluster.stall(node)
            self.down[kind] = node
        elif kind == "not_writable":
            cluster.set_writable(topic, partition, False)
            self.down[kind] = (topic, partition)
        elif kind == "move_leader":
            cluster.move_leader(topic, partition)

    async def _heal(self) -> None:
        cluster = self.cluster
        assert cluster is not None
        for kind, what in list(self.down.items()):
            if kind in ("kill", "leave"):
                await cluster.start_node(what)
            elif kind == "stop_lookupd":
                await cluster.start_lookupd(what)
            elif kind == "stall":
                cluster.resume(what)
            elif kind == "not_writable":
                cluster.set_writable(*what, True)
        self.down.clear()
        await cluster.faults.settled(30.0)

    # -- the end --------------------------------------------------------------------------------

    def check_now(self) -> list[str]:
        """The invariants checked after every step (the rest need the end: :meth:`finish`)."""
        return list(self.violations)

    def finish(self, drain_seconds: float = 40.0) -> list[str]:
        """Heal, close every client (within its timeout), drain each topic with a healthy
        consumer until every acknowledged publish was handled, check per-key order, stop
        everything and look for what was left behind. Returns every violation."""
        self._release.set()
        self._run(self._heal(), 40.0)
        while self.consumers:
            self.consumer_close(0, 5.0)
        self._run(self._drain(drain_seconds), drain_seconds + 30)
        self.counts.handled = len(self.handled)
        missing = [b for b in self.acked if b not in self.handled]
        if missing:
            self.violations.append(f"lost: {len(missing)} acknowledged publishes never "
                                   f"handled, e.g. {missing[:3]}")
        for (topic, key), seqs in self.first_handled.items():
            acked = [s for s in seqs if f"fz|{topic}|{key}|{s}".encode() in self.acked]
            if topic == "fz_ordered" and acked != sorted(acked):
                self.violations.append(f"order: key {key!r} of {topic} handled first in "
                                       f"order {acked}")
        self._run(self._close_producers(), 30.0)
        self.sync_producer.close()
        self._sync_loop.stop()
        leftover = self._run(self._stop(), 60.0) or []
        self.violations += leftover
        # a close that met its deadline aborted its connections: each socket closes in a
        # callback already scheduled; let those run before the loop stops (asyncio.run
        # would too), so the socket count below sees what was left open, not what is closing
        self._run(_turns(3), 5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10.0)
        self._loop.close()
        dev_channels.Channel.finish = self._original_finish  # type: ignore[method-assign]
        threads = [t for t in threading.enumerate()
                   if t.ident not in self._baseline_threads and t.is_alive()]
        if threads:
            self.violations.append(f"threads left after close: {[t.name for t in threads]}")
        sockets = _sockets()
        if sockets > self._baseline_sockets:
            self.violations.append(f"sockets left after close: {sockets} open, "
                                   f"{self._baseline_sockets} before")
        return self.violations

    async def _drain(self, seconds: float) -> None:
        """One ok consumer per topic until every acknowledged body was handled."""
        assert self.cluster is not None
        done = asyncio.Event()
        want = set(self.acked)

        async def handler(msg: Any) -> None:
            self._record(msg)
            if want <= self.handled:
                done.set()

        consumers = [Consumer(t, CHANNEL, lookupd=self.cluster.lookupd_http_addresses,
                              handler=handler, max_in_flight=20, msg_timeout=2.0)
                     for t in TOPICS]
        for c in consumers:
            await c.start()
        if not want <= self.handled:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), seconds)
        for c in consumers:
            await c.close(timeout=5.0)

    async def _close_producers(self) -> None:
        started = time.monotonic()
        await self.producer.close(timeout=5.0)
        self._outcome("Producer.close(timeout=5)", started, 5.0, None)

    async def _stop(self) -> list[str]:
        out: list[str] = []
        me = asyncio.current_task()
        servers = (f"{os.sep}devcluster{os.sep}", f"{os.sep}testing{os.sep}")  # not clients
        client = [t for t in asyncio.all_tasks() if t is not me
                  and not any(s in t.get_coro().cr_code.co_filename  # type: ignore[union-attr]
                              for s in servers)
                  and not t.done()]
        if client:
            # a task cancelled in the same turn the close returned ends on the next one: only
            # what is still running a grace second later is left behind
            _, still = await asyncio.wait(client, timeout=1.0)
            if still:
                out.append(f"client tasks left after close: "
                           f"{[repr(t.get_coro()) for t in still]}")
        for peer in self._peers.values():
            await peer.__aexit__(None, None, None)
        assert self.cluster is not None
        await self.cluster.stop()
        return out


def run_guarded(fn: Callable[[], Any]) -> Any:
    """Call ``fn`` for a driver, logging what escaped (a bug of the harness, not the client)."""
    try:
        return fn()
    except Exception:
        log.exception("the fuzz harness failed")
        raise
