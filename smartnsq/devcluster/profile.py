"""How long each fault of the dev cluster lasts: a :class:`FaultProfile`.

A real youzan cluster does not fail instantly: a killed nsqd leaves its partitions leaderless
until etcd's session expires, a replica loss stalls writes on the surviving leaders, a new topic
waits for the lookupd's cluster check. Those durations were measured on real servers
(``docs/devcluster.md``, "Real failure modes, on a clock") and are the :data:`REALISTIC`
profile. Tests want the same *sequence* in a fraction of the time: :meth:`FaultProfile.scaled`
multiplies every duration.
:data:`OFF` (the default) keeps the dev cluster as fast as it always was: failovers, handoffs and
topic creation take no time.

A duration is a ``(low, high)`` span in seconds: the real figures are ranges, and the fault
clock picks each occurrence from its span with a seeded random generator, so a run is
reproducible. ``(x, x)`` is a fixed duration.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from .nsqd.options import first_twice_mode

__all__ = ["OFF", "PROFILES", "REALISTIC", "FaultProfile", "Span", "profile_named"]

Span = tuple[float, float]

_SPANS = ("leaderless_window", "elect_not_writable", "replica_stall", "isr_shrink",
          "replica_catchup", "leave_handoff", "leave_slow_handoff", "leave_stall",
          "check_delay", "check_min_spacing", "check_interval", "leader_ready_delay",
          "create_resend")


@dataclass(frozen=True)
class FaultProfile:
    """Every fault duration of a dev cluster (seconds, before ``scale``).

    Node loss (``DevCluster.kill_node``): the partitions the node led stay leaderless for
    ``leaderless_window``, then a replica is elected and answers ``E_FAILED_ON_NOT_WRITABLE``
    for ``elect_not_writable``; a partition whose live leader had a replica on the node answers
    no PUB for ``replica_stall``, then ``E_FAILED_ON_NOT_WRITABLE`` until ``isr_shrink``
    (counted from the kill). A partition left with fewer in-sync replicas than a write quorum
    (``replica // 2 + 1``) stays unwritable until a spare node has caught up, at
    ``replica_catchup`` after the kill.

    Graceful leave (``DevCluster.leave_node``): each partition it led moves after
    ``leave_handoff``, its second one after ``leave_slow_handoff``, and one partition whose leader
    stays up stalls for ``leave_stall``.

    Topic creation: with ``slow_creation`` a ``/topic/create`` is acted on by the next cluster
    check: one runs ``check_delay`` after a create (or a re-sent create) unless the last one ran
    less than ``check_min_spacing`` ago, and one runs every ``check_interval`` anyway. A checked
    partition's leader is listed by read lookups at once but serves (answers ``/channel/create``)
    only ``leader_ready_delay`` later. ``DevCluster.create_topic`` re-sends every
    ``create_resend``, as an operator of a real cluster does.

    ``ordered_first_delivery_twice`` turns on the nsqd behaviour of the same name (the first
    ``SUB_ORDERED`` of a channel with a backlog delivers its first message twice) where the
    nsqd implementation has it: ``True`` or a mode of ``NsqdOptions`` (``"before"``,
    ``"after"``, ``"both"``, ``"reset"``, ``"random"``: where the copy falls against the
    original's FIN).
    ``seed`` seeds the picks from the spans.
    """

    name: str = "off"
    leaderless_window: Span = (0.0, 0.0)
    elect_not_writable: Span = (0.0, 0.0)
    replica_stall: Span = (0.0, 0.0)
    isr_shrink: Span = (0.0, 0.0)
    replica_catchup: Span = (0.0, 0.0)
    leave_handoff: Span = (0.0, 0.0)
    leave_slow_handoff: Span = (0.0, 0.0)
    leave_stall: Span = (0.0, 0.0)
    slow_creation: bool = False
    check_delay: Span = (0.0, 0.0)
    check_min_spacing: Span = (0.0, 0.0)
    check_interval: Span = (0.0, 0.0)
    leader_ready_delay: Span = (0.0, 0.0)
    create_resend: Span = (0.0, 0.0)
    ordered_first_delivery_twice: bool | str = False
    scale: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, not {self.scale!r}")
        first_twice_mode(self.ordered_first_delivery_twice)  # a ValueError names the modes
        for name in _SPANS:
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} must be a span 0 <= low <= high, not {(low, high)!r}")

    def scaled(self, scale: float) -> FaultProfile:
        """The same profile with every duration multiplied by ``scale`` (0.01: 100x faster)."""
        return dataclasses.replace(self, scale=scale)

    def seconds(self, name: str, rng: random.Random | None = None) -> float:
        """One occurrence of the span ``name``, scaled (the span's middle without ``rng``)."""
        low, high = getattr(self, name)
        value = (low + high) / 2 if rng is None else rng.uniform(low, high)
        return float(value * self.scale)

    def longest(self, name: str) -> float:
        """The scaled upper end of a span (for deadlines: the worst this fault can last)."""
        return float(getattr(self, name)[1] * self.scale)

    def nsqd_options(self) -> dict[str, Any]:
        """The nsqd options this profile turns on (``NsqdOptions`` fields)."""
        if self.ordered_first_delivery_twice:
            return {"ordered_first_delivery_twice": self.ordered_first_delivery_twice}
        return {}

    def describe(self) -> dict[str, Any]:
        """Every field, spans already scaled (what the admin endpoint shows)."""
        out: dict[str, Any] = dataclasses.asdict(self)
        for name in _SPANS:
            low, high = getattr(self, name)
            out[name] = [low * self.scale, high * self.scale]
        return out


OFF = FaultProfile()
"""Today's fast dev cluster: every fault takes no time, topics are usable at once."""

REALISTIC = FaultProfile(
    name="realistic",
    leaderless_window=(21.0, 49.0),     # SIGKILL: etcd session expiry, then election
    elect_not_writable=(0.3, 0.3),      # new leader: NOT_WRITABLE 21.406 -> OK 21.738 (p1r3)
    replica_stall=(12.0, 12.0),         # live leader, replica lost: PUB unanswered ~12 s
    isr_shrink=(22.0, 49.0),            # ... then NOT_WRITABLE until the ISR shrinks
    replica_catchup=(93.0, 139.0),      # below write quorum: writable once a spare caught up
    leave_handoff=(0.07, 0.33),         # SIGTERM: leadership moves in 0.07-0.33 s
    leave_slow_handoff=(1.3, 4.1),      # ... the second partition took 1.3-4.1 s
    leave_stall=(3.1, 3.1),             # ... and a live-leader partition stalled 3.1 s
    slow_creation=True,
    check_delay=(0.5, 0.5),             # a re-sent create: usable within about 1 s
    check_min_spacing=(6.0, 6.0),       # creation checks closer than ~6 s are ignored
    check_interval=(60.0, 120.0),       # otherwise the periodic check: 60-120 s
    leader_ready_delay=(0.5, 0.5),      # read lookups list a leader that is not serving yet
    create_resend=(6.0, 6.0),           # re-sending every ~5-7 s made topics usable in 1-10 s
    # the copy before the original's FIN (not in flight) in most channels, after it (in
    # flight: a 60 s stall when unanswered) or both in others: picked per channel
    ordered_first_delivery_twice="random",
)
"""The real youzan 0.3.7-HA.1.13.0 cluster's measured figures (a loaded 2-core machine)."""

PROFILES = {"off": OFF, "realistic": REALISTIC}


def profile_named(name: str, scale: float = 1.0, seed: int = 0) -> FaultProfile:
    """``"off"`` or ``"realistic"``, at ``scale``; a ValueError names the known ones."""
    try:
        base = PROFILES[name]
    except KeyError:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, not {name!r}") from None
    return dataclasses.replace(base, scale=scale, seed=seed)
