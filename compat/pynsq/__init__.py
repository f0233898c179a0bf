"""pynsq's ``Reader``, ``Writer`` and ``run()`` on smartnsq's core: move over by changing imports.

::

    from smartnsq.compat import pynsq as nsq      # was: import nsq

    def handler(message):
        print(message.body)
        return True

    r = nsq.Reader(message_handler=handler, lookupd_http_addresses=["http://127.0.0.1:4161"],
                   topic="nsq_reader", channel="asdf", lookupd_poll_interval=15)
    nsq.run()

What stays as in pynsq: the constructor arguments, a handler returning ``True`` (finish) or
``False`` (requeue, with backoff), a raise (requeue), ``message.enable_async()`` (answer
later), coroutine handlers, ``max_tries`` and ``giving_up()``, ``preprocess_message`` /
``validate_message`` / ``process_message`` overrides, ``is_starved()``,
``set_max_in_flight()``, ``Writer.pub/mpub/dpub(..., callback=)`` with ``callback(conn,
data)`` getting ``b"OK"`` or an :class:`Error`, and a blocking ``run()``.

Threads. As in pynsq, every handler and every callback runs on the thread that called
``run()``, one at a time, on that thread's event loop (tornado's ``IOLoop.current()`` is the
same loop, so tornado's ``PeriodicCallback`` and ``IOLoop.current().stop()`` keep working).
The network side lives on smartnsq's background event loop: a slow handler delays the next
handler, never heartbeats or other connections.

What is better than pynsq: discovery, reconnection, RDY and backoff are smartnsq's, and on
youzan NSQ the Reader reads every partition of the topic and the Writer (given
``lookupd_http_addresses=``, an extension) publishes to partition leaders. The message also
carries youzan's fields (``partition``, ``trace_id``, ``headers``...; see ``message.smartnsq``).

The package has pynsq's module layout where programs import from it: ``nsq.conn``
(``AsyncConn`` and its events, on smartnsq's connection), ``nsq.event``, ``nsq.protocol``
(errors, command builders), ``nsq.message``, ``nsq.sync`` (``SyncConn``),
``nsq.backoff_timer``, ``nsq.legacy_reader``, ``nsq.deflate_socket``, ``nsq.snappy_socket``;
``Reader`` and ``Writer`` live in ``reader`` and ``writer``. Every name of pynsq's
``nsq.__all__`` is importable from here, as from pynsq's ``nsq``; ``options`` holds what
Reader, Writer and AsyncConn share. The name-by-name mapping is in docs/migration-pynsq.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from typing import Any

from smartnsq.compat.pynsq_loops import (
    loops_lock,
    release_user_loop,
    running_loops,
    signals_wake,
    stopping_loops,
    user_entry,
)
from smartnsq.errors import InvalidArgument

from . import (
    backoff_timer,
    conn,
    deflate_socket,
    event,
    legacy_reader,
    message,
    protocol,
    reader,
    snappy_socket,
    sync,
    writer,
)
from .backoff_timer import BackoffTimer
from .conn import AsyncConn
from .legacy_reader import LegacyReader
from .message import Message
from .protocol import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Error,
    SendError,
    asserting,
    decode_message,
    finish,
    identify,
    mpub,
    nop,
    pub,
    ready,
    requeue,
    subscribe,
    touch,
    unpack_response,
    valid_channel_name,
    valid_topic_name,
)
from .reader import Reader, readers_without_handler
from .sync import SyncConn
from .writer import Writer

# pynsq's nsq.__all__, its modules, and stop() (an addition: run() ends on it)
__all__ = [
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "AsyncConn",
    "BackoffTimer",
    "Error",
    "LegacyReader",
    "Message",
    "Reader",
    "SendError",
    "SyncConn",
    "Writer",
    "backoff_timer",
    "conn",
    "decode_message",
    "deflate_socket",
    "event",
    "finish",
    "identify",
    "legacy_reader",
    "message",
    "mpub",
    "nop",
    "protocol",
    "pub",
    "reader",
    "ready",
    "requeue",
    "run",
    "snappy_socket",
    "stop",
    "subscribe",
    "sync",
    "touch",
    "unpack_response",
    "valid_channel_name",
    "valid_topic_name",
    "writer",
]

log = logging.getLogger("smartnsq.compat.pynsq")


@asserting
def run() -> None:
    """Run every Reader's handlers and Writer's callbacks until :func:`stop` (or SIGTERM/INT).

    As ``nsq.run()``: blocks the calling thread on its event loop. Tornado's
    ``IOLoop.current().stop()`` stops it too.
    """
    entry = user_entry(acquire=True)
    loop = entry.loop
    try:
        for reader in readers_without_handler(loop):
            raise InvalidArgument("message_handler", f"Reader {reader.name} has none: "
                                  "give message_handler= or call set_message_handler() "
                                  "before run()")
        with contextlib.ExitStack() as on_return:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, _on_signal)
                on_return.enter_context(signals_wake(loop))
            stopping_loops.discard(loop)
            running_loops.add(loop)
            try:
                loop.run_forever()
            finally:
                running_loops.discard(loop)
                stopping_loops.discard(loop)
    finally:
        release_user_loop(entry)


def stop() -> None:
    """Make :func:`run` return: the calling thread's, or, from another thread, every one."""
    try:  # a handler, a callback or a signal handler of a run(): that run()
        own: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        own = None
    with loops_lock:
        running = list(running_loops)
    targets = [own] if own is not None and own in running else running
    for target in targets:
        if target.is_closed() or (target in stopping_loops and target.is_running()):
            continue  # closed, or already stopping: a second stop must not end the next run
        stopping_loops.add(target)
        # after what this turn scheduled (done callbacks), as call_soon would, but also
        # waking the loop's selector: called from a signal handler (ours on SIGINT/SIGTERM,
        # or the program's own), the loop may be idle in select() with nothing due, and a
        # plain call_soon would wait there for the next message
        target.call_soon_threadsafe(target.stop)


def _on_signal(signum: int, frame: Any) -> None:
    log.info("signal %d: stopping", signum)
    stop()
