"""pynsq's ``nsq.event``: the event names and the mixin that calls their listeners.

``AsyncConn`` and ``Message`` trigger these events; a program listens with ``on(name,
callback)``. The names are pynsq's strings, so a program comparing them or listening by the
literal name (``conn.on("ready", ...)``) works alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

__all__ = [
    "AUTH",
    "AUTH_RESPONSE",
    "BACKOFF",
    "CLOSE",
    "CONNECT",
    "CONTINUE",
    "DATA",
    "ERROR",
    "FINISH",
    "HEARTBEAT",
    "IDENTIFY",
    "IDENTIFY_RESPONSE",
    "MESSAGE",
    "READY",
    "REQUEUE",
    "RESPONSE",
    "RESUME",
    "TOUCH",
    "DuplicateListenerError",
    "EventedMixin",
    "InvalidListenerError",
]

CONNECT = "connect"
CLOSE = "close"
DATA = "data"
ERROR = "error"
IDENTIFY = "identify"
READY = "ready"
RESPONSE = "response"
MESSAGE = "message"
HEARTBEAT = "heartbeat"
BACKOFF = "backoff"
CONTINUE = "continue"
RESUME = "resume"
REQUEUE = "requeue"
TOUCH = "touch"
FINISH = "finish"
AUTH = "auth"
AUTH_RESPONSE = "auth_response"
IDENTIFY_RESPONSE = "identify_response"


class DuplicateListenerError(Exception):
    """``on()`` was given a callback already listening to that event (pynsq refuses it)."""


class InvalidListenerError(Exception):
    """``off()`` was given a callback that does not listen to that event."""


Listener = Callable[..., object]


class EventedMixin:
    """Listeners by event name, called in the order they were added, with the keyword
    arguments the event is triggered with (``conn=``, ``data=``, ``message=``...).

    A listener's exception propagates to whoever triggered the event, as in pynsq: the
    connection logs it and goes on (see :mod:`smartnsq.compat.pynsq.conn`).
    """

    # slots: every delivered Message is one; the table is made by the first on(), so a
    # message nobody listens to costs no dict
    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: defaultdict[str, list[Listener]] | None = None

    def on(self, name: str, callback: Listener) -> None:
        """Call ``callback(**kwargs)`` each time ``name`` is triggered."""
        assert callable(callback), "callback is not callable"
        if self._listeners is None:
            self._listeners = defaultdict(list)
        listeners = self._listeners[name]
        if callback in listeners:
            raise DuplicateListenerError(f"{callback!r} already listens to {name!r}")
        listeners.append(callback)

    def off(self, name: str, callback: Listener) -> None:
        """Stop calling ``callback`` for ``name``."""
        listeners = self._listeners.get(name, []) if self._listeners is not None else []
        if callback not in listeners:
            raise InvalidListenerError(f"{callback!r} does not listen to {name!r}")
        listeners.remove(callback)

    def trigger(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Call every listener of ``name`` with these arguments."""
        if self._listeners is None:
            return
        # a copy: a listener may add or remove listeners (pynsq's AsyncConn does, mid-event)
        for listener in list(self._listeners.get(name, ())):
            listener(*args, **kwargs)
