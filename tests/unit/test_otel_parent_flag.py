"""The consumer's span gate reads the producer's decision from a W3C ``traceparent``'s
flags without the SDK (``smartnsq.observability.otel._parent_sampled``); anything not a well-formed
traceparent counts as none, as the propagator would ignore it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("opentelemetry")

from smartnsq.observability.otel import _parent_sampled

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


@pytest.mark.parametrize(("flags", "sampled"), [("01", True), ("00", False), ("03", True),
                                                ("02", False), ("ff", True), ("FE", False)])
def test_the_low_bit_of_the_flags_is_the_decision(flags: str, sampled: bool) -> None:
    message = SimpleNamespace(headers={"traceparent": f"00-{TRACE}-{SPAN}-{flags}"})
    assert _parent_sampled(message) is sampled


@pytest.mark.parametrize("value", [None, 1, "", f"00-{TRACE}-{SPAN}", f"00-{TRACE}-{SPAN}-011",
                                   "x" * 55 + "1", "x" * 54 + "1"])
def test_no_well_formed_traceparent_means_none(value: object) -> None:
    headers = {} if value is None else {"traceparent": value}
    assert _parent_sampled(SimpleNamespace(headers=headers)) is None
