"""pynsq's ``nsq.backoff_timer``: ``BackoffTimer``, an interval that grows on failures.

pynsq's Reader used it for its backoff; smartnsq's Reader backs off through
``smartnsq.model.backoff`` instead, so this one is for programs that use the timer themselves.
It keeps pynsq's arithmetic: the interval is ``min_interval`` plus a short-term and a
long-term part, each moved one unit per ``failure()`` / ``success()``; the short part holds
``ratio`` of the range in ``short_length`` steps, the long part the rest in ``long_length``.
"""

from __future__ import annotations

from decimal import Decimal

__all__ = ["BackoffTimer"]


def _decimal(value: int | float | Decimal) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value))


class BackoffTimer:
    """``failure()`` lengthens the interval, ``success()`` shortens it, ``get_interval()``
    reads it (seconds, a float)."""

    def __init__(self, min_interval: int | float | Decimal, max_interval: int | float | Decimal,
                 ratio: float = 0.25, short_length: int = 10, long_length: int = 250) -> None:
        for value in (min_interval, max_interval):
            assert isinstance(value, int | float | Decimal) and not isinstance(value, bool), \
                "intervals must be numbers"
        self.min_interval = _decimal(min_interval)
        self.max_interval = _decimal(max_interval)
        span = self.max_interval - self.min_interval
        self.max_short_timer = span * _decimal(ratio)
        self.max_long_timer = span * (1 - _decimal(ratio))
        self.short_unit = self.max_short_timer / _decimal(short_length)
        self.long_unit = self.max_long_timer / _decimal(long_length)
        self.short_interval = Decimal(0)
        self.long_interval = Decimal(0)
        self.interval = 0.0
        self.update_interval()

    def success(self) -> None:
        """One step shorter (never below ``min_interval``)."""
        if self.interval == 0.0:
            return
        self.short_interval = max(self.short_interval - self.short_unit, Decimal(0))
        self.long_interval = max(self.long_interval - self.long_unit, Decimal(0))
        self.update_interval()

    def failure(self) -> None:
        """One step longer (never above ``max_interval``)."""
        self.short_interval = min(self.short_interval + self.short_unit, self.max_short_timer)
        self.long_interval = min(self.long_interval + self.long_unit, self.max_long_timer)
        self.update_interval()

    def update_interval(self) -> None:
        self.interval = float(self.min_interval + self.short_interval + self.long_interval)

    def get_interval(self) -> float:
        return self.interval
