"""The pynsq layer's resources: the shared loop thread, run() loops, failures at construction.

No cluster: these Readers/Writers point at a closed port and are never run, or run briefly.
"""

from __future__ import annotations

import gc
from typing import Any

from smartnsq import _loop_thread
from smartnsq.compat import pynsq as nsq

NOWHERE = "127.0.0.1:1"  # nothing listens there: connecting fails, retried in the background


def users() -> int:
    thread = _loop_thread._shared
    if thread is None or not thread.running:
        return 0
    return _loop_thread._shared_users


def test_close_gives_the_loop_thread_back_before_its_future_completes() -> None:
    before = users()
    reader = nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    assert users() == before + 1
    reader.close().result(10)
    assert users() == before
    reader.close().result(10)  # idempotent: nothing released twice
    assert users() == before


def test_a_reader_dropped_unclosed_gives_the_loop_thread_back(pynsq_objects: list[Any]) \
        -> None:
    before = users()
    reader = nsq.Reader("t", "c", lambda m: True, nsqd_tcp_addresses=NOWHERE)
    assert users() == before + 1
    pynsq_objects.remove(reader)  # the fixture would keep it alive (and close it)
    del reader
    gc.collect()
    assert users() == before
