"""The one check of a number argument: an ``int`` or a real number, never a ``bool``, in a range.

Python's ``True`` is an ``int`` and ``float("nan")`` compares false with everything, so "a
number from a to b" written by hand needs three tests that were each forgotten somewhere once;
every setting and argument of the library (config fields through
:func:`smartnsq.config.number`/:func:`smartnsq.config.integer`, and the plain arguments of
commands, rdy, requeue and the clients) is checked here, so the rule and its error text are
written once. It sits in ``protocol/`` because the sans-I/O command builders need it and they
sit below the configs.
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from ..errors import InvalidArgument

__all__ = ["check_int", "check_number", "is_int", "is_real", "range_text"]


def is_int(value: Any) -> TypeGuard[int]:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> TypeGuard[int | float]:
    """An ``int`` or ``float`` that is not a ``bool`` and not NaN (infinity is a real here;
    :func:`check_number` refuses it unless told)."""
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and not (isinstance(value, float) and math.isnan(value))


def range_text(low: float | str | None = None, high: float | None = None, *,
               low_open: bool = False) -> str:
    """How a range reads in errors and in the reference: ``1..9``, ``>= 0``, ``> 0, <= 60``
    (``low`` may name another field)."""
    floor = low if isinstance(low, str) or low is None else _show(low)
    if floor is None:
        return "" if high is None else f"<= {_show(high)}"
    if high is not None and not low_open:
        return f"{floor}..{_show(high)}"
    text = f"{'>' if low_open else '>='} {floor}"
    return text if high is None else f"{text}, <= {_show(high)}"


def _show(bound: float) -> str:
    """An int bound exactly (2**64-1 is not 1.84467e+19), a float one short (0.01)."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def check_int(field: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """``value`` if it is an int in ``low..high`` (either end open when None), else
    :class:`InvalidArgument` naming ``field``."""
    if not is_int(value) or (low is not None and value < low) \
            or (high is not None and value > high):
        bounds = range_text(low, high)
        text = "must be an int" + (f" {bounds}" if bounds.startswith(("<", ">")) else
                                   f" in {bounds}" if bounds else "")
        raise InvalidArgument(field, text, value)
    return int(value)


def check_number(field: str, value: Any, low: float | str | None = 0, *, low_open: bool = False,
                 high: float | None = None, finite: bool = True,
                 what: str = "number of seconds", floor: float | None = None) -> float:
    """``value`` as a float if it is a real number from ``low`` (``low_open``: above it) to
    ``high``, finite unless ``finite`` is False, else :class:`InvalidArgument` naming ``field``
    and ``what`` it must be. ``floor`` is the value of a ``low`` written as another field's
    name (the rule's text then names that field)."""
    bound = floor if isinstance(low, str) else low
    if not is_real(value) or (finite and math.isinf(value)):
        raise InvalidArgument(field, f"must be a {'finite ' if finite else ''}{what}", value)
    if (bound is not None and (value < bound or (low_open and value == bound))) \
            or (high is not None and value > high):
        raise InvalidArgument(field, f"must be {range_text(low, high, low_open=low_open)}",
                              value)
    return float(value)
