"""``cellcal report [RESULT_ID] [-o FILE]``: the HTML report of a stored result.

Reads the daemon's store (``--state-dir``, or ``[service] state_dir`` of ``--config`` /
``CELLCAL_CONFIG`` / ``/etc/cellcal/cellcal.toml``) read-only, renders the result's report
with its run's stations and every drift check so far (``cellcal.daemon.report.html``), and
writes it to ``FILE`` (default: ``cellcal-result-<id>.html`` in the working directory;
``-o -`` writes to stdout). Without ``RESULT_ID``: the active result. Prints the path.

The daemon writes the same report beside the exports when it stores a result; this command
makes it again later, with the drift checks made since.

Exit codes: 0 written; 2 no such result / store / configuration, or the file cannot be written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cellcal.daemon.cli.results import CommandError, add_state_arguments, open_store, result_or_active
from cellcal.daemon.report.html import report_from_store


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("result_id", nargs="?", default=None, metavar="RESULT_ID",
                   help="the result (default: the active one)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="where to write the report (default: cellcal-result-<id>.html here; '-': stdout)")
    add_state_arguments(p)


def run(args: argparse.Namespace) -> int:
    try:
        store = open_store(args)
        try:
            rec = result_or_active(store, args.result_id)
            text = report_from_store(store, rec.id)
        finally:
            store.close()
    except CommandError as exc:
        print(f"cellcal report: {exc}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output or f"cellcal-result-{rec.id}.html")
    try:
        if out.parent != Path(""):
            out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    except OSError as exc:
        print(f"cellcal report: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"report of result {rec.id}: {out.resolve()}")
    return 0
