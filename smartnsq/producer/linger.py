"""Opt-in batching (``ProducerConfig.linger``): single publishes to one partition, made within
``linger`` seconds of each other, sent as one MPUB, each caller keeping its own result.

Only plain publishes linger (no headers, trace id, delay or receipt): an MPUB's answer is one
``OK`` for the batch, so there is nothing per message a batch could not give back; and only
those with a timeout of at least ``LINGER_TIMEOUTS`` lingers (see below). A batch is
bounded (``MAX_BATCH`` messages and the producer's ``max_body_size``); it goes out when its
timer fires, when it is full, when its connection changes or when the producer closes. If the
MPUB fails, every message of it fails the way its own PUB would have and is retried on its
own (by ``publish()``'s retry loop), so no message is lost or acknowledged twice by the batch.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..transport.connection import Connection
    from .request import NowaitRequest

__all__ = ["LINGER_TIMEOUTS", "MAX_BATCH", "Batch"]

MAX_BATCH = 1000  # messages per lingering batch (a bound, whatever the bodies' sizes)
# a publish lingers only when its timeout is at least this many lingers: its batch's MPUB then
# goes out with far more than ``retry.least_time`` left, and no call outlives its timeout by
# waiting for its batch
LINGER_TIMEOUTS = 20


class Batch:
    """The lingering publishes of one (topic, partition) on one connection, and the answer
    slot their MPUB settles: the connection hands the one answer to every message."""

    __slots__ = ("answered", "conn", "deadline", "requests", "size", "timer")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.requests: list[NowaitRequest] = []
        self.size = 4  # the MPUB body: the message count, then each message's size + bytes
        self.deadline = float("inf")  # the earliest of its messages' deadlines
        self.timer: asyncio.TimerHandle | None = None
        self.answered = False

    def fits(self, body: bytes, max_body: int) -> bool:
        return len(self.requests) < MAX_BATCH and self.size + 4 + len(body) <= max_body

    def add(self, request: NowaitRequest) -> None:
        self.requests.append(request)
        self.size += 4 + len(request.body)
        if request.deadline < self.deadline:
            self.deadline = request.deadline

    # -- the connection's answer slot ------------------------------------------------------

    def done(self) -> bool:
        return self.answered

    def set_result(self, answer: bytes, /) -> None:
        self.answered = True
        for request in self.requests:
            request.set_result(answer)

    def set_exception(self, error: BaseException, /) -> None:
        self.answered = True
        for request in self.requests:
            request.set_exception(error)
