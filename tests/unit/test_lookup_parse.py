"""The lookupd answer parser, driven by captures of real youzan and classic lookupds."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.discovery.lookup import LookupConfig, TopicChange, normalize_lookupd
from smartnsq.discovery.route_source import LookupRouteSource
from smartnsq.errors import (
    InvalidArgument,
    LookupdError,
    LookupFailed,
    ProtocolError,
    TopicNotFound,
    TopicNotWritable,
)
from smartnsq.protocol.lookup import (
    LookupLimits,
    Node,
    Partition,
    TopicMeta,
    TopicView,
    lookup_params,
    merge_views,
    parse_listlookup,
    parse_lookup,
    unwrap,
    valid_host,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def capture(name: str) -> tuple[int, bytes]:
    """(HTTP status, body) of a captured HTTP answer (both capture layouts)."""
    lines = (FIXTURES / name).read_bytes().split(b"\n")
    i = 0
    while not lines[i].startswith(b"HTTP"):
        i += 1
    status = int(lines[i].split()[1])
    i += 1
    while lines[i].strip():  # headers up to the blank line
        i += 1
    return status, b"\n".join(lines[i + 1:]).strip()


YZ_VERSION = "0.3.7-HA.1.13.0"


def yz_node(tcp: int) -> Node:
    return Node("127.0.0.1", tcp, tcp + 1, version=YZ_VERSION)


# -- youzan /lookup -----------------------------------------------------------------------------

def test_youzan_writers_with_meta() -> None:
    view = parse_lookup("test_p2r2", "w", *capture("youzan/http_lookup_p2r2_w_metainfo_v1.txt"))
    assert view.youzan
    assert view.meta == TopicMeta(partition_num=2, replica=2, ordered=False,
                                  extend_support=False, multi_part=True)
    assert view.meta is not None and view.meta.raw["multi_part"] is True
    assert view.partitions == {0: Partition(0, yz_node(14150)), 1: Partition(1, yz_node(24150))}
    assert view.leader(1) == yz_node(24150)
    assert view.leaders() == {0: yz_node(14150), 1: yz_node(24150)}
    assert {n.address for n in view.producers} == {("127.0.0.1", 14150), ("127.0.0.1", 24150)}
    assert view.channels == ("ch1",)
    assert view.unpartitioned == ()
    node = view.producers[0]
    assert node.youzan and node.http_address == "127.0.0.1:14151"  # sorted by address
    assert node.hostname == "vm" and node.distributed_id.endswith(":1")
    assert view.partition_num == 2 and not view.ordered and not view.extend_support


def test_views_pickle() -> None:
    view = parse_lookup("test_p2r2", "w", *capture("youzan/http_lookup_p2r2_w_metainfo_v1.txt"))
    copy = pickle.loads(pickle.dumps(view))
    assert copy == view and copy.channels == view.channels
    assert copy.meta is not None and copy.meta.raw == view.meta.raw  # type: ignore[union-attr]
    assert hash(copy) == hash(view)
    change = TopicChange.between(None, view)
    assert pickle.loads(pickle.dumps(change)).added == {0, 1}


def test_wrapped_answer_reads_like_the_bare_one() -> None:
    bare = parse_lookup("test_p2r2", "w", *capture("youzan/http_lookup_p2r2_w_metainfo_v1.txt"))
    wrapped = parse_lookup("test_p2r2", "w",
                           *capture("youzan/http_lookup_p2r2_w_metainfo_v0_noaccept.txt"))
    assert wrapped == bare  # channels differ (ch2 created in between); they are not compared
    assert wrapped.channels == ("ch1", "ch2")


def test_ordered_and_ext_meta() -> None:
    ordered = parse_lookup("test_ordered", "w",
                           *capture("youzan/http_lookup_ordered_w_metainfo_v1.txt"))
    assert ordered.ordered and ordered.partition_num == 2
    assert list(ordered.partitions) == [0]  # partition 1 had no channel yet: hidden to writers
    full = parse_lookup("test_ordered", "w",
                        *capture("youzan/http_lookup_ordered_w_metainfo_all_partitions_v1.txt"))
    assert list(full.partitions) == [0, 1]
    ext = parse_lookup("test_ext", "w", *capture("youzan/http_lookup_ext_w_metainfo_v1.txt"))
    assert ext.extend_support and ext.partition_num == 1


def test_readers_without_meta_and_one_partition() -> None:
    view = parse_lookup("test_p2r2", "r", *capture("youzan/http_lookup_p2r2_r_v1.txt"))
    assert view.youzan and view.meta is None and view.partition_num == 0
    assert sorted(view.partitions) == [0, 1]
    before = parse_lookup("test_p2r2", "r",
                          *capture("youzan/http_lookup_p2r2_r_before_channel_v1.txt"))
    assert sorted(before.partitions) == [0, 1] and before.channels == ()
    one = parse_lookup("test_p2r2", "w", *capture("youzan/http_lookup_p2r2_w_partition1_v1.txt"))
    assert list(one.partitions) == [1] and one.producers == (yz_node(24150),)


@pytest.mark.parametrize("name, access", [
    ("youzan/http_lookup_nonexistent_w_metainfo_v1.txt", "w"),  # 404 Key not found
    ("youzan/http_lookup_nonexistent_w_nometa_v1.txt", "w"),
    ("youzan/http_lookup_nonexistent_r_v1.txt", "r"),  # 200, nothing listed... see below
    ("classic/http_lookupd_lookup_missing_v0.txt", "r"),
    ("classic/http_lookupd_lookup_missing_v1.txt", "w"),
])
def test_missing_topic(name: str, access: str) -> None:
    status, body = capture(name)
    if status == 200:
        # a youzan reader's answer for an unknown topic lists nothing; without meta it cannot
        # be told from a topic whose nodes are all gone, so it is an empty view...
        view = parse_lookup("no_such_topic", access, status, body)
        assert view.youzan and view.empty and view.meta is None
        # ...and with the zeroed meta a metainfo lookup gets, it is "not found"
        data = json.loads(body)
        data["meta"] = {"partition_num": 0, "replica": 0, "ordered": False,
                        "extend_support": False}
        body = json.dumps(data).encode()
    with pytest.raises(TopicNotFound) as info:
        parse_lookup("no_such_topic", access, status, body)
    assert info.value.topic == "no_such_topic"
    assert not isinstance(info.value, TopicNotWritable)


def test_wrapped_missing_topic_is_a_500() -> None:
    body = b'{"status_code":500,"status_txt":"Key not found","data":null}'
    with pytest.raises(TopicNotFound):
        parse_lookup("gone", "w", 500, body)


def test_topic_without_channel_is_not_writable() -> None:
    status, body = capture("youzan/http_lookup_p2r2_w_metainfo_before_channel_v1.txt")
    with pytest.raises(TopicNotWritable, match="no channel") as info:
        parse_lookup("test_p2r2", "w", status, body)
    assert isinstance(info.value, TopicNotFound) and info.value.topic == "test_p2r2"


@pytest.mark.parametrize("name, message", [
    ("youzan/http_lookup_bad_access_v1.txt", "INVALID_ACCESS_MODE"),
    ("youzan/http_lookup_missing_topic_param_v1.txt", "MISSING_ARG_TOPIC"),
    ("classic/http_lookupd_lookup_no_topic_param_v0.txt", "MISSING_ARG_TOPIC"),
])
def test_request_errors(name: str, message: str) -> None:
    with pytest.raises(LookupdError, match=message) as info:
        parse_lookup("t", "w", *capture(name))
    assert info.value.status == 400 and not info.value.retriable
    assert isinstance(info.value, LookupFailed)


def test_server_errors_are_retriable() -> None:
    with pytest.raises(LookupdError) as info:
        parse_lookup("t", "w", 500, b'{"status_code":500,"status_txt":"etcd down","data":null}')
    assert info.value.retriable and info.value.message == "etcd down"
    with pytest.raises(LookupdError) as info:
        parse_lookup("t", "w", 502, b"<html>bad gateway</html>")
    assert info.value.retriable


def test_writes_disabled_answers_null_lists() -> None:
    body = json.dumps({"channels": ["c"], "meta": {"partition_num": 2, "replica": 1},
                       "partitions": None, "producers": None})
    view = parse_lookup("t", "w", 200, body)
    assert view.youzan and view.empty and view.partition_num == 2


def test_garbage_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        parse_lookup("t", "w", 200, b"not json")
    with pytest.raises(ProtocolError):
        parse_lookup("t", "w", 200, b"[1, 2]")
    with pytest.raises(ProtocolError):
        parse_lookup("t", "w", 200, b'{"producers": [{"tcp_port": 1}]}')
    with pytest.raises(ProtocolError):
        parse_lookup("t", "w", 200, b'{"partitions": {"x": {}}, "producers": []}')


def test_classic_pseudo_partition_is_not_a_partition() -> None:
    classic_peer = {"broadcast_address": "10.0.0.9", "tcp_port": 4150, "http_port": 4151,
                    "version": "1.3.0"}
    body = json.dumps({"channels": [], "partitions": {"-11": classic_peer},
                       "producers": [classic_peer]})
    view = parse_lookup("t", "r", 200, body)
    assert view.youzan and view.partitions == {}
    assert view.unpartitioned == (Node("10.0.0.9", 4150, 4151, version="1.3.0"),)
    assert not view.unpartitioned[0].youzan


# -- classic /lookup ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["classic/http_lookupd_lookup_v0.txt",
                                  "classic/http_lookupd_lookup_v1.txt"])
def test_classic_lookup(name: str) -> None:
    view = parse_lookup("cl_topic", "w", *capture(name))
    assert not view.youzan and view.meta is None and view.partitions == {}
    assert view.producers == (Node("127.0.0.1", 34450, 34451, version="1.3.0"),)
    assert not view.producers[0].youzan
    assert view.channels == ("ch1", "ch_noid")
    routes = LookupRouteSource.view_routes(view)
    assert routes.nodes == (("127.0.0.1", 34450),) and routes.youzan is False
    assert not routes.partitioned


# -- /listlookup --------------------------------------------------------------------------------

def test_listlookup_youzan() -> None:
    for name in ("youzan/http_lookupd_listlookup_v1.txt",
                 "youzan/http_lookupd_listlookup_v0.txt",
                 "youzan/http_lookupd_listlookup_from_nonleader_v1.txt"):
        answer = parse_listlookup(*capture(name))
        assert not answer.classic
        assert sorted(answer.nodes) == ["127.0.0.1:14161", "127.0.0.1:14171"]
        assert answer.leader == "127.0.0.1:14161"


@pytest.mark.parametrize("name", ["classic/http_lookupd_listlookup_v0.txt",
                                  "classic/http_lookupd_listlookup_v1.txt"])
def test_listlookup_classic(name: str) -> None:
    answer = parse_listlookup(*capture(name))
    assert answer.classic and answer.nodes == () and answer.leader is None


def test_listlookup_standalone() -> None:
    for body in (b"", b"null", b'{"status_code":200,"status_txt":"OK","data":null}'):
        answer = parse_listlookup(200, body)
        assert answer.nodes == () and not answer.classic
    with pytest.raises(LookupdError):
        parse_listlookup(500, b'{"message":"boom"}')


def test_unwrap() -> None:
    assert unwrap(200, b'{"status_code":200,"status_txt":"OK","data":{"a":1}}') == \
        (200, {"a": 1}, "")
    assert unwrap(404, b'{"message":"TOPIC_NOT_FOUND"}') == (404, None, "TOPIC_NOT_FOUND")
    assert unwrap(200, b"") == (200, None, "")
    # a real answer that merely has a "data" key is not an envelope
    assert unwrap(200, b'{"data": 1, "x": 2}') == (200, {"data": 1, "x": 2}, "")


def test_lookup_params() -> None:
    assert lookup_params("t", "w") == {"topic": "t", "access": "w", "metainfo": "true"}
    assert lookup_params("t", "r", partition=3, metainfo=False) == \
        {"topic": "t", "access": "r", "partition": "3"}


# -- merging several lookupds -------------------------------------------------------------------

def view_of(access: str, leaders: dict[int, int], extra: tuple[int, ...] = (),
            lookupd: str = "") -> TopicView:
    partitions = {pid: Partition(pid, yz_node(tcp)) for pid, tcp in leaders.items()}
    producers = tuple(sorted(dict.fromkeys([yz_node(t) for t in leaders.values()]
                                           + [Node("127.0.0.1", t, t + 1, version="1.3.0")
                                              for t in extra]),
                             key=lambda n: n.address))  # sorted, as the parser gives them
    meta = TopicMeta(len(leaders), 1, False, False)
    return TopicView("t", access, True, meta, partitions, producers,
                     lookupds=(lookupd,) if lookupd else ())


def test_merge_unions_producers_and_partitions() -> None:
    a = view_of("w", {0: 100}, lookupd="a:1")
    b = view_of("w", {1: 200}, extra=(300,), lookupd="b:1")
    merged = merge_views([a, b])
    assert sorted(merged.partitions) == [0, 1]
    assert [n.tcp_port for n in merged.producers] == [100, 200, 300]  # sorted by address
    assert merged.lookupds == ("a:1", "b:1")
    assert merge_views([a]) is a
    with pytest.raises(ValueError):
        merge_views([])


def test_merge_dedupes_by_address_and_votes_on_leaders() -> None:
    same = Node("127.0.0.1", 100, 101, version=YZ_VERSION, remote_address="127.0.0.1:1")
    other = Node("127.0.0.1", 100, 101, version=YZ_VERSION, remote_address="127.0.0.1:2")
    assert same == other  # remote_address is one lookupd's view of nsqd's outbound port
    stale = view_of("w", {0: 100})
    fresh = view_of("w", {0: 200})
    assert merge_views([stale, fresh, fresh]).leader(0) == yz_node(200)
    assert merge_views([stale, fresh]).leader(0) == yz_node(100)  # tie: first answer wins
    producers = merge_views([stale, stale]).producers
    assert len(producers) == 1


def test_merge_prefers_known_meta_and_youzan() -> None:
    classic = TopicView("t", "w", False, None, {}, (Node("h", 1, 2),))
    zeroed = TopicView("t", "w", True, TopicMeta(0, 0, False, False), {}, ())
    known = view_of("w", {0: 100})
    merged = merge_views([classic, zeroed, known])
    assert merged.youzan and merged.partition_num == 1


# -- routes and changes -------------------------------------------------------------------------

def test_view_routes_youzan() -> None:
    view = parse_lookup("test_ordered", "w",
                        *capture("youzan/http_lookup_ordered_w_metainfo_v1.txt"))
    routes = LookupRouteSource.view_routes(view)
    assert routes.youzan is True and routes.ordered and not routes.ext
    assert routes.partition_num == 2
    assert routes.leaders == {0: ("127.0.0.1", 24150)}  # partition 1 hidden: no leader now
    assert routes.nodes == ()
    mixed = view_of("w", {0: 100}, extra=(300,))
    routes = LookupRouteSource.view_routes(mixed)
    assert routes.nodes == (("127.0.0.1", 300),)  # a classic node beside youzan ones


def test_topic_change_between() -> None:
    old = view_of("w", {0: 100, 1: 200})
    new = view_of("w", {0: 300, 2: 200})
    change = TopicChange.between(old, new)
    assert dict(change.leaders_moved) == {0: (yz_node(100), yz_node(300))}
    assert change.added == {2} and change.removed == {1}
    first = TopicChange.between(None, new)
    assert first.added == {0, 2} and first.old is None and not first.leaders_moved
    gone = TopicChange.between(old, None)
    assert gone.new is None and gone.removed == {0, 1} and gone.topic == "t"


# -- configuration ------------------------------------------------------------------------------

def test_config_validation() -> None:
    LookupConfig(poll_interval=0.5, jitter=0, refresh_delay=0)
    for bad in ({"poll_interval": 0}, {"jitter": 1.5}, {"timeout": -1}, {"attempts": 0},
                {"retry_delay": 1.0, "retry_delay_max": 0.5}, {"backoff": 2, "backoff_max": 1},
                {"poll_interval": float("nan")}, {"forget_after": True}):
        with pytest.raises(InvalidArgument):
            LookupConfig(**bad)  # type: ignore[arg-type]


def test_normalize_lookupd() -> None:
    assert normalize_lookupd(" http://10.0.0.1:4161/ ") == "10.0.0.1:4161"
    assert normalize_lookupd("[::1]:4161") == "[::1]:4161"
    for bad in ("10.0.0.1", "host:0", ":4161", "host:http"):
        with pytest.raises(InvalidArgument):
            normalize_lookupd(bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.integers(0, 5), st.integers(1, 4)), min_size=1, max_size=4))
def test_merge_properties(answers: list[dict[int, int]]) -> None:
    views = [view_of("w", {pid: 1000 * port for pid, port in a.items()}) for a in answers]
    merged = merge_views(views)
    assert {n.address for n in merged.producers} == {n.address for v in views
                                                      for n in v.producers}
    assert list(merged.producers) == sorted(merged.producers, key=lambda n: n.address)
    assert set(merged.partitions) == {pid for a in answers for pid in a}
    for pid, part in merged.partitions.items():
        named = [v.leader(pid) for v in views if pid in v.partitions]
        assert part.leader in named
        assert named.count(part.leader) == max(named.count(n) for n in named)


# -- bounds on untrusted answers: a hostile lookupd's huge or malformed answer ------------------

def _answer(partitions: int, producers: int = 1, host: str = "127.0.0.1") -> bytes:
    node = {"broadcast_address": host, "tcp_port": 4150, "http_port": 4151,
            "version": YZ_VERSION}
    return json.dumps({"partitions": {str(i): node for i in range(partitions)},
                       "producers": [node] * producers,
                       "meta": {"partition_num": partitions, "replica": 1}}).encode()


def test_partition_and_node_counts_are_bounded() -> None:
    limits = LookupLimits(max_partitions=4, max_nodes=2)
    assert len(parse_lookup("t", "w", 200, _answer(4, 2), limits=limits).partitions) == 4
    with pytest.raises(ProtocolError, match=r"5 partitions.*max_partitions"):
        parse_lookup("t", "w", 200, _answer(5), limits=limits)
    with pytest.raises(ProtocolError, match=r"3 producers.*max_nodes"):
        parse_lookup("t", "w", 200, _answer(1, 3), limits=limits)
    big_id = json.loads(_answer(1))
    big_id["partitions"] = {"7": big_id["partitions"]["0"]}
    with pytest.raises(ProtocolError, match="partition id 7"):
        parse_lookup("t", "w", 200, json.dumps(big_id).encode(), limits=limits)


@pytest.mark.parametrize("host", ["h:1,h2", "a b", "a/b", "user@host", "-x", "", "[::1"])
def test_node_addresses_must_be_hosts(host: str) -> None:
    with pytest.raises(ProtocolError, match="broadcast_address"):
        parse_lookup("t", "w", 200, _answer(1, host=host))


@pytest.mark.parametrize("host", ["127.0.0.1", "nsqd-1.example", "::1", "[::1]", "node_2"])
def test_valid_hosts(host: str) -> None:
    assert valid_host(host)
    assert parse_lookup("t", "w", 200, _answer(1, host=host)).leader(0) is not None


def test_tcp_port_zero_is_not_a_port() -> None:
    answer = json.loads(_answer(1))
    answer["partitions"]["0"]["tcp_port"] = 0
    with pytest.raises(ProtocolError, match="tcp_port"):
        parse_lookup("t", "w", 200, json.dumps(answer).encode())


@pytest.mark.parametrize("port", ["\u00b2", "\u0663", "-1", "70000"])
def test_a_port_in_other_digits_is_not_a_port(port: str) -> None:
    # str.isdigit accepts these; int() raised a bare ValueError on the first, read the second
    answer = json.loads(_answer(1))
    answer["partitions"]["0"]["tcp_port"] = port
    with pytest.raises(ProtocolError, match="tcp_port"):
        parse_lookup("t", "w", 200, json.dumps(answer).encode())


def test_listlookup_is_bounded() -> None:
    nodes = [{"NodeIP": "127.0.0.1", "HttpPort": str(5000 + i)} for i in range(65)]
    with pytest.raises(ProtocolError, match="more than 64"):
        parse_listlookup(200, json.dumps({"lookupdnodes": nodes}).encode())
    odd = [{"NodeIP": "a b", "HttpPort": "1"}, {"NodeIP": "127.0.0.1", "HttpPort": "2"}]
    assert parse_listlookup(200, json.dumps({"lookupdnodes": odd}).encode()).nodes == \
        ("127.0.0.1:2",)


def test_lookup_config_bounds() -> None:
    for bad in ({"answer_grace": -1}, {"max_answer_size": 10}, {"max_partitions": 0},
                {"max_nodes": True}, {"tls_ca_file": 3}):
        with pytest.raises(InvalidArgument):
            LookupConfig(**bad)  # type: ignore[arg-type]
