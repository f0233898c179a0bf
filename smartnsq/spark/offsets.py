"""What a position in the ``startingOffsets``/``endingOffsets`` options means, parsed on the driver.

Apart from the other options because offsets are values of their own: Spark stores them in the
checkpoint as JSON, the planner resolves them against the queues' bounds, and a typo in one
(a millisecond timestamp, another job's topic) must fail before any task starts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgument
from ..protocol import validate as v
from ..protocol.numbers import is_int

__all__ = [
    "OFFSET_EARLIEST",
    "OFFSET_LATEST",
    "OffsetSpec",
    "Offsets",
    "check_offset_topics",
    "check_offsets",
    "parse_offsets",
    "refuse_kafka_timestamps",
    "timestamp_of_spec",
]

OFFSET_EARLIEST = "earliest"
OFFSET_LATEST = "latest"
TIMESTAMP_PREFIX = "timestamp:"
# timestamp: values from here on are refused as milliseconds (Kafka's unit): as seconds they
# would be after the year 2286, as milliseconds they are any time since April 1970
SECONDS_LIMIT = 10**10
# Kafka's timestamp options (milliseconds) -> the option that takes a time here (seconds)
_KAFKA_TIMESTAMPS = {"startingTimestamp": "startingOffsets", "endingTimestamp": "endingOffsets",
                     "startingOffsetsByTimestamp": "startingOffsets",
                     "endingOffsetsByTimestamp": "endingOffsets"}

# Offsets as Spark stores them: {"topic": {"0": 8192, "1": 0}} (keys are strings in JSON)
Offsets = dict[str, dict[str, int]]
OffsetSpec = str | Offsets  # "earliest", "latest" or explicit offsets

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
    return check_offsets(value, name)


def check_offset_topics(spec: OffsetSpec, topics: tuple[str, ...], name: str) -> None:
    """Explicit offsets name only topics the source reads: a key that matches none (a typo,
    another job's offsets) would otherwise be ignored and its topic read from the default."""
    if not isinstance(spec, dict):
        return
    unknown = [topic for topic in spec if topic not in topics]
    if unknown:
        raise InvalidArgument(name, f"names topic(s) {', '.join(map(repr, unknown))}, but this "
                              f"source reads {', '.join(map(repr, topics))} (the topic "
                              "option): key the offsets by those topics", unknown)


def refuse_kafka_timestamps(opts: Mapping[str, str]) -> None:
    """Kafka's timestamp options (milliseconds): name the option to use, not only "unknown"."""
    for kafka, ours in _KAFKA_TIMESTAMPS.items():
        if kafka.lower() in opts:
            raise InvalidArgument(kafka, f"is Kafka's option (milliseconds); here use "
                                  f"{ours}=timestamp:<unix seconds> (one time for every "
                                  "partition)", opts[kafka.lower()])


def timestamp_of_spec(spec: object) -> int | None:
    """The unix seconds of a ``timestamp:T`` offset spec, else ``None``."""
    if isinstance(spec, str) and spec.startswith(TIMESTAMP_PREFIX):
        return int(spec[len(TIMESTAMP_PREFIX):])
    return None


def check_offsets(value: Any, name: str = "offsets") -> Offsets:
    """Validate (and normalise) offsets as JSON gives them."""
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
            if not is_int(offset) or offset < 0 or pid < 0:
                raise InvalidArgument(name, f"partition {part!r} of {topic!r} needs a "
                                      "non-negative integer queue offset", offset)
            checked[str(pid)] = offset
        out[topic] = checked
    return out
