"""The ``cellcal`` command line: one entry point, one module per subcommand.

Subcommand modules are imported only when used, so ``cellcal solve`` does not pay for
ZeroMQ or CAN imports. Each module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# name -> (module, one-line help). Modules are imported lazily.
COMMANDS: dict[str, tuple[str, str]] = {
    "solve": ("cellcal.daemon.cli.solve", "solve a calibration from a station file"),
    "sim": ("cellcal.sim.cli", "serve the simulated cell's devices (robot and tracker) until SIGTERM"),
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


def _quiet_broken_pipe() -> int:
    """The reader of our stdout went away (``cellcal ... | head``): exit quietly.

    stdout is pointed at /dev/null so that the interpreter's final flush does not raise
    (and print) a second BrokenPipeError; the exit code is the shell's for SIGPIPE.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a file
        pass
    return 141


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return _quiet_broken_pipe()


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
