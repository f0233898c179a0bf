"""``smartnsq dev-cluster ...``: everything after the command goes to the dev cluster."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable

__all__ = ["register", "run_devcluster"]

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("dev-cluster", "run an embedded dev cluster in the foreground",
                add_help=False, allow_abbrev=False, passthrough=True,
                description="Everything after dev-cluster goes to the dev cluster "
                            "(smartnsq dev-cluster --help).")
    p.set_defaults(handler=run_devcluster, passthrough=True)


def run_devcluster(args: argparse.Namespace) -> int:
    from ..devcluster import main as devcluster_main

    with contextlib.redirect_stderr(args.err), contextlib.redirect_stdout(args.out):
        try:
            return int(devcluster_main(args.extra, prog="smartnsq dev-cluster") or 0)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        except KeyboardInterrupt:  # Ctrl-C during a fault request: as every command
            args.err.write("interrupted\n")
            return EXIT_INTERRUPTED
        except BrokenPipeError:  # `... fault status | head`: the reader went away
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, args.out.fileno())
            return 0
