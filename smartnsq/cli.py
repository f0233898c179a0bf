"""``smartnsq``: the command line (``smartnsq ...`` and ``python -m smartnsq ...``).

Commands: ``demo``, ``dev-cluster``, ``lookup``, ``pub``, ``tail``, ``stats`` (docs/cli.md).
Each lives in its own module and is imported only when run, so ``smartnsq --help`` and
``smartnsq dev-cluster`` start fast.

Errors are for people: anything expected (bad input, unreachable lookupd, unknown topic, a
server refusing) prints ONE line on stderr and exits non-zero; a traceback only appears with
``--debug``, which also turns on debug logging. ``main(argv, stdin=, stdout=, stderr=)`` is
importable so tests drive every command in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from . import __version__
from .cli_util import CLIError, one_line

__all__ = ["build_parser", "main"]

log = logging.getLogger("smartnsq.cli")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_DEFAULT_LOOKUPD_ENV = "SMARTNSQ_LOOKUPD"


_streams = threading.local()  # where argparse writes during one main() call, per thread


class _Parser(argparse.ArgumentParser):
    """argparse writing to ``main``'s streams instead of the process-wide ``sys.stdout``/
    ``sys.stderr``, so concurrent in-process calls (tests, embedding) do not mix outputs."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if not message:
            return
        out = getattr(_streams, "out", None)
        err = getattr(_streams, "err", None)
        if file is None or file is sys.stderr:
            file = err or sys.stderr
        elif file is sys.stdout:
            file = out or sys.stdout
        file.write(message)


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after the command name.

    On the sub-commands they default to SUPPRESS, so a value given before the command name is
    not overwritten by the sub-parser's default.
    """
    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    group = parser.add_argument_group("cluster options")
    group.add_argument("--lookupd", action="append", metavar="HOST:PORT[,HOST:PORT]",
                       default=default(None),
                       help=f"nsqlookupd HTTP address(es), repeatable or comma separated "
                            f"(default: ${_DEFAULT_LOOKUPD_ENV})")
    group.add_argument("--nsqd", action="append", metavar="HOST:PORT[,HOST:PORT]",
                       default=default(None),
                       help="nsqd TCP address(es) to use directly instead of lookupd")
    group.add_argument("--timeout", type=float, metavar="SECONDS", default=default(10.0),
                       help="deadline of each network operation (default 10)")
    group.add_argument("--debug", action="store_true", default=default(False),
                       help="debug logging, and a traceback on errors")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="smartnsq",
        description="Partition-aware tools for youzan NSQ (and classic NSQ). "
                    "Start with: smartnsq demo")
    parser.add_argument("--version", action="version", version=f"smartnsq {__version__}")
    _add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=kwargs.pop("description", help),
                           **kwargs)
        _add_global_options(p, top=False)
        return p

    # demo --------------------------------------------------------------------------------
    p = command("demo", "run the partitioned, ordered, traced demo on an embedded cluster",
                description="Publish order events sharded by order id to an ordered topic, "
                            "consume them in order while a partition leader moves, and verify "
                            "that every event arrived once and in order per order id.")
    p.add_argument("--orders", type=int, default=300, help="order ids (default 300)")
    p.add_argument("--events", type=int, default=5,
                   help="events per order, published in order (default 5)")
    p.add_argument("--duration", type=float, default=4.0, metavar="SECONDS",
                   help="spread publishing over about this long (default 4; 0: as fast as "
                        "possible)")
    p.add_argument("--cluster", metavar="LOOKUPD[,LOOKUPD]",
                   help="run against a real cluster (its nsqlookupd HTTP addresses) instead "
                        "of an embedded one; its topics are created if missing")
    p.add_argument("--topic-prefix", default="smartnsq_demo",
                   help="prefix of the demo topics (default smartnsq_demo)")
    p.add_argument("--partitions", type=int, default=4,
                   help="partitions of the ordered topic (default 4)")
    p.add_argument("--no-failover", action="store_true",
                   help="do not move a partition leader mid-stream")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="live progress line on stderr (default: when stderr is a terminal)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the event stream")
    p.set_defaults(handler="smartnsq.demo:run_cli")

    # dev-cluster ---------------------------------------------------------------------------
    p = command("dev-cluster", "run an embedded dev cluster in the foreground",
                add_help=False, allow_abbrev=False,
                description="Everything after dev-cluster goes to the dev cluster "
                            "(smartnsq dev-cluster --help).")
    p.set_defaults(handler="dev-cluster")

    # lookup --------------------------------------------------------------------------------
    p = command("lookup", "show a topic's partitions, leaders, replicas and meta")
    p.add_argument("topic")
    p.add_argument("--access", choices=("r", "w"), default="r",
                   help="look up for reading (default, every partition with a leader) or "
                        "writing (only writable partitions)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler="smartnsq.cli_lookup:run_lookup")

    # pub -----------------------------------------------------------------------------------
    p = command("pub", "publish lines from stdin or files",
                description="Publish each non-empty line as one message (MPUB batches).")
    p.add_argument("topic")
    p.add_argument("files", nargs="*", metavar="FILE", default=[],
                   help="files to read ('-' or none: stdin)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--sharding-key", metavar="KEY",
                     help="one sharding key for every message")
    key.add_argument("--key-field", metavar="FIELD",
                     help="lines are JSON objects; shard each by this field (a.b for nested)")
    key.add_argument("--partition", type=int, help="write every message to this partition")
    p.add_argument("--sharding", choices=("murmur3", "java"), default="murmur3",
                   help="hash of sharding keys: murmur3 (Go client, default) or java")
    p.add_argument("--trace-id", type=int, metavar="ID",
                   help="publish traced with this uint64 trace id")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="ext JSON header (repeatable; ext topics only)")
    p.add_argument("--batch", type=int, default=200,
                   help="messages per MPUB (default 200; 1 sends PUB)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line on stderr for files (default: when a terminal)")
    p.set_defaults(handler="smartnsq.cli_pub:run_pub")

    # tail ----------------------------------------------------------------------------------
    p = command("tail", "print messages of a topic as they arrive",
                description="Consume a topic on an ephemeral channel (nothing is left behind) "
                            "and print each message.")
    p.add_argument("topic")
    p.add_argument("--channel", help="consume this channel instead of a new ephemeral one "
                                     "(its messages are then finished!)")
    p.add_argument("--ordered", action="store_true",
                   help="ordered consumption (SUB_ORDERED; the default on ordered topics)")
    p.add_argument("--from", dest="start", metavar="WHERE",
                   help="where a new channel starts: earliest, latest, "
                        "timestamp:UNIX_SECONDS (or an ISO date), offset:QUEUE_OFFSET, "
                        "count:MESSAGES (default: latest)")
    p.add_argument("--partition", type=int, action="append", metavar="P",
                   help="only this partition (repeatable)")
    p.add_argument("-n", "--count", type=int, metavar="N", help="exit after N messages")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="exit after this long without a message")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per message (partition, ids, offset, headers, body)")
    p.add_argument("--show", choices=("body", "meta"), default="body",
                   help="plain output: the body only (default) or metadata and body")
    p.set_defaults(handler="smartnsq.cli_tail:run_tail")

    # stats ---------------------------------------------------------------------------------
    p = command("stats", "per partition depth and in-flight counts from the nsqd nodes")
    p.add_argument("topic", nargs="?", help="only this topic")
    p.add_argument("--channel", help="only this channel")
    p.add_argument("--nsqd-http", action="append", metavar="HOST:PORT[,HOST:PORT]",
                   help="nsqd HTTP address(es) to ask (default: every node lookupd knows)")
    p.add_argument("--replicas", action="store_true",
                   help="also show partitions on nodes that do not lead them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler="smartnsq.cli_stats:run_stats")
    return parser


def _resolve_handler(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    module = __import__(module_name, fromlist=[attr])
    handler: Callable[..., Any] = getattr(module, attr)
    return handler


def _setup_logging(debug: bool, stderr: TextIO) -> None:
    logger = logging.getLogger("smartnsq")
    if debug:
        handler: logging.Handler = logging.StreamHandler(stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    elif not logger.handlers and not logging.getLogger().handlers:
        # the library logs retries and failovers as warnings (and asyncio its own complaints
        # at shutdown); without --debug the CLI says what matters itself, in one line, so
        # keep Python's last-resort handler quiet
        logger.addHandler(logging.NullHandler())
        asyncio_logger = logging.getLogger("asyncio")
        if not asyncio_logger.handlers:
            asyncio_logger.addHandler(logging.NullHandler())


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None,
         stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run one command; return its exit status (0 success, 1 failure, 2 usage, 130 Ctrl-C)."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parser = build_parser()
    _streams.out, _streams.err = out, err
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command != "dev-cluster":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse printed usage or help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    finally:
        _streams.out = _streams.err = None
    if args.command is None:
        parser.print_help(out)
        return EXIT_USAGE
    if args.command == "dev-cluster":
        from .devcluster import main as devcluster_main

        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                return int(devcluster_main(extra, prog="smartnsq dev-cluster") or 0)
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.stdin = stdin if stdin is not None else sys.stdin
    args.out = out
    args.err = err
    if args.lookupd is None and os.environ.get(_DEFAULT_LOOKUPD_ENV):
        args.lookupd = [os.environ[_DEFAULT_LOOKUPD_ENV]]
    _setup_logging(args.debug, err)
    handler = _resolve_handler(args.handler)
    try:
        result = handler(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except KeyboardInterrupt:
        if args.command == "tail":
            return EXIT_OK  # Ctrl-C is how a tail without -n ends
        err.write("interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader went away (smartnsq tail ... | head): stop quietly
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
        return EXIT_OK
    except CLIError as exc:
        if args.debug:
            raise
        err.write(f"smartnsq {args.command}: error: {one_line(exc)}\n")
        return exc.code
    except Exception as exc:
        if args.debug:
            raise
        err.write(f"smartnsq {args.command}: error: {_describe(exc)}\n")
        return EXIT_FAILED


def _describe(exc: BaseException) -> str:
    """One line for an exception the commands did not turn into a CLIError themselves."""
    from .errors import NSQError

    text = one_line(exc)
    if isinstance(exc, NSQError | OSError | ValueError | asyncio.TimeoutError):
        if isinstance(exc, asyncio.TimeoutError) and not str(exc):
            return "timed out"
        return text
    return f"{type(exc).__name__}: {text} (run with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
