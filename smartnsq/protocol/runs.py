"""The message frames of one read as columns: ``MessageRun``, decoded by ``RunReader``.

A reader that takes a whole received chunk at once (the Spark range reader) checks its
queue offsets with a few whole-list operations and FINs it in one command, rather than
building and handling one ``MessageFrame`` per message. ``RunReader.feed_runs`` is
``FrameReader.feed`` with each stretch of consecutive message frames as one run; spread back
with ``MessageRun.frames`` they are exactly the messages ``feed`` returns, and the same bytes
raise the same errors (``tests/protocol/test_message_runs.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from struct import Struct
from typing import Final

from .frames import Frame, FrameReader, MessageFrame

__all__ = ["MessageRun", "RunReader"]

# a message frame of a run, to its queue offset and size: with an ext block whose version is
# 0 (no header), and without an ext block (docs/protocol.md §4.4)
_RUN_EXT: Final = Struct(">iiqH16sBQI")
_RUN_PLAIN: Final = Struct(">iiqH16sQI")
_HDR: Final = Struct(">ii")
_DETAIL: Final = Struct(">QI")


class MessageRun:
    """Consecutive message frames of one read, as columns.

    Runs exist only for youzan subscriptions that carry the detail block (SUB_ORDERED,
    SUB_ADVANCED), the ones read by queue offset; ``exts`` and ``ext_versions`` are ``None``
    when the layout has no ext block.
    """

    __slots__ = ("attempts", "bodies", "ext_versions", "exts", "ids", "offsets", "raw_sizes",
                 "timestamps")

    def __init__(self, timestamps: list[int], attempts: list[int], ids: list[bytes],
                 bodies: list[bytes], offsets: list[int], raw_sizes: list[int],
                 ext_versions: list[int] | None = None,
                 exts: list[bytes | None] | None = None) -> None:
        self.timestamps = timestamps
        self.attempts = attempts
        self.ids = ids
        self.bodies = bodies
        self.offsets = offsets
        self.raw_sizes = raw_sizes
        self.ext_versions = ext_versions
        self.exts = exts

    @classmethod
    def empty(cls, ext: bool = False) -> MessageRun:
        return cls([], [], [], [], [], [], [] if ext else None, [] if ext else None)

    @classmethod
    def of(cls, messages: Sequence[MessageFrame]) -> MessageRun:
        """The run of decoded messages (youzan, with queue offsets)."""
        run = cls.empty()
        for m in messages:
            run.add(m)
        return run

    @classmethod
    def join(cls, parts: Sequence[MessageRun | MessageFrame]) -> MessageRun:
        """One run of runs and messages, in order."""
        out = cls.empty()
        for p in parts:
            if isinstance(p, MessageRun):
                out.extend(p)
            else:
                out.add(p)
        return out

    def add(self, m: MessageFrame) -> None:
        """Append one decoded message (youzan, with its queue offset)."""
        if not m.youzan or m.queue_offset is None or m.raw_size is None:
            raise ValueError(f"{m!r} has no queue offset: runs are of youzan messages read by "
                             "offset")
        if m.ext_version and self.exts is None:
            self._add_ext_columns()
        self.timestamps.append(m.timestamp)
        self.attempts.append(m.attempts)
        self.ids.append(m.id)
        self.bodies.append(m.body)
        self.offsets.append(m.queue_offset)
        self.raw_sizes.append(m.raw_size)
        if self.exts is not None and self.ext_versions is not None:
            self.ext_versions.append(m.ext_version)
            self.exts.append(m.ext)

    def extend(self, other: MessageRun) -> None:
        """Append the messages of ``other`` (its lists are copied, not kept)."""
        n = len(other.ids)
        if other.exts is not None and self.exts is None:
            self._add_ext_columns()
        self.timestamps += other.timestamps
        self.attempts += other.attempts
        self.ids += other.ids
        self.bodies += other.bodies
        self.offsets += other.offsets
        self.raw_sizes += other.raw_sizes
        if self.exts is not None and self.ext_versions is not None:
            self.ext_versions += other.ext_versions if other.ext_versions is not None \
                else [0] * n
            self.exts += other.exts if other.exts is not None else [None] * n

    def _add_ext_columns(self) -> None:
        self.ext_versions = [0] * len(self.ids)
        self.exts = [None] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def end_offset(self) -> int:
        """The queue offset just after the run's last message."""
        return self.offsets[-1] + self.raw_sizes[-1]

    def contiguous(self) -> bool:
        """Whether each message starts where the one before it ends."""
        offsets = self.offsets
        return all(map(int.__eq__, offsets[1:], map(int.__add__, offsets, self.raw_sizes)))

    def body_bytes(self) -> int:
        return sum(map(len, self.bodies))

    def frame(self, i: int) -> MessageFrame:
        exts, versions = self.exts, self.ext_versions
        return MessageFrame(self.timestamps[i], self.attempts[i], self.ids[i], self.bodies[i],
                            versions[i] if versions is not None else 0,
                            exts[i] if exts is not None else None,
                            self.offsets[i], self.raw_sizes[i], True)

    def frames(self) -> list[MessageFrame]:
        return [self.frame(i) for i in range(len(self.ids))]

    def __repr__(self) -> str:
        if not self.ids:
            return "<MessageRun empty>"
        return f"<MessageRun {len(self.ids)} messages at {self.offsets[0]}..{self.end_offset}>"


class RunReader(FrameReader):
    """A ``FrameReader`` that can also hand messages over as runs (``feed_runs``)."""

    __slots__ = ()

    def feed_runs(self, data: bytes) -> list[Frame | MessageRun]:
        """``feed``, with each stretch of consecutive message frames as one ``MessageRun``
        when the layout has runs (youzan, with the detail block); the same frames otherwise."""
        layout = self._layout
        if layout.youzan and layout.detail:
            return self._feed(data, self._decode_runs)
        return self._feed(data, self._decode)  # type: ignore[arg-type]

    def _decode_runs(self, data: bytes) -> list[Frame | MessageRun]:
        """``_decode`` for a layout with the detail block, message frames into columns.

        A message frame without an ext header is one ``unpack_from`` (header, id, the ext
        block's version byte, queue offset and size) and a body slice. A message with no
        other beside it stays a message (an ordered channel's one in flight: a run of one
        would cost more than it saves). Any other frame, and any message frame that does not
        parse, is handed to ``_decode`` on its own: one place decides every other frame and
        words every error."""
        out: list[Frame | MessageRun] = []
        n = len(data)
        pos = 0
        max_size = self._max
        has_ext = self._layout.ext
        fixed = _RUN_EXT if has_ext else _RUN_PLAIN
        head = fixed.size
        unpack = fixed.unpack_from
        unpack_hdr = _HDR.unpack_from
        unpack_detail = _DETAIL.unpack_from
        cls = self._message_class
        run: MessageRun | None = None
        lone: MessageFrame | None = None  # a stretch's first message, until a second comes
        while n - pos >= 8:
            if n - pos >= head:
                if has_ext:
                    size, ftype, ts, attempts, msg_id, version, offset, raw_size = \
                        unpack(data, pos)
                else:
                    size, ftype, ts, attempts, msg_id, offset, raw_size = unpack(data, pos)
                    version = 0
            else:
                size, ftype = unpack_hdr(data, pos)
            if size < 4 or size > max_size:
                raise self._fail(self._bad_size(size, data[pos:pos + 256]))
            end = pos + 4 + size
            if end > n:
                break
            if ftype != 2 or end - pos < head:  # not a message, or one too short for its blocks
                run = lone = None
                out += self._decode(data[pos:end])
                pos = end
                continue
            body = pos + head
            if has_ext:
                ext: bytes | None = None
                if version:
                    p = pos + 35
                    length = (data[p] << 8) | data[p + 1]  # head covers these two bytes
                    body = p + 2 + length + 12
                    if body > end:
                        raise self._rejected(data[pos:end])
                    ext = data[p + 2:p + 2 + length]
                    offset, raw_size = unpack_detail(data, body - 12)
            if run is None:
                if lone is None:
                    lone = cls(ts, attempts, msg_id, data[body:end], version,
                               ext if has_ext else None, offset, raw_size, True)
                    out.append(lone)
                    pos = end
                    continue
                run = MessageRun.empty(has_ext)
                run.add(lone)
                out[-1] = run
                lone = None
                timestamps, attempts_, ids, bodies = (run.timestamps, run.attempts, run.ids,
                                                      run.bodies)
                offsets, raw_sizes, versions, exts = (run.offsets, run.raw_sizes,
                                                      run.ext_versions, run.exts)
            if has_ext:
                versions.append(version)  # type: ignore[union-attr]
                exts.append(ext)  # type: ignore[union-attr]
            timestamps.append(ts)
            attempts_.append(attempts)
            ids.append(msg_id)
            bodies.append(data[body:end])
            offsets.append(offset)
            raw_sizes.append(raw_size)
            pos = end
        if pos < n:
            self._keep_tail(data, pos)
        return out
