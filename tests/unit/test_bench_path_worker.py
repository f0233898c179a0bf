"""The consumer's in-process benchmark (``bench/consume.py``'s ``smartnsq-path`` workers) runs
against the consumer's internals as they are now.

The worker builds a link, the runtime, flow control and the inline runner by hand, so a
module that moves or a signature that changes breaks it without breaking any other test; the
deterministic instruction counts quoted in the performance page come from it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "consume.py"


@pytest.mark.parametrize("client", ["smartnsq-path", "smartnsq-path-ordered"])
def test_the_path_worker_delivers_and_finishes_every_message(client: str) -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--worker", client, "", "", "bench_sub",
                          "500", "200", "asyncio"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert result["count"] == 500 and result["rate"] > 0
