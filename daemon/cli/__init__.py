"""The ``cellcal`` command line: one entry point, one module per subcommand.

Subcommand modules are imported only when used, so ``cellcal solve`` does not pay for
ZeroMQ or CAN imports. Each module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Iterable
from typing import TextIO, cast

from cellcal.daemon.blas import prefer_one_blas_thread

# name -> (module, one-line help). Modules are imported lazily.
COMMANDS: dict[str, tuple[str, str]] = {
    "solve": ("cellcal.daemon.cli.solve", "solve a calibration from a station file"),
    "sim": ("cellcal.sim.cli", "serve the simulated cell's devices (robot, tracker, camera) until SIGTERM"),
    "check-config": ("cellcal.daemon.cli.check_config", "validate a configuration file"),
    "run": ("cellcal.daemon.cli.run", "run the calibration service (what systemd starts)"),
    "demo": ("cellcal.daemon.cli.demo", "calibrate the simulated cell end to end and print the report"),
    "keys": ("cellcal.daemon.cli.keys", "generate a CURVE key pair for the daemon or a client"),
    "watch": ("cellcal.daemon.cli.watch", "live view of heartbeat, stations, results and drift"),
    "ctl": ("cellcal.daemon.cli.ctl", "send one command to the daemon"),
    "report": ("cellcal.daemon.cli.report", "write the HTML report (figures) of a stored result"),
    "show": ("cellcal.daemon.cli.show", "a stored result in mm/deg with uncertainty; --diff A B: how the base moved"),
    "stations": ("cellcal.daemon.cli.stations", "export a run's stations as a file cellcal solve reads"),
    "init": ("cellcal.daemon.cli.init", "write a commented starting configuration (UR, CiA 402 or the simulator)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cellcal", description="robot-cell calibration")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        # Listed only: each command's own options are parsed by its module (main()), so a
        # command whose optional dependency is broken never breaks the others' help.
        sub.add_parser(name, help=help_text, description=help_text, add_help=False)
    return parser


#: The exit status after the reader of stdout went away: the shell's status of a process killed
#: by SIGPIPE (128 + 13), what ``cat`` or ``yes`` give under ``set -o pipefail``. Python ignores
#: SIGPIPE (a closed socket must raise in the daemon, not kill it), so the status is returned.
EXIT_BROKEN_PIPE = 141


class _StdoutGone(BaseException):
    """The reader of stdout went away (``cellcal solve ... | head``).

    A ``BaseException``, like ``KeyboardInterrupt``: a command's own catch-all (``except
    Exception``, which ``cellcal solve`` turns into "internal error") must not swallow it.
    """


class _GuardedStdout:
    """``sys.stdout`` while a command runs: a write or flush into a closed pipe raises
    :class:`_StdoutGone` instead of ``BrokenPipeError``; everything else is the stream's."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except BrokenPipeError:
            raise _StdoutGone from None

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except BrokenPipeError:
            raise _StdoutGone from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def _quiet_broken_pipe(stdout: TextIO | None) -> int:
    """The reader of our stdout went away: exit quietly with :data:`EXIT_BROKEN_PIPE`.

    stdout is pointed at /dev/null so that the interpreter's final flush of what is still
    buffered does not raise (and print) a second BrokenPipeError.
    """
    try:
        if stdout is not None:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stdout.fileno())
            os.close(devnull)
    except (OSError, ValueError):  # stdout already closed, or not a file (a test's capture)
        pass
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    """``cellcal COMMAND ...``; the exit status. A closed stdout ends any command quietly
    (:data:`EXIT_BROKEN_PIPE`), whatever the command was doing."""
    # Before any command imports numpy: one BLAS thread (ADR 0033), unless the user set it.
    prefer_one_blas_thread()
    stdout = sys.stdout
    guard = None if stdout is None or isinstance(stdout, _GuardedStdout) else _GuardedStdout(stdout)
    if guard is not None:
        sys.stdout = cast(TextIO, guard)
    try:
        try:
            rc = _main(argv)
        except SystemExit:  # argparse's --help and usage errors: their output is flushed here too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a pipe closed early fails here, inside the guard, not at exit
        return rc
    except (_StdoutGone, BrokenPipeError):
        return _quiet_broken_pipe(stdout)
    finally:
        if guard is not None and sys.stdout is cast(TextIO, guard):
            sys.stdout = stdout


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Build only the subparser needed when a command is named, so one broken optional
    # import (say, CAN support) never breaks every other command.
    if argv and argv[0] in COMMANDS:
        module = importlib.import_module(COMMANDS[argv[0]][0])
        parser = argparse.ArgumentParser(prog=f"cellcal {argv[0]}", description=COMMANDS[argv[0]][1])
        module.add_arguments(parser)
        args = parser.parse_args(argv[1:])
        return int(module.run(args) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        # Loaded for --version only: every other command would pay for the metadata machinery.
        from importlib.metadata import version

        print(version("cellcal"))
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
