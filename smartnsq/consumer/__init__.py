"""The asyncio Consumer (``smartnsq.consumer.Consumer``) and its configuration.

One module per concern: ``config`` (:class:`ConsumerConfig`), ``targets`` (where to read and
which SUB: pure decisions), ``subscription`` (keeping targets subscribed), ``discovery``
(the lookup view), ``link`` (delivery and the answer state machine), ``flow`` (RDY, over the
pure ``smartnsq.rdy``), ``dispatch`` (queue and workers), ``setoffset`` (HTTP start
positions) and ``core`` (the Consumer itself).
"""

from __future__ import annotations

from ..message import Message
from ..protocol.commands import StartPosition
from .config import ConsumerConfig, GiveUpHook, Handler, OrderErrorHook
from .core import Consumer

__all__ = ["Consumer", "ConsumerConfig", "GiveUpHook", "Handler", "Message", "OrderErrorHook",
           "StartPosition"]
