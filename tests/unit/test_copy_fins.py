"""The tally of FINs whose refusal is expected (smartnsq.message.CopyFins), shared by the
consumer's links and the Spark range reader: the error texts are the real servers'."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ServerError, error_from_payload
from smartnsq.message import CopyFins

YOUZAN_ID = bytes([0, 0, 0, 0, 0, 0, 0, 2]) + bytes(8)
CLASSIC_ID = b"0a1b2c3d4e5f6789"


def server_error(text: str) -> ServerError:
    return error_from_payload(text.encode())


def fin_failed(message_id: bytes, youzan: bool = True) -> ServerError:
    shown = f"[{' '.join(map(str, message_id))}]" if youzan else message_id.decode()
    return server_error(f"E_FIN_FAILED FIN {shown} failed ErrMsgNotInFlight")


def test_nothing_is_expected_at_first() -> None:
    assert not CopyFins().absorbs(fin_failed(YOUZAN_ID))


def test_each_expected_refusal_is_absorbed_once() -> None:
    tally = CopyFins()
    tally.expect(YOUZAN_ID, 2)
    assert tally.absorbs(fin_failed(YOUZAN_ID))
    assert tally.absorbs(fin_failed(YOUZAN_ID))
    assert not tally.absorbs(fin_failed(YOUZAN_ID))


def test_another_id_or_code_is_a_real_failure() -> None:
    tally = CopyFins()
    tally.expect(CLASSIC_ID)
    assert not tally.absorbs(fin_failed(YOUZAN_ID))
    req = server_error(f"E_REQ_FAILED REQ {CLASSIC_ID.decode()} failed")
    assert not tally.absorbs(req)
    assert tally.absorbs(fin_failed(CLASSIC_ID, youzan=False))


@given(st.lists(st.integers(min_value=1, max_value=3), max_size=8), st.integers(0, 30))
def test_never_absorbs_more_than_expected(expects: list[int], errors: int) -> None:
    tally = CopyFins()
    for n in expects:
        tally.expect(YOUZAN_ID, n)
    absorbed = sum(tally.absorbs(fin_failed(YOUZAN_ID)) for _ in range(errors))
    assert absorbed == min(errors, sum(expects))


# -- a refusal held until the next delivery judges it (the reader's reset, ~1 in 100 drains) ----

def test_a_held_refusal_is_forgiven_by_a_copy_of_its_message() -> None:
    tally = CopyFins()
    refused = fin_failed(YOUZAN_ID)
    assert tally.hold(refused, YOUZAN_ID) and tally.held is refused
    assert tally.forgive(YOUZAN_ID) and tally.held is None
    assert tally.release() is None


def test_a_held_refusal_is_released_when_no_copy_comes() -> None:
    tally = CopyFins()
    refused = fin_failed(YOUZAN_ID)
    assert tally.hold(refused, YOUZAN_ID)
    assert not tally.forgive(bytes(16))  # another message: no forgiveness
    assert tally.release() is refused and tally.release() is None


def test_only_one_refusal_of_the_message_named_is_held() -> None:
    tally = CopyFins()
    assert not tally.hold(fin_failed(YOUZAN_ID), bytes(16))  # names another message
    assert not tally.hold(server_error("E_REQ_FAILED REQ [0 0 0 0 0 0 0 2 0 0 0 0 0 0 0 0] "
                                       "failed"), YOUZAN_ID)  # not a FIN's
    assert tally.hold(fin_failed(YOUZAN_ID), YOUZAN_ID)
    assert not tally.hold(fin_failed(YOUZAN_ID), YOUZAN_ID)  # one at a time: reported now


@given(st.lists(st.sampled_from(["hold", "forgive", "other", "release"]), max_size=20))
def test_every_held_refusal_is_forgiven_or_released_once(steps: list[str]) -> None:
    """Whatever the order of deliveries: a refusal taken by hold() leaves either through
    forgive() (a copy came) or release() (to be reported), exactly once."""
    tally = CopyFins()
    held = forgiven = released = 0
    for step in steps:
        if step == "hold":
            held += tally.hold(fin_failed(YOUZAN_ID), YOUZAN_ID)
        elif step == "forgive":
            forgiven += tally.forgive(YOUZAN_ID)
        elif step == "other":
            forgiven += tally.forgive(CLASSIC_ID)
        else:
            released += tally.release() is not None
    released += tally.release() is not None  # the connection closes
    assert held == forgiven + released
