"""The asyncio Producer, one module per concern (``docs/producer.md`` is the user's guide).

=============== ==========================================================================
``producer``    the :class:`Producer`: public calls, lifecycle, the thin I/O shell
``config``      :class:`ProducerConfig`: each field's doc and range check in one place
``results``     :class:`PublishResult`, :class:`BatchResult`
``validation``  the arguments of a call, checked once before anything is sent
``routing``     which partition and leader an attempt goes to (plain functions)
``encoding``    which command bytes for which kind of node (via ``smartnsq.protocol``)
``retry``       the one retry decision of every call, a plain function of the failure,
                the attempt and the time left
``request``     one call in progress, as one slotted object
=============== ==========================================================================
"""

from __future__ import annotations

from .config import ProducerConfig
from .producer import Producer
from .results import BatchResult, PublishResult
from .retry import NoLeader, NotWritable

__all__ = ["BatchResult", "NoLeader", "NotWritable", "Producer", "ProducerConfig",
           "PublishResult"]

# the public names live here: references, reprs and pickles say smartnsq.producer.X
for _cls in (BatchResult, Producer, ProducerConfig, PublishResult):
    _cls.__module__ = __name__
del _cls
