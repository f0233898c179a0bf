"""``Admin``/``AsyncAdmin`` given nsqd's TCP or HTTP port as a lookupd fail at once (as they
did) and now with the sentence the Producer, the Consumer and the CLI give for the same
mistake: what the port looks like and the usual lookupd port. Same bodies on the real
servers (``-m real``)."""

from __future__ import annotations

from typing import Any

import pytest
from support import bounded

from smartnsq.admin import AsyncAdmin
from smartnsq.errors import NSQError

ASK = "is this nsqlookupd's HTTP port (usually 4161)?"


async def says_which_port(cluster: Any) -> None:
    await cluster.create_topic("t", channels=["c"])
    for wrong, looks in ((cluster.nsqd_tcp_addresses[0], "nsqd's TCP port (usually 4150)"),
                         (cluster.nsqd_http_addresses[0], "nsqd's HTTP port (usually 4151)")):
        async with AsyncAdmin(lookupd=[wrong]) as admin:
            for call in (lambda: admin.nodes(), lambda: admin.lookup("t"),
                         lambda: admin.create_topic("t2"), lambda: admin.channel_lag("t", "c"),
                         lambda: admin.cluster_stats("t", None)):
                with pytest.raises(NSQError) as info:
                    async with bounded(5):
                        await call()
                text = str(info.value)
                assert f"this looks like {looks}" in text and ASK in text, text
                assert wrong in text


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_nsqds_ports_as_lookupd_youzan(nsq_any_cluster: Any) -> None:
    await says_which_port(nsq_any_cluster)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_nsqds_ports_as_lookupd_classic(nsq_any_cluster: Any) -> None:
    await says_which_port(nsq_any_cluster)
