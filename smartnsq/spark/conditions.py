"""The conditions the connector waits out: which are transient, the wait, and their one line.

Apart from ``cluster`` because the planner, the executors' leader wait (:class:`LeaderWait`)
and the final ``PartitionUnavailable`` all judge and describe conditions the same way, and
one of them needs naming
with care: youzan's nsqd refuses every consumption step (``/channel/setoffset``, SUB) of a
partition whose leader is not ready to serve reads, a new leader after a failover and the
leaders whose replica set is changing, with HTTP 500 ``ErrType:7 ErrCode:0 : Consume is
disabled currently``, for minutes after a node's death or leave (``bench/leader_loss.py``),
while its lookup and its ``/stats`` already name it leader. Called "no usable leader" or
"does not lead", that looks like an election that never ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ..errors import (
    AdminError,
    ClusterError,
    ConnectionFailed,
    LookupFailed,
    PartitionUnavailable,
    ServerError,
    Timeout,
)
from ..model.failover import LEADER_WAIT_FIRST, leader_wait

__all__ = ["CONSUME_DISABLED", "LeaderWait", "condition_of", "consumption_disabled",
           "is_transient"]

log = logging.getLogger("smartnsq.spark")

CONSUME_DISABLED = "consume is disabled"
"""The refusal's text, lower case (the server says "Consume is disabled currently")."""


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def consumption_disabled(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is nsqd's "Consume is disabled" refusal."""
    return any(CONSUME_DISABLED in str(e).lower() for e in _causes(exc))


def condition_of(exc: BaseException, whose: str = "its leader") -> str:
    """A short, one-line description of a transient condition (for the final error).

    nsqd's "Consume is disabled" refusal is named as such, with what the server answered
    (``whose`` says which leader: the planner knows when it is a new one)."""
    if consumption_disabled(exc):
        for cause in _causes(exc):
            if isinstance(cause, AdminError) and CONSUME_DISABLED in cause.message.lower():
                what = cause.what.removeprefix("nsqd ") or "a request"
                return (f"consumption disabled on {whose} (nsqd {cause.address} answered "
                        f"{what} with HTTP {cause.status}: {cause.message})")[:400]
            if isinstance(cause, ServerError):
                return (f"consumption disabled on {whose} (nsqd answered {cause.code}: "
                        f"{cause.text})")[:400]
        first = next(e for e in _causes(exc) if CONSUME_DISABLED in str(e).lower())
        return f"consumption disabled on {whose} (nsqd answered: {_line(first)})"[:400]
    return _line(exc)[:300]


def _line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


_TRANSIENT_CODES = ("E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE", "E_TOPIC_NOT_EXIST")

def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a cluster condition that waiting for a leader can clear."""
    if consumption_disabled(exc):
        return True
    if isinstance(exc, ClusterError):
        return exc.transient
    if isinstance(exc, AdminError):
        return exc.retriable
    if isinstance(exc, ServerError):
        return exc.code in _TRANSIENT_CODES
    if isinstance(exc, LookupFailed):  # not a missing topic, nor a port that is no lookupd
        return exc.retriable
    return isinstance(exc, (ConnectionFailed, Timeout, OSError))


class LeaderWait:
    """Retries a partition's transient conditions until ``timeout`` s have passed.

    One per partition and operation: ``failed(exc)`` sleeps a growing back-off and returns
    when the caller should try again, or raises :class:`PartitionUnavailable` (or ``exc``
    itself, when it is not transient) once the time is up. ``progressed()`` restarts the
    clock: a read that moved forward between two failures is not stuck. The timing is
    :func:`smartnsq.model.failover.leader_wait`'s; this is its blocking shell.
    """

    def __init__(self, topic: str, partition: int | None, timeout: float) -> None:
        self.topic = topic
        self.partition = partition
        self.timeout = timeout
        self._since: float | None = None
        self._delay = LEADER_WAIT_FIRST

    def progressed(self) -> None:
        self._since = None
        self._delay = LEADER_WAIT_FIRST

    def failed(self, exc: BaseException) -> None:
        if not is_transient(exc):
            raise exc
        if self._since is None:
            log.warning("%s/%s: %s; waiting for a leader (up to %gs)", self.topic,
                        self.partition, condition_of(exc), self.timeout)
        step, waited = leader_wait(self._since, time.monotonic(), self._delay, self.timeout)
        self._since = step.since
        if step.sleep is None:
            raise PartitionUnavailable(self.topic, self.partition, condition_of(exc),
                                       waited) from exc
        time.sleep(step.sleep)
        self._delay = step.next_delay
