"""pynsq's ``nsq.Message``: a delivered message, its answers and its events.

As in pynsq, a message triggers ``finish``, ``requeue`` (with the keyword arguments given to
``requeue()``) and ``touch`` events for listeners added with ``message.on(...)``; answering a
second time is refused. A message built by hand (``nsq.Message(id, body, timestamp,
attempts)``, as a program's tests build one) does only that. A message the layer delivered
(through a ``Reader`` or an ``AsyncConn``) also sends its answer to the server, through the
:class:`Answers` of whoever delivered it.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from smartnsq.errors import AlreadyRespondedAssertion
from smartnsq.protocol.frames import MessageFrame
from smartnsq.protocol.numbers import is_real

from .event import FINISH, REQUEUE, TOUCH, EventedMixin

__all__ = ["Answers", "Message"]


class Answers(Protocol):
    """Who sends a delivered message's answers to the server: the Reader (over its consumer,
    on the network loop) or an ``AsyncConn`` (on its own connection)."""

    @property
    def requeue_delay(self) -> float:
        """Seconds; a requeue without a delay waits this times the message's attempts."""

    def fin(self, message: Message) -> None: ...

    def req(self, message: Message, seconds: float, backoff: bool) -> None: ...

    def touch(self, message: Message) -> None: ...

    def timeout_of(self, message: Message) -> float:
        """The ``msg_timeout`` (seconds) the server applies to this message."""


class Message(EventedMixin):
    """pynsq's message: ``id``, ``body``, ``timestamp`` (ns), ``attempts``; ``enable_async()``,
    ``is_async()``, ``has_responded()``, ``finish()``, ``requeue(delay=None, backoff=True,
    time_ms=-1)``, ``touch()``, ``is_alive()``, and the events ``finish``, ``requeue``,
    ``touch``.

    A delivered message keeps the frame it came in as ``smartnsq`` (from a Reader: the core
    ``smartnsq.Message``); its other fields (youzan's ``partition``, ``trace_id``,
    ``headers``...) are read through from it.
    """

    __slots__ = ("_answers", "_async", "_responded", "_since", "attempts", "body", "id",
                 "smartnsq", "timestamp")

    def __init__(self, id: Any, body: bytes, timestamp: int, attempts: int) -> None:
        super().__init__()
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.smartnsq: MessageFrame | None = None
        self._answers: Answers | None = None
        self._async = False
        self._responded = False
        self._since = time.monotonic()  # delivery (built as it arrives), then the last touch

    @classmethod
    def received(cls, id: Any, frame: MessageFrame, answers: Answers) -> Message:
        """A message the layer delivers: ``id`` as the program sees it, ``frame`` as it came,
        ``answers`` to send its FIN/REQ/TOUCH."""
        message = cls(id, frame.body, frame.timestamp, frame.attempts)
        message.smartnsq = frame
        message._answers = answers
        return message

    def __getattr__(self, name: str) -> Any:
        frame = self.smartnsq  # a slot, always set: no recursion here
        if frame is None or name.startswith("__"):
            raise AttributeError(f"'Message' object has no attribute {name!r}")
        return getattr(frame, name)

    def enable_async(self) -> None:
        """Answer later, by hand: the Reader will not finish/requeue on the handler's return."""
        self._async = True

    def is_async(self) -> bool:
        return self._async

    def has_responded(self) -> bool:
        return self._responded

    def _settle(self) -> None:
        if self._responded:
            raise AlreadyRespondedAssertion(f"message {self.id!r} was already answered")
        self._responded = True

    def finish(self) -> None:
        """FIN: processed (or to be dropped)."""
        self._settle()
        if self._answers is not None:
            self._answers.fin(self)
        self.trigger(FINISH, message=self)

    def requeue(self, **kwargs: Any) -> None:
        """REQ. ``delay`` (s; -1 or absent: ``requeue_delay`` x attempts), ``time_ms``,
        ``backoff`` (default True) as in pynsq; the ``requeue`` event gets these keywords."""
        self._settle()
        answers = self._answers
        if answers is not None:
            backoff = bool(kwargs.get("backoff", True))
            delay = kwargs.get("delay")
            time_ms = kwargs.get("time_ms", -1)
            if is_real(delay) and delay >= 0:
                seconds = float(delay)
            elif isinstance(time_ms, int | float) and time_ms >= 0:
                seconds = time_ms / 1000.0
            else:
                seconds = answers.requeue_delay * self.attempts
            answers.req(self, seconds, backoff)
        self.trigger(REQUEUE, message=self, **kwargs)

    def touch(self) -> None:
        """TOUCH: more time before the server's ``msg_timeout`` redelivers the message."""
        if self._responded:
            raise AlreadyRespondedAssertion(f"message {self.id!r} was already answered")
        self._since = time.monotonic()
        if self._answers is not None:
            self._answers.touch(self)
        self.trigger(TOUCH, message=self)

    def is_alive(self) -> bool:
        """Whether the message has *timed out*, as pynsq documents it ("whether or not this
        message is timed out based on the msg_timeout parameter") and returns it: True once
        the server's ``msg_timeout`` passed since delivery (or the last ``touch()``) with no
        answer, when the server redelivers it to someone; False before, and once answered.
        Despite the name, False is the healthy answer: pynsq programs rely on that."""
        return self._timed_out(time.monotonic())

    def _timed_out(self, now: float) -> bool:
        if self._responded:
            return False
        timeout = self._answers.timeout_of(self) if self._answers is not None else 60.0
        return now - self._since >= timeout

    def __repr__(self) -> str:
        return f"<Message id={self._id_text()} attempts={self.attempts} body={self.body[:40]!r}>"

    def _id_text(self) -> str:
        """The id as text (bytes ids decoded as ASCII), for logs and reprs."""
        raw = self.id
        if isinstance(raw, bytes | bytearray):
            return bytes(raw).decode("ascii", "replace")
        return str(raw)
