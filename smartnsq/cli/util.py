"""What the ``smartnsq`` commands share: errors, addresses, tables, progress, clients.

The one module the command modules import from each other: a command never imports another
command. Imports of the library stay inside the functions, so ``smartnsq --help`` loads
argparse and this file, not httpx or the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any, TextIO

__all__ = [
    "CLIError",
    "Deadline",
    "Progress",
    "Pump",
    "admin_client",
    "lookup_manager",
    "lookupd_or_node",
    "parse_start",
    "split_addresses",
    "timeout_of",
]


class CLIError(Exception):
    """A failure the user can act on; ``main`` prints it as one line and exits ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Deadline:
    """A command's ``--timeout``: one deadline for all its steps (start, lookups, requests).

    Each step gets what is ``left()``, so a command that makes several requests in a row
    (discovery, a lookup, a retry, ``/stats`` of the nodes) still ends within ``--timeout``
    instead of within ``--timeout`` per step.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = max(0.1, float(seconds))
        self.end = time.monotonic() + self.seconds

    def left(self) -> float:
        """Seconds left, to a tenth (for readable messages), at least 0.1 (a step past the
        end fails fast rather than at once)."""
        return max(0.1, round(self.end - time.monotonic(), 1))

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.end


def timeout_of(args: Any) -> float:
    """The command's ``--timeout``, checked: a finite number of seconds greater than 0.

    Every command reads it through here (``deadline_of``, ``lookup_manager``,
    ``admin_client``), so ``-1``, ``0``, ``nan`` and ``inf`` get one message naming
    ``--timeout`` instead of being clamped by some commands, refused by others, or refused
    deep in the library under the name of an option the user never gave.
    """
    value = getattr(args, "timeout", 10.0)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise CLIError(f"bad --timeout {value!r}: expected a finite number of seconds "
                       f"greater than 0 (e.g. --timeout 10)")
    return seconds


def deadline_of(args: Any) -> Deadline:
    """The command's deadline: the one ``main`` started when it was called, else a new one."""
    timeout_of(args)
    deadline = getattr(args, "deadline", None)
    return deadline if isinstance(deadline, Deadline) else Deadline(args.timeout)


def lookup_failure(exc: BaseException, topic: str, lookupd: Sequence[str],
                   timeout: float) -> CLIError:
    """The one line for a failed lookup: the library's reason, and a hint when it timed out
    (the usual cause: an address that is not nsqlookupd's HTTP port)."""
    from ..errors import Timeout

    text = one_line(exc)
    if isinstance(exc, Timeout | TimeoutError):
        where = ", ".join(lookupd)
        return CLIError(f"no lookup answer for {topic!r} from {where} within {timeout:g} s "
                        f"(hint: --lookupd takes nsqlookupd's HTTP address, port 4161 by "
                        f"default; raise --timeout for a slow cluster)")
    prefix = f"lookup of {topic!r} failed"
    return CLIError(text if text.startswith(prefix) else f"{prefix}: {text}")


def topic_missing(topic: str) -> CLIError:
    """The one line for a topic the cluster does not have: youzan topics are created by an
    operator (nsqlookupd's /topic/create), not by the first publish as on classic NSQ."""
    return CLIError(f"topic {topic!r} does not exist: create it first (a dev cluster: "
                    f"smartnsq dev-cluster fault create-topic {topic}:PARTITIONS:REPLICAS; a "
                    f"youzan cluster: nsqlookupd's /topic/create, docs/admin.md)")


def split_addresses(values: Iterable[str] | str | None, what: str) -> list[str]:
    """``["a:1,b:2", "c:3"]`` -> ``["a:1", "b:2", "c:3"]``; an ``http://`` prefix is dropped.

    Addresses are checked here so that a typo is reported before anything is dialled. Every
    kind of address (lookupd, nsqd TCP or HTTP) is ``HOST:PORT`` read the way the library
    reads lookupd addresses (``smartnsq.discovery.lookup.normalize_lookupd``), so the CLI accepts
    exactly what the API does.
    """
    from ..discovery.lookup import normalize_lookupd
    from ..errors import InvalidArgument

    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            try:
                out.append(normalize_lookupd(item))
            except InvalidArgument:
                raise CLIError(f"bad {what} address {item!r}: expected HOST:PORT") from None
    return out


def lookupd_or_node(args: Any, command: str, *,
                    node_suffices: bool = True) -> tuple[list[str], str | None]:
    """The operator commands' ``--lookupd`` (or ``SMARTNSQ_LOOKUPD``) and at most one
    ``--nsqd-http`` node: one of them is needed, or the lookupd always when a node alone
    cannot serve ``command`` (``node_suffices=False``)."""
    lookupd = split_addresses(args.lookupd, "lookupd")
    nodes = split_addresses(args.nsqd_http, "nsqd HTTP")
    if len(nodes) > 1:
        raise CLIError(f"--nsqd-http takes one node for {command}")
    if not lookupd and not (nodes and node_suffices):
        other = " or --nsqd-http HOST:PORT" if node_suffices else ""
        raise CLIError(f"{command} needs --lookupd HOST:PORT (or SMARTNSQ_LOOKUPD){other}")
    return lookupd, nodes[0] if nodes else None


class Progress:
    """One status line on stderr, rewritten in place with a carriage return.

    Redraws at most every ``interval`` seconds so a tight loop costs almost nothing; ``done()``
    ends the line. Disabled (every call a no-op) unless ``enabled``: by default only when
    stderr is a terminal, so logs and pipes never fill with ``\\r`` noise.
    """

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None,
                 interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = _isatty(self.stream)
        self.enabled = enabled
        self.interval = interval
        self._last = 0.0
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        columns = shutil.get_terminal_size((100, 24)).columns
        if len(text) >= columns:  # a wrapped line cannot be rewritten with \r
            text = text[:max(10, columns - 2)] + "~"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def done(self, text: str | None = None) -> None:
        if not self.enabled:
            return
        if text is not None:
            self.update(text, force=True)
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0


def bar(fraction: float, width: int = 24) -> str:
    """``[#########---------]`` for a fraction in 0..1."""
    fraction = min(1.0, max(0.0, fraction))
    filled = round(fraction * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def one_line(exc: BaseException) -> str:
    """An exception as one line: its message (or its type), its cause when that helps."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" ({' '.join(str(cause).split())})"
    return text


def dumps(value: Any) -> str:
    """Compact, key-ordered JSON for ``--json`` output rows."""
    return json.dumps(value, separators=(",", ":"), sort_keys=False, default=str)


def warn(args: Any, text: str) -> None:
    """A warning line of the command's own on stderr (not with ``-q``)."""
    if not getattr(args, "quiet", False):
        args.err.write(f"warning: {text}\n")


def cluster_addresses(args: Any) -> tuple[list[str], list[str]]:
    """The ``--lookupd`` and ``--nsqd`` addresses of a command; exactly one kind is required."""
    lookupd = split_addresses(getattr(args, "lookupd", None), "lookupd")
    nsqd = split_addresses(getattr(args, "nsqd", None), "nsqd")
    if lookupd and nsqd:
        raise CLIError("give --lookupd or --nsqd, not both")
    if not lookupd and not nsqd:
        raise CLIError("no cluster given: use --lookupd HOST:PORT (or set SMARTNSQ_LOOKUPD) "
                       "or --nsqd HOST:PORT")
    return lookupd, nsqd


def check_topic(topic: str) -> str:
    """The topic name rules, checked before anything is dialled."""
    from ..errors import InvalidArgument
    from ..protocol import validate

    try:
        return validate.check_topic(topic)
    except InvalidArgument as exc:
        raise CLIError(f"bad topic name {topic!r}: {exc.rule}") from None


def lookup_manager(args: Any, lookupd: list[str]) -> Any:
    """A LookupManager tuned for one-shot commands: each request within ``--timeout``.

    Not started here: the command's first ``view(..., timeout=deadline.left())`` starts it,
    so the start's discovery (``/listlookup``) counts against the same deadline.
    """
    from ..discovery.lookup import LookupManager

    timeout = timeout_of(args)
    return LookupManager(lookupd, timeout=timeout, connect_timeout=min(2.0, timeout),
                         attempts=2, retry_delay=0.1, retry_delay_max=0.5)


def admin_client(args: Any, lookupd: Sequence[str] = (), deadline: Deadline | None = None
                 ) -> Any:
    """The commands' ``smartnsq.admin.AsyncAdmin``: every request within ``--timeout`` (or
    within what is left of ``deadline``)."""
    from ..admin import AsyncAdmin

    checked = timeout_of(args)
    timeout = deadline.left() if deadline is not None else checked
    return AsyncAdmin(list(lookupd), timeout=timeout)


def parse_start(text: str | None, what: str = "--from") -> Any:
    """A start position as ``tail --from`` and ``channel setoffset`` take it: a
    ``StartPosition``, ``None`` for latest (the channel's default); ``what`` names the
    argument in the error."""
    from ..errors import InvalidArgument
    from ..protocol.commands import StartPosition

    if text is None or text in ("latest", "end"):
        return None
    if text in ("earliest", "beginning", "start"):
        return StartPosition.earliest()
    kind, sep, value = text.partition(":")
    try:
        if not sep:
            raise ValueError
        if kind in ("timestamp", "ts", "time"):
            if value.lstrip("-").isdigit():
                return StartPosition.timestamp(int(value))
            when = datetime.fromisoformat(value)
            if when.tzinfo is None:
                when = when.replace(tzinfo=timezone.utc)
            return StartPosition.timestamp(int(when.timestamp()))
        if kind in ("offset", "virtual_queue"):
            return StartPosition.queue_offset(int(value))
        if kind in ("count", "msgcount"):
            return StartPosition.message_count(int(value))
    except (ValueError, InvalidArgument):
        pass
    raise CLIError(f"bad {what} {text!r}: expected earliest, latest, timestamp:UNIX_SECONDS, "
                   "timestamp:ISO_DATE, offset:QUEUE_OFFSET or count:MESSAGES")


async def run_admin(args: Any, lookupd: Sequence[str], what: str, call: Any) -> Any:
    """``await call(admin)`` on the commands' admin client, the whole of it within what is
    left of the command's deadline (a call asks several servers in turn: each request's own
    timeout alone would not bound it). A topic the lookupds do not know is the one line of
    :func:`topic_missing`; a deadline passed says what was being done."""
    import asyncio

    from ..errors import TopicNotFound

    deadline = deadline_of(args)
    async with admin_client(args, lookupd, deadline) as admin:
        try:
            return await asyncio.wait_for(call(admin), deadline.left() + 0.2)
        except asyncio.TimeoutError:
            raise CLIError(f"{what}: not done within {deadline.seconds:g} s (raise "
                           f"--timeout for a slow cluster)") from None
        except TopicNotFound as exc:
            raise topic_missing(exc.topic) from None


def targets_text(targets: Iterable[tuple[int | None, str]]) -> str:
    """``p0 on 127.0.0.1:4151, p1 on ...`` (classic nodes without a partition)."""
    parts = [(f"p{pid} on {node}" if pid is not None else node) for pid, node in targets]
    return ", ".join(parts) or "no node"


def targets_json(targets: Iterable[tuple[int | None, str]]) -> list[dict[str, Any]]:
    return [{"partition": pid, "node": node} for pid, node in targets]


def report(args: Any, row: dict[str, Any], text: str) -> int:
    """A command's result: one JSON object with ``--json``, else one line for people."""
    args.out.write((dumps(row) if getattr(args, "json", False) else text) + "\n")
    return 0


class Pump:
    """A consumer's messages, taken one at a time with a wait: a task moves them from the
    consumer to a one-slot queue, since waiting on a queue with a timeout is safe while
    cancelling the consumer's iterator on a timeout would end it. What was taken and not
    ``settled`` when the command ends is given back (REQ 0, no back-off) on the way out."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
        self._held: set[Any] = set()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Pump:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async for message in self._consumer:
            self._held.add(message)
            await self._queue.put(message)
        await self._queue.put(None)

    async def next(self, wait: float) -> Any:
        """The next message, ``None`` once the consumer ended; ``TimeoutError`` after
        ``wait`` seconds without one.

        ``asyncio.timeout`` where there is one (3.11): 3.11's ``wait_for`` can swallow the
        cancel Ctrl-C brings (asyncio.run cancels the command's task) when it meets the
        timeout or a message, and the command then runs on until a second Ctrl-C."""
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(wait):
                return await self._queue.get()
        return await asyncio.wait_for(self._queue.get(), wait)  # pragma: no cover - 3.10

    def ended(self) -> bool:
        """Whether the consumer stopped delivering; raises the error that stopped it."""
        assert self._task is not None
        if not self._task.done():
            return False
        self._task.result()
        return True

    def settled(self, message: Any) -> None:
        """``message`` was answered: nothing to give back for it."""
        self._held.discard(message)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for message in self._held:
            with contextlib.suppress(Exception):
                message.req(0, backoff=False)  # not handled here: back to the channel
