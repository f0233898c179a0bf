"""Where a micro-batch cut by ``maxMessagesPerTrigger`` ends, found without reading the range.

Spark checkpoints a batch's end offsets before the batch runs, so the end of a limited batch
must be a message boundary the driver knows exactly when it plans: an estimate from byte sizes
would not do (queue offsets are bytes, the limit counts messages). A youzan leader numbers its
messages (``queue_cnt_index``, 1-based, counted from the queue's first message ever, as the
``msgcount:`` positions are) and its ``/message/get?search_mode=count`` answers with the queue
offset of the message of a given number. So the end of ``share`` messages from ``start`` is
the offset of message ``before(start) + share + 1``, one HTTP call, where ``before(start)``
(the messages ahead of ``start``) is known from the last planning: the previous batch's end
(found here) or a queue end (``message_count`` in the leader's stats). Where it is not known
(a restart from a checkpoint, an explicit or earliest start), one more call asks the number of
the message at ``start`` (``search_mode=virtual_offset``).

The answers are checked, never trusted blindly: a message number other than the one asked, or
an offset outside the range, and any failed call, make the driver read the range once instead
(a short private subscription, what it always did), so a server that numbers differently costs
time, never a row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..errors import ClusterError
from ..transport import loop_thread as _loop_thread
from .cluster import ClusterClient, LeaderInfo, TopicLayout
from .options import SourceOptions
from .ranges import read_range

__all__ = ["BatchEnds", "counted"]

log = logging.getLogger("smartnsq.spark")


class BatchEnds:
    """The driver's search for limited ends; remembers, per partition, the last boundary
    whose message count it learnt, so that the next batch's search is one call."""

    def __init__(self, client: ClusterClient, options: SourceOptions) -> None:
        self._client = client
        self._options = options
        # (topic, partition) -> (offset, messages ahead of it): learnt from the leaders
        self.known: dict[tuple[str, int], tuple[int, int]] = {}
        self.reads = 0  # ranges read because the count lookup could not answer (for tests)

    def end_after(self, layout: TopicLayout, partition: int, start: int, end: int,
                  share: int, at_end: tuple[int, int] | None = None) -> int:
        """The queue offset after ``share`` messages from ``start`` (at most ``end``).

        ``at_end``: (queue end, message count there) from the planning's stats answer."""
        leader = layout.leaders.get(partition)
        if leader is None:
            raise ClusterError("no leader in lookup", transient=True)
        found = self._by_count(layout.topic, partition, leader, start, end, share, at_end)
        if found is not None:
            return found
        self.reads += 1
        return self._read(layout, partition, leader, start, end, share)

    def _by_count(self, topic: str, partition: int, leader: LeaderInfo, start: int, end: int,
                  share: int, at_end: tuple[int, int] | None) -> int | None:
        """The end from the leader's message numbers, or ``None`` when they do not tell."""
        key = (topic, partition)
        try:
            before = self._before(topic, partition, leader, start, at_end)
            if before is None:
                return None
            wanted = before + share  # messages ahead of the end
            if at_end is not None and at_end[0] == end and wanted >= at_end[1]:
                self.known[key] = at_end
                return end  # the rest of the queue fits in the share
            found = self._client.message_at(topic, partition, leader, count=wanted + 1)
        except ClusterError as exc:
            log.debug("%s/%d: the message count lookup failed (%s); reading the range to find "
                      "the batch's end", topic, partition, exc)
            return None
        offset = found.queue_offset
        if found.count != wanted + 1 or offset is None or offset <= start:
            log.debug("%s/%d: /message/get for count %d answered count %s at %s; reading the "
                      "range to find the batch's end", topic, partition, wanted + 1,
                      found.count, offset)
            return None
        if offset >= end:
            return end
        self.known[key] = (offset, wanted)
        return offset

    def _before(self, topic: str, partition: int, leader: LeaderInfo, start: int,
                at_end: tuple[int, int] | None) -> int | None:
        """Messages ahead of ``start``: remembered, a queue end's count, or asked."""
        for seen in (self.known.get((topic, partition)), at_end):
            if seen is not None and seen[0] == start:
                return seen[1]
        if start == 0:
            return 0
        found = self._client.message_at(topic, partition, leader, queue_offset=start)
        if found.queue_offset != start or found.count is None or found.count < 1:
            return None
        return found.count - 1

    def _read(self, layout: TopicLayout, partition: int, leader: LeaderInfo, start: int,
              end: int, share: int) -> int:
        """The end from one read of the range's first ``share`` messages' positions."""
        options = self._options
        found = [start]
        loop_thread = _loop_thread.shared()
        try:
            for _ in read_range(loop_thread, self._client, layout.topic, partition, leader,
                                start, end, ordered=layout.ordered, ext=layout.ext,
                                rdy=min(share, options.rdy), read_timeout=options.read_timeout,
                                channel=None, channel_prefix=options.channel_prefix,
                                limit=share, on_end=lambda e: found.__setitem__(0, e)):
                pass
        finally:
            _loop_thread.release_shared(loop_thread)
        return found[0]


def counted(known: Mapping[tuple[str, int], tuple[int, int]],
            offsets: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """The remembered message counts that are at ``offsets`` (for ``minOffsetsPerTrigger``)."""
    return {(t, int(p)): known[(t, int(p))] for t, parts in offsets.items()
            for p, offset in parts.items() if known.get((t, int(p)), (None,))[0] == offset}
