"""Low-RDY mode (fewer ``max_in_flight`` than connections) with every connection busy.

A holder of RDY 1 fed a steady trickle is never idle, so handing RDY on only from idle
holders starves the other connections for ever (seen on a real youzan cluster: 4 partitions,
1 msg/s each, ``max_in_flight=2``: two partitions delivered nothing in 90 s). These tests play
a well-behaved nsqd over the pure controller on a simulated clock: the server delivers on a
connection whenever it has a message and the connection's in-flight count is below its RDY,
and the handler answers each message after a processing time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.model.backoff import BackoffPolicy
from smartnsq.model.rdy import RdyController


@dataclass
class _Server:
    """One connection as the server sees it: its RDY window and its backlog."""

    rdy: int = 0
    in_flight: int = 0
    backlog: int = 0
    deliveries: list[float] = field(default_factory=list)


class Sim:
    """A discrete-event run of one consumer over ``n`` connections.

    ``rate`` is messages per second published to each connection (``None``: an endless
    backlog); ``work`` draws a message's processing time; ``ticks`` draws the time to the next
    ``tick``. The invariants of the controller are checked after every event.
    """

    def __init__(self, ctl: RdyController, n: int, *, rate: float | None,
                 work: random.Random, processing: float, tick_every: tuple[float, float],
                 ordered: frozenset[int] = frozenset()) -> None:
        self.ctl = ctl
        self.now = 0.0
        self.servers = {i: _Server(backlog=0 if rate is not None else 10**9) for i in range(n)}
        self.rate = rate
        self.work = work
        self.processing = processing
        self.tick_every = tick_every
        self.ordered = ordered
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.max_committed_seen = 0
        for i in range(n):
            if ordered and i in ordered:
                self.apply(ctl.add(i, 1, self.now, own_backoff=True))
            else:
                self.apply(ctl.add(i, 2500, self.now))
            if rate is not None:
                self.push(self.now + work.uniform(0.0, 1.0 / rate), "publish", i)
        self.push(self.now + work.uniform(*tick_every), "tick", -1)

    def push(self, at: float, kind: str, conn: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, conn))

    def apply(self, out: list[tuple[object, int]]) -> None:
        for key, count in out:
            assert isinstance(key, int)
            self.servers[key].rdy = count
        self.check()
        self.deliver()

    def deliver(self) -> None:
        for key, s in self.servers.items():
            if s.backlog and s.in_flight < s.rdy:
                s.backlog -= 1
                s.in_flight += 1
                s.deliveries.append(self.now)
                self.push(self.now + self.work.uniform(self.processing / 2, self.processing),
                          "finish", key)
                self.apply(self.ctl.on_message(key, self.now))
                return  # apply() delivers the rest

    def check(self) -> None:
        ctl = self.ctl
        total = sum(s.rdy for s in self.servers.values())
        assert total == ctl.total_rdy <= ctl.max_in_flight, self.snapshot()
        committed = sum(max(s.rdy, s.in_flight) for s in self.servers.values())
        assert committed <= ctl.max_in_flight, self.snapshot()
        for key, s in self.servers.items():
            assert ctl.in_flight(key) == s.in_flight
            if key in self.ordered:
                assert s.rdy <= 1 and s.in_flight <= 1, self.snapshot()
        # work-conserving: a slot's holder waits for RDY only while the capacity is still
        # committed to messages in flight elsewhere (it is handed over on their FIN, not at
        # the next tick)
        waiting_for_capacity = [k for k, s in self.servers.items() if ctl.share(k) and s.rdy == 0]
        if waiting_for_capacity:
            assert committed == ctl.max_in_flight, self.snapshot()

    def snapshot(self) -> str:
        return f"t={self.now:.3f} {self.ctl.stats()['connections']}"

    def run(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            at, _, kind, key = heapq.heappop(self.events)
            self.now = at
            if kind == "tick":
                self.apply(self.ctl.tick(self.now))
                self.push(self.now + self.work.uniform(*self.tick_every), "tick", -1)
            elif kind == "finish":
                s = self.servers[key]
                s.in_flight -= 1
                self.apply(self.ctl.on_finished(key, self.now, success=True))
            else:
                assert self.rate is not None
                self.servers[key].backlog += 1
                self.push(self.now + 1.0 / self.rate, "publish", key)
                self.check()
                self.deliver()
        self.now = until

    def longest_gap(self, key: int, start: float) -> float:
        """The longest stretch from ``start`` to the end without a delivery on ``key``."""
        times = [start, *(t for t in self.servers[key].deliveries if t >= start), self.now]
        return max(b - a for a, b in itertools.pairwise(times))


def test_four_busy_partitions_each_deliver_within_10_s() -> None:
    """The observed case, with the consumer's defaults (idle timeout 10 s, tick 2 s)."""
    ctl = RdyController(2, rng=random.Random(5))
    sim = Sim(ctl, 4, rate=1.0, work=random.Random(1), processing=0.01,
              tick_every=(2.0, 2.0))
    sim.run(10.0)
    firsts = {k: s.deliveries[0] if s.deliveries else None for k, s in sim.servers.items()}
    assert all(t is not None and t < 10.0 for t in firsts.values()), firsts
    sim.run(120.0)
    for k in sim.servers:  # and keeps being read: no partition waits long for its turn
        assert sim.longest_gap(k, 0.0) < 10.0, (k, sim.servers[k].deliveries)


def test_a_busy_holder_keeps_its_slot_for_its_turn() -> None:
    """Rotation is not churn: within a turn a busy holder is not interrupted."""
    ctl = RdyController(1, low_rdy_idle_timeout=10.0, low_rdy_turn=5.0, rng=random.Random(2))
    ctl.add("a", 2500, 0.0)
    ctl.add("b", 2500, 0.0)
    holder = next(c for c in ctl if ctl.rdy(c))
    other = "b" if holder == "a" else "a"
    for t in range(1, 5):
        ctl.on_message(holder, float(t))
        ctl.on_finished(holder, t + 0.1, success=True)
        assert ctl.tick(t + 0.5) == []
    ctl.on_message(holder, 5.0)  # in flight at the turn's end: RDY 0 now, RDY 1 on its FIN
    assert ctl.tick(5.5) == [(holder, 0)]
    assert ctl.rdy(other) == 0 and ctl.total_rdy == 0
    assert ctl.on_finished(holder, 5.6, success=True) == [(other, 1)]
    # the message in flight was answered normally; the slot changed hands at once
    assert ctl.in_flight(holder) == 0 and ctl.total_rdy == 1


def test_an_idle_holder_still_gives_way_after_the_idle_timeout() -> None:
    ctl = RdyController(1, low_rdy_idle_timeout=10.0, low_rdy_turn=30.0, rng=random.Random(2))
    for c in "abc":
        ctl.add(c, 2500, 0.0)
    holder = next(c for c in ctl if ctl.rdy(c))
    assert ctl.tick(9.0) == []
    out = ctl.tick(10.0)
    assert out[0] == (holder, 0) and out[1][1] == 1


def test_the_turn_defaults_to_half_the_idle_timeout() -> None:
    assert RdyController(2).low_rdy_turn == 5.0
    assert RdyController(2, low_rdy_idle_timeout=4.0).low_rdy_turn == 2.0
    assert RdyController(2, low_rdy_idle_timeout=math.inf).low_rdy_turn == math.inf


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 8), data=st.data(), seed=st.integers(0, 2**32 - 1),
       idle=st.sampled_from([2.0, 5.0, 10.0]), turn=st.sampled_from([None, 1.0, 3.0, 7.0]),
       processing=st.sampled_from([0.05, 0.3, 1.5]),
       tick=st.sampled_from([(2.0, 2.0), (1.0, 5.0)]),
       rate=st.sampled_from([None, 1.0, 5.0]))
def test_every_busy_connection_gets_its_turn(n: int, data: st.DataObject, seed: int,
                                             idle: float, turn: float | None,
                                             processing: float, tick: tuple[float, float],
                                             rate: float | None) -> None:
    """With more connections than ``max_in_flight`` and all of them busy, every connection is
    read within a bounded time, again and again; the total RDY and the messages in flight
    stay within ``max_in_flight``; ordered partitions never get more than one in flight."""
    mif = data.draw(st.integers(1, n - 1), label="max_in_flight")
    ordered = frozenset(data.draw(st.sets(st.integers(0, n - 1), max_size=n), label="ordered"))
    ctl = RdyController(mif, low_rdy_idle_timeout=idle, low_rdy_turn=turn,
                        rng=random.Random(seed))
    sim = Sim(ctl, n, rate=rate, work=random.Random(seed + 1), processing=processing,
              tick_every=tick, ordered=ordered)
    duration = 120.0
    sim.run(duration)
    t = ctl.low_rdy_turn
    # a slot changes hands at most every turn + one tick (noticed) + one message (handed
    # over on its FIN); a connection waits for the slots ahead of it in the queue
    rounds = math.ceil((n - mif) / mif) + 1
    bound = rounds * (t + tick[1] + processing) + tick[1] + processing
    if rate is not None:
        bound += 1.0 / rate  # and for its next message to be published
    for key in sim.servers:
        assert sim.longest_gap(key, 0.0) <= bound, (key, bound, sim.servers[key].deliveries)
    # nothing is stranded: with the backlogs gone, every message in flight (on a holder or
    # on a connection whose RDY was taken back meanwhile) is answered, and the slots are all
    # held again
    for s in sim.servers.values():
        s.backlog = 0
    sim.rate = None
    sim.events = [e for e in sim.events if e[2] != "publish"]
    heapq.heapify(sim.events)
    sim.run(duration + processing + 10.0)
    assert all(s.in_flight == 0 for s in sim.servers.values())
    assert ctl.total_in_flight == 0 and ctl.total_rdy == mif, sim.snapshot()


def test_a_partition_backing_off_on_its_own_is_skipped_until_it_can_read() -> None:
    """An ordered partition in its own back-off would sit on a slot with RDY 0: the turn
    goes to it only once its window is over."""
    ctl = RdyController(1, low_rdy_idle_timeout=10.0, low_rdy_turn=5.0, rng=random.Random(4),
                        backoff=BackoffPolicy(initial=30.0, max=60.0, jitter=0.0))
    ctl.add("a", 1, 0.0, own_backoff=True)
    ctl.add("b", 1, 0.0, own_backoff=True)
    first = next(c for c in ctl if ctl.rdy(c))
    second = "b" if first == "a" else "a"
    ctl.on_message(first, 1.0)
    ctl.on_finished(first, 1.1, success=True)
    assert ctl.tick(5.5) == [(first, 0), (second, 1)]
    ctl.on_message(second, 6.0)
    assert ctl.on_finished(second, 6.1, success=False) == [(second, 0)]  # its own back-off
    assert ctl.tick(11.0) == [(first, 1)]  # its turn is over, though it reads nothing
    assert ctl.backoff_state(second, 17.0) == "backing_off"
    assert ctl.tick(17.0) == []  # first's turn is over, but second could not use the slot
    assert ctl.tick(40.0) == [(first, 0), (second, 1)]  # its window is over: its probe
