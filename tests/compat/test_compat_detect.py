"""Detection of youzan vs classic from what the servers said (the captures, then live probes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from smartnsq.compat.detect import (
    Kind,
    classic_nodes,
    classify_lookup,
    kind_of_identify,
    kind_of_info,
    kind_of_listlookup,
    kind_of_lookup,
    kind_of_node,
    kind_of_peer,
    kind_of_version,
    kind_of_view,
    unwrap,
)
from smartnsq.compat.probe import group_lookupds, probe_lookupd
from smartnsq.errors import InvalidArgument
from smartnsq.protocol.lookup import parse_lookup
from smartnsq.protocol.responses import parse_identify_response

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def http_capture(kind: str, name: str) -> tuple[int, Any]:
    """The status and decoded JSON body of a captured HTTP exchange."""
    lines = (FIXTURES / kind / name).read_text().splitlines()
    status_line = next(line for line in lines if line.startswith("HTTP"))
    status = int(status_line.split()[1])
    body_text = lines[-1].strip()
    return status, json.loads(body_text) if body_text.startswith(("{", "[")) else None


@pytest.mark.parametrize(("name", "kind"), [
    ("http_lookup_p2r2_w_metainfo_v1.txt", Kind.YOUZAN),
    ("http_lookup_p2r2_r_v1.txt", Kind.YOUZAN),
    ("http_lookup_nonexistent_r_v1.txt", Kind.YOUZAN),
    ("http_lookup_p2r2_w_metainfo_v0_noaccept.txt", Kind.YOUZAN),  # wrapped
])
def test_youzan_lookup_answers(name: str, kind: Kind) -> None:
    status, body = http_capture("youzan", name)
    assert status == 200
    assert kind_of_lookup(body) is kind


@pytest.mark.parametrize("name", ["http_lookupd_lookup_v1.txt", "http_lookupd_lookup_v0.txt"])
def test_classic_lookup_answers(name: str) -> None:
    status, body = http_capture("classic", name)
    assert status == 200
    assert kind_of_lookup(body) is Kind.CLASSIC
    split = classify_lookup(body)
    assert split.lookupd is Kind.CLASSIC and split.youzan_nodes == ()
    assert split.classic_nodes and not split.partitions and not split.mixed


def test_classify_youzan_answer() -> None:
    _, body = http_capture("youzan", "http_lookup_p2r2_w_metainfo_v1.txt")
    split = classify_lookup(body)
    assert split.lookupd is Kind.YOUZAN
    assert split.partitions == {0: "127.0.0.1:14150", 1: "127.0.0.1:24150"}
    assert set(split.youzan_nodes) == {"127.0.0.1:14150", "127.0.0.1:24150"}
    assert split.classic_nodes == ()


def test_youzan_lookupd_listing_classic_nodes() -> None:
    body = {"channels": [], "partitions": {},
            "producers": [{"broadcast_address": "10.0.0.9", "tcp_port": 4150,
                           "version": "1.2.1"},
                          {"broadcast_address": "10.0.0.8", "tcp_port": 4150,
                           "version": "0.3.7-HA.1.13.0"}]}
    split = classify_lookup({"status_code": 200, "status_txt": "OK", "data": body})
    assert split.lookupd is Kind.YOUZAN and split.mixed
    assert split.classic_nodes == ("10.0.0.9:4150",)
    assert split.youzan_nodes == ("10.0.0.8:4150",)


def test_partitions_null_is_still_youzan() -> None:
    # writes disabled: access=w answers "producers": null, "partitions": null
    assert kind_of_lookup({"channels": [], "producers": None, "partitions": None}) is Kind.YOUZAN


def test_listlookup() -> None:
    status, body = http_capture("classic", "http_lookupd_listlookup_v1.txt")
    assert kind_of_listlookup(status, body) is Kind.CLASSIC
    status, body = http_capture("youzan", "http_lookupd_listlookup_v1.txt")
    assert kind_of_listlookup(status, body) is Kind.YOUZAN
    status, body = http_capture("youzan", "http_lookupd_listlookup_v0.txt")
    assert kind_of_listlookup(status, body) is Kind.YOUZAN
    assert kind_of_listlookup(200, None) is Kind.YOUZAN  # standalone: data null
    assert kind_of_listlookup(500, None) is None
    assert kind_of_listlookup(502, {"message": "bad gateway"}) is None


def test_info() -> None:
    assert kind_of_info(http_capture("youzan", "http_lookupd_info_v1.txt")[1]) is Kind.YOUZAN
    assert kind_of_info(http_capture("classic", "http_lookupd_info_v1.txt")[1]) is Kind.CLASSIC
    assert kind_of_info(http_capture("youzan", "http_nsqd_info_v1.txt")[1]) is Kind.YOUZAN
    assert kind_of_info("not json object") is None


def test_versions_and_peers() -> None:
    assert kind_of_version("0.3.7-HA.1.13.0") is Kind.YOUZAN
    assert kind_of_version("1.3.0") is Kind.CLASSIC
    assert kind_of_version("") is None and kind_of_version(None) is None
    assert kind_of_peer({"version": "0.3.7-HA.1.13.0"}) is Kind.YOUZAN
    assert kind_of_peer({"version": 3}) is None
    assert unwrap({"a": 1}) == {"a": 1}


def test_identify_answers() -> None:
    youzan = (FIXTURES / "youzan" / "tcp_01_identify_response.json").read_bytes()
    classic = (FIXTURES / "classic" / "tcp_01_identify_feature_negotiation_response.json")
    assert kind_of_identify(parse_identify_response(youzan)) is Kind.YOUZAN
    assert kind_of_identify(json.loads(classic.read_text())) is Kind.CLASSIC
    assert kind_of_identify(b"OK") is None  # no feature negotiation: nothing told


# -- live probes against the dev cluster ---------------------------------------------------------

async def test_probe_each_kind(nsq_cluster_factory: Any) -> None:
    youzan = await nsq_cluster_factory(nodes=1, lookupds=2)
    classic = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic")
    for address in youzan.lookupd_http_addresses:
        assert await probe_lookupd(address) is Kind.YOUZAN
    assert await probe_lookupd(classic.lookupd_http_addresses[0]) is Kind.CLASSIC
    assert await probe_lookupd(f"http://{classic.lookupd_http_addresses[0]}/") is Kind.CLASSIC
    groups = await group_lookupds([*classic.lookupd_http_addresses,
                                   *youzan.lookupd_http_addresses, "127.0.0.1:1"],
                                  timeout=1.0)
    assert groups.youzan == tuple(youzan.lookupd_http_addresses)
    assert groups.classic == tuple(classic.lookupd_http_addresses)
    assert groups.unknown == ("127.0.0.1:1",) and groups.mixed


async def test_probe_ignores_proxies_from_the_environment(nsq_cluster_factory: Any,
                                                          monkeypatch: pytest.MonkeyPatch) \
        -> None:
    """As the rest of the library (trust_env=False): a lookupd is reached directly, even with
    a proxy set for the process (here one that does not exist)."""
    classic = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic")
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:1")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert await probe_lookupd(classic.lookupd_http_addresses[0]) is Kind.CLASSIC
    groups = await group_lookupds(classic.lookupd_http_addresses)
    assert groups.classic == tuple(classic.lookupd_http_addresses)


async def test_probe_refuses_a_malformed_address() -> None:
    for address in ("no-port", "http://host:", "host:99999", ""):
        with pytest.raises(InvalidArgument):
            await probe_lookupd(address)


async def test_kind_changes_with_the_cluster(nsq_cluster_factory: Any) -> None:
    """A migration: the same address answers classic, then youzan; the next probe decides."""
    classic = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic")
    address = classic.lookupd_http_addresses[0]
    port = int(address.rsplit(":", 1)[1])
    assert await probe_lookupd(address) is Kind.CLASSIC
    await classic.stop()
    youzan = await nsq_cluster_factory(nodes=1, lookupds=1, lookupd_http_ports=[port])
    assert youzan.lookupd_http_addresses == [address]
    assert await probe_lookupd(address) is Kind.YOUZAN


def test_core_views_and_nodes() -> None:
    """The core's parsed views give the same verdicts (compat reuses them, no second parser)."""
    _, youzan_body = http_capture("youzan", "http_lookup_p2r2_w_metainfo_v1.txt")
    _, classic_body = http_capture("classic", "http_lookupd_lookup_v1.txt")
    youzan = parse_lookup("test_p2r2", "w", 200, json.dumps(youzan_body))
    classic = parse_lookup("t", "r", 200, json.dumps(classic_body))
    assert kind_of_view(youzan) is Kind.YOUZAN and kind_of_view(classic) is Kind.CLASSIC
    assert {kind_of_node(n) for n in youzan.producers} == {Kind.YOUZAN}
    assert {kind_of_node(n) for n in classic.producers} == {Kind.CLASSIC}
    assert classic_nodes(youzan) == () and classic_nodes(classic) == classic.producers
    mixed = dict(youzan_body, producers=[*youzan_body["producers"], *classic_body["producers"]])
    view = parse_lookup("test_p2r2", "r", 200, json.dumps(mixed))
    assert [n.version for n in classic_nodes(view)] == ["1.3.0"]
