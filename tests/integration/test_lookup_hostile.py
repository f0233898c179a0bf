"""LookupManager against hostile lookupds (``smartnsq.testing.hostile``), beside healthy ones.

Every public call is wrapped in ``bounded``: it must end within its timeout + 1 s whatever the
hostile peer does. Without a deadline on the whole request each of these hung or waited for
the slowest lookupd.
"""

from __future__ import annotations

import ssl
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from support import bounded

from smartnsq.discovery.lookup import LookupManager
from smartnsq.errors import InvalidArgument, LookupFailed, LookupTimeout, Timeout
from smartnsq.testing.hostile import (
    DripLookupd,
    FakeLookupd,
    HugeLookupd,
    PartitionsLookupd,
    SilentLookupd,
    lookup_answer,
)

QUIET = {"poll_interval": 300.0, "discover_interval": 300.0}


def state(lm: LookupManager, address: str) -> Any:
    return next(s for s in lm.health() if s.address == address)


@pytest.mark.parametrize("hostile", [DripLookupd, SilentLookupd])
async def test_a_stuck_lookupd_beside_a_healthy_one_costs_nothing(hostile: type) -> None:
    # before: the drip lookupd hung start() for good; the silent one added the whole
    # request timeout (5 s) to every round
    async with FakeLookupd() as good, hostile() as bad:
        lm = LookupManager([bad.address, good.address], **QUIET)
        try:
            async with bounded(0.0):  # nothing to wait for: the healthy answer suffices
                view = await lm.view("t")
            assert view.lookupds == (good.address,)
            assert view.leader(0) is not None
            async with bounded(0.0):
                await lm.view("t", refresh=True)
        finally:
            async with bounded(1.0):
                await lm.close()


async def test_the_whole_request_has_a_deadline() -> None:
    async with DripLookupd() as bad, \
            LookupManager([bad.address], timeout=1.0, attempts=1, **QUIET) as lm:
        async with bounded(2.0):  # discovery (1 s) is over; one round of 1 s
            with pytest.raises(LookupFailed, match="within 1s"):
                await lm.view("t")
        status = state(lm, bad.address)
        assert status.state == "timeout" and status.failures >= 1
        assert "whole answer" in status.last_error


async def test_a_slow_lookupd_is_demoted_and_reported() -> None:
    async with FakeLookupd() as good, SilentLookupd() as bad, \
            LookupManager([bad.address, good.address], timeout=0.5, **QUIET) as lm:
        async with bounded(0.0):
            await lm.view("t")
        async with bounded(1.0):  # the silent request ends at its own deadline
            await lm.wait_idle()
        status = state(lm, bad.address)
        assert status.state == "timeout" and status.retry_in > 0
        assert state(lm, good.address).state == "ok"
        assert lm.stats()["lookupds"][0]["state"] == "timeout"


async def test_a_huge_answer_is_refused_with_bounded_memory() -> None:
    async with FakeLookupd() as good, HugeLookupd() as bad:
        tracemalloc.start()
        try:
            async with LookupManager([bad.address, good.address], **QUIET) as lm:
                async with bounded(5.0):
                    view = await lm.view("t")
                async with bounded(5.0):
                    await lm.wait_idle()
                _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert view.lookupds == (good.address,)
        status = state(lm, bad.address)
        assert status.state == "malformed" and "bytes" in status.last_error
        assert peak < 64 * 1024 * 1024  # before: the whole 300 MiB answer, then its parse
        assert bad.sent < 64 * 1024 * 1024


async def test_ten_to_the_five_partitions_are_refused() -> None:
    async with PartitionsLookupd() as bad, \
            LookupManager([bad.address], attempts=1, max_answer_size=64 << 20, **QUIET) as lm:
        async with bounded(5.0):
            with pytest.raises(LookupFailed, match="partitions"):
                await lm.view("t")
        assert state(lm, bad.address).state == "malformed"


async def test_a_node_with_a_bad_address_is_malformed() -> None:
    answer = lookup_answer(2)
    answer["partitions"]["1"]["broadcast_address"] = "10.0.0.1/../x y"
    async with FakeLookupd(answer) as bad, \
            LookupManager([bad.address], attempts=1, **QUIET) as lm, bounded(5.0):
        with pytest.raises(LookupFailed, match="broadcast_address"):
            await lm.view("t")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture()
def https_files(ca: trustme.CA, tmp_path: Path) -> Iterator[tuple[ssl.SSLContext, str]]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    yield server, str(ca_file)


async def test_https_lookupd_is_asked_over_tls(
        https_files: tuple[ssl.SSLContext, str]) -> None:
    server, ca_file = https_files
    async with FakeLookupd(ssl_context=server) as lookupd:
        url = f"https://{lookupd.address}"
        # before: the scheme was dropped and the request went out as plain http
        async with LookupManager([url], tls_ca_file=ca_file, attempts=1, **QUIET) as lm:
            assert lm.seeds == (url,)
            async with bounded(5.0):
                view = await lm.view("t")
            assert view.leader(0) is not None and view.lookupds == (url,)
        # not trusting the CA: a verification failure, reported as such
        async with LookupManager([url], attempts=1, **QUIET) as lm, bounded(5.0):
            with pytest.raises(LookupFailed, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
                await lm.view("t")


@pytest.mark.parametrize("bad", ["h:1,h2", "", " ", "host", "host:", ":4161", "host:0",
                                 "host:65536", "ftp://host:4161", "http://host:4161/lookup",
                                 "ho st:4161", "host:41 61", "host:\u00b2", "host:\u0663"])
def test_bad_addresses_are_refused_at_construction(bad: str) -> None:
    # ("h:1,h2:2" is two addresses, as --lookupd takes them: each is checked)
    with pytest.raises(InvalidArgument) as caught:
        LookupManager([bad])
    assert caught.value.field == "lookupd"


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="lookupd"):
        LookupManager([])


def test_good_addresses() -> None:
    lm = LookupManager(["10.1.2.3:4161", "http://lookupd.example:4161/", "[::1]:4161",
                        "https://lookupd.example:4443"])
    assert lm.seeds == ("10.1.2.3:4161", "lookupd.example:4161", "[::1]:4161",
                        "https://lookupd.example:4443")


async def test_view_keeps_its_own_deadline_when_no_lookupd_answers() -> None:
    async with SilentLookupd() as bad:
        lm = LookupManager([bad.address], **QUIET)  # start (discovery) inside the call
        try:
            async with bounded(0.5):
                with pytest.raises(LookupTimeout) as caught:
                    await lm.view("t", timeout=0.5)
            assert isinstance(caught.value, LookupFailed) and isinstance(caught.value, Timeout)
            assert caught.value.retriable and not caught.value.fatal
            with pytest.raises(InvalidArgument, match="timeout"):
                await lm.view("t", timeout=float("inf"))
        finally:
            async with bounded(1.0):
                await lm.close()


def test_http_url_keeps_the_scheme() -> None:
    from smartnsq.discovery.lookup import normalize_lookupd
    from smartnsq.model.lookupd_health import http_url

    assert http_url(normalize_lookupd("https://h:4443/"), "/lookup") == "https://h:4443/lookup"
    assert http_url(normalize_lookupd("http://h:4161"), "/lookup") == "http://h:4161/lookup"
    assert http_url("h:4161") == "http://h:4161"
