"""``ConsumerOptions``: the Consumer's keywords as a TypedDict, for type checkers and editors.

``Consumer(topic, channel, ..., **options: Unpack[ConsumerOptions])`` lets mypy and an editor
check and complete every option by name and type. The names and annotations are those of
:class:`~smartnsq.consumer.config.ConsumerConfig`'s fields and of
:class:`~smartnsq.ConnectionConfig`'s (which go to ``connection``), written again here because
a TypedDict cannot be derived from a dataclass for a type checker; ``tests/unit/
test_client_options.py`` fails when the two differ, so the copy cannot drift. A keyword the
config normalizes takes more than the field holds (``WIDER``: ``partitions=[0, 1]`` becomes a
frozenset; ``None`` for a policy means its default), and says so here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from ..config import ConnectionConfig, ConnectionOptions
from ..model.backoff import BackoffPolicy, RequeuePolicy
from ..model.dialect import ClassicDialect
from ..protocol.commands import StartPosition
from .config import DeadLetterHook, GiveUpHook, OrderErrorHook

__all__ = ["WIDER", "ConsumerOptions"]

WIDER: Final = {  # keyword -> what it takes, where that is more than the field's type
    "partitions": "Iterable[int] | None",
    "requeue_policy": "RequeuePolicy | None",
    "backoff_policy": "BackoffPolicy | None",
    "lookup_options": "Mapping[str, Any] | None",
}


class ConsumerOptions(ConnectionOptions, total=False):
    """Every keyword option of the Consumer (``sync.Consumer`` takes them all but
    ``concurrency``, which is its ``threads=``)."""

    max_in_flight: int
    concurrency: int | None
    ordered: bool | None
    start: StartPosition | None
    partitions: Iterable[int] | None
    desired_tag: str | None
    ext_filter: Mapping[str, Any] | None
    extend_support: bool | None
    max_attempts: int
    on_give_up: GiveUpHook | None
    dead_letter: str | DeadLetterHook | None
    dead_letter_ordered: bool
    on_order_error: OrderErrorHook | None
    decompress: bool
    max_decompressed_size: int
    auto_finish: bool
    requeue_policy: RequeuePolicy | None
    backoff_policy: BackoffPolicy | None
    trace: bool | None
    span_one_in: int
    drain_timeout: float
    reconnect_delay: float
    reconnect_delay_max: float
    discovery_timeout: float | None
    low_rdy_idle_timeout: float
    rdy_tick_interval: float
    lookup_options: Mapping[str, Any] | None
    classic: ClassicDialect | None
    connection: ConnectionConfig
