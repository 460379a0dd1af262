"""The `cellseg` command line: one sub-command per module in this package.

Each sub-command module defines `register(subparsers)`, which adds its parser and sets `func`
to a handler taking the parsed arguments and returning an exit code. Handlers import heavy
libraries (torch, tensorstore) lazily so that `cellseg --help` stays instant.

Errors a user can fix are one line on stderr, without a traceback (`-vv` logs it): wrong arguments, config
keys or paths (exit status 2), operating-system errors such as a full disk, a read-only file system or
missing permissions (exit status 1, naming the file) and a library that cannot be imported (exit status 1).

SIGTERM and SIGUSR1 (a scheduler's time limit or pre-emption, `timeout`, `scancel`) end every command with exit
status 75, "stopped early, resumable" (docs/hpc.md): work already committed is kept (finished crops, tuned
classes, checkpoints), and the same command run again goes on from it. `cellseg train` stops at the end of a step
with a checkpoint (`cellseg.train.stop`); the other commands stop where the signal finds them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import signal
import sys

from cellseg import __version__
from cellseg.train.stop import EXIT_RESUMABLE  # no torch behind it: `cellseg --help` stays instant


def _command_modules() -> list[str]:
    """Every module of this package is a sub-command; `ORDER` (default 100) sorts `cellseg --help`."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    modules = [importlib.import_module(f"{__name__}.{n}") for n in names]
    return [m.__name__ for m in sorted(modules, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered sub-command."""
    parser = argparse.ArgumentParser(
        prog="cellseg",
        description="Organelle segmentation ensembles for the CellMap Segmentation Challenge.",
    )
    parser.add_argument("--version", action="version", version=f"cellseg {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _command_modules():
        importlib.import_module(name).register(subparsers)
    return parser


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose >= 2 else logging.INFO)
    from cellseg import logs

    logs.configure(level)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # SIGINT stays Python's KeyboardInterrupt


class Stopped(BaseException):
    """A stop signal arrived (not an `Exception`: no `except Exception` of the work swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def _raise_stopped(signum: int, frame: object) -> None:
    for sig in STOP_SIGNALS:  # a second signal while the work unwinds ends the process the default way
        signal.signal(sig, signal.SIG_DFL)
    raise Stopped(signum)


def _catch_stop_signals() -> dict[int, object]:
    """Turn SIGTERM and SIGUSR1 into `Stopped` (main thread only); the previous handlers, to restore."""
    previous: dict[int, object] = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, _raise_stopped)
        except ValueError:  # not the main thread (main() called from a thread): signals are not ours
            pass
    return previous


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `cellseg` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose, args.quiet)
    # A command module with HANDLES_STOP_SIGNALS (`cellseg train`: a checkpoint first) installs its own handlers.
    own = getattr(sys.modules.get(getattr(args.func, "__module__", "")), "HANDLES_STOP_SIGNALS", False)
    previous = {} if own else _catch_stop_signals()
    try:
        return _run(args)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except Stopped as stop:
        print(f"cellseg {args.command}: stopped early on {stop}; finished work is kept: run the same command again "
              "to continue", file=sys.stderr)
        return EXIT_RESUMABLE
    except (FileNotFoundError, FileExistsError, KeyError, ValueError) as err:
        # User errors: one clear line, no traceback (use -vv for one).
        logging.getLogger("cellseg").debug("traceback", exc_info=True)
        print(f"cellseg {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ImportError as err:  # a broken install, here or in a worker process (`cellseg.pool`): one line
        logging.getLogger("cellseg").debug("traceback", exc_info=True)
        where = "; ".join(getattr(err, "__notes__", []))
        print(f"cellseg {args.command}: error: {err}{f' ({where})' if where else ''}; check the installation "
              "(`pip check`)", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        sys.stderr.close()
        return 0
    except OSError as err:
        # Disk full, read-only file system, permissions: the system's words and the path, in one line.
        logging.getLogger("cellseg").debug("traceback", exc_info=True)
        print(f"cellseg {args.command}: error: {err}", file=sys.stderr)  # str(OSError) names its file, if any
        return 1


if __name__ == "__main__":
    sys.exit(main())
