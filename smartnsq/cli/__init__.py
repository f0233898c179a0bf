"""``smartnsq``: the command line (``smartnsq ...`` and ``python -m smartnsq ...``).

Commands: ``demo``, ``dev-cluster``, ``lookup``, ``pub``, ``tail``, ``stats``, ``top``,
``topic``, ``channel``, ``message``, ``dead-letter``, ``completion`` (docs/cli.md).
Each lives in its own module, ``smartnsq.cli.<command>``, which declares its arguments and its
handler (``register``); what they share is in ``smartnsq.cli.util``, and no command imports
another. A command module imports the library only when its handler runs, so
``smartnsq --help`` and ``smartnsq dev-cluster`` start fast.

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
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

from .. import __version__, extensions
from ..transport import event_loop
from . import (
    channel,
    completion,
    deadletter,
    demo,
    devcluster,
    lookup,
    message,
    pub,
    stats,
    tail,
    top,
    topic,
)
from .util import CLIError, Deadline, one_line

__all__ = ["build_parser", "main"]

log = logging.getLogger("smartnsq.cli")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended

_DEFAULT_LOOKUPD_ENV = "SMARTNSQ_LOOKUPD"

COMMANDS: tuple[Callable[[Callable[..., argparse.ArgumentParser]], None], ...] = (
    demo.register, devcluster.register, lookup.register, pub.register, tail.register,
    stats.register, top.register, topic.register, channel.register, message.register,
    deadletter.register, completion.register)
"""Each command module's ``register(command)``: it adds its sub-parser and sets its handler
(a function; the module imports the library only when the handler runs)."""


_streams = threading.local()  # where argparse writes during one main() call, per thread


class _Parser(argparse.ArgumentParser):
    """argparse writing to ``main``'s streams instead of the process-wide ``sys.stdout``/
    ``sys.stderr``, so concurrent in-process calls (tests, embedding) do not mix outputs."""

    intermixed = False  # a command's parser: options and positionals in any order
    _mixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # argparse matches positionals greedily: `pub t --key-field id f.jsonl` gave TOPIC
        # and an empty FILE list before the option, then refused f.jsonl; intermixed parsing
        # reads the options first and the positionals from what is left
        if self.intermixed and not self._mixing:
            self._mixing = True
            try:
                return self.parse_known_intermixed_args(args, namespace)
            finally:
                self._mixing = False
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        # `pub --topic t`: argparse only says "unrecognized arguments" (or that TOPIC is
        # missing), while what the user needs is that the topic is not an option
        argv = getattr(_streams, "argv", None) or []
        command = getattr(_streams, "command", None)
        if command and any(a == "--topic" or a.startswith("--topic=") for a in argv):
            message += f" (the topic is positional: smartnsq {command} TOPIC)"
        super().error(message)

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
    group.add_argument("-v", "--verbose", action="count", default=default(0),
                       help="show the library's log: -v warnings and info, -vv debug too "
                            "(each line with time, level and logger)")
    group.add_argument("-q", "--quiet", action="store_true", default=default(False),
                       help="only the error line: no warnings or progress from the command")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="smartnsq",
        description="Partition-aware tools for youzan NSQ (and classic NSQ). "
                    "Start with: smartnsq demo")
    parser.add_argument("--version", action="version",
                        version=f"smartnsq {__version__} ({extensions.describe()})")
    _add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
        passthrough = kwargs.pop("passthrough", False)
        p = sub.add_parser(name, help=help, description=kwargs.pop("description", help),
                           **kwargs)
        if not passthrough:
            _add_global_options(p, top=False)
            p.intermixed = True
        return p

    for register in COMMANDS:
        register(command)
    return parser


_TOPIC_COMMANDS = ("pub", "tail", "lookup", "stats", "top")
"""The commands whose topic is a positional argument (``smartnsq pub TOPIC``)."""


def _topic_command(argv: Sequence[str]) -> str | None:
    """The command named on the command line when it takes a positional topic."""
    for item in argv:
        if item in _TOPIC_COMMANDS:
            return item
    return None


LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


def _setup_logging(verbose: int, debug: bool, stderr: TextIO) -> Callable[[], None]:
    """The command's logging: the library's records on stderr with time, level and logger
    from ``-v`` (WARNING and INFO) or ``-vv``/``--debug`` (DEBUG too); without them the
    command says what matters in its own lines (one on failure), so nothing else prints.
    Returns what undoes it (``main`` is also called in-process, by tests and programs).
    """
    logger = logging.getLogger("smartnsq")
    asyncio_logger = logging.getLogger("asyncio")
    undo: list[Callable[[], None]] = []

    def add(target: logging.Logger, handler: logging.Handler) -> None:
        target.addHandler(handler)
        undo.append(lambda: target.removeHandler(handler))

    def set_level(target: logging.Logger, level: int) -> None:
        old = target.level
        target.setLevel(level)
        undo.append(lambda: target.setLevel(old))

    if debug:
        verbose = max(verbose, 2)
    if verbose:
        handler: logging.Handler = logging.StreamHandler(stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT))
        add(logger, handler)
        set_level(logger, logging.DEBUG if verbose >= 2 else logging.INFO)
        propagate = logger.propagate
        logger.propagate = False  # not twice when the program embedding main() logs too
        undo.append(lambda: setattr(logger, "propagate", propagate))
        if verbose >= 2:
            add(asyncio_logger, handler)
            set_level(asyncio_logger, logging.DEBUG)
    elif not logging.getLogger().handlers:
        # the library logs retries and failovers as warnings (and asyncio its own complaints,
        # some at shutdown, after main() returned: these handlers stay); the command says
        # what matters itself, in one line, so keep the library's fallback handler
        # (smartnsq.observability.logs) and Python's last resort quiet
        for target in (logger, asyncio_logger):
            if not any(isinstance(h, logging.NullHandler) for h in target.handlers):
                target.addHandler(logging.NullHandler())

    def restore() -> None:
        for step in reversed(undo):
            step()

    return restore


def main(argv: Sequence[str] | None = None, *, stdin: TextIO | None = None,
         stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run one command; return its exit status (0 success, 1 failure, 2 usage, 130 Ctrl-C,
    143 SIGTERM)."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parser = build_parser()
    _streams.out, _streams.err = out, err
    _streams.argv = list(sys.argv[1:] if argv is None else argv)
    _streams.command = _topic_command(_streams.argv)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "passthrough", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse printed usage or help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    finally:
        _streams.out = _streams.err = _streams.argv = _streams.command = None
    if args.command is None:
        parser.print_help(out)
        return EXIT_USAGE
    args.extra = extra
    args.parser = parser  # `completion` reads the whole command line from it
    args.stdin = stdin if stdin is not None else sys.stdin
    args.out = out
    args.err = err
    if getattr(args, "passthrough", False):
        return int(args.handler(args) or 0)  # dev-cluster: its own options, logging, errors
    if args.lookupd is None and not getattr(args, "nsqd", None) \
            and os.environ.get(_DEFAULT_LOOKUPD_ENV):
        args.lookupd = [os.environ[_DEFAULT_LOOKUPD_ENV]]
    # the command's deadline starts now: the library's imports count against --timeout too
    args.deadline = Deadline(args.timeout)
    restore_logging = _setup_logging(args.verbose, args.debug, err)
    try:
        return _run(args, err, out)
    finally:
        restore_logging()


def _sigterm_as_ctrl_c() -> tuple[list[int], Callable[[], None]]:
    """SIGTERM (a container runtime's stop, ``kill PID``, ``timeout``) made Ctrl-C: the
    command's cleanup runs as for SIGINT (asyncio cancels the command's task; tail gives back
    what it took) instead of the process ending on the spot. Main thread only (the one a
    signal handler runs on); returns the signals received and the undo."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        return got, lambda: None

    def on_term(signum: int, _frame: Any) -> None:
        got.append(signum)
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, on_term)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return got, restore


def _run(args: argparse.Namespace, err: TextIO, out: TextIO) -> int:
    handler = args.handler
    terminated, restore = _sigterm_as_ctrl_c()
    try:
        result = handler(args)
        if asyncio.iscoroutine(result):
            result = event_loop.run(result)
        return int(result or 0)
    except KeyboardInterrupt:
        if args.command == "tail":
            return EXIT_OK  # Ctrl-C (or SIGTERM) is how a tail without -n ends
        err.write("terminated\n" if terminated else "interrupted\n")
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
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
    finally:
        restore()


def _describe(exc: BaseException) -> str:
    """One line for an exception the commands did not turn into a CLIError themselves."""
    from ..errors import NSQError

    text = one_line(exc)
    if isinstance(exc, NSQError | OSError | ValueError | asyncio.TimeoutError):
        if isinstance(exc, asyncio.TimeoutError) and not str(exc):
            return "timed out"
        return text
    return f"{type(exc).__name__}: {text} (run with --debug for the traceback)"


if __name__ == "__main__":
    sys.exit(main())
