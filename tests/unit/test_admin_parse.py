"""The admin answers parser (smartnsq.protocol.admin), driven by captures of real servers."""

from __future__ import annotations

import pytest
from support import http_capture

from smartnsq.errors import AdminError, InvalidArgument, ProtocolError
from smartnsq.protocol.admin import (
    channel_params,
    creation_progress,
    parse_info,
    parse_nodes,
    parse_stats,
    parse_write,
    setoffset_body,
    stats_params,
    topic_create_params,
)
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.lookup import Node, Partition, TopicMeta, TopicView, parse_listlookup

# -- writes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["youzan/http_topic_create_p3r1.txt",
                                  "youzan/http_topic_create_ordered.txt",
                                  "youzan/http_topic_create_ext.txt",
                                  "youzan/http_topic_create_p2r2_multipart.txt",
                                  "youzan/http_nsqd_channel_create_ordered_p1.txt",
                                  "classic/http_nsqd_topic_create.txt",
                                  "classic/http_nsqd_channel_create.txt"])
def test_successful_writes(name: str) -> None:
    parse_write(*http_capture(name))


def test_create_refused_for_lack_of_nodes() -> None:
    with pytest.raises(AdminError) as info:
        parse_write(*http_capture("youzan/http_topic_create_p2r2_nomultipart_fail.txt"),
                    what="nsqlookupd /topic/create", address="127.0.0.1:14161")
    err = info.value
    assert err.status == 400
    assert err.code == "No node is available for topic"  # the coordinator prefix is skipped
    assert err.message.startswith("ErrType:9")
    assert not err.not_leader and not err.retriable
    assert "nsqlookupd /topic/create on 127.0.0.1:14161" in str(err)


def test_create_on_a_follower_lookupd_is_not_leader() -> None:
    with pytest.raises(AdminError) as info:
        parse_write(*http_capture("youzan/http_topic_create_on_nonleader_lookupd.txt"))
    assert info.value.code == "E_FAILED_ON_NOT_LEADER"
    assert info.value.not_leader and info.value.retriable


def test_channel_create_on_a_replica_is_not_leader() -> None:
    with pytest.raises(AdminError) as info:
        parse_write(*http_capture("youzan/http_nsqd_channel_create_on_nonleader.txt"))
    assert info.value.not_leader


def test_invalid_topic_name_is_not_retriable() -> None:
    with pytest.raises(AdminError) as info:
        parse_write(*http_capture("youzan/http_topic_create_invalid_name.txt"))
    assert info.value.code == "INVALID_ARG_TOPIC" and not info.value.retriable


def test_wrapped_and_text_errors() -> None:
    with pytest.raises(AdminError) as info:
        parse_write(500, b'{"status_code":500,"status_txt":"E_FAILED_ON_NOT_LEADER","data":null}')
    assert info.value.not_leader
    with pytest.raises(AdminError) as info:
        parse_write(503, b"<html>bad gateway</html>")
    assert info.value.retriable and "bad gateway" in info.value.message


# -- requests -----------------------------------------------------------------------------------

def test_topic_create_params() -> None:
    assert topic_create_params("t", 4, 2, ordered=True, ext=True) == {
        "topic": "t", "partition_num": "4", "replicator": "2", "orderedmulti": "true",
        "extend": "true"}
    assert topic_create_params("t", multipart=True)["multipart"] == "true"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"partition_num": 0}, "partition_num"), ({"partition_num": 256}, "partition_num"),
    ({"replicator": 6}, "replicator"), ({"replicator": True}, "replicator"),
    ({"retention_days": 0}, "retention_days")])
def test_topic_create_params_name_the_bad_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        topic_create_params("t", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_bad_names_are_refused_before_sending() -> None:
    with pytest.raises(InvalidArgument) as info:
        topic_create_params("bad*name")
    assert info.value.field == "topic"
    with pytest.raises(InvalidArgument) as info:
        channel_params("t", "bad channel")
    assert info.value.field == "channel"


def test_channel_params_and_setoffset() -> None:
    assert channel_params("t", "c", 1) == {"topic": "t", "channel": "c", "partition": "1"}
    assert setoffset_body(StartPosition.end()) == b"special:-1"
    assert setoffset_body(StartPosition.timestamp(5)) == b"timestamp:5"
    with pytest.raises(InvalidArgument):
        setoffset_body("end")  # type: ignore[arg-type]
    assert stats_params("t", leader_only=True) == {"format": "json", "topic": "t",
                                                    "leaderOnly": "true"}


# -- stats, info, nodes, listlookup ---------------------------------------------------------------

def test_youzan_stats_one_partition() -> None:
    stats = parse_stats(*http_capture("youzan/http_nsqd_stats_json_topic_v1.txt"))
    assert stats.youzan and stats.health == "OK"
    topic = stats.topic("test_ordered", 0)
    assert topic is not None
    assert topic.partition == 0 and topic.leader is True and topic.ordered
    assert topic.backend_depth == 240 and topic.backend_start == 0
    channel = topic.channel("och")
    assert channel is not None and channel.message_count == 6 and channel.backlogs == 0
    # the topic's "depth" is its queue in bytes (six messages, 240), not messages waiting
    assert (topic.waiting, topic.queue_bytes) == (None, 240)


@pytest.mark.parametrize("name", ["youzan/http_nsqd_stats_json_v0.txt",
                                  "youzan/http_nsqd_stats_json_v1.txt"])
def test_youzan_stats_both_envelopes_agree(name: str) -> None:
    stats = parse_stats(*http_capture(name))
    assert stats == parse_stats(*http_capture("youzan/http_nsqd_stats_json_v1.txt"))
    assert any(t.leader is False for t in stats.topics)  # replicas are listed too
    for t in stats.topics:
        assert stats.partitions(t.name)


def test_classic_stats() -> None:
    stats = parse_stats(*http_capture("classic/http_nsqd_stats_json_v1.txt"))
    assert not stats.youzan
    assert stats.topics and all(t.partition is None and t.leader is None for t in stats.topics)
    counts = {c.name: c.clients for t in stats.topics for c in t.channels}
    assert counts
    assert all(t.waiting == t.depth and t.queue_bytes is None for t in stats.topics)
    assert parse_stats(*http_capture("classic/http_nsqd_stats_json_v0.txt")) == stats


def test_stats_refuses_garbage() -> None:
    with pytest.raises(ProtocolError):
        parse_stats(200, b"[1, 2]")
    with pytest.raises(ProtocolError):
        parse_stats(200, b'{"topics": [{"topic_name": "t", "topic_partition": "x"}]}')
    with pytest.raises(AdminError):
        parse_stats(500, b'{"status_code":500,"status_txt":"INTERNAL","data":null}')


def test_info() -> None:
    nsqd = parse_info(*http_capture("youzan/http_nsqd_info_v1.txt"))
    assert nsqd.youzan and nsqd.ha_support and nsqd.tcp_port == 14150
    assert parse_info(*http_capture("youzan/http_nsqd_info_v0.txt")) == nsqd
    lookupd = parse_info(*http_capture("youzan/http_lookupd_info_v1.txt"))
    assert lookupd.youzan and lookupd.tcp_port is None
    classic = parse_info(*http_capture("classic/http_nsqd_info_v1.txt"))
    assert not classic.youzan and classic.ha_support is None and classic.http_port == 34451
    assert not parse_info(*http_capture("classic/http_lookupd_info_v1.txt")).youzan


def test_nodes() -> None:
    nodes = parse_nodes(*http_capture("youzan/http_lookupd_nodes_v1.txt"))
    assert [n.tcp_port for n in nodes] == [14150, 24150, 34150]
    assert all(isinstance(n, Node) and n.youzan for n in nodes)
    classic = parse_nodes(*http_capture("classic/http_lookupd_nodes_v1.txt"))
    assert classic and not any(n.youzan for n in classic)


def test_listlookup_names_the_leader() -> None:
    listing = parse_listlookup(*http_capture("youzan/http_lookupd_listlookup_v1.txt"))
    assert listing.leader == "127.0.0.1:14161" and len(listing.nodes) == 2
    assert parse_listlookup(*http_capture("classic/http_lookupd_listlookup_v1.txt")).classic


# -- the create-topic decision ------------------------------------------------------------------

def _view(partitions: int, access: str = "r") -> TopicView:
    node = Node("127.0.0.1", 4150, 4151, version="0.3.7-HA.1.13.0")
    return TopicView("t", access, True, TopicMeta(4, 1, False, False),
                     {p: Partition(p, node) for p in range(partitions)}, (node,))


def test_first_round_sends_the_create() -> None:
    state = creation_progress("t", 4, read=None, write=None, channels_ready=(),
                              want_channels=True, started=0.0, last_sent=None, now=0.0,
                              resend_interval=5.0)
    assert state.resend and not state.done and state.missing_leaders == (0, 1, 2, 3)


def test_resent_only_after_the_interval_until_usable() -> None:
    def at(now: float, read: TopicView | None, want_channels: bool = False,
           write: TopicView | None = None) -> bool:
        return creation_progress("t", 4, read=read, write=write, channels_ready=range(4),
                                 want_channels=want_channels, started=0.0, last_sent=10.0,
                                 now=now, resend_interval=5.0).resend

    assert not at(14.9, _view(2))
    assert at(15.0, _view(2))
    assert not at(30.0, _view(4))  # every partition has a leader: no more sends
    # a read lookup can name leaders before the topic is writable: keep re-sending
    assert at(30.0, _view(4), want_channels=True, write=_view(2, "w"))
    assert not at(30.0, _view(4), want_channels=True, write=_view(4, "w"))


def test_done_needs_leaders_then_writability_when_channels_are_wanted() -> None:
    def state(write: int, ready: range) -> bool:
        return creation_progress("t", 4, read=_view(4), write=_view(write, "w") if write else None,
                                 channels_ready=ready, want_channels=True, started=0.0,
                                 last_sent=0.0, now=1.0, resend_interval=5.0).done

    assert not state(0, range(4))
    assert not state(4, range(3))
    assert state(4, range(4))
    without = creation_progress("t", 4, read=_view(4), write=None, channels_ready=(),
                                want_channels=False, started=0.0, last_sent=0.0, now=1.0,
                                resend_interval=5.0)
    assert without.done
    assert without.describe() == "t: 4/4 partitions have a leader after 1.0 s"
