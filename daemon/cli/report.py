"""``cellcal report [RESULT_ID] [-o FILE]``: the HTML report of a stored result.

Reads the daemon's store (``--state-dir``, or ``[service] state_dir`` of ``--config`` /
``CELLCAL_CONFIG`` / ``/etc/cellcal/cellcal.toml``) read-only, renders the result's report
with its run's stations and every drift check so far (``cellcal.daemon.report.html``), and
writes it to ``FILE`` (default: ``cellcal-result-<id>.html`` in the working directory;
``-o -`` writes to stdout). Without ``RESULT_ID``: the active result. Prints the path. An
existing file or a symlink there is refused unless ``--force`` (``cellcal.daemon.cli.output``).

The daemon writes the same report beside the exports when it stores a result; this command
makes it again later, with the drift checks made since.

Exit codes: 0 written; 2 no such result / store / configuration, or the file cannot be written.
"""

from __future__ import annotations

import argparse
import sys

from cellcal.daemon.cli.output import OutputRefused, check_output, write_output
from cellcal.daemon.cli.results import CommandError, add_state_arguments, open_store, parse_id, result_or_active
from cellcal.daemon.report.html import report_from_store


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("result_id", nargs="?", default=None, metavar="RESULT_ID",
                   help="the result (default: the active one)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="where to write the report (default: cellcal-result-<id>.html here; '-': stdout)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists (a symlink: the link, not its target)")
    add_state_arguments(p)


def run(args: argparse.Namespace) -> int:
    try:
        if args.result_id is not None:
            parse_id(args.result_id, "RESULT_ID")  # before the store: a typo is the argument's error
        if args.output not in (None, "-"):
            check_output(args.output, force=args.force)  # before the work (and again when written)
        store = open_store(args)
        try:
            rec = result_or_active(store, args.result_id)
            text = report_from_store(store, rec.id)
        finally:
            store.close()
    except (CommandError, OutputRefused) as exc:
        print(f"cellcal report: {exc}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    try:
        out = write_output(args.output or f"cellcal-result-{rec.id}.html", text, force=args.force, make_parents=True)
    except OutputRefused as exc:
        print(f"cellcal report: {exc}", file=sys.stderr)
        return 2
    print(f"report of result {rec.id}: {out.resolve()}")
    return 0
