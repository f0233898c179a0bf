"""The one retry decision of every publish call: after a failed attempt, what next?

``publish``, ``publish_nowait`` (its fast-path answer and its slow path) and ``publish_many``
all ask :func:`decide`; it is a plain function of the failure (its class and flags, and the
stage it happened at), the attempt count, the time left before the call's deadline, whether
the message is pinned to a partition and whether the producer is closing. Time and randomness
are inputs, so every branch is unit-tested.

The rules (``smartnsq.errors`` gives each server error its action):

=====================================  ===================================================
failure                                next
=====================================  ===================================================
``GIVE_UP`` server error, bad input,   give up with that error
unknown topic, any error whose
``retriable`` flag is false, anything
unexpected
``E_FAILED_ON_NOT_WRITABLE`` for a     refresh lookup, then probe the same leader again
pinned message                         at the partition's next probe turn (per partition
                                       ``retry_delay`` apart at first, then further apart
                                       per refusal up to 1 s; the first success wakes the
                                       rest): the leader knows first
``E_TOPIC_NOT_EXIST`` after a publish  ask lookup first (``check_topic``): gone, or no
                                       lookup to ask (``nsqd=``: the node is the authority),
                                       gives up with ``TopicNotFound`` (:func:`topic_gone`);
                                       listed (being created, moving) or silent: as below
``REFRESH_AND_RETRY`` server error;    refresh lookup, retry after a back-off that a route
no leader for the target               change ends early
``RETRY`` server error; lookup failed  retry after a back-off (a route change ends it)
node backing off after a failed        retry after the node's back-off, or at once when the
connect                                routes change (a leader that left is replaced by one
                                       that answers; the same node is dialled earlier only
                                       if it reappears in the routes)
connect failed                         retry after a back-off; give up at once when the
                                       certificate does not verify (``incurable``)
connection lost under the request      the first time: retry now (on a fresh connection);
                                       then after a back-off
request timed out (no answer: a        refresh lookup, retry after a back-off (a stall
stalled partition)                     ends in a retriable error, never a re-route)
producer closing                       give up: nothing new goes on the wire
=====================================  ===================================================

Whatever the rule, no attempt is decided with no time left: past the deadline the decision is
to give up with ``Timeout``, caused by the failure (and no retry is sent with less than
``least_time`` left); a back-off longer than the time left is cut
to it (a route change may still end it early enough). Back-offs start at ``retry_delay``,
double per attempt up to ``retry_delay_max`` and are jittered (``exponential_delay``).
A pinned message (sharding key or explicit partition) keeps its partition on every retry.
"""

from __future__ import annotations

import enum
import random
import ssl

from ..errors import (
    Action,
    ConnectionFailed,
    LookupFailed,
    NodeBackoff,
    NoLeader,
    NSQError,
    ProducerClosed,
    ServerError,
    Timeout,
    TopicNotFound,
)
from ..model.backoff import exponential_delay

NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"

__all__ = [
    "CONNECT",
    "NOT_WRITABLE",
    "ROUTE",
    "SEND",
    "TOPIC_NOT_EXIST",
    "Decision",
    "Lookup",
    "Next",
    "Stage",
    "answer_deadline",
    "decide",
    "incurable",
    "least_time",
    "missing_topic",
    "topic_gone",
]


class Stage(enum.Enum):
    """How far the failed attempt got."""

    ROUTE = "route"  # looking the topic up, choosing the target
    CONNECT = "connect"  # opening the target's connection
    SEND = "send"  # written; waiting for the answer


# the members as plain module constants: an Enum member lookup costs a metaclass call (about
# 0.3 us on CPython 3.11), which the publish fast path would pay twice per message
ROUTE, CONNECT, SEND = Stage.ROUTE, Stage.CONNECT, Stage.SEND


class Next(enum.Enum):
    RETRY_NOW = "retry now"
    RETRY_AFTER = "retry after a back-off"
    REFRESH_AND_RETRY = "refresh lookup, then retry after a back-off"
    GIVE_UP = "give up"


class Decision:
    """What to do after a failed attempt.

    ``delay``: how long to wait at most (a route change of the topic ends the wait early);
    ``keep_partition``: the retry goes to the same partition; ``probe``: the partition's
    leader refused the write for now, so the retry takes the partition's next probe turn
    (``RouteBook.probe_delay``) when one is free within ``delay``, and wakes when another
    publish to it succeeds; ``check_topic``: the node has no such topic, so before retrying
    the caller asks lookup whether the topic still exists (:func:`topic_gone` decides from
    the answer): a deleted topic must not cost the call its whole deadline; ``error``: what
    to raise when giving up (its ``__cause__`` already set when it wraps the failure).
    """

    __slots__ = ("check_topic", "delay", "error", "keep_partition", "next", "probe")

    def __init__(self, next: Next, delay: float = 0.0, *, keep_partition: bool = False,
                 probe: bool = False, error: BaseException | None = None) -> None:
        self.next = next
        self.delay = delay
        self.keep_partition = keep_partition
        self.probe = probe
        self.check_topic = False
        self.error = error

    def __repr__(self) -> str:
        return (f"Decision({self.next.name}, delay={self.delay:.3f}, "
                f"keep_partition={self.keep_partition}, probe={self.probe}, "
                f"check_topic={self.check_topic}, error={self.error!r})")


def _give_up(error: BaseException) -> Decision:
    return Decision(Next.GIVE_UP, error=error)


def timed_out(topic: str, timeout: float, error: BaseException) -> Timeout:
    """The call's ``Timeout``, caused by its last failure."""
    exc = Timeout(f"publish to {topic!r} not acknowledged within {timeout:g}s; "
                  f"last error: {error}")
    exc.__cause__ = error
    return exc


def answer_deadline(deadline: float, now: float, request_timeout: float | None) -> float:
    """Until when an attempt written at ``now`` waits for its answer (loop clock): the call's
    ``deadline``, or ``request_timeout`` after ``now`` when that comes first.

    The one place a publish's time is cut to the connection's ``request_timeout``: the first
    attempt, every retry and a lingering batch all go through it, and the connection is given
    this deadline rather than deriving its own. At or before ``now``: no time is left and
    nothing may be sent.
    """
    if request_timeout is not None and now + request_timeout < deadline:
        return now + request_timeout
    return deadline


def least_time(timeout: float) -> float:
    """The least time left worth a retry: a tenth of the call's timeout, at most 0.1 s.

    A retry sent with a few milliseconds left times out before any answer can come back, and a
    request unanswered for twice its own (tiny) timeout makes the connection deem itself dead,
    closing a healthy connection every other partition shares. Probe turns and back-offs
    often end just before a deadline, so the call gives up with ``Timeout`` there instead.
    """
    return min(0.1, timeout / 10)


def incurable(error: BaseException) -> bool:
    """A connect failure no retry can cure: the server's certificate does not verify (or the
    error says it is not retriable). Retrying it would only turn it into a ``Timeout`` at the
    deadline, hiding the cause."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, ssl.SSLCertVerificationError) \
                or getattr(exc, "retriable", True) is False:
            return True
        todo += [exc.__cause__, exc.__context__, getattr(exc, "cause", None)]
    return False


def decide(error: BaseException, stage: Stage, attempt: int, time_left: float, *,
           pinned: bool, closing: bool, topic: str, timeout: float, retry_delay: float,
           retry_delay_max: float, rng: random.Random | None = None) -> Decision:
    """The decision after attempt number ``attempt`` (1 for the first) failed with ``error``.

    ``time_left``: seconds to the call's deadline (<= 0: none); ``pinned``: the message must
    stay in its partition; ``closing``: the producer's close() has begun.
    """
    decision = _by_failure(error, stage, attempt, retry_delay, retry_delay_max, rng)
    if decision.next is Next.GIVE_UP:
        return decision
    if closing:
        closed = ProducerClosed("the producer is closed")
        closed.__cause__ = error
        return _give_up(closed)
    if time_left <= 0:
        return _give_up(timed_out(topic, timeout, error))
    if decision.delay > time_left:
        decision.delay = time_left
    decision.keep_partition = pinned
    # a pinned message can only wait for its own partition; an unpinned one goes elsewhere
    code = error.code if stage is Stage.SEND and isinstance(error, ServerError) else None
    decision.probe = pinned and code == NOT_WRITABLE
    # no such topic on the node: deleted, or not served yet (lookup tells which)
    decision.check_topic = code == TOPIC_NOT_EXIST
    return decision


class Lookup(enum.Enum):
    """What the caller learned about a topic a node said it does not have."""

    LISTED = "lookup lists the topic"  # being created, or its partition moved: retry
    GONE = "lookup says the topic does not exist"
    SILENT = "lookup did not answer in time"  # says nothing about the topic: retry
    NONE = "no lookup to ask"  # fixed nsqd (``nsqd=``): the node's answer is the last word


_HOW_TO_CREATE = ("create it first: smartnsq.admin.Admin.create_topic (or AsyncAdmin), "
                  "nsqlookupd's /topic/create on a youzan cluster, or `smartnsq dev-cluster "
                  "fault create-topic NAME:PARTITIONS:REPLICAS` on a dev cluster")


def _not_found(topic: str, text: str) -> TopicNotFound:
    error = TopicNotFound(topic)
    error.args = (text,)  # (the class's own text says only "not found in lookup")
    return error


def missing_topic(error: TopicNotFound) -> TopicNotFound:
    """Lookup's ``TopicNotFound`` saying what to do: create the topic. A subclass
    (``TopicNotWritable``: no channel yet) already says what to do and is returned as is."""
    if type(error) is not TopicNotFound:
        return error
    made = _not_found(error.topic, f"topic {error.topic!r} does not exist (not found in "
                                   f"lookup): {_HOW_TO_CREATE}")
    made.__cause__ = error
    return made


def topic_gone(topic: str, error: ServerError, answer: Lookup, *, node: str | None,
               found: TopicNotFound | None = None) -> TopicNotFound | None:
    """After ``E_TOPIC_NOT_EXIST`` from ``node`` (``error``): the ``TopicNotFound`` to give
    up with, or None to retry as any refresh-and-retry error.

    A node's "no such topic" alone is not the end: during youzan's slow creation, or while a
    partition moves, lookup lists the topic before its nsqd serves it, so the call waits for
    it within its deadline. Lookup saying the topic does not exist is the end (a deleted
    topic stays deleted: waiting would only turn the cause into a ``Timeout``), and so is the
    node's answer when there is no lookup to ask. ``found``: lookup's own ``TopicNotFound``,
    kept when it says more (``TopicNotWritable``).
    """
    where = f"nsqd {node}" if node else "the nsqd"
    if answer is Lookup.GONE:
        if found is not None and type(found) is not TopicNotFound:
            gone = found
        else:
            gone = _not_found(topic, f"topic {topic!r} does not exist: {where} answered "
                                     f"{error.code} and lookup no longer lists it (deleted, "
                                     f"or never created); {_HOW_TO_CREATE}")
    elif answer is Lookup.NONE:
        gone = _not_found(topic, f"topic {topic!r} does not exist on {where} (it answered "
                                 f"{error.code}; with nsqd= the node is not asked again); "
                                 f"{_HOW_TO_CREATE}; a topic of a youzan cluster is "
                                 "published through its lookupds (lookupd=)")
    else:
        return None
    gone.__cause__ = error
    return gone


def _by_failure(error: BaseException, stage: Stage, attempt: int, base: float, cap: float,
                rng: random.Random | None) -> Decision:
    def backoff(n: int) -> float:
        return exponential_delay(base, cap, n, 0.5, rng)

    if isinstance(error, ServerError):
        action = error.action
        if action is Action.GIVE_UP:
            return _give_up(error)
        if action is Action.REFRESH_AND_RETRY and stage is Stage.SEND:
            return Decision(Next.REFRESH_AND_RETRY, backoff(attempt))
        return Decision(Next.RETRY_AFTER, backoff(attempt))
    if isinstance(error, NoLeader):
        return Decision(Next.REFRESH_AND_RETRY, backoff(attempt))
    if isinstance(error, ProducerClosed | TopicNotFound) \
            or (isinstance(error, NSQError) and not error.retriable):
        return _give_up(error)  # (its flags say so: a TLSNotOffered at any stage, say)
    if stage is Stage.ROUTE:
        if isinstance(error, LookupFailed | Timeout):
            return Decision(Next.RETRY_AFTER, backoff(attempt))
        return _give_up(error)
    if stage is Stage.CONNECT:
        if incurable(error):
            return _give_up(error)
        if isinstance(error, NodeBackoff):
            return Decision(Next.RETRY_AFTER, max(backoff(attempt), error.retry_in))
        if isinstance(error, ConnectionFailed | Timeout | OSError):
            return Decision(Next.RETRY_AFTER, backoff(attempt))
        return _give_up(error)
    if isinstance(error, ConnectionFailed):
        if attempt == 1:  # the first loss retries at once on a fresh connection
            return Decision(Next.RETRY_NOW)
        return Decision(Next.RETRY_AFTER, backoff(attempt - 1))
    if isinstance(error, Timeout):
        # no answer in time: most often a partition stalled by a dead replica (the server
        # answers E_FAILED_ON_NOT_WRITABLE ~12 s later) or a leader handing off. Ask lookup,
        # and do not pile retries up behind the stalled request: back off first.
        return Decision(Next.REFRESH_AND_RETRY, backoff(attempt))
    return _give_up(error)
