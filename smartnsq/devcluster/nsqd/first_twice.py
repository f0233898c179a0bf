"""The real server's duplicated first ordered delivery, as a dev channel reproduces it.

On the first ``SUB_ORDERED`` of a channel with a backlog the real youzan nsqd delivers the
first message twice (same id, same attempts, even with RDY 1): ``SetOrdered`` resets the
channel's reader asynchronously, so the first message is read twice (``docs/devcluster.md``,
"Real failure modes, on a clock").
nsqd records a message in flight before writing it and writes it even when the id is in
flight already, so where the copy falls against the consumer's answer decides which of the
two is in flight. The modes (``NsqdOptions.ordered_first_delivery_twice``):

* ``before``: right behind the original, while that is in flight: the copy is not in flight
  and its FIN fails with ``E_FIN_FAILED``;
* ``after``: once the original's FIN or REQ was accepted: the copy *is* in flight (its FIN
  succeeds; unanswered it holds the ordered channel until ``msg_timeout`` and comes back
  with ``attempts + 1``);
* ``both``: one copy of each kind;
* ``reset``: the reset drops the original from flight before the consumer's answer comes, so
  that answer is refused, and only then does the copy go out, in flight (seen once in about
  a hundred drains on the real cluster);
* ``random``: one of the four, picked per channel (seeded by its identity).

The channel calls in at each step (:class:`FirstTwice`); nothing here runs per message once
the copy went out.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Protocol

__all__ = ["FirstTwice"]

_PICKS = ("before", "after", "both", "reset")


class Entry(Protocol):
    """A delivery (``channels.Entry``): its stored message, with ``internal_id``."""

    msg: Any


class Consumer(Protocol):
    """What is needed of a subscribed connection (``channels.Consumer``)."""

    in_flight: dict[int, Any]
    msg_timeout: float

    def deliver(self, entry: Any) -> None: ...


class Channel(Protocol):
    """What is needed of the channel (``channels.Channel``)."""

    partition: Any
    name: str
    in_flight: int

    def send_copy(self, entry: Any) -> None: ...


class FirstTwice:
    """One channel's duplicated first delivery: due, then where its copy stands."""

    __slots__ = ("_timer", "channel", "due", "late", "mode", "reset", "seen")

    def __init__(self, channel: Channel, mode: str) -> None:
        self.channel = channel
        self.mode = mode  # "" (off) or a FIRST_TWICE_MODES value
        self.seen = False  # a SUB_ORDERED came: only the first one duplicates
        self.due = ""  # the next delivery is duplicated this way
        self.late: Entry | None = None  # delivered; its copy follows its FIN (or REQ)
        self.reset: tuple[Consumer, Entry] | None = None  # dropped; copy after the refusal
        self._timer: asyncio.TimerHandle | None = None

    def sub_ordered(self, backlog: bool) -> None:
        """A ``SUB_ORDERED`` on the channel (``backlog``: it has messages waiting)."""
        if self.mode and not self.seen and backlog:
            mode = self.mode
            if mode == "random":
                # seeded by the channel's identity: a given topic/partition/channel behaves the
                # same in every run, the partitions of a topic differ
                p = self.channel.partition
                mode = random.Random(f"{p.topic}/{p.partition}/{self.channel.name}").choice(
                    _PICKS)
            self.due = mode
        self.seen = True

    def sent(self, consumer: Consumer, entry: Entry, loop: asyncio.AbstractEventLoop) -> None:
        """``entry`` was just delivered to ``consumer`` (and put in its flight)."""
        due, self.due = self.due, ""
        if due == "reset":
            # out of the consumer's flight (its answer will be refused), still holding the
            # ordered channel (its in-flight count) until the copy goes out
            del consumer.in_flight[entry.msg.internal_id]
            self.reset = (consumer, entry)
            self._timer = loop.call_later(consumer.msg_timeout, self._release)
            return
        if due != "after":
            consumer.deliver(entry)  # the copy: same id and attempts, not in flight
        if due != "before":
            self.late = entry  # another copy once this one's answer is accepted

    def taken(self, entry: Entry) -> None:
        """``entry`` left flight (FIN, REQ, timeout): a late copy goes out now."""
        if entry is self.late:
            self.late = None
            self.channel.send_copy(entry)

    def refused(self, consumer: Consumer, key: int) -> None:
        """An answer of ``consumer``'s for a message not in its flight: the reset's?"""
        held = self.reset
        if held is not None and held[0] is consumer and held[1].msg.internal_id == key:
            self._release()

    def gone(self, consumer: Consumer) -> None:
        if self.reset is not None and self.reset[0] is consumer:
            self._release()

    def clear(self) -> None:
        """The channel was reset or closed: no copy is due any more."""
        self.late = None
        if self.reset is not None:
            self.reset = None
            self.channel.in_flight -= 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _release(self) -> None:
        """The ``reset`` copy goes out: after the consumer's answer to the original was refused,
        when the consumer went, or ``msg_timeout`` after the original if it never answered."""
        if self.reset is None:
            return
        _, entry = self.reset
        self.reset = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.channel.in_flight -= 1
        self.channel.send_copy(entry)
