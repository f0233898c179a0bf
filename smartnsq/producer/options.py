"""``ProducerOptions``: the Producer's keywords as a TypedDict, for type checkers and editors.

``Producer(lookupd, nsqd, ..., **options: Unpack[ProducerOptions])`` lets mypy and an editor
check and complete every option by name and type. The names and annotations are those of
:class:`~smartnsq.producer.config.ProducerConfig`'s fields and of
:class:`~smartnsq.ConnectionConfig`'s (which go to ``connection``), written again here because
a TypedDict cannot be derived from a dataclass for a type checker; ``tests/unit/
test_client_options.py`` fails when the two differ, so the copy cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import ConnectionConfig, ConnectionOptions
from ..model.dialect import ChooserFactory, ClassicDialect, RouteChooser
from ..model.sharding import ShardingScheme
from .config import BodyCompression

__all__ = ["ProducerOptions"]


class ProducerOptions(ConnectionOptions, total=False):
    """Every keyword option of the Producer and of ``sync.Producer``."""

    timeout: float
    sharding: ShardingScheme
    max_msg_size: int
    max_body_size: int
    retry_delay: float
    retry_delay_max: float
    reconnect_delay: float
    reconnect_delay_max: float
    drain_timeout: float
    idle_timeout: float | None
    sharded_receipts: bool
    linger: float
    trace: bool | None
    span_one_in: int
    compress: BodyCompression | Mapping[str, BodyCompression] | None
    connection: ConnectionConfig
    classic: ClassicDialect | None
    migration: RouteChooser | ChooserFactory | None
