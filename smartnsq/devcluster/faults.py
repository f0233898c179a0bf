"""The fault clock: what a real youzan cluster does, over time, after a node fails.

In a real cluster the lookupd and the nsqd coordinators react to a failure on their own timers
(etcd's session TTL, the leader's replica write timeout, the ISR check, the cluster check that
acts on ``/topic/create``). :class:`FaultClock` plays those timers on the shared
:class:`~smartnsq.devcluster.state.ClusterState`, with the durations of a
:class:`~smartnsq.devcluster.profile.FaultProfile`; the servers only read the state, so every
client-visible effect (lookups, ``E_FAILED_ON_NOT_LEADER``, an unanswered PUB) follows from
what the clock set. ``DevCluster.kill_node``/``leave_node`` start the sequences; the clock
never sleeps: it schedules loop callbacks and records a timeline of what it did.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .profile import FaultProfile
from .state import ClusterState, PartitionInfo

__all__ = ["Event", "FaultClock"]

log = logging.getLogger("smartnsq.devcluster.faults")

TIMELINE_LIMIT = 10_000  # events kept (oldest dropped): a long chaos run stays bounded


@dataclass(frozen=True)
class Event:
    """One step the clock took, ``at`` in ``time.monotonic()`` seconds."""

    at: float
    what: str
    details: dict[str, Any]


def write_quorum(replica: int) -> int:
    """In-sync replicas youzan needs to accept writes (``replica / 2 + 1``)."""
    return replica // 2 + 1


class FaultClock:
    """Timers of one dev cluster's faults (see the module doc).

    ``stop_node`` is how the clock stops a leaving node once its partitions have moved
    (``DevCluster`` passes its own crash-stop).
    """

    def __init__(self, state: ClusterState, profile: FaultProfile,
                 stop_node: Callable[[str], Coroutine[Any, Any, None]]) -> None:
        self.state = state
        self.profile = profile
        self.rng = random.Random(profile.seed)
        self._stop_node = stop_node
        self._timers: set[asyncio.TimerHandle] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.timeline: list[Event] = []
        self._last_check = -float("inf")
        self._check_timer: asyncio.TimerHandle | None = None
        self._periodic: asyncio.TimerHandle | None = None
        self._started = False

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Install the topic-creation hooks and the periodic cluster check (slow creation)."""
        if self._started:
            return
        self._started = True
        if self.profile.slow_creation:
            self.state.slow_creation = True
            self.state.creation_check = self.request_check
            self._schedule_periodic()

    def stop(self) -> None:
        """Cancel every pending step (the cluster is going down)."""
        self._started = False
        for timer in list(self._timers):
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        for pending in (self._check_timer, self._periodic):
            if pending is not None:
                pending.cancel()
        self._check_timer = self._periodic = None
        if self.state.creation_check == self.request_check:
            self.state.creation_check = None
            self.state.slow_creation = False
        self._idle.set()

    @property
    def busy(self) -> bool:
        """Whether a fault sequence still has steps to take."""
        return bool(self._timers or self._tasks)

    async def settled(self, timeout: float | None = None) -> None:
        """Wait until every started fault sequence has run its course."""
        await asyncio.wait_for(self._idle.wait(), timeout)

    @property
    def last_check(self) -> float:
        """``time.monotonic()`` of the last cluster check (-inf before the first)."""
        return self._last_check

    def seconds(self, name: str) -> float:
        return self.profile.seconds(name, self.rng)

    def _record(self, what: str, **details: Any) -> None:
        self.timeline.append(Event(time.monotonic(), what, details))
        del self.timeline[:-TIMELINE_LIMIT]
        log.info("fault clock: %s %s", what, details)

    def _later(self, delay: float, step: Callable[..., None], *args: Any) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def run() -> None:
            self._timers.discard(handle)
            try:
                step(*args)
            except Exception:
                log.exception("fault clock step %s failed", getattr(step, "__name__", step))
            finally:
                self._check_idle()

        handle = loop.call_later(max(0.0, delay), run)
        self._timers.add(handle)
        self._idle.clear()

    def _check_idle(self) -> None:
        if not self._timers and not self._tasks:
            self._idle.set()

    # -- helpers ----------------------------------------------------------------------------

    def _alive(self, node_id: str) -> bool:
        node = self.state.nodes.get(node_id)
        return node is not None and node.alive

    def _partitions(self) -> list[PartitionInfo]:
        return [p for info in self.state.topics.values() if not info.classic
                for p in info.partitions]

    def _quorum(self, p: PartitionInfo) -> bool:
        info = self.state.topics.get(p.topic)
        replica = info.replica if info is not None else 1
        in_sync = [r for r in p.replicas if self._alive(r)]
        return len(in_sync) >= write_quorum(replica)

    def _set_writable(self, p: PartitionInfo, writable: bool) -> None:
        if p.writable != writable and self.state.topics.get(p.topic) is not None:
            self.state.set_writable(p.topic, p.partition, writable)

    def _stall(self, p: PartitionInfo, seconds: float) -> None:
        if seconds > 0:
            p.stalled_until = max(p.stalled_until, time.monotonic() + seconds)

    # -- node loss (SIGKILL) ----------------------------------------------------------------

    def node_lost(self, dead: str) -> None:
        """The node is gone (its sockets already closed): start the real cluster's reaction."""
        self._record("node_lost", node=dead)
        for p in self._partitions():
            catchup = self.seconds("replica_catchup")  # counted from the kill
            if p.leader == dead:
                window = self.seconds("leaderless_window")
                self._later(window, self._elect, p, dead, max(0.0, catchup - window))
            elif dead in p.replicas and p.leader is not None and self._alive(p.leader):
                stall = self.seconds("replica_stall")
                shrink = max(self.seconds("isr_shrink"), stall)
                self._stall(p, stall)
                # lookups keep listing it while stalled (``PartitionInfo.stalled``); once the
                # stall is over the leader answers E_FAILED_ON_NOT_WRITABLE
                self._set_writable(p, False)
                self._later(shrink, self._shrink, p, dead, max(0.0, catchup - shrink))

    def _elect(self, p: PartitionInfo, dead: str, catchup: float) -> None:
        if self._alive(dead) or p.leader != dead or p.topic not in self.state.topics:
            return  # it came back before its session expired, or someone moved it
        candidates = [r for r in p.replicas if r != dead and self._alive(r)]
        if not candidates:
            self._record("no_replica_to_elect", topic=p.topic, partition=p.partition)
            return
        self._set_writable(p, False)
        self.state.move_leader(p.topic, p.partition, candidates[0])
        p.replicas[:] = [r for r in p.replicas if r != dead]
        self._record("elected", topic=p.topic, partition=p.partition, leader=candidates[0])
        self._later(self.seconds("elect_not_writable"), self._writable_or_catchup, p, catchup)

    def _shrink(self, p: PartitionInfo, dead: str, catchup: float) -> None:
        if p.topic not in self.state.topics:
            return
        if not self._alive(dead):
            p.replicas[:] = [r for r in p.replicas if r != dead]
        self._record("isr_shrunk", topic=p.topic, partition=p.partition, isr=list(p.replicas))
        self._writable_or_catchup(p, catchup)

    def _writable_or_catchup(self, p: PartitionInfo, catchup: float) -> None:
        if p.topic not in self.state.topics:
            return
        if self._quorum(p):
            self._set_writable(p, True)
            self._record("writable", topic=p.topic, partition=p.partition)
        else:
            self._later(catchup, self._catch_up, p)

    def _catch_up(self, p: PartitionInfo) -> None:
        """A spare node has copied the partition and joins the ISR."""
        if p.topic not in self.state.topics:
            return
        spare = [n.node_id for n in self.state.youzan_nodes() if n.node_id not in p.replicas]
        if spare and not self._quorum(p):
            p.replicas.append(spare[0])
        self._record("caught_up", topic=p.topic, partition=p.partition, isr=list(p.replicas))
        if self._quorum(p):
            self._set_writable(p, True)

    def node_back(self, node_id: str) -> None:
        """A killed node restarted: it rejoins the ISR of every partition it had a copy of."""
        self._record("node_back", node=node_id)
        for p in self._partitions():
            info = self.state.topics[p.topic]
            if node_id not in p.replicas and p.leader is not None \
                    and len(p.replicas) < info.replica and not self._quorum(p):
                p.replicas.append(node_id)  # it copies the partition and joins the ISR
            if (p.leader == node_id or node_id in p.replicas) and not p.writable \
                    and self._quorum(p) and not p.stalled():
                self._set_writable(p, True)

    # -- graceful leave (SIGTERM) -----------------------------------------------------------

    def node_leaving(self, leaving: str) -> None:
        """The node has begun to exit: move what it leads, stall one live-leader partition,
        then stop it."""
        self._record("node_leaving", node=leaving)
        last = 0.0
        led = [p for p in self._partitions() if p.leader == leaving]
        for i, p in enumerate(led):
            delay = self.seconds("leave_slow_handoff" if i == 1 else "leave_handoff")
            last = max(last, delay)
            self._later(delay, self._handoff, p, leaving)
        stalled = False
        for p in self._partitions():
            if leaving in p.replicas and p.leader not in (None, leaving) and self._alive(
                    p.leader or ""):
                if not stalled:
                    stalled = True
                    seconds = self.seconds("leave_stall")
                    self._stall(p, seconds)
                    last = max(last, seconds)
                    self._record("stalled", topic=p.topic, partition=p.partition,
                                 seconds=seconds)
                p.replicas[:] = [r for r in p.replicas if r != leaving]
        self._later(last, self._finish_leave, leaving)

    def _handoff(self, p: PartitionInfo, leaving: str) -> None:
        if p.leader != leaving or p.topic not in self.state.topics:
            return
        candidates = [r for r in p.replicas if r != leaving and self._alive(r)]
        if not candidates:
            self._record("no_replica_to_elect", topic=p.topic, partition=p.partition)
            return
        self.state.move_leader(p.topic, p.partition, candidates[0])
        p.replicas[:] = [r for r in p.replicas if r != leaving]
        self._record("handed_off", topic=p.topic, partition=p.partition, leader=candidates[0])
        if not self._quorum(p):
            # below its write quorum (replica 2 with one left): the new leader is listed for
            # reads at once but takes no write until a spare has caught up, as after a kill
            # (real: ~110 s for a 2-replica topic on 3 nodes, tests/both/test_cluster_faults.py)
            self._set_writable(p, False)
            self._later(self.seconds("replica_catchup"), self._catch_up, p)

    def _finish_leave(self, leaving: str) -> None:
        task = asyncio.get_running_loop().create_task(self._stop_node(leaving))
        self._tasks.add(task)
        self._idle.clear()

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("stopping %s failed: %r", leaving, t.exception())
            self._record("node_left", node=leaving)
            self._check_idle()

        task.add_done_callback(done)

    # -- slow topic creation: the lookupd's cluster check -----------------------------------

    def request_check(self) -> None:
        """A ``/topic/create`` (new or re-sent) asks for a check: ignored if one ran lately."""
        now = time.monotonic()
        if now - self._last_check < self.seconds("check_min_spacing"):
            self._record("check_ignored", since_last=now - self._last_check)
            return
        if self._check_timer is None:
            loop = asyncio.get_running_loop()
            self._check_timer = loop.call_later(self.seconds("check_delay"), self._check)

    def _schedule_periodic(self) -> None:
        interval = self.seconds("check_interval")
        if interval <= 0:
            return
        self._periodic = asyncio.get_running_loop().call_later(interval, self._periodic_check)

    def _periodic_check(self) -> None:
        self._periodic = None
        self.check(quiet=True)
        if self._started:
            self._schedule_periodic()

    def _check(self) -> None:
        self._check_timer = None
        self.check()

    def check(self, quiet: bool = False) -> None:
        """One cluster check: every partition still without a leader gets one, which serves
        ``leader_ready_delay`` later. ``quiet``: no timeline entry if it named nobody (the
        periodic check)."""
        self._last_check = time.monotonic()
        named = self.state.elect_pending()
        if named or not quiet:
            self._record("cluster_check", named=[f"{p.topic}/{p.partition}" for p in named])
        for p in named:
            self._later(self.seconds("leader_ready_delay"), self._ready, p)

    def _ready(self, p: PartitionInfo) -> None:
        if p.topic in self.state.topics:
            self.state.ready_leader(p)
