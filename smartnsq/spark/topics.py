"""Which topics a replay source reads: the ``topic`` list, or the cluster's topics that
``subscribePattern`` matches.

A pattern is Kafka's way to say "every topic of this family, including the ones created
later"; the answer changes while a stream runs, so it is asked again at each planning, at most
every ``RELIST_INTERVAL`` seconds (the names come from every nsqd's ``/stats``, one call per
node: not worth making at every micro-batch of a busy stream). A topic once matched stays in
the set, so its offsets are never dropped from the stream's offsets while its nodes restart.
"""

from __future__ import annotations

import logging
import re
import time

from ..admin import Admin
from ..errors import ClusterError, NSQError
from ..protocol import validate as v
from .options import SourceOptions

__all__ = ["RELIST_INTERVAL", "TopicSet"]

log = logging.getLogger("smartnsq.spark")

RELIST_INTERVAL = 30.0  # seconds between two listings of the cluster's topics


class TopicSet:
    """The topics of a source, as of now (driver side)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._pattern = (re.compile(options.topic_pattern)
                         if options.topic_pattern is not None else None)
        self._known: tuple[str, ...] = options.topics
        self._listed_at: float | None = None

    @property
    def pattern(self) -> re.Pattern[str] | None:
        return self._pattern

    def current(self) -> tuple[str, ...]:
        """The topics to plan with (a pattern's matches re-listed when they are due)."""
        if self._pattern is None:
            return self._known
        now = time.monotonic()
        if self._listed_at is None or now - self._listed_at >= RELIST_INTERVAL:
            found = self._matches()
            new = sorted(set(found) - set(self._known))
            if new:
                log.info("subscribePattern %r: reading topic(s) %s", self._pattern.pattern,
                         ", ".join(new))
            self._known = tuple(sorted(set(self._known) | set(found)))
            self._listed_at = now
        return self._known

    def _matches(self) -> list[str]:
        """The names every nsqd reports (through lookupd's node list, or ``nsqdHttp``) that
        the pattern matches whole, as Kafka's ``Pattern.matcher(topic).matches()`` does."""
        assert self._pattern is not None
        cluster = self._options.cluster
        nsqd = list(cluster.nsqd_http) or None
        try:
            with Admin(cluster.lookupd or None, timeout=cluster.http_timeout) as admin:
                answers = admin.cluster_stats(nsqd=nsqd)
        except NSQError as exc:
            if self._listed_at is not None:  # known already: keep those until it answers
                log.warning("subscribePattern: could not list the topics (%s); reading the "
                            "ones known", exc)
                return []
            raise ClusterError(f"subscribePattern: could not list the topics: {exc}",
                               transient=False) from exc
        names: set[str] = set()
        for address, stats in answers.items():
            if isinstance(stats, NSQError):
                log.info("subscribePattern: %s did not answer (%s)", address, stats)
                continue
            names.update(t.name for t in stats.topics)
        out = []
        for name in sorted(names):
            if self._pattern.fullmatch(name):
                try:
                    v.check_topic(name)
                except NSQError:
                    continue
                out.append(name)
        return out
