"""The sync facade's constructor does not block, and its errors are the async call's own.

Without this, ``sync.Producer(...)`` hung on a silent lookupd, and every timeout read "no
answer from the event loop within 7s" instead of the cause.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from support import BackgroundCluster, keeps_deadline

from smartnsq import sync
from smartnsq.errors import Timeout


@pytest.fixture
def bg() -> Iterator[BackgroundCluster]:
    background = BackgroundCluster(1, {"orders": 1}, proxied=True)
    yield background
    background.stop()


@pytest.fixture
def silent_lookupd() -> Iterator[str]:
    """A loopback lookupd that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_constructor_does_not_wait_for_a_silent_lookupd(silent_lookupd: str) -> None:
    with keeps_deadline(0.0), sync.Producer(lookupd=[silent_lookupd], timeout=1.0) as producer:
        pass
    assert producer.closed


def test_a_publish_timeout_is_the_publish_s_own_error(bg: BackgroundCluster) -> None:
    with sync.Producer(lookupd=bg.lookupd, timeout=5.0) as producer:
        producer.publish("orders", b"warm-up")
        bg.thread.call(bg.cluster.stall)  # the nsqd keeps the connection and stops answering
        try:
            with keeps_deadline(1.0), pytest.raises(Timeout) as info:
                producer.publish("orders", b"stalled", timeout=1.0)
            assert "event loop" not in str(info.value)
            assert "orders" in str(info.value)
            with keeps_deadline(1.0), pytest.raises(Timeout) as info:
                producer.publish_many("orders", [b"a", b"b"], timeout=1.0)
            assert "event loop" not in str(info.value)
        finally:
            bg.thread.call(bg.cluster.resume)


def test_consumer_constructor_does_not_wait_for_a_silent_lookupd(silent_lookupd: str) -> None:
    with keeps_deadline(0.0):
        consumer = sync.Consumer("orders", "c", lookupd=[silent_lookupd],
                                 handler=lambda message: None)
    with keeps_deadline(consumer.async_consumer.drain_timeout + 2):
        consumer.close()
