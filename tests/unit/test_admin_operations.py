"""The operator's requests and the ``/message/get`` answer (``smartnsq.protocol.operations``).

The answers are the ones the real servers gave (youzan 0.3.7-HA.1.13.0, asked directly), so
the reader is held to them without a cluster.
"""

from __future__ import annotations

import pytest

from smartnsq.errors import AdminError, InvalidArgument, ProtocolError
from smartnsq.protocol import operations as ops

# youzan nsqd, GET /message/get?topic=ptopic&search_mode=id&search_pos=7
REAL_MESSAGE = (b'{"id":7,"trace_id":202,"body":"n2","timestamp":1796287743251780076,'
                b'"attempts":0,"offset":160,"queue_cnt_index":6,"ext":""}')


def test_an_id_names_its_partition() -> None:
    assert ops.partition_of_id(7) == 0
    assert ops.partition_of_id((1 << 50) + 2) == 1
    assert ops.partition_of_id(2251799813685263) == 2
    with pytest.raises(InvalidArgument, match="message_id"):
        ops.partition_of_id(-1)


def test_message_get_by_id_sends_the_ids_partition() -> None:
    assert ops.message_get_params("t", message_id=(1 << 50) + 9) == {
        "topic": "t", "search_mode": "id", "search_pos": str((1 << 50) + 9), "partition": "1"}
    assert ops.message_get_params("t", message_id=3, ext=True)["needext"] == "true"


def test_message_get_by_offset_or_count_needs_the_partition() -> None:
    assert ops.message_get_params("t", queue_offset=160, partition=0) == {
        "topic": "t", "search_mode": "virtual_offset", "search_pos": "160", "partition": "0"}
    assert ops.message_get_params("t", count=2, partition=3)["search_mode"] == "count"
    with pytest.raises(InvalidArgument, match="partition"):
        ops.message_get_params("t", count=1)


@pytest.mark.parametrize("kwargs", [
    {}, {"message_id": 1, "count": 1}, {"queue_offset": -1, "partition": 0},
    {"message_id": 1, "delayed_channel": "bad name"},
    {"count": 1, "partition": 0, "delayed_channel": "ch"},
])
def test_message_get_refuses_what_the_server_would(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        ops.message_get_params("t", **kwargs)  # type: ignore[arg-type]


def test_the_delayed_queue_is_searched_by_id_with_a_channel() -> None:
    params = ops.message_get_params("t", message_id=5, delayed_channel="ch")
    assert (params["delayed_queue"], params["channel"]) == ("true", "ch")


def test_the_real_answer_is_read() -> None:
    got = ops.parse_message(200, REAL_MESSAGE, partition=0)
    assert got == ops.StoredMessage(id=7, trace_id=202, body="n2",
                                    timestamp=1796287743251780076, attempts=0,
                                    queue_offset=160, count=6, ext="", orig_id=None,
                                    partition=0)
    assert got.as_dict()["queue_offset"] == 160


@pytest.mark.parametrize(("status", "body", "message"), [
    (500, b'{"message":"INTERNAL_ERROR"}', "INTERNAL_ERROR"),  # past the end
    (404, b'{"message":"commit log end of file"}', "commit log end of file"),  # empty
    (400, b'{"message":"topic does not exist"}', "topic does not exist"),
])
def test_refusals_are_admin_errors(status: int, body: bytes, message: str) -> None:
    with pytest.raises(AdminError) as caught:
        ops.parse_message(status, body, address="127.0.0.1:1")
    assert (caught.value.status, caught.value.message) == (status, message)


@pytest.mark.parametrize("body", [b"[]", b'{"id":"x","body":"b"}', b'{"id":1,"body":3}'])
def test_a_malformed_answer_is_a_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        ops.parse_message(200, body)


def test_expand_tombstone_finish_and_topic_params() -> None:
    assert ops.expand_params("t", 3) == {"topic": "t", "partition_num": "3"}
    for bad in (0, 256):
        with pytest.raises(InvalidArgument, match="partition_num"):
            ops.expand_params("t", bad)
    assert ops.tombstone_params("t", "127.0.0.1:4151") == {"topic": "t", "node": "127.0.0.1:4151"}
    assert ops.tombstone_params("t", "h:1", restore=True)["restore"] == "true"
    with pytest.raises(InvalidArgument, match="node"):
        ops.tombstone_params("t", "no-port")
    assert ops.finish_params("t", "ch", 7, 0) == {"topic": "t", "channel": "ch", "msgid": "7",
                                                 "partition": "0"}
    with pytest.raises(InvalidArgument):
        ops.finish_params("t", "ch", 1 << 63)
    assert ops.topic_params("t") == {"topic": "t"}
    with pytest.raises(InvalidArgument):
        ops.topic_params("bad topic")


def test_every_channel_action_has_a_route() -> None:
    assert {path for path, _ in ops.CHANNEL_ACTIONS.values()} == {
        "/channel/pause", "/channel/unpause", "/channel/empty", "/channel/skip",
        "/channel/unskip", "/channel/emptydelayed", "/channel/requeuedelayed"}
    assert [a for a, (_, classic) in ops.CHANNEL_ACTIONS.items() if classic] == [
        "pause", "unpause", "empty"]
