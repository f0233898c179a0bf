"""The message a consumer hands to its handler, and the answers it can give (FIN, REQ, TOUCH).

``Message`` extends the codec's decoded frame (``smartnsq.protocol.frames.MessageFrame``) with the
link back to the subscription it came from, so the connection decodes straight into the object
the handler sees: one object per message, no copy, no wrapper.

A message is answered once. ``fin()`` and ``req()`` settle it; a second answer raises
:class:`AlreadyResponded` instead of sending a second command (the server would refuse it with
``E_FIN_FAILED``/``E_REQ_FAILED`` and count an error against the client's RDY). ``touch()``
may be sent any number of times before the answer. When the connection the message came on has
closed, an answer cannot reach the server any more: it is dropped (logged at debug) and the
server redelivers the message after its ``msg_timeout``; nothing is lost, and at-least-once
holds because a FIN is only ever sent after the handler succeeded.

Answers may be given from any thread (``smartnsq.sync.Consumer`` runs handlers in a thread
pool): the subscription hops to its event loop when called from elsewhere. The first answer wins
atomically, so exactly one FIN or REQ leaves per delivery: on the event loop's thread the state
changes without a lock (only that thread runs there); another thread *claims* the message under
a small lock (a negative state), and the event loop sends the claimed answer only if nothing
answered in between. A second answer that comes visibly later raises :class:`AlreadyResponded`;
one that races the event loop's own answer in the same instant is dropped (logged at debug).
"""

from __future__ import annotations

from typing import NoReturn, Protocol

from .errors import AlreadyResponded, ProtocolError, ServerError
from .protocol import frames
from .protocol.numbers import check_number

__all__ = [
    "CLAIMED_FINISH",
    "CLAIMED_REQUEUE",
    "FINISHED",
    "PENDING",
    "REQUEUED",
    "CopyFins",
    "Message",
    "Responder",
    "claimed",
    "names_message_id",
]

# A message's answer state (``Message._state``). The event loop's thread moves PENDING straight
# to FINISHED or REQUEUED; another thread first *claims* the message (CLAIMED_FINISH or
# CLAIMED_REQUEUE, under a lock) and the loop then settles it, unless the loop answered first.
PENDING = 0
FINISHED = 1
REQUEUED = 2
CLAIMED_FINISH = -FINISHED
CLAIMED_REQUEUE = -REQUEUED


def claimed(state: int) -> int:
    """The claim another thread puts on a message it is about to settle as ``state``."""
    return -state


def names_message_id(text: str, message_id: bytes) -> bool:
    """Whether an error's text (``E_FIN_FAILED FIN <id> failed ...``) names ``message_id``:
    youzan prints the 16 bytes as a Go byte array (``[0 0 0 0 0 0 0 2 0 ...]``), classic nsqd
    as its 16 characters."""
    if f"[{' '.join(map(str, message_id))}]" in text:
        return True
    return message_id.decode("ascii", "replace") in text


class CopyFins:
    """The FINs sent for second copies of a message, whose ``E_FIN_FAILED`` is expected.

    The real youzan server sometimes delivers a message twice (its duplicated first ordered
    delivery, a redelivery racing our FIN). Whether a copy was counted in flight depends on
    when the server sent it against our FIN, which the client cannot see; FINing it anyway
    costs at most one refused FIN, while leaving it costs the ordered partition a
    ``msg_timeout`` stall. The consumer's links and the Spark range reader both FIN such
    copies and tell, through one instance of this, which refusals were the price of that
    choice (logged at DEBUG) and which are real failures.
    """

    __slots__ = ("_id", "_left", "held")

    def __init__(self) -> None:
        self._id = b""
        self._left = 0
        # a refusal of the FIN of the message read last that nothing expected, held until the
        # next delivery says what it was (hold)
        self.held: ServerError | None = None

    def expect(self, message_id: bytes, refusals: int = 1) -> None:
        """FINs of ``message_id`` were sent that the server may refuse, ``refusals`` of them.
        One id is remembered (copies come one at a time on a channel); the count adds up."""
        self._id = message_id
        self._left += refusals

    def absorbs(self, error: ServerError) -> bool:
        """``error`` is one of the expected refusals (and is counted off)."""
        if error.code != "E_FIN_FAILED" or not self._left \
                or not names_message_id(error.text, self._id):
            return False
        self._left -= 1
        return True

    def hold(self, error: ServerError, message_id: bytes) -> bool:
        """Hold an ``E_FIN_FAILED`` of ``message_id``, the message read and FINed last, until
        the next delivery says what it was. The real server's reset of a fresh ordered
        channel's reader can drop the original from flight before the FIN comes, refuse the
        FIN, and only then send the copy (in flight): that refusal belongs to the duplicate
        delivery (:meth:`forgive`). A FIN that came too late is followed by the message again
        with attempts + 1, or by anything else: :meth:`release` then gives the refusal back
        to be reported, as it would have been at once."""
        if self.held is not None or error.code != "E_FIN_FAILED" \
                or not names_message_id(error.text, message_id):
            return False
        self.held = error
        return True

    def forgive(self, message_id: bytes) -> bool:
        """A copy of ``message_id`` (same attempts) came: True when a held refusal was its
        original's FIN's, which is then dropped."""
        held = self.held
        if held is None or not names_message_id(held.text, message_id):
            return False
        self.held = None
        return True

    def release(self) -> ServerError | None:
        """The held refusal (another delivery came, or the connection closed), to report."""
        held, self.held = self.held, None
        return held


class Responder(Protocol):
    """The subscription's link that delivered a message: where its answers go. The handler's
    answers come through :meth:`answer` and :meth:`touch` (from any thread); the consumer's
    own (auto-answers, give-ups, drain) through :meth:`settle` and :meth:`give_back`, on the
    event loop's thread, where no claim is needed."""

    topic: str
    channel: str
    node: str
    ordered: bool
    dead: bool  # the connection is gone: answers can no longer reach the server

    def answer(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        """Settle ``message`` as ``state`` (FINISHED/REQUEUED) atomically and send the answer;
        ``message._refuse()`` when it was already answered."""
        ...

    def touch(self, message: Message) -> None: ...

    def settle(self, message: Message, state: int, delay: float | None,
               backoff: bool) -> None:
        """Settle a message still PENDING (the event loop's thread) and send the answer."""
        ...

    def give_back(self, message: Message) -> None:
        """Requeue at once, without back-off, a message nobody will handle."""
        ...


class Message(frames.MessageFrame):
    """One delivered message.

    Data (from the frame): ``body``, ``attempts`` (1 on first delivery), ``timestamp``
    (nanoseconds since the epoch, set at publish), ``id`` (the raw 16 bytes), ``internal_id``,
    ``trace_id`` (youzan; 0 when the producer gave none), ``partition``, ``queue_offset`` and
    ``raw_size`` (SUB_ORDERED/SUB_ADVANCED subscriptions, else ``None``), ``headers`` (the ext
    JSON header as a dict; empty without one), ``body_error`` (why a body the publisher
    compressed could not be decoded; ``None`` for every message a handler is given).
    Where it came from: ``topic``, ``channel``, ``node`` (``"host:port"``).
    Answers: ``fin()``, ``req(delay=None, backoff=True)``, ``touch()``; ``has_responded``.
    """

    __slots__ = ("_auto", "_body_error", "_responder", "_state")

    _responder: Responder
    _state: int
    _auto: bool
    _body_error: ProtocolError  # set only on a body that could not be decoded

    # the subscription sets _responder, _state and _auto right after decoding

    @property
    def internal_id(self) -> int | None:  # type: ignore[override]
        """Youzan: the 64-bit internal id; classic: ``None`` (a classic id is an opaque GUID:
        use ``id``), as ``trace_id`` and ``partition`` are."""
        if self.youzan:
            return super().internal_id
        return None

    @property
    def body_error(self) -> ProtocolError | None:
        """Why the consumer could not decode the body its publisher compressed (a codec
        missing, corrupt data, over ``max_decompressed_size``), for a give-up hook: such a
        message reaches no handler, and ``body`` and ``headers`` are as stored."""
        try:
            return self._body_error
        except AttributeError:  # left unset on every decodable message: no cost per message
            return None

    @property
    def topic(self) -> str:
        return self._responder.topic

    @property
    def channel(self) -> str:
        return self._responder.channel

    @property
    def node(self) -> str:
        """``"host:port"`` of the nsqd that delivered the message (where FIN must go)."""
        return self._responder.node

    @property
    def has_responded(self) -> bool:
        """True once ``fin()`` or ``req()`` was called (by the handler or automatically)."""
        return self._state != PENDING

    @property
    def finished(self) -> bool:
        return self._state in (FINISHED, CLAIMED_FINISH)

    @property
    def requeued(self) -> bool:
        return self._state in (REQUEUED, CLAIMED_REQUEUE)

    @property
    def auto_response(self) -> bool:
        """Whether the consumer answers for the handler (FIN on return, REQ on raise)."""
        return self._auto

    def disable_auto_response(self) -> None:
        """Keep this message in flight after the handler returns: it will be answered later
        (by hand: ``fin()``/``req()``), e.g. once an asynchronous job it started completes.
        ``touch()`` it if that can take longer than the server's ``msg_timeout``."""
        self._auto = False

    def fin(self) -> None:
        """Acknowledge the message: the server forgets it. Call only once it is processed."""
        self._responder.answer(self, FINISHED, None, False)

    def req(self, delay: float | None = None, backoff: bool = True) -> None:
        """Give the message back for redelivery after ``delay`` seconds.

        ``delay=None`` uses the consumer's requeue policy for this attempt count. ``backoff``
        counts this as a failure for the consumer's backoff (RDY 0, then probes); pass
        ``False`` to requeue without slowing down (e.g. "not for me now"). On ordered
        subscriptions the delay is always 0: the server ignores a delayed REQ there.
        """
        if delay is not None:
            check_number("requeue delay", delay, 0)
        self._responder.answer(self, REQUEUED, delay, backoff)

    def touch(self) -> None:
        """Reset the server's redelivery timer (``msg_timeout``) for this message."""
        if self._state != PENDING:
            self._refuse("; it cannot be touched")
        self._responder.touch(self)

    def _refuse(self, why: str = "") -> NoReturn:
        done = "finished" if self.finished else "requeued"
        raise AlreadyResponded(f"message {self._id_text()} was already {done}{why}")

    def _id_text(self) -> str:
        if self.youzan:
            return f"internal_id={self.internal_id}"
        return self.id.decode("ascii", "replace")
