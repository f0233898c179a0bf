"""``"a:1,b:2"``, the form ``SMARTNSQ_LOOKUPD`` and ``--lookupd`` take, is also a list of
lookupd addresses for the library: split, each address checked as when given alone."""

from __future__ import annotations

import pytest

from smartnsq.admin import AsyncAdmin
from smartnsq.discovery.lookup import normalize_lookupds
from smartnsq.errors import InvalidArgument


def test_a_comma_separated_string_is_split_and_each_address_normalized() -> None:
    assert normalize_lookupds("a:1, http://b:2/ ,,https://c:3") == ["a:1", "b:2", "https://c:3"]
    assert normalize_lookupds(["a:1,b:2", "c:3", "a:1"]) == ["a:1", "b:2", "c:3"]
    assert normalize_lookupds(None) == []


@pytest.mark.parametrize("bad", ["a:1,b", "a:1,b:0", "a:1,http://b:2/x", "a:1,::1:2"])
def test_each_address_of_the_string_is_validated(bad: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        normalize_lookupds(bad)
    assert caught.value.field == "lookupd"
    assert "a:1," not in repr(caught.value.value)  # names the bad address, not the string


def test_not_a_string_or_list_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        normalize_lookupds(4161)  # type: ignore[arg-type]


def test_admin_takes_the_string_form_in_a_list_too() -> None:
    assert AsyncAdmin("a:1,b:2").lookupd == ("a:1", "b:2")
    assert AsyncAdmin(["a:1,b:2", "c:3"]).lookupd == ("a:1", "b:2", "c:3")
    with pytest.raises(InvalidArgument):
        AsyncAdmin(["a:1,b"])


def test_the_lookup_manager_takes_the_comma_form_as_the_clients_pass_it() -> None:
    from smartnsq.discovery.lookup import LookupManager

    manager = LookupManager("127.0.0.1:4161,127.0.0.2:4161")
    assert list(manager.lookupds) == ["127.0.0.1:4161", "127.0.0.2:4161"]
    with pytest.raises(InvalidArgument, match="lookupd"):
        LookupManager("127.0.0.1:4161,127.0.0.2")
