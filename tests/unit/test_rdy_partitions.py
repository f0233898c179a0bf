"""RdyController with ordered partitions (own back-off, requeue holds) and where the back-off
probe goes: the pure model's side of ordered consumption on the real server."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from smartnsq.model.backoff import BackoffPolicy
from smartnsq.model.rdy import MIN_HOLD, RdyController

POLICY = BackoffPolicy(initial=10.0, max=40.0, jitter=0.0)


def ordered(*conns: str, policy: BackoffPolicy = POLICY) -> RdyController:
    ctl = RdyController(100, rng=random.Random(3), backoff=policy)
    for c in conns:
        ctl.add(c, 1, 0.0, own_backoff=True)
        ctl.on_message(c, 0.5)
        ctl.on_finished(c, 0.5, success=True)
    return ctl


def test_a_failure_pauses_only_its_own_partition() -> None:
    ctl = ordered("p0", "p1", "p2")
    assert {c: ctl.rdy(c) for c in ctl} == {"p0": 1, "p1": 1, "p2": 1}
    ctl.on_message("p0", 1.0)
    assert ctl.on_finished("p0", 1.0, success=False, hold=0.0) == [("p0", 0)]
    assert ctl.backoff.state == "normal"  # the consumer-wide back-off did not count it
    ctl.on_message("p1", 2.0)
    assert ctl.on_finished("p1", 2.0, success=True) == []
    assert ctl.rdy("p1") == 1 and ctl.rdy("p2") == 1
    assert ctl.next_deadline() == 11.0  # p0's own window
    assert ctl.tick(11.0) == [("p0", 1)]  # its probe
    ctl.on_message("p0", 11.5)
    ctl.on_finished("p0", 11.5, success=True)
    assert ctl.rdy("p0") == 1 and ctl.stats()["connections"]["p0"]["backoff"] == "normal"


def test_a_requeue_holds_the_partition_for_its_delay_even_without_back_off() -> None:
    ctl = ordered("p0", policy=BackoffPolicy(enabled=False))
    ctl.on_message("p0", 1.0)
    assert ctl.on_finished("p0", 1.0, success=False, hold=2.5) == [("p0", 0)]
    assert ctl.next_deadline() == 3.5
    assert ctl.tick(3.0) == []
    assert ctl.tick(3.5) == [("p0", 1)]


def test_a_zero_delay_requeue_still_holds_for_the_floor() -> None:
    ctl = ordered("p0", policy=BackoffPolicy(enabled=False))
    ctl.on_message("p0", 1.0)
    assert ctl.on_finished("p0", 1.0, success=False, backoff=False, hold=0.0) == [("p0", 0)]
    assert ctl.next_deadline() == 1.0 + MIN_HOLD
    assert ctl.tick(1.0 + MIN_HOLD) == [("p0", 1)]


def test_the_probe_goes_to_the_connection_whose_failure_started_the_back_off() -> None:
    for seed in range(20):
        ctl = RdyController(100, rng=random.Random(seed),
                            backoff=BackoffPolicy(initial=1.0, jitter=0.0))
        for c in ("a", "b", "c", "d"):
            ctl.add(c, 2500, 0.0)
        ctl.on_message("c", 0.5)
        ctl.on_finished("c", 0.5, success=False)
        assert all(ctl.rdy(c) == 0 for c in ctl)
        assert ctl.tick(1.5) == [("c", 1)], seed


def test_a_gone_failed_connection_leaves_the_probe_to_another() -> None:
    ctl = RdyController(100, rng=random.Random(1), backoff=BackoffPolicy(initial=1.0,
                                                                          jitter=0.0))
    for c in ("a", "b"):
        ctl.add(c, 2500, 0.0)
    ctl.on_message("a", 0.5)
    ctl.on_finished("a", 0.5, success=False)
    ctl.remove("a", 0.6)
    assert ctl.tick(1.5) == [("b", 1)]


# -- random sequences: own-backoff (ordered) and shared connections mixed ----------------------


_NAMES = [f"o{i}" for i in range(4)] + [f"s{i}" for i in range(3)]
_DT = st.floats(min_value=0.0, max_value=30.0, allow_nan=False)


class MixedMachine(RuleBasedStateMachine):
    """A well-behaved server: delivers only within RDY; ``o*`` connections are ordered (own
    back-off, RDY cap 1), ``s*`` share the consumer-wide back-off."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.ctl = RdyController(6, rng=random.Random(5),
                                 backoff=BackoffPolicy(initial=1.0, max=8.0, jitter=0.0))
        self.rdy: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}
        self.held_until: dict[str, float] = {}

    def apply(self, out: list[tuple[object, int]]) -> None:
        for key, count in out:
            assert isinstance(key, str) and key in self.rdy
            self.rdy[key] = count

    @rule(name=st.sampled_from(_NAMES), dt=_DT)
    def add(self, name: str, dt: float) -> None:
        if name in self.rdy or len(self.rdy) >= 6:
            return
        self.now += dt
        self.rdy[name], self.in_flight[name] = 0, 0
        own = name.startswith("o")
        self.apply(self.ctl.add(name, 1 if own else 2500, self.now, own_backoff=own))

    @precondition(lambda self: any(self.in_flight[k] < self.rdy[k] for k in self.rdy))
    @rule(data=st.data(), dt=_DT)
    def deliver(self, data: st.DataObject, dt: float) -> None:
        name = data.draw(st.sampled_from(sorted(k for k in self.rdy
                                                if self.in_flight[k] < self.rdy[k])))
        self.now += dt
        self.in_flight[name] += 1
        self.apply(self.ctl.on_message(name, self.now))

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data(), success=st.booleans(), hold=st.sampled_from([0.0, 0.5, 3.0]),
          dt=_DT)
    def finish(self, data: st.DataObject, success: bool, hold: float, dt: float) -> None:
        name = data.draw(st.sampled_from(sorted(k for k, v in self.in_flight.items() if v)))
        self.now += dt
        self.in_flight[name] -= 1
        others = {k: v for k, v in self.rdy.items() if k != name and k.startswith("o")}
        self.apply(self.ctl.on_finished(name, self.now, success=success, hold=hold))
        if name.startswith("o") and not success:
            self.held_until[name] = self.now + max(hold, MIN_HOLD)
            assert self.rdy[name] == 0, "a failed ordered partition is held at once"
        if name.startswith("s"):
            # the shared back-off never takes RDY from ordered partitions
            assert all(self.rdy[k] >= v for k, v in others.items())

    @rule(dt=_DT)
    def tick(self, dt: float) -> None:
        self.now += dt
        self.apply(self.ctl.tick(self.now))

    @precondition(lambda self: bool(self.rdy))
    @rule()
    def everything_recovers(self) -> None:
        for name in sorted(self.in_flight):
            while self.in_flight[name]:
                self.in_flight[name] -= 1
                self.apply(self.ctl.on_finished(name, self.now, success=True))
        for _ in range(12):  # windows end, probes succeed, every partition flows again
            self.now += 10.0
            self.apply(self.ctl.tick(self.now))
            for name in sorted(k for k in self.rdy if self.rdy[k] > self.in_flight[k]):
                self.in_flight[name] += 1
                self.apply(self.ctl.on_message(name, self.now))
                self.in_flight[name] -= 1
                self.apply(self.ctl.on_finished(name, self.now, success=True))
        assert all(v >= 1 for v in self.rdy.values()), self.rdy

    @invariant()
    def within_limits(self) -> None:
        assert self.ctl.total_rdy == sum(self.rdy.values()) <= 6
        for k, v in self.rdy.items():
            assert self.ctl.rdy(k) == v and self.ctl.in_flight(k) == self.in_flight[k]
            if k.startswith("o"):
                assert v <= 1
                if self.now < self.held_until.get(k, 0.0):
                    assert v == 0, f"{k} flows during its hold"


MixedMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestMixedMachine = MixedMachine.TestCase
