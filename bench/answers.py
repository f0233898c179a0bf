"""What settling a ``publish_nowait`` answer costs, without sockets: deterministic.

    valgrind --tool=callgrind python bench/answers.py N

Makes N publish_nowait requests as the producer does once they are written (one topic, no
partition, a classic node) and settles each with the server's ``OK`` through the
connection's entry point (``NowaitRequest.set_result`` -> ``Producer._answered``): the
counting, the result record and the caller's future. No event loop turn, no I/O, so two runs
of the same tree count the same instructions (``PYTHONHASHSEED=0``), and the difference of
N and 3N over 2N is the answer path's cost per message. Run it on two trees (one with a
change, one without) to weigh the change, e.g. what counting adds to a
pipelined publish, whose network bench (``bench/publish.py --worker smartnsq pipe``) moves by
a few hundred instructions between runs with the socket reads' batching.
"""

from __future__ import annotations

import asyncio
import sys


def settle(count: int) -> int:
    """Settle ``count`` answers; the producer's published count afterwards."""
    from smartnsq import Producer
    from smartnsq.producer.request import NowaitRequest

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    producer = Producer(nsqd=["127.0.0.1:4150"])
    producer._loop = loop  # (what start() sets: the answers' clock)
    requests = []
    for _ in range(count):
        request = NowaitRequest("bench_pub", b"x" * 100, None, None, None, None, None, 5.0,
                                loop.time())
        request.owner = producer
        request.result = loop.create_future()
        request.answered = False
        # as _submit_first leaves a request it wrote to a classic node
        request.target = None
        request.address = ("127.0.0.1", 4150)
        request.attempt = 1
        request.traced = False
        requests.append(request)
    producer._on_wire = count
    for request in requests:
        request.set_result(b"OK")
    assert all(request.result.done() for request in requests)
    published = sum(part.published for part in producer.stats().partitions)
    loop.close()
    return published


if __name__ == "__main__":
    print(settle(int(sys.argv[1])))
