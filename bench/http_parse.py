"""Cost of one lookup exchange in :mod:`smartnsq.protocol.http`: build a ``/lookup`` request
and parse a real lookupd answer (tests/fixtures/youzan/http_lookup_p2r2_w_metainfo_v1.txt).

Why: the client's HTTP runs on h11; its memory and CPU per call are weighed by these two
numbers, not by wall-clock time (the machine is shared):

* ``python bench/http_parse.py --mode memory``: tracemalloc peak of one exchange (bytes);
* ``valgrind --tool=callgrind python bench/http_parse.py --mode cpu --calls N`` for N=0 and
  N=2000: the instruction counts' difference over N is the instructions of one exchange.
"""

from __future__ import annotations

import argparse
import tracemalloc
from pathlib import Path

from smartnsq.protocol.http import ResponseParser, build_request, parse_url

CAPTURE = (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "youzan"
           / "http_lookup_p2r2_w_metainfo_v1.txt")


def answer() -> bytes:
    """The capture's body behind the head lookupd sends (Content-Length framed)."""
    text = CAPTURE.read_bytes()
    body = text.split(b"\n\n", 1)[1].strip() if b"\n\n" in text else text
    start = body.find(b"{")
    body = body[start:]
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.nsq; version=1.0\r\n"
            b"X-Nsq-Content-Type: nsq; version=1.0\r\nDate: Fri, 27 Nov 2026 21:00:00 GMT\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    return head + body


def exchange(data: bytes) -> int:
    """One request built and its answer read, as :mod:`smartnsq.transport.http` does it: on one
    parser (h11 connection) when the parser builds requests, else the two calls before."""
    url = parse_url("http://127.0.0.1:4161/lookup", {"topic": "t", "access": "w",
                                                      "metainfo": "true"})
    fields = [("User-Agent", "smartnsq"), ("Accept-Encoding", "identity"),
              ("Accept", "application/vnd.nsq; version=1.0")]
    if "request" in getattr(ResponseParser, "__slots__", ()):
        parser = ResponseParser(max_body=1 << 20, url=url, headers=fields)  # type: ignore[call-arg]
        assert parser.request
    else:  # the hand-written parser this was measured against
        build_request("GET", url, fields)
        parser = ResponseParser(max_body=1 << 20)
    response = parser.feed(data)
    assert response is not None and response.status == 200
    return len(response.body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("memory", "cpu"), default="memory")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    data = answer()
    exchange(data)  # imports and caches warmed outside the measure
    if args.mode == "memory":
        tracemalloc.start()
        exchange(data)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(f"answer {len(data)} bytes; tracemalloc peak of one exchange: {peak} bytes")
    else:
        for _ in range(args.calls):
            exchange(data)
        print(f"{args.calls} exchanges")


if __name__ == "__main__":
    main()
