"""Administering an NSQ cluster over HTTP: topics, channels, offsets, stats, lookupds, and the
operator's actions (pause, empty, skip, expand, read one message, tombstone).

:class:`AsyncAdmin` (asyncio) and :class:`Admin` (blocking, any thread) speak the nsqd and
nsqlookupd HTTP APIs of youzan's NSQ and of classic NSQ. What the servers answer is read by
:mod:`smartnsq.protocol.admin` and :mod:`smartnsq.protocol.operations` (sans-I/O); this
package only sends requests, with

* a deadline on every whole request (connect, send, the whole answer), not per read, so a
  server trickling bytes cannot hold a call past its ``timeout``;
* a bound on every answer's size (``max_answer_bytes``);
* errors that say what was asked, where, and why: :class:`~smartnsq.errors.AdminError`
  when a server refused, :class:`~smartnsq.errors.Timeout` past the deadline,
  :class:`~smartnsq.errors.ConnectionFailed` (with the network error as its cause) when a
  server could not be reached.

Its modules, by role: ``base`` (one request, the lookupd reads every call starts from),
``creation`` (creating a topic until it is usable), ``operator`` (the operator's actions),
``client`` (:class:`AsyncAdmin`, which is all of them, and the node reads), ``blocking``
(:class:`Admin`). This ``__init__`` names the two clients, the package's public surface.
"""

from .blocking import Admin
from .client import AsyncAdmin

__all__ = ["Admin", "AsyncAdmin"]
