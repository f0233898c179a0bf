"""RdyController invariants over random event sequences (hypothesis state machine).

The test plays a well-behaved nsqd: it applies every returned RDY command to its own model
and delivers a message on a connection only while that connection's in-flight count is below
the RDY the model holds (nsqd's window rule).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from smartnsq.model.backoff import BackoffPolicy
from smartnsq.model.rdy import RdyController

NAMES = [f"c{i}" for i in range(8)]
DT = st.floats(min_value=0.0, max_value=15.0, allow_nan=False)


class RdyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.ctl: RdyController | None = None
        self.rdy: dict[str, int] = {}        # the server's view: RDY last received
        self.in_flight: dict[str, int] = {}
        self.max_rdy: dict[str, int] = {}
        self.removed: set[str] = set()
        self.committed_before = 0
        self.on_the_wire: dict[str, int] = {}  # may still arrive under an old, larger window
        self.ceiling = 0  # max_in_flight, or the in-flight total when it was lowered below

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def c(self) -> RdyController:
        assert self.ctl is not None
        return self.ctl

    def committed(self) -> int:
        return sum(max(self.rdy[k], self.in_flight[k]) for k in self.rdy)

    def apply(self, out: list[tuple[object, int]]) -> None:
        keys = [k for k, _ in out]
        assert len(keys) == len(set(keys)), f"one command per connection: {out}"
        for key, count in out:
            assert isinstance(key, str)
            assert key in self.rdy, f"RDY {count} to a removed/unknown connection {key}"
            assert count != self.rdy[key], f"no-op RDY reported: {out}"
            assert 0 <= count <= self.max_rdy[key]
            if count < self.rdy[key]:
                spare = self.rdy[key] - max(count, self.in_flight[key])
                self.on_the_wire[key] = max(self.on_the_wire.get(key, 0), spare)
            self.rdy[key] = count

    def step(self, dt: float) -> None:
        self.now += dt
        self.committed_before = self.committed()

    # -- rules ------------------------------------------------------------------------------

    @precondition(lambda self: self.ctl is None)
    @rule(mif=st.integers(0, 12), seed=st.integers(0, 2**16), idle=st.sampled_from([1.0, 10.0]),
          jitter=st.sampled_from([0.0, 0.3]), enabled=st.booleans())
    def start(self, mif: int, seed: int, idle: float, jitter: float, enabled: bool) -> None:
        self.ceiling = mif
        self.ctl = RdyController(mif, low_rdy_idle_timeout=idle, rng=random.Random(seed),
                                 backoff=BackoffPolicy(enabled=enabled, jitter=jitter,
                                                       max=16.0))

    @precondition(lambda self: self.ctl is not None)
    @rule(name=st.sampled_from(NAMES), max_rdy=st.sampled_from([1, 2, 3, 2500]), dt=DT)
    def add(self, name: str, max_rdy: int, dt: float) -> None:
        if name in self.rdy:
            return
        self.step(dt)
        self.rdy[name] = 0
        self.in_flight[name] = 0
        self.max_rdy[name] = max_rdy
        self.removed.discard(name)
        self.apply(self.c.add(name, max_rdy, self.now))

    @precondition(lambda self: self.ctl is not None and bool(self.rdy))
    @rule(data=st.data(), dt=DT)
    def remove(self, data: st.DataObject, dt: float) -> None:
        name = data.draw(st.sampled_from(sorted(self.rdy)))
        self.step(dt)
        del self.rdy[name], self.in_flight[name], self.max_rdy[name]
        self.on_the_wire.pop(name, None)
        self.removed.add(name)
        self.committed_before = self.committed()
        self.apply(self.c.remove(name, self.now))

    @precondition(lambda self: any(self.in_flight[k] < self.rdy[k] for k in self.rdy))
    @rule(data=st.data(), dt=DT)
    def deliver(self, data: st.DataObject, dt: float) -> None:
        ready = sorted(k for k in self.rdy if self.in_flight[k] < self.rdy[k])
        name = data.draw(st.sampled_from(ready))
        self.step(dt)
        self.in_flight[name] += 1
        self.apply(self.c.on_message(name, self.now))

    @precondition(lambda self: any(self.on_the_wire.values()))
    @rule(data=st.data())
    def deliver_raced(self, data: st.DataObject) -> None:
        """A message the server sent under a window since lowered: it arrives after the RDY
        that lowered it was sent, beyond the new window."""
        name = data.draw(st.sampled_from(sorted(k for k, v in self.on_the_wire.items() if v)))
        self.step(0.0)
        self.on_the_wire[name] -= 1
        self.in_flight[name] += 1
        self.apply(self.c.on_message(name, self.now))
        # not asked for: the in-flight bound allows for it
        self.committed_before = self.committed()
        self.ceiling += 1

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data(), success=st.booleans(), backoff=st.booleans(), dt=DT)
    def finish(self, data: st.DataObject, success: bool, backoff: bool, dt: float) -> None:
        name = data.draw(st.sampled_from(sorted(k for k, v in self.in_flight.items() if v)))
        self.step(dt)
        self.in_flight[name] -= 1
        self.apply(self.c.on_finished(name, self.now, success=success, backoff=backoff))

    @precondition(lambda self: bool(self.removed))
    @rule(data=st.data(), success=st.booleans(), dt=DT)
    def finish_on_removed(self, data: st.DataObject, success: bool, dt: float) -> None:
        name = data.draw(st.sampled_from(sorted(self.removed)))
        self.step(dt)
        self.apply(self.c.on_finished(name, self.now, success=success))
        self.apply(self.c.on_message(name, self.now))

    @precondition(lambda self: self.ctl is not None)
    @rule(n=st.integers(0, 12), dt=DT)
    def set_max_in_flight(self, n: int, dt: float) -> None:
        self.step(dt)
        self.ceiling = max(n, sum(self.in_flight.values()))
        self.apply(self.c.set_max_in_flight(n, self.now))

    @precondition(lambda self: self.ctl is not None)
    @rule(dt=st.floats(min_value=0.0, max_value=40.0, allow_nan=False))
    def tick(self, dt: float) -> None:
        self.step(dt)
        self.apply(self.c.tick(self.now))

    @precondition(lambda self: self.ctl is not None and bool(self.rdy))
    @rule()
    def drain_and_recover(self) -> None:
        """Liveness: with everything finished and time passing, every connection gets RDY
        (or exactly max_in_flight of them do, in low-RDY mode)."""
        self.on_the_wire.clear()
        for name in sorted(self.in_flight):
            while self.in_flight[name]:
                self.step(0.0)
                self.in_flight[name] -= 1
                self.apply(self.c.on_finished(name, self.now, success=True))
        if self.c.max_in_flight == 0:
            return
        for _ in range(20):
            if self.c.backoff.state == "normal":
                break
            self.step(20.0)
            self.apply(self.c.tick(self.now))
            probes = [k for k in self.rdy if self.rdy[k] > self.in_flight[k]]
            assert len(probes) == 1, f"probing must open exactly one window: {self.rdy}"
            (name,) = probes
            self.in_flight[name] += 1
            self.apply(self.c.on_message(name, self.now))
            self.in_flight[name] -= 1
            self.apply(self.c.on_finished(name, self.now, success=True))
        assert self.c.backoff.state == "normal"
        self.check_full_flow()
        if self.c.low_rdy_mode:
            # every connection gets its turn once holders sit idle
            served = {k for k, v in self.rdy.items() if v}
            for _ in range(len(self.rdy) + 1):
                self.step(self.c.low_rdy_idle_timeout)
                self.apply(self.c.tick(self.now))
                served |= {k for k, v in self.rdy.items() if v}
            assert served == set(self.rdy)

    # -- invariants -------------------------------------------------------------------------

    def check_full_flow(self) -> None:
        n, mif = len(self.rdy), self.c.max_in_flight
        if mif >= n:
            assert all(v >= 1 for v in self.rdy.values()), self.rdy
        else:
            assert sum(1 for v in self.rdy.values() if v) == mif, self.rdy

    @invariant()
    def bookkeeping_matches_the_server(self) -> None:
        if self.ctl is None:
            return
        assert set(self.c) == set(self.rdy)
        for k in self.rdy:
            assert self.c.rdy(k) == self.rdy[k]
            assert self.c.in_flight(k) == self.in_flight[k] >= 0
            assert self.rdy[k] <= self.max_rdy[k]
        for k in self.removed:
            assert self.c.rdy(k) == 0 and k not in self.c
        assert self.c.total_rdy == sum(self.rdy.values())

    @invariant()
    def total_rdy_within_max_in_flight(self) -> None:
        if self.ctl is not None:
            assert self.c.total_rdy <= self.c.max_in_flight

    @invariant()
    def committed_capacity_never_grows_past_max_in_flight(self) -> None:
        # max(RDY, in_flight) summed bounds what can be in flight; it may stay above
        # max_in_flight after max_in_flight was lowered, but never grows while above it
        if self.ctl is not None:
            assert self.committed() <= max(self.c.max_in_flight, self.committed_before)

    @invariant()
    def in_flight_within_max_in_flight(self) -> None:
        # a lowered max_in_flight drains: in-flight never grows past the old level meanwhile
        # (plus messages that were already on the wire when a window was lowered)
        assert sum(self.in_flight.values()) <= self.ceiling

    @invariant()
    def no_flow_while_backing_off(self) -> None:
        if self.ctl is None:
            return
        state = self.c.backoff.state
        if state == "backing_off":
            assert self.c.total_rdy == 0
        elif state == "probing":
            assert self.c.total_rdy <= 1

    @invariant()
    def idle_consumer_in_normal_state_has_full_flow(self) -> None:
        if self.ctl is None or self.c.backoff.state != "normal" or self.c.max_in_flight == 0:
            return
        if any(self.in_flight.values()):
            return
        self.check_full_flow()


RdyMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestRdyMachine = RdyMachine.TestCase
