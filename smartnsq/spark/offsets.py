"""What a position in the ``startingOffsets``/``endingOffsets`` options means, parsed on the driver.

Apart from the other options because offsets are values of their own: Spark stores them in the
checkpoint as JSON, the planner resolves them against the queues' bounds, and a typo in one
(a timestamp in the wrong unit, another job's topic) must fail before any task starts.

Kafka's forms are read here too, where they mean the same thing: ``-2``/``-1`` in the JSON
(earliest/latest, kept as those numbers until the planner knows the queues) and Kafka's
timestamp options, in Kafka's milliseconds (``ByTimestamp``). The ``timestamp:`` form stays in
seconds, as it always was: each unit is refused where the other one is expected, because a
time in the wrong unit selects everything or nothing without any error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from ..protocol import validate as v
from ..protocol.numbers import is_int

__all__ = [
    "KAFKA_EARLIEST",
    "KAFKA_LATEST",
    "OFFSET_EARLIEST",
    "OFFSET_LATEST",
    "ByTimestamp",
    "OffsetSpec",
    "Offsets",
    "check_offset_topics",
    "check_offsets",
    "parse_offsets",
    "position_options",
    "timestamp_of_spec",
]

OFFSET_EARLIEST = "earliest"
OFFSET_LATEST = "latest"
TIMESTAMP_PREFIX = "timestamp:"
# timestamp: values from here on are refused as milliseconds (Kafka's unit): as seconds they
# would be after the year 2286, as milliseconds they are any time since April 1970
SECONDS_LIMIT = 10**10
# Kafka's JSON offsets: -2 is the earliest offset of the partition, -1 the latest
KAFKA_EARLIEST = -2
KAFKA_LATEST = -1
# milliseconds below this (before 26 April 1970) but at or above SECONDS_FLOOR are seconds
# given to a Kafka option: as seconds they are 2001-2286, as milliseconds January 1970
SECONDS_FLOOR = 10**9

# Offsets as Spark stores them: {"topic": {"0": 8192, "1": 0}} (keys are strings in JSON)
Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class ByTimestamp:
    """Kafka's timestamp positions, in Kafka's unit (milliseconds since the epoch).

    ``every`` is ``startingTimestamp``/``endingTimestamp`` (every partition); ``partitions``
    is ``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp`` (``{topic: {partition:
    ms}}``; partitions it leaves out take the default, as in the JSON offsets). A position is
    the first message published at or after the time, or the partition's end when none is.
    """

    every: int | None = None
    partitions: dict[str, dict[str, int]] = field(default_factory=dict)

    def of(self, topic: str, partition: str) -> int | None:
        """The time this spec gives the partition (``None``: it takes the default)."""
        return self.partitions.get(topic, {}).get(partition, self.every)


OffsetSpec = str | Offsets | ByTimestamp  # "earliest", "latest", "timestamp:<s>", JSON, Kafka's

def parse_offsets(raw: str | None, name: str, default: str,
                  allowed: tuple[str, ...] = (OFFSET_EARLIEST, OFFSET_LATEST)) -> OffsetSpec:
    """``earliest``/``latest``, ``timestamp:<unix seconds>`` or JSON offsets.

    JSON is ``{"topic": {"partition": queue_offset}}``; ``timestamp:T`` means, in every
    partition, the first message published at or after ``T`` (the end when there is none).
    """
    if raw is None or not raw.strip():
        return default
    text = raw.strip()
    if text.lower() in allowed:
        return text.lower()
    if text.lower().startswith(TIMESTAMP_PREFIX):
        try:
            seconds = int(text[len(TIMESTAMP_PREFIX):])
        except ValueError:
            raise InvalidArgument(name, "timestamp: takes whole unix seconds", raw) from None
        if seconds < 0:
            raise InvalidArgument(name, "timestamp: takes whole unix seconds", raw)
        if seconds >= SECONDS_LIMIT:  # taken as seconds, it would select nothing, silently
            raise InvalidArgument(name, "looks like milliseconds: this option takes seconds "
                                  "since the epoch; divide by 1000, e.g. "
                                  f"{TIMESTAMP_PREFIX}{seconds // 1000}", raw)
        return f"{TIMESTAMP_PREFIX}{seconds}"
    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidArgument(name, f"must be {' or '.join(allowed)}, timestamp:<unix "
                              'seconds> or JSON like {"topic": {"0": 8192, "1": 0}}',
                              raw) from None
    kafka = (KAFKA_LATEST,) if default == OFFSET_LATEST and allowed == (OFFSET_LATEST,) \
        else (KAFKA_EARLIEST, KAFKA_LATEST)
    return check_offsets(value, name, kafka=kafka)


def _milliseconds(raw: Any, name: str) -> int:
    """A Kafka timestamp: whole milliseconds since the epoch; seconds are refused."""
    try:
        ms = int(raw) if not isinstance(raw, bool) else -1
    except (TypeError, ValueError):
        ms = -1
    if ms < 0 or (isinstance(raw, float) and not raw.is_integer()):
        raise InvalidArgument(name, "takes whole milliseconds since the epoch (Kafka's unit)",
                              raw)
    if SECONDS_FLOOR <= ms < SECONDS_LIMIT:  # as milliseconds, a day of January 1970
        raise InvalidArgument(name, "looks like seconds: Kafka's option takes milliseconds "
                              f"since the epoch; multiply by 1000, e.g. {ms * 1000} (or give "
                              f"the offsets option {TIMESTAMP_PREFIX}{ms}, in seconds)", raw)
    return ms


def _by_timestamp(raw: str, name: str) -> ByTimestamp:
    """``{topic: {partition: ms}}`` of Kafka's ``...OffsetsByTimestamp``."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise InvalidArgument(name, 'must be a JSON object like {"topic": {"0": '
                              '1700000000000}} (milliseconds)', raw)
    out: dict[str, dict[str, int]] = {}
    for topic, parts in value.items():
        v.check_topic(topic)
        if not isinstance(parts, dict):
            raise InvalidArgument(name, f"topic {topic!r} needs an object of partitions", parts)
        row: dict[str, int] = {}
        for part, ms in parts.items():
            if not str(part).isdigit():
                raise InvalidArgument(name, f"partition {part!r} of {topic!r} is not a "
                                      "number", part)
            row[str(int(part))] = _milliseconds(ms, name)
        out[topic] = row
    return ByTimestamp(partitions=out)


def position_options(opts: Mapping[str, str], which: str, default: str,
                     allowed: tuple[str, ...] = (OFFSET_EARLIEST, OFFSET_LATEST)) -> OffsetSpec:
    """The start (``which="starting"``) or end of a read from whichever of Kafka's three ways
    to say it is given: ``<which>Offsets``, ``<which>OffsetsByTimestamp`` (per partition,
    ms) or ``<which>Timestamp`` (every partition, ms).

    Kafka lets one of them win silently when several are given; here that is refused, since
    the one that loses was meant too."""
    names = [f"{which}Timestamp", f"{which}OffsetsByTimestamp", f"{which}Offsets"]
    given = [n for n in names if opts.get(n.lower())]
    if len(given) > 1:
        raise InvalidArgument(given[0], f"give one of {', '.join(given)}: each sets where the "
                              "read " + ("starts" if which == "starting" else "ends"),
                              opts[given[0].lower()])
    if not given or given[0] == names[2]:
        return parse_offsets(opts.get(names[2].lower()), names[2], default, allowed)
    raw = opts[given[0].lower()].strip()
    if given[0] == names[0]:
        return ByTimestamp(every=_milliseconds(raw, given[0]))
    return _by_timestamp(raw, given[0])


def check_offset_topics(spec: OffsetSpec, topics: tuple[str, ...], name: str,
                        pattern: re.Pattern[str] | None = None) -> None:
    """Explicit offsets name only topics the source reads (or, with ``subscribePattern``,
    topics the pattern matches): a key that matches none (a typo, another job's offsets)
    would otherwise be ignored and its topic read from the default."""
    keys = spec.partitions if isinstance(spec, ByTimestamp) else spec
    if not isinstance(keys, dict):
        return
    if pattern is not None:
        unknown = [topic for topic in keys if not pattern.fullmatch(topic)]
        if unknown:
            raise InvalidArgument(name, f"names topic(s) {', '.join(map(repr, unknown))}, which "
                                  f"subscribePattern {pattern.pattern!r} does not match",
                                  unknown)
        return
    unknown = [topic for topic in keys if topic not in topics]
    if unknown:
        raise InvalidArgument(name, f"names topic(s) {', '.join(map(repr, unknown))}, but this "
                              f"source reads {', '.join(map(repr, topics))} (the topic "
                              "option): key the offsets by those topics", unknown)


def timestamp_of_spec(spec: object) -> ByTimestamp | None:
    """A time-based spec as Kafka's milliseconds (``timestamp:T`` is seconds), else ``None``."""
    if isinstance(spec, ByTimestamp):
        return spec
    if isinstance(spec, str) and spec.startswith(TIMESTAMP_PREFIX):
        return ByTimestamp(every=int(spec[len(TIMESTAMP_PREFIX):]) * 1000)
    return None


def check_offsets(value: Any, name: str = "offsets", kafka: tuple[int, ...] = ()) -> Offsets:
    """Validate (and normalise) offsets as JSON gives them; ``kafka`` are the negative
    numbers (Kafka's -2 earliest, -1 latest) a user's JSON may hold. Spark's own offsets
    (the checkpoint's) never hold them."""
    if not isinstance(value, dict):
        raise InvalidArgument(name, "must be a JSON object of topics", value)
    out: Offsets = {}
    for topic, parts in value.items():
        v.check_topic(topic)
        if not isinstance(parts, dict):
            raise InvalidArgument(name, f"topic {topic!r} needs an object of partitions", parts)
        checked: dict[str, int] = {}
        for part, offset in parts.items():
            try:
                pid = int(part)
            except (TypeError, ValueError):
                raise InvalidArgument(name, f"partition {part!r} of {topic!r} is not a "
                                      "number", part) from None
            if is_int(offset) and offset < 0 and kafka and pid >= 0:
                if offset not in kafka:
                    what = ("-1 (latest) or -2 (earliest)" if KAFKA_EARLIEST in kafka else
                            "-1 (latest); -2 (earliest) is not an end")
                    raise InvalidArgument(name, f"partition {part!r} of {topic!r}: a negative "
                                          f"offset must be Kafka's {what}", offset)
            elif not is_int(offset) or offset < 0 or pid < 0:
                raise InvalidArgument(name, f"partition {part!r} of {topic!r} needs a "
                                      "non-negative integer queue offset", offset)
            checked[str(pid)] = offset
        out[topic] = checked
    return out
