"""How healthy each lookupd is, and which to ask next: pure bookkeeping with time passed in.

A lookupd that fails (refused, timed out, 5xx, malformed) is skipped for a back-off that
doubles per consecutive failure (``backoff`` .. ``backoff_max``, jittered), then asked again
by the next round; one success restores it. One that answers after its round has gone on is
*slow* and asked after the healthy ones. A discovered (non-seed) lookupd failing
``forget_after`` times in a row is forgotten until a ``/listlookup`` names it again.
:func:`targets` ranks who to ask now; the lookup manager's set of lookupds
(:mod:`smartnsq.discovery.lookupds`) does the asking and the racing
(:mod:`smartnsq.discovery.race`) and records outcomes here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .backoff import exponential_delay

__all__ = ["LookupdHealth", "LookupdStatus", "http_url", "targets"]


def http_url(address: str, path: str = "") -> str:
    """The URL of ``path`` on an HTTP address as :func:`smartnsq.discovery.lookup.normalize_lookupd`
    returns it: ``https://host:port/path`` when it kept an https scheme,
    ``http://host:port/path`` otherwise."""
    base = address if address.startswith("https://") else f"http://{address}"
    return f"{base}{path}"


@dataclass(frozen=True)
class LookupdStatus:
    """One lookupd's health as the manager sees it (a snapshot; see
    :meth:`smartnsq.discovery.lookup.LookupManager.health`)."""

    address: str
    seed: bool
    classic: bool | None
    failures: int
    retry_in: float
    requests: int
    errors: int
    last_error: str
    state: str = "unknown"
    """What it last was: ``ok``, ``slow`` (answered after its round had gone on),
    ``timeout`` (no whole answer within ``timeout``), ``refused`` (no connection),
    ``malformed`` (an answer too large, not JSON, or breaking the bounds), ``tls``
    (certificate refused), ``error`` (an error status), ``unknown`` (not asked yet)."""
    slow: int = 0
    """Answers that came after their round had gone on without them."""


class LookupdHealth:
    """One lookupd's record: its failures and when it may be asked again."""

    __slots__ = ("address", "classic", "errors", "failures", "last_error", "requests",
                 "retry_at", "seed", "slow", "slow_streak", "state")

    def __init__(self, address: str, seed: bool) -> None:
        self.address = address
        self.seed = seed
        self.classic: bool | None = None
        self.failures = 0
        self.retry_at = 0.0
        self.requests = 0
        self.errors = 0
        self.last_error = ""
        self.state = "unknown"
        self.slow = 0
        self.slow_streak = 0

    @property
    def url(self) -> str:
        return http_url(self.address)

    def sibling(self, address: str) -> str:
        """How to reach a lookupd this one listed: over TLS if this one is."""
        return f"https://{address}" if self.address.startswith("https://") else address

    def succeeded(self) -> int:
        """It answered: healthy again. Returns the failures in a row it had before."""
        before = self.failures
        self.failures = 0
        self.retry_at = 0.0
        self.state = "ok"
        self.slow_streak = 0
        return before

    def failed(self, now: float, error: str, state: str, backoff: float, backoff_max: float,
               rng: random.Random | None = None) -> float:
        """It failed at ``now`` (``state``: how): skip it for a back-off doubling per failure
        in a row; returns that back-off."""
        self.failures += 1
        self.errors += 1
        self.last_error = error
        self.state = state
        delay = exponential_delay(backoff, backoff_max, self.failures, 0.2, rng)
        self.retry_at = now + delay
        return delay

    def answered_late(self) -> int:
        """It answered after its round had gone on; returns how many times in a row."""
        self.slow += 1
        self.slow_streak += 1
        self.state = "slow"
        return self.slow_streak

    def forgettable(self, forget_after: int) -> bool:
        """A discovered lookupd failing ``forget_after`` times in a row (seeds never are)."""
        return not self.seed and self.failures >= forget_after

    def status(self, now: float) -> LookupdStatus:
        return LookupdStatus(self.address, self.seed, self.classic, self.failures,
                             max(self.retry_at - now, 0.0), self.requests, self.errors,
                             self.last_error, self.state, self.slow)


def targets(known: list[LookupdHealth], now: float) -> list[LookupdHealth]:
    """Lookupds to ask at ``now``: every one due (fewest failures, then fewest late answers,
    seeds before discovered ones), else the one due soonest, never none (when ``known`` is
    not empty)."""
    ready = [d for d in known if d.retry_at <= now]
    if not ready and known:
        ready = [min(known, key=lambda d: d.retry_at)]
    ready.sort(key=lambda d: (d.failures, d.slow_streak, not d.seed))
    return ready
