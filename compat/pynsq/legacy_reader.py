"""pynsq's ``nsq.legacy_reader``: ``LegacyReader``, the pre-0.5 "tasks" API (deprecated there
too) as one :class:`~smartnsq.compat.pynsq.reader.Reader` per task.

With several tasks each Reader reads the channel ``<channel>.<task>``; with one, the channel
itself. Every other keyword goes to each Reader.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from .protocol import asserting
from .reader import Reader

__all__ = ["LegacyReader"]


class LegacyReader:
    """``LegacyReader(all_tasks={name: handler}, topic=..., channel=..., **reader_kwargs)``;
    the Readers are in ``readers``."""

    @asserting
    def __init__(self, *, all_tasks: Mapping[str, Callable[..., Any]], topic: str,
                 channel: str, **kwargs: Any) -> None:
        warnings.warn("LegacyReader is deprecated (as in pynsq): build one Reader per "
                      "handler", DeprecationWarning, stacklevel=2)
        assert isinstance(all_tasks, Mapping), "all_tasks must be a dict of handlers"
        for task, handler in all_tasks.items():
            assert callable(handler), f"the handler of task {task!r} must be callable"
        self.readers: list[Reader] = []
        for task, handler in all_tasks.items():
            name = f"{channel}.{task}" if len(all_tasks) > 1 else channel
            self.readers.append(Reader(topic=topic, channel=name, message_handler=handler,
                                       **kwargs))
