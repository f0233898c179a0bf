"""``POST /channel/setoffset``: a partition's start position over HTTP.

Youzan reads the partition of a ``SUB_ADVANCED`` with a start position from the node's default
partition (the lowest it leads); for any other partition the consumer subscribes without the
position and sets it here, on the leader, after SUB (the channel exists) and before the first
RDY (nothing delivered yet).
"""

from __future__ import annotations

from ..errors import ConnectionError_, ServerError
from ..protocol.commands import StartPosition
from ..protocol.lookup import ACCEPT_V1

__all__ = ["set_offset"]


async def set_offset(http: str, topic: str, channel: str, partition: int,
                     start: StartPosition, timeout: float, name: str) -> None:
    """Set ``start`` on ``http`` (the leader's ``host:port``); ``name`` is for errors."""
    import httpx

    url = f"http://{http}/channel/setoffset"
    params = {"topic": topic, "partition": str(partition), "channel": channel}
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
        try:
            answer = await client.post(url, params=params, content=start.token(),
                                       headers={"Accept": ACCEPT_V1})
        except httpx.HTTPError as exc:
            raise ConnectionError_(f"setting the start of {name} failed: {exc}") from exc
    if answer.status_code != 200:
        raise ServerError("E_SETOFFSET", f"{answer.status_code} {answer.text.strip()}",
                          "SUB_ADVANCED", fatal=False)
