"""What one consumer's parts share: the links, the subscriptions, the workers and the
snapshot all read and count into one :class:`Runtime`, handed to each explicitly (no globals,
no back-references to the Consumer)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..message import Message, Responder
from ..observability.counters import ConsumeMeter
from .config import ConsumerConfig

if TYPE_CHECKING:
    from .deadletter import DeadLetters
    from .dispatch import Dispatch
    from .flow import Flow

__all__ = ["Runtime"]

log = logging.getLogger("smartnsq.consumer")


class Runtime:
    """What one consumer's links, subscriptions and workers share, handed to each explicitly:
    the configuration, the loop, the dispatch queue and flow control, run-time switches and
    the counters ``Consumer.stats()`` reports."""

    __slots__ = (
        "auto_finish",
        "channel",
        "concurrency",
        "config",
        "dead_letters",
        "discarded",
        "draining",
        "finished",
        "flow",
        "give_ups",
        "handled_queued",
        "handler_errors",
        "idle_waiter",
        "in_flight",
        "inline_handled",
        "loop",
        "loop_thread_id",
        "lost_answers",
        "meter",
        "order_errors",
        "queue",
        "requeued",
        "run_now",
        "suspended",
        "topic",
        "trace",
        "undecodable",
        "undecoded",
    )

    def __init__(self, topic: str, channel: str, config: ConsumerConfig) -> None:
        self.topic = topic
        self.channel = channel
        self.config = config
        self.auto_finish = config.auto_finish
        self.trace: bool | None = config.trace
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.loop_thread_id = -1
        self.queue: Dispatch = None  # type: ignore[assignment]
        self.flow: Flow = None  # type: ignore[assignment]
        self.draining = False  # RDY 0 went out: what still arrives is given straight back
        # a plain-function handler, run from data_received when a slot is free and nothing is
        # queued ahead (handling.inline_runner); None: every message goes through the queue
        self.run_now: Callable[[Message, Responder], None] | None = None
        self.concurrency = 0
        # workers of a plain-function handler suspended on the awaitable it returned (or on
        # a give-up hook): the slots in use while the loop runs other things
        self.suspended = 0
        self.idle_waiter: asyncio.Future[None] | None = None  # close(): in_flight reached 0
        self.in_flight = 0
        self.finished = 0
        self.requeued = 0
        self.handled_queued = 0  # by the workers and async for (the inline runner: below)
        # the inline runner's count, derived from its sample countdown (inline_runner)
        self.inline_handled: Callable[[], int] = _none
        self.handler_errors = 0
        self.give_ups = 0
        self.order_errors = 0
        self.lost_answers = 0  # answers given after their connection closed
        self.discarded = 0  # received on a link that closed before a handler started
        # messages whose compressed body could not be decoded, until a worker settles them
        # (empty but for them: the workers' test of it costs one truth test per message)
        self.undecoded: set[Message] = set()
        self.undecodable = 0  # deliveries of such messages
        # dead_letter's producer or hook and the last errors it reports (None: not asked for)
        self.dead_letters: DeadLetters | None = None
        self.meter = ConsumeMeter()  # per partition, for Consumer.stats() (observability.stats)

    @property
    def handled(self) -> int:
        """Handlers that returned, plus messages iterated with ``async for``: the workers'
        count and the inline runner's, which it derives from its sample countdown instead of
        counting every call (one increment fewer per message)."""
        return self.handled_queued + self.inline_handled()

    @property
    def received(self) -> int:
        """Messages delivered: the partitions' counts summed (each delivery is counted once,
        on its partition, for ``Consumer.stats()``)."""
        return sum(counts.received for counts in list(self.meter.parts.values()))

    def requeue_delay(self, msg: Message) -> float:
        return float(self.config.requeue_policy.delay(msg.attempts))

    def order_error(self, msg: Message, what: str) -> None:
        self.order_errors += 1
        log.error("%s", what)
        hook = self.config.on_order_error
        if hook is not None:
            try:
                hook(msg, what)
            except Exception:
                log.exception("on_order_error failed")

    def check_idle(self) -> None:
        """Wake ``close()`` once nothing is in flight any more."""
        if self.in_flight == 0 and self.idle_waiter is not None:
            waiter, self.idle_waiter = self.idle_waiter, None
            if not waiter.done():
                waiter.set_result(None)


def _none() -> int:
    return 0
