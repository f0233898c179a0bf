"""The IDENTIFY request: what a client announces and which features it asks for.

Values are checked against the ranges youzan nsqd enforces (docs/protocol.md §3.3), because the
server answers an out-of-range value with a fatal ``E_BAD_BODY``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from . import validate as v

USER_AGENT = "smartnsq/0.1.0"


@dataclass(frozen=True)
class IdentifyOptions:
    """The IDENTIFY body. ``client_id`` and ``hostname`` have no default here (finding the
    machine's name is an OS call, kept out of the sans-I/O package): the connection layer
    passes them in (``ConnectionConfig.identify_options``); empty ones are not sent."""

    client_id: str = ""
    hostname: str = ""
    user_agent: str = USER_AGENT
    heartbeat_interval: int = 30_000
    output_buffer_size: int | None = None
    output_buffer_timeout: int | None = None
    msg_timeout: int = 0
    sample_rate: int = 0
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    extend_support: bool = False
    desired_tag: str = ""
    ext_filter: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        hb = self.heartbeat_interval
        if hb != -1 and not 1000 <= hb <= 60_000:
            raise InvalidArgument("heartbeat_interval", "must be -1 or 1000..60000 ms", hb)
        if self.output_buffer_size is not None and self.output_buffer_size not in (-1, 0):
            v.check_count("output_buffer_size", self.output_buffer_size, 64, 64 * 1024)
        if self.output_buffer_timeout is not None and self.output_buffer_timeout not in (-1, 0):
            # youzan forces 1..9 to 10; asking for 10+ keeps client and server in agreement
            v.check_count("output_buffer_timeout", self.output_buffer_timeout, 10, 1000)
        if self.msg_timeout != 0:
            v.check_count("msg_timeout", self.msg_timeout, 1000, 900_000)
        v.check_count("sample_rate", self.sample_rate, 0, 99)
        if self.snappy and self.deflate:
            raise InvalidArgument("compression", "choose snappy or deflate, not both")
        # youzan uses the level as sent (0 would mean no compression): always send 1..9
        v.check_count("deflate_level", self.deflate_level, 1, 9)
        v.check_tag(self.desired_tag)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.client_id:
            data["client_id"] = self.client_id
        if self.hostname:
            data["hostname"] = self.hostname
        data.update({
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": self.heartbeat_interval,
            "tls_v1": self.tls_v1,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
            "extend_support": self.extend_support,
        })
        if self.msg_timeout:
            data["msg_timeout"] = self.msg_timeout
        if self.output_buffer_size is not None:
            data["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            data["output_buffer_timeout"] = self.output_buffer_timeout
        if self.desired_tag:
            data["desired_tag"] = self.desired_tag
        if self.ext_filter is not None:
            data["ext_filter"] = self.ext_filter
        return data
