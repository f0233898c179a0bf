"""nsqd's options: :class:`NsqdOptions` as given, :class:`Settings` as a running node uses them.

Their own module so that the node and the modules serving its connections (``tcp``,
``http``, ``publish``) share them without importing each other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["FIRST_TWICE_MODES", "NsqdOptions", "Settings", "first_twice_mode"]

_HOUR_MS = 3_600_000

FIRST_TWICE_MODES = ("before", "after", "both", "reset", "random")
"""When the duplicate of a fresh ordered channel's first message goes out
(``NsqdOptions.ordered_first_delivery_twice``): ``before`` right behind the original, while it
is in flight (the copy is not in flight: its FIN fails); ``after`` once the original's FIN (or
REQ) was accepted (the copy is then in flight: its FIN succeeds, unanswered it times out);
``both`` one copy of each kind (three deliveries); ``reset`` the original dropped from flight
before its answer comes (that FIN fails), the copy after the refusal, in flight; ``random``
one of the other four, picked per channel."""


def first_twice_mode(value: bool | str) -> str:
    """``ordered_first_delivery_twice`` as a mode: ``""`` (off) or one of
    :data:`FIRST_TWICE_MODES`; ``True`` is ``"before"`` (what the option meant first)."""
    if value is True:
        return "before"
    if value is False or value in ("", "off"):
        return ""
    if value in FIRST_TWICE_MODES:
        return str(value)
    raise ValueError(f"ordered_first_delivery_twice must be a bool or one of "
                     f"{FIRST_TWICE_MODES}, not {value!r}")


@dataclass(frozen=True)
class NsqdOptions:
    """Server options (times in ms, sizes in bytes); ``None`` = the flavour's default.

    The defaults are the real servers' (youzan where they differ: output buffer 100 bytes /
    50 ms, max output buffer timeout 1 s, max REQ delay 72 h; classic: 16 KiB / 250 ms,
    25 ms..30 s, 1 h).
    """

    heartbeat_interval: int = 30_000  # a client's until it IDENTIFYs (ClientTimeout / 2)
    max_heartbeat_interval: int = 60_000
    msg_timeout: int = 60_000
    max_msg_timeout: int = 900_000
    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_rdy_count: int = 2500
    max_req_timeout: int | None = None
    output_buffer_size: int | None = None
    output_buffer_timeout: int | None = None
    max_output_buffer_size: int = 64 * 1024
    min_output_buffer_timeout: int | None = None
    max_output_buffer_timeout: int | None = None
    max_deflate_level: int = 6
    snappy: bool = True
    deflate: bool = True
    tls_required: bool = False
    allow_ext_compatible: bool = False
    allow_sub_ext_compatible: bool = False
    max_connections: int = 0  # youzan's max_conn_for_client; 0 = no limit
    # as on the real youzan nsqd, a fresh ordered channel's first message goes out twice (True:
    # the copy while the original is in flight; "after", "both", "reset", "random":
    # FIRST_TWICE_MODES)
    ordered_first_delivery_twice: bool | str = False

    def __post_init__(self) -> None:
        first_twice_mode(self.ordered_first_delivery_twice)  # a ValueError names the choices

    def resolved(self, classic: bool) -> Settings:
        """Every option with a value: the flavour's defaults fill the ``None`` ones."""
        defaults: dict[str, int] = (
            {"max_req_timeout": _HOUR_MS, "output_buffer_size": 16 * 1024,
             "output_buffer_timeout": 250, "min_output_buffer_timeout": 25,
             "max_output_buffer_timeout": 30_000}
            if classic else
            {"max_req_timeout": 72 * _HOUR_MS, "output_buffer_size": 100,
             "output_buffer_timeout": 50, "min_output_buffer_timeout": 1,
             "max_output_buffer_timeout": 1000})
        values = dataclasses.asdict(self)
        for key, default in defaults.items():
            if values[key] is None:
                values[key] = default
        values["ordered_first_delivery_twice"] = first_twice_mode(
            self.ordered_first_delivery_twice)
        return Settings(**values)


@dataclass(frozen=True)
class Settings:
    """:class:`NsqdOptions` resolved for one flavour (what a running node uses)."""

    heartbeat_interval: int
    max_heartbeat_interval: int
    msg_timeout: int
    max_msg_timeout: int
    max_msg_size: int
    max_body_size: int
    max_rdy_count: int
    max_req_timeout: int
    output_buffer_size: int
    output_buffer_timeout: int
    max_output_buffer_size: int
    min_output_buffer_timeout: int
    max_output_buffer_timeout: int
    max_deflate_level: int
    snappy: bool
    deflate: bool
    tls_required: bool
    allow_ext_compatible: bool
    allow_sub_ext_compatible: bool
    max_connections: int
    ordered_first_delivery_twice: str  # "" (off) or one of FIRST_TWICE_MODES
