"""The asyncio Consumer, one module per concern (``smartnsq.Consumer`` is the public name).

``config`` (:class:`~smartnsq.ConsumerConfig`), ``targets`` (where to read and
which SUB: pure decisions), ``subscription`` (keeping targets subscribed), ``discovery`` (the
lookup view turned into targets), ``link`` (delivery and the answer state machine), ``flow``
(RDY, over the pure :mod:`smartnsq.model.rdy`), ``dispatch`` (queue and workers),
``setoffset`` (HTTP start positions), ``observe`` (stats and lag) and ``core`` (the Consumer).
"""
