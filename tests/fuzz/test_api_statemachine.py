"""The stateful fuzz of the public API, seeded and CI-sized.

A hypothesis state machine drives Producer (``publish``, ``publish_nowait``,
``publish_many``; keyed, by partition, unpinned; traced; ext headers; plain, ordered and ext
topics; expired, small and ordinary timeouts), Consumer (start, close, join; handlers that
succeed, raise or hang) and the ``smartnsq.sync`` facade against a dev cluster, while faults
fire between calls (node kill and leave, lookupd stop, cut and stalled connections, a
partition not writable, a leader moved) and hostile peers (dead, silent, trickling and
huge-answer lookupds, a silent nsqd, an nsqd stalling mid-frame) meet fresh clients; wrong
peers (an nsqd answering garbage beside a healthy one, a lookupd listing 2,000 partitions, an
nsqd without TLS) must be met with the documented outcome, not merely within the deadline.

After every step: only ``smartnsq.errors`` exceptions escaped, each naming its field, topic or
peer; every call ended within its timeout plus ``world.SLACK``; no FIN of a message whose
handler had not returned. At the end of each run: every acknowledged publish was handled, the
ordered topic's keys kept their order, and no task, socket or thread was left after close.

The seed is fixed (``derandomize``): the same runs every time; ``bench/fuzz.py`` is the long,
seeded-by-choice run.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from world import (
    BAD_INPUTS,
    FAULTS,
    HANDLERS,
    HEADERS,
    HOSTILE,
    HOSTILE_CALLS,
    KEYS,
    PARTITIONS,
    PINS,
    PUBLISH_KINDS,
    TIMEOUTS,
    TOPICS,
    WRONG_PEERS,
    World,
)


class PublicAPI(RuleBasedStateMachine):
    """One dev cluster per run; rules are public calls and faults."""

    def __init__(self) -> None:
        super().__init__()
        self.world = World()

    @rule(kind=st.sampled_from(PUBLISH_KINDS), topic=st.sampled_from(TOPICS),
          pin=st.sampled_from(PINS), key=st.sampled_from(KEYS),
          partition=st.integers(0, PARTITIONS - 1), traced=st.booleans(),
          headers=st.sampled_from(HEADERS), timeout=st.sampled_from(TIMEOUTS))
    def publish(self, kind: str, topic: str, pin: str, key: str, partition: int,
                traced: bool, headers: bool, timeout: float) -> None:
        self.world.publish(kind, topic, pin, key, partition, traced, headers, timeout)

    @rule(topic=st.sampled_from(TOPICS), timeout=st.sampled_from(TIMEOUTS),
          sync=st.booleans())
    def routes(self, topic: str, timeout: float, sync: bool) -> None:
        self.world.routes(topic, timeout, sync)

    @rule(kind=st.sampled_from(FAULTS), node=st.integers(0, 2),
          topic=st.sampled_from(TOPICS), partition=st.integers(0, PARTITIONS - 1))
    def fault(self, kind: str, node: int, topic: str, partition: int) -> None:
        self.world.fault(kind, node, topic, partition)

    @rule(peer=st.sampled_from(HOSTILE), call=st.sampled_from(HOSTILE_CALLS),
          timeout=st.sampled_from((0.05, 0.5, 1.0)))
    def hostile(self, peer: str, call: str, timeout: float) -> None:
        self.world.hostile(peer, call, timeout)

    @rule(topic=st.sampled_from(TOPICS), partition=st.integers(0, PARTITIONS - 1),
          sync=st.booleans())
    def publish_unwritable(self, topic: str, partition: int, sync: bool) -> None:
        self.world.publish_unwritable(topic, partition, sync)

    @rule(case=st.sampled_from(WRONG_PEERS))
    def wrong_peer(self, case: str) -> None:
        self.world.wrong_peer(case)

    @rule(case=st.sampled_from(BAD_INPUTS))
    def bad_input(self, case: str) -> None:
        self.world.bad_input(case)

    @rule(topic=st.sampled_from(TOPICS), mode=st.sampled_from(HANDLERS), sync=st.booleans())
    def consumer_start(self, topic: str, mode: str, sync: bool) -> None:
        self.world.consumer_start(topic, mode, sync)

    @precondition(lambda self: bool(self.world.consumers))
    @rule(index=st.integers(0, 1), timeout=st.sampled_from((0.5, 2.0)))
    def consumer_close(self, index: int, timeout: float) -> None:
        self.world.consumer_close(index, timeout)

    @invariant()
    def nothing_broken_yet(self) -> None:
        assert self.world.check_now() == []

    def teardown(self) -> None:
        violations = self.world.finish()
        print(self.world.counts.format())
        for sample in self.world.counts.samples.values():
            print("  e.g.", sample)
        assert violations == []


PublicAPI.TestCase.settings = settings(
    max_examples=6, stateful_step_count=50, deadline=None, derandomize=True, database=None,
    # no shrinking: it replays a failing run dozens of times (minutes against a cluster); the
    # failure shows the whole sequence and the violation's own text instead
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=list(HealthCheck))
test_public_api_under_faults = PublicAPI.TestCase
