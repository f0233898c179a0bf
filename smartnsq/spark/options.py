"""The ``format("nsq")`` options, parsed once on the driver into frozen, picklable records.

Spark hands a data source its options as strings in a case-insensitive mapping. Everything is
checked here, on the driver, so a typo fails the query before any task starts (with
``InvalidArgument`` naming the option) instead of failing every task on every executor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import ConnectionConfig, Rule, flag, integer, one_source, seconds
from ..discovery.lookup import normalize_lookupd
from ..errors import InvalidArgument
from ..model.routes import parse_address
from ..model.sharding_schemes import DEFAULT_SCHEME, SCHEMES
from ..protocol import validate as v
from .offsets import (
    OFFSET_EARLIEST,
    OFFSET_LATEST,
    OffsetSpec,
    check_offset_topics,
    position_options,
)

__all__ = [
    "OPTION_TABLES",
    "AckSourceOptions",
    "ClusterOptions",
    "ConnectionOptions",
    "Option",
    "SinkOptions",
    "SourceOptions",
]

# how each connection to an nsqd is secured (every option set takes them)
CONNECTION_OPTIONS = frozenset({
    "tls", "tlscafile", "tlscertfile", "tlskeyfile", "tlsverify", "tlsserverhostname",
    "authsecret", "compression",
})
SINK_OPTIONS = CONNECTION_OPTIONS | frozenset({
    "lookupd", "nsqd", "topic", "topiccolumn", "bodycolumn", "shardingkeycolumn",
    "partitioncolumn", "traceidcolumn", "headerscolumn", "batchsize", "sharding", "timeout",
    "idempotencykey", "idempotencyheader", "idempotencyid", "maxinflight", "keyheader",
})
SOURCE_OPTIONS = CONNECTION_OPTIONS | frozenset({
    "lookupd", "nsqdhttp", "topic", "startingoffsets", "endingoffsets",
    "maxmessagespertrigger", "channel", "channelprefix", "commitchannel", "readtimeout",
    "rdy", "httptimeout", "mode", "leadertimeout", "failondataloss", "partitions",
    "minpartitions", "orderedreadchannels", "keyheader", "maxdecompressedsize",
    # Kafka's names, where they mean the same here
    "subscribe", "subscribepattern", "startingtimestamp", "startingoffsetsbytimestamp",
    "endingtimestamp", "endingoffsetsbytimestamp", "maxoffsetspertrigger",
    "minoffsetspertrigger", "maxtriggerdelay",
})
ACK_SOURCE_OPTIONS = CONNECTION_OPTIONS | frozenset({
    "lookupd", "nsqd", "topic", "channel", "mode", "maxinflight", "maxmessagespertrigger",
    "touchinterval", "connecttimeout",
})
# Spark passes some options of its own (the path of load()/save(), checkpoint settings...)
_SPARK_OWN = frozenset({"path", "checkpointlocation", "queryname"})


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(val) for k, val in options.items() if val is not None}


def _check_known(opts: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(opts) - known - _SPARK_OWN)
    if unknown:
        raise InvalidArgument(f"nsq {what} option", f"unknown option(s); known: "
                              f"{', '.join(sorted(known))}", unknown)


def _split(text: str | None, name: str) -> list[str]:
    if not text:
        return []
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise InvalidArgument(name, "needs at least one 'host:port'", text)
    return items


def _http_addresses(text: str | None, name: str) -> tuple[str, ...]:
    """nsqlookupd / nsqd HTTP addresses, read as everywhere else in smartnsq: ``host:port``
    or a URL such as ``http://host:port/``."""
    out = []
    for item in _split(text, name):
        try:
            out.append(normalize_lookupd(item))
        except InvalidArgument as exc:
            raise InvalidArgument(name, "must be 'host:http_port' (or http://host:port)",
                                  item) from exc
    return tuple(out)


def _lookupd_or_nsqd(opts: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ``lookupd`` (HTTP) or ``nsqd`` (TCP) addresses: exactly one of them is given."""
    lookupd = _http_addresses(opts.get("lookupd"), "lookupd")
    nsqd = _tcp_addresses(opts.get("nsqd"), "nsqd")
    one_source("lookupd", lookupd=lookupd, nsqd=nsqd)  # the clients' rule and wording
    return lookupd, nsqd


def _tcp_addresses(text: str | None, name: str) -> tuple[str, ...]:
    """nsqd TCP addresses (``host:port``; IPv6 hosts in brackets)."""
    out = []
    for item in _split(text, name):
        if "://" in item:
            raise InvalidArgument(name, "takes TCP addresses 'host:port', not URLs", item)
        host, port = parse_address(item, name)
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return tuple(out)


@dataclass(frozen=True)
class Option:
    """One number or switch of ``format("nsq")``, declared once: its name as written, its
    default, its :class:`~smartnsq.config.Rule` (the check, its error text and the range the
    reference shows, as for every client setting) and one line of doc. Spark gives options as
    strings; :meth:`read` turns the string into the default's type, then applies the rule."""

    name: str
    default: int | float | bool
    rule: Rule
    doc: str
    unit: str = ""
    default_text: str = ""  # what an absent option means, when not the default's value

    def read(self, opts: Mapping[str, str]) -> Any:
        raw = opts.get(self.name.lower())
        if raw is None or raw == "":
            return self.default
        value = _from_text(self.name, raw, type(self.default))
        self.rule.check(self.name, value, None)
        return value


def _from_text(name: str, raw: str, kind: type) -> int | float | bool:
    """An option's string as ``kind``: ``true``/``false`` (also 1/0, yes/no), an integer, or
    a number of seconds."""
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise InvalidArgument(name, "must be true or false", raw)
    try:
        return int(raw) if kind is int else float(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number of seconds"
        raise InvalidArgument(name, f"must be {what}", raw) from None


def _options(*options: Option) -> dict[str, Option]:
    return {o.name: o for o in options}


_SWITCH = Rule("true or false", flag().check)  # as Spark users write them
TLS_VERIFY = Option("tlsVerify", True, _SWITCH, "Verify the server certificate and host name "
                    "(false only for tests).")
SINK = _options(
    Option("batchSize", 500, integer(1, 100_000), "Messages per MPUB; a batch is also cut "
           "before it would exceed the server's max_body_size."),
    Option("maxInFlight", 8, integer(1, 1024), "MPUB batches a task keeps in flight (never "
           "more than one per partition)."),
    Option("timeout", 30.0, seconds(), "How long a batch may take, retries included, before "
           "the task fails.", "s"),
    Option("idempotencyKey", False, _SWITCH, "Add an idempotency header to every message "
           "(ext topics only)."),
)
SOURCE = _options(
    Option("maxMessagesPerTrigger", 1, integer(1), "Streaming: at most this many messages "
           "per micro-batch.", default_text="unlimited"),
    Option("readTimeout", 30.0, seconds(), "How long a range read may wait for the next "
           "message before the task fails.", "s"),
    Option("rdy", 500, integer(1, 2500), "RDY of a range read (messages in flight per "
           "connection)."),
    Option("httpTimeout", 5.0, seconds(), "Deadline of each HTTP call to nsqlookupd/nsqd.",
           "s"),
    Option("leaderTimeout", 300.0, seconds(), "How long a partition may stay unreadable (no "
           "leader, or consumption disabled on it) before the query fails.", "s"),
    Option("failOnDataLoss", True, _SWITCH, "A range that starts before the retained queue "
           "fails the query (true) or skips to the first retained message (false)."),
    Option("minPartitions", 1, integer(1, 100_000), "Split the ranges into at least this many "
           "Spark tasks.", default_text="one task per partition range"),
    Option("orderedReadChannels", 8, integer(1, 64), "Ordered topics: channels one task reads "
           "its range with at once."),
    Option("maxDecompressedSize", 64 << 20, integer(1, 1 << 31), "Most bytes a body its "
           "producer compressed may decode to; a larger one fails the task.", "bytes"),
    Option("minOffsetsPerTrigger", 1, integer(1), "Streaming: hold a micro-batch back until "
           "at least this many new messages wait (or maxTriggerDelay has passed).",
           default_text="none"),
)
ACK_SOURCE = _options(
    Option("maxInFlight", 1000, integer(1, 1_000_000), "mode=ack: the consumer's RDY budget "
           "(messages received and not yet FINed)."),
    Option("maxMessagesPerTrigger", 1, integer(1), "mode=ack: at most this many messages per "
           "micro-batch.", default_text="all buffered"),
    Option("touchInterval", 20.0, seconds(), "mode=ack: time between TOUCHes of the messages "
           "waiting for their commit.", "s"),
    Option("connectTimeout", 120.0, seconds(), "mode=ack: how long the source may go without "
           "any nsqd connection before the query fails.", "s"),
)
OPTION_TABLES: dict[str, dict[str, Option]] = {
    "connection": {TLS_VERIFY.name: TLS_VERIFY}, "sink": SINK, "source (replay)": SOURCE,
    "source (mode=ack)": ACK_SOURCE}
"""Every declared option by the reader that takes it (rendered in docs/configuration.md)."""


def _topics(raw: str | None, name: str = "topic") -> tuple[str, ...]:
    if not raw:
        raise InvalidArgument("topic", "is required (a topic name, or a comma list to read "
                              "several topics)", raw)
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if not topics:
        raise InvalidArgument(name, "names no topic", raw)
    for topic in topics:
        v.check_topic(topic)
    return topics


def _subscription(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    """The topics (``topic``, or Kafka's ``subscribe``) or the pattern (``subscribePattern``)
    read: exactly one of the three, as Kafka wants one of its ``subscribe*``/``assign``."""
    if "assign" in opts:
        raise InvalidArgument("assign", "is Kafka's option: here give topic (the topics) and "
                              "partitions (the partition ids, read of every topic)",
                              opts["assign"])
    given = [n for n in ("topic", "subscribe", "subscribePattern") if opts.get(n.lower())]
    if len(given) > 1:
        raise InvalidArgument(given[0], f"give one of {', '.join(given)}", opts[given[0].lower()])
    if given == ["subscribePattern"]:
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidArgument("subscribePattern", f"is not a valid regular expression "
                                  f"({exc})", pattern) from None
        return (), pattern
    return _topics(opts.get(given[0].lower()) if given else None,
                   given[0] if given else "topic"), None


_DELAY_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
                "d": 86400.0}


def _delay(raw: str | None, name: str) -> float:
    """A duration with its unit (``30s``, ``5m``, ``500ms``): Kafka's ``maxTriggerDelay``
    form. A bare number is refused: Kafka reads it as milliseconds, every other time option
    here takes seconds, and either reading would surprise someone."""
    if raw is None or not raw.strip():
        return 900.0  # Kafka's default, 15m
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)\s*", raw.lower())
    if match is None or match.group(2) not in _DELAY_UNITS:
        raise InvalidArgument(name, "must be a duration with its unit, e.g. 30s, 5m, 500ms "
                              "or 1h", raw)
    return float(match.group(1)) * _DELAY_UNITS[match.group(2)]


def _trigger_limits(opts: Mapping[str, str], streaming: bool
                    ) -> tuple[int | None, int | None, float]:
    """``maxMessagesPerTrigger`` (or Kafka's ``maxOffsetsPerTrigger``: a queue offset here is
    a byte, but Kafka's option counts messages, which is what this one counts),
    ``minOffsetsPerTrigger`` and ``maxTriggerDelay``: streaming only."""
    if opts.get("maxoffsetspertrigger") and opts.get("maxmessagespertrigger"):
        raise InvalidArgument("maxOffsetsPerTrigger", "give one of maxOffsetsPerTrigger, "
                              "maxMessagesPerTrigger", opts["maxoffsetspertrigger"])
    limit_name = "maxOffsetsPerTrigger" if opts.get("maxoffsetspertrigger") \
        else "maxMessagesPerTrigger"
    for name in (limit_name, "minOffsetsPerTrigger", "maxTriggerDelay"):
        if opts.get(name.lower()) and not streaming:
            raise InvalidArgument(name, "is for streaming reads only", opts[name.lower()])
    limit = None
    if opts.get(limit_name.lower()):
        limit = SOURCE["maxMessagesPerTrigger"].read(
            {"maxmessagespertrigger": opts[limit_name.lower()]})
    least = SOURCE["minOffsetsPerTrigger"].read(opts) if opts.get("minoffsetspertrigger") \
        else None
    if opts.get("maxtriggerdelay") and least is None:
        raise InvalidArgument("maxTriggerDelay", "bounds how long minOffsetsPerTrigger holds a "
                              "micro-batch back: give minOffsetsPerTrigger too",
                              opts["maxtriggerdelay"])
    if least is not None and limit is not None and least > limit:
        raise InvalidArgument("minOffsetsPerTrigger", f"is more than {limit_name} ({limit}): "
                              "no micro-batch could hold it", least)
    return limit, least, _delay(opts.get("maxtriggerdelay"), "maxTriggerDelay")


@dataclass(frozen=True)
class ConnectionOptions:
    """TLS, AUTH and compression of every nsqd connection, as ``ConnectionConfig`` fields.

    The secret is kept out of ``repr``, so it is in no log line or error smartnsq makes.
    """

    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_verify: bool = True
    tls_server_hostname: str | None = None
    auth_secret: str | None = field(default=None, repr=False)
    compression: str = "none"

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> ConnectionOptions:
        compression = (opts.get("compression") or "none").lower()
        if compression not in ("none", "snappy", "deflate"):
            raise InvalidArgument("compression", "must be none, snappy or deflate", compression)
        files = {name: opts.get(name.lower()) or None
                 for name in ("tlsCaFile", "tlsCertFile", "tlsKeyFile")}
        tls = bool(_from_text("tls", opts["tls"], bool)) if opts.get("tls") \
            else any(files.values())
        if not tls and any(files.values()):
            raise InvalidArgument("tls", "is false but tlsCaFile/tlsCertFile/tlsKeyFile are "
                                  "given: drop them or set tls=true", opts.get("tls"))
        if files["tlsKeyFile"] and not files["tlsCertFile"]:
            raise InvalidArgument("tlsKeyFile", "needs tlsCertFile (the client certificate)",
                                  files["tlsKeyFile"])
        secret = opts.get("authsecret")
        if secret is not None and not secret:
            raise InvalidArgument("authSecret", "must not be empty", "")
        return cls(tls=tls, tls_ca_file=files["tlsCaFile"], tls_cert_file=files["tlsCertFile"],
                   tls_key_file=files["tlsKeyFile"],
                   tls_verify=TLS_VERIFY.read(opts),
                   tls_server_hostname=opts.get("tlsserverhostname") or None,
                   auth_secret=secret or None, compression=compression)

    def kwargs(self) -> dict[str, Any]:
        """The ``ConnectionConfig`` fields these options set (defaults left out)."""
        out: dict[str, Any] = {}
        if self.tls:
            out.update(tls=True, tls_verify=self.tls_verify, tls_ca_file=self.tls_ca_file,
                       tls_cert_file=self.tls_cert_file, tls_key_file=self.tls_key_file,
                       tls_server_hostname=self.tls_server_hostname)
        if self.auth_secret is not None:
            out["auth_secret"] = self.auth_secret
        if self.compression != "none":
            out["compression"] = self.compression
        return out

    def config(self) -> ConnectionConfig:
        return ConnectionConfig(**self.kwargs())


@dataclass(frozen=True)
class ClusterOptions:
    """How to find the cluster: lookupd (normal) or nsqd nodes given directly."""

    lookupd: tuple[str, ...] = ()     # "host:http_port" of nsqlookupds
    nsqd: tuple[str, ...] = ()        # "host:tcp_port" of nsqd (sink only)
    nsqd_http: tuple[str, ...] = ()   # "host:http_port" of nsqd (source without lookupd)
    http_timeout: float = 5.0
    connection: ConnectionOptions = field(default_factory=ConnectionOptions)


@dataclass(frozen=True)
class SinkOptions:
    cluster: ClusterOptions
    topic: str | None
    topic_column: str | None
    body_column: str
    sharding_key_column: str | None
    partition_column: str | None
    trace_id_column: str | None
    headers_column: str | None
    batch_size: int
    sharding: str
    timeout: float
    max_in_flight: int
    idempotency: bool
    idempotency_header: str
    idempotency_id: str | None
    key_header: str | None = None  # store the sharding key in this ext header
    # the columns taken by Kafka's names (topic, key, value, partition, headers), no option
    # naming them: a null key or partition there means "none", as in Kafka
    picked: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = _lower(options)
        _check_known(opts, SINK_OPTIONS, "sink")
        lookupd, nsqd = _lookupd_or_nsqd(opts)
        topic = opts.get("topic") or None
        topic_column = opts.get("topiccolumn") or None
        if topic is not None and topic_column is not None:
            # neither is fine: the sink then takes a column named topic, as Kafka's does
            raise InvalidArgument("topic", "give one of the options topic and topicColumn, "
                                  "not both", topic)
        if topic is not None:
            v.check_topic(topic)
        key = opts.get("shardingkeycolumn") or None
        part = opts.get("partitioncolumn") or None
        if key is not None and part is not None:
            raise InvalidArgument("shardingKeyColumn", "give shardingKeyColumn or "
                                  "partitionColumn, not both", key)
        sharding = opts.get("sharding", DEFAULT_SCHEME).lower()
        if sharding not in SCHEMES:  # the Producer's schemes (callables make no sense here)
            raise InvalidArgument("sharding", f"must be {' or '.join(SCHEMES)}", sharding)
        key_header = opts.get("keyheader") or None
        if key_header is not None and key is None:
            raise InvalidArgument("keyHeader", "stores the sharding key: give "
                                  "shardingKeyColumn too", key_header)
        header = opts.get("idempotencyheader", "spark_idempotency_key")
        if not header:
            raise InvalidArgument("idempotencyHeader", "must not be empty", header)
        return cls(
            cluster=ClusterOptions(lookupd=lookupd, nsqd=nsqd,
                                   connection=ConnectionOptions.parse(opts)),
            topic=topic, topic_column=topic_column,
            body_column=opts.get("bodycolumn") or "body",
            sharding_key_column=key, partition_column=part,
            trace_id_column=opts.get("traceidcolumn") or None,
            headers_column=opts.get("headerscolumn") or None,
            batch_size=SINK["batchSize"].read(opts),
            sharding=sharding,
            timeout=SINK["timeout"].read(opts),
            max_in_flight=SINK["maxInFlight"].read(opts),
            idempotency=SINK["idempotencyKey"].read(opts),
            idempotency_header=header,
            idempotency_id=opts.get("idempotencyid") or None,
            key_header=key_header,
        )

    def producer_key(self) -> tuple[object, ...]:
        """What makes two writers able to share one cached producer."""
        return (self.cluster.lookupd, self.cluster.nsqd, self.sharding, self.timeout,
                self.cluster.connection)


@dataclass(frozen=True)
class SourceOptions:
    cluster: ClusterOptions
    topics: tuple[str, ...]
    starting: OffsetSpec
    ending: OffsetSpec
    max_messages_per_trigger: int | None
    channel: str | None
    channel_prefix: str
    commit_channel: str | None
    read_timeout: float
    rdy: int
    leader_timeout: float = 300.0
    fail_on_data_loss: bool = True
    partitions: frozenset[int] | None = None  # only these partitions of every topic
    min_partitions: int | None = None  # split ranges into at least this many tasks
    ordered_read_channels: int = 8  # channels a task reads an ordered range with at once
    key_header: str = "key"  # the ext header the `key` column comes from
    max_decompressed_size: int = 64 << 20  # bound of a producer-compressed body, decoded
    topic_pattern: str | None = None  # subscribePattern: the topics are the cluster's matches
    min_messages_per_trigger: int | None = None  # minOffsetsPerTrigger
    max_trigger_delay: float = 900.0  # maxTriggerDelay, seconds

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        opts = _lower(options)
        if "assign" in opts:
            _subscription(opts)  # refused, pointing at topic + partitions
        _check_known(opts, SOURCE_OPTIONS, "source")
        mode = opts.get("mode", "replay").lower()
        if mode != "replay":
            raise InvalidArgument("mode", "must be replay (or ack, for streaming reads only)",
                                  opts.get("mode"))
        lookupd = _http_addresses(opts.get("lookupd"), "lookupd")
        nsqd_http = _http_addresses(opts.get("nsqdhttp"), "nsqdHttp")
        if bool(lookupd) == bool(nsqd_http):
            raise InvalidArgument("lookupd", "give exactly one of the options lookupd "
                                  "(nsqlookupd HTTP addresses) or nsqdHttp (nsqd HTTP "
                                  "addresses)", opts.get("lookupd"))
        if "nsqd" in opts:
            raise InvalidArgument("nsqd", "the source needs HTTP addresses: use nsqdHttp "
                                  "(or lookupd)", opts["nsqd"])
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if streaming and opts.get(name.lower()):
                raise InvalidArgument(name, "is for bounded reads (spark.read) only",
                                      opts[name.lower()])
        limit, least, delay = _trigger_limits(opts, streaming)
        channel = opts.get("channel") or None
        if channel is not None:
            v.check_channel(channel)
        commit_channel = opts.get("commitchannel") or None
        if commit_channel is not None:
            v.check_channel(commit_channel)
        prefix = opts.get("channelprefix", "spark-nsq")
        v.check_channel(prefix + "-" + "0" * 16)
        topics, pattern = _subscription(opts)
        starting = position_options(opts, "starting",
                                    OFFSET_LATEST if streaming else OFFSET_EARLIEST)
        ending = position_options(opts, "ending", OFFSET_LATEST, (OFFSET_LATEST,))
        compiled = re.compile(pattern) if pattern is not None else None
        for which, spec in (("starting", starting), ("ending", ending)):
            given = next((n for n in (f"{which}Timestamp", f"{which}OffsetsByTimestamp")
                          if opts.get(n.lower())), f"{which}Offsets")
            check_offset_topics(spec, topics, given, compiled)
        return cls(
            cluster=ClusterOptions(lookupd=lookupd, nsqd_http=nsqd_http,
                                   http_timeout=SOURCE["httpTimeout"].read(opts),
                                   connection=ConnectionOptions.parse(opts)),
            topics=topics, starting=starting, ending=ending,
            max_messages_per_trigger=limit,
            channel=channel,
            channel_prefix=prefix,
            commit_channel=commit_channel,
            read_timeout=SOURCE["readTimeout"].read(opts),
            rdy=SOURCE["rdy"].read(opts),
            leader_timeout=SOURCE["leaderTimeout"].read(opts),
            fail_on_data_loss=SOURCE["failOnDataLoss"].read(opts),
            partitions=_partition_list(opts.get("partitions")),
            min_partitions=(SOURCE["minPartitions"].read(opts)
                            if opts.get("minpartitions") else None),
            ordered_read_channels=SOURCE["orderedReadChannels"].read(opts),
            key_header=_key_header(opts.get("keyheader")),
            max_decompressed_size=SOURCE["maxDecompressedSize"].read(opts),
            topic_pattern=pattern,
            min_messages_per_trigger=least,
            max_trigger_delay=delay,
        )


def _key_header(raw: str | None) -> str:
    """The ext header the source's ``key`` column is read from (the sink's ``keyHeader``)."""
    if raw is None:
        return "key"
    if not raw.strip():
        raise InvalidArgument("keyHeader", "must name an ext header, e.g. key", raw)
    return raw


def _partition_list(raw: str | None) -> frozenset[int] | None:
    """``partitions``: a comma list of partition ids (read only those, of every topic)."""
    if raw is None or not raw.strip():
        return None
    out = set()
    for item in raw.split(","):
        try:
            pid = int(item.strip())
        except ValueError:
            raise InvalidArgument("partitions", "must be a comma list of partition numbers, "
                                  "e.g. 0,2", raw) from None
        if pid < 0:
            raise InvalidArgument("partitions", "partition numbers are >= 0", raw)
        out.add(pid)
    return frozenset(out)


def source_mode(options: Mapping[str, str]) -> str:
    """``replay`` (queue offsets, youzan) or ``ack`` (driver-held consumer, FIN on commit)."""
    mode = _lower(options).get("mode", "replay").lower()
    if mode not in ("replay", "ack"):
        raise InvalidArgument("mode", "must be replay or ack", mode)
    return mode


@dataclass(frozen=True)
class AckSourceOptions:
    """``mode=ack``: a consumer on the driver; messages are FINed when Spark commits."""

    cluster: ClusterOptions
    topic: str
    channel: str
    max_in_flight: int
    max_messages_per_trigger: int | None
    touch_interval: float
    connect_timeout: float = 120.0
    # the query's checkpoint, when the reader is given it too: the only place a stopping
    # source can learn that Spark committed a batch it was never told about (ack_source.py)
    checkpoint_location: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> AckSourceOptions:
        opts = _lower(options)
        _check_known(opts, ACK_SOURCE_OPTIONS, "source (mode=ack)")
        lookupd, nsqd = _lookupd_or_nsqd(opts)
        topics = _topics(opts.get("topic"))
        if len(topics) != 1:
            raise InvalidArgument("topic", "mode=ack reads one topic", opts.get("topic"))
        channel = opts.get("channel")
        if not channel:
            raise InvalidArgument("channel", "mode=ack consumes a channel: name it", channel)
        v.check_channel(channel)
        limit = opts.get("maxmessagespertrigger")
        max_in_flight = ACK_SOURCE["maxInFlight"].read(opts)
        return cls(
            cluster=ClusterOptions(lookupd=lookupd, nsqd=nsqd,
                                   connection=ConnectionOptions.parse(opts)),
            topic=topics[0], channel=channel, max_in_flight=max_in_flight,
            max_messages_per_trigger=(ACK_SOURCE["maxMessagesPerTrigger"].read(opts)
                                      if limit else None),
            touch_interval=ACK_SOURCE["touchInterval"].read(opts),
            connect_timeout=ACK_SOURCE["connectTimeout"].read(opts),
            checkpoint_location=opts.get("checkpointlocation") or None,
        )
