"""``POST /channel/setoffset``: a partition's start position over HTTP.

Youzan reads the partition of a ``SUB_ADVANCED`` with a start position from the node's default
partition (the lowest it leads); for any other partition the consumer subscribes without the
position and sets it here, on the leader, after SUB (the channel exists) and before the first
RDY (nothing delivered yet). The request is :meth:`smartnsq.admin.AsyncAdmin.set_offset`'s;
only the consumer's view of a refusal is decided here.
"""

from __future__ import annotations

from ..errors import ServerError
from ..model.partitions import NEVER_WRITTEN
from ..protocol.commands import StartPosition

__all__ = ["set_offset"]


async def set_offset(http: str, topic: str, channel: str, partition: int,
                     start: StartPosition, timeout: float) -> None:
    """Set ``start`` on ``http`` (the leader's ``host:port``).

    A refusal becomes ``E_SETOFFSET`` (not retriable: the consumer stops and says why, as a
    refused ``SUB_ADVANCED`` would); an unreachable or silent node is retried like any
    failed subscription (``ConnectionFailed``/``Timeout``, naming the node).
    """
    from ..admin import AsyncAdmin
    from ..errors import AdminError  # the HTTP client only when a position is set

    async with AsyncAdmin(timeout=timeout) as admin:
        try:
            await admin.set_offset(topic, channel, start, partition=partition, address=http)
        except AdminError as exc:
            if exc.status == 500 and exc.message == NEVER_WRITTEN:
                return  # nothing to skip on a partition never written to: it starts there
            raise ServerError("E_SETOFFSET", f"{exc.status} {exc.message}", "SUB_ADVANCED",
                              fatal=False) from exc
