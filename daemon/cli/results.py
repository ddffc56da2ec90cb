"""What ``cellcal report``, ``cellcal show`` and ``cellcal stations`` share: finding the
daemon's state directory and opening its store read-only, and reading ids as people type them.

The state directory is ``--state-dir`` when given, else ``[service] state_dir`` of the
configuration: ``--config FILE``, else the file named by ``CELLCAL_CONFIG``, else
``/etc/cellcal/cellcal.toml`` (where ``systemd/README.md`` installs it). The store is opened
read-only: these commands run beside the daemon (SQLite's WAL lets a reader in while it
writes) and never change what it keeps.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from cellcal.daemon.config import ConfigError, load_config
from cellcal.daemon.report.refused import REFUSED_DIR
from cellcal.daemon.store import DB_FILENAME, ResultRecord, Store, UnknownRecord
from cellcal.solver.errors import CellcalError

__all__ = ["DEFAULT_CONFIG", "MAX_ID", "CommandError", "add_state_arguments", "state_dir_of", "open_store", "parse_id",
           "result_or_active", "export_paths"]

#: The configuration read when neither ``--config`` nor ``CELLCAL_CONFIG`` names one.
DEFAULT_CONFIG = "/etc/cellcal/cellcal.toml"


class CommandError(CellcalError):
    """A command that cannot do what was asked; the message says why (exit 2)."""


def add_state_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None,
                   help=f"daemon configuration (default: $CELLCAL_CONFIG, else {DEFAULT_CONFIG}); its "
                        "[service] state_dir holds the results")
    p.add_argument("--state-dir", default=None, help="the daemon's state directory (instead of the configuration's)")


def state_dir_of(args: argparse.Namespace) -> Path:
    """The state directory ``args`` point to (module docstring).

    Raises
    ------
    CommandError
        The configuration cannot be read, naming the file and where it came from.
    """
    if getattr(args, "state_dir", None):
        return Path(args.state_dir)
    path, why = args.config, "--config"
    if not path:
        path, why = os.environ.get("CELLCAL_CONFIG") or DEFAULT_CONFIG, "CELLCAL_CONFIG"
        if not os.environ.get("CELLCAL_CONFIG"):
            why = "the default path"
    try:
        return Path(load_config(path).service.state_dir)
    except ConfigError as exc:
        raise CommandError(f"configuration {path} (from {why}): {exc}; give --config FILE or --state-dir DIR") from exc


def open_store(args: argparse.Namespace) -> Store:
    """The store of ``args``' state directory, opened read-only (close it).

    Raises
    ------
    CommandError
        No store there, or it cannot be read (the message names the directory).
    """
    d = state_dir_of(args)
    if not (d / DB_FILENAME).exists():
        raise CommandError(f"no cellcal store in {d} (no {DB_FILENAME}): is this the daemon's state directory?")
    try:
        return Store(d, read_only=True).open()
    except CellcalError as exc:
        raise CommandError(f"cannot open the store in {d}: {exc}") from exc


#: The largest id the store can hold: SQLite's INTEGER PRIMARY KEY is a signed 64-bit integer.
MAX_ID = 2**63 - 1

# ASCII digits only: str.isdigit() (and int()) also take Arabic-Indic and other Unicode digits,
# so "\u0661" would name result 1, and superscripts, which int() then refuses.
_DIGITS = re.compile(r"[0-9]+")


def parse_id(text: object, what: str) -> int:
    """An id as a person types it: ``7``, ``"7"``, ``result_7``, ``#7``: ASCII digits naming
    a positive integer the store can hold (1 .. 2**63 - 1).

    ``-1``, ``1e3``, ``+7``, ``7.0``, a Unicode digit (``\u0661``) or a 20-digit number are
    refused here, before the store is asked.

    Raises
    ------
    CommandError
        Naming ``what`` and the text.
    """
    s = str(text).strip().strip("'\"").lstrip("#")
    for prefix in ("result_", "result", "run_", "run"):
        if s.lower().startswith(prefix) and _DIGITS.fullmatch(s[len(prefix):].strip()):
            s = s[len(prefix):].strip()
            break
    shown = str(text)
    shown = repr(shown if len(shown) <= 40 else shown[:40] + "...")
    if not _DIGITS.fullmatch(s) or not s.strip("0"):
        raise CommandError(f"{what} must be a positive integer in ASCII digits (e.g. 3), got {shown}")
    # The length first: int() of thousands of digits raises, and past 2**63 - 1 SQLite would
    # overflow (OverflowError) where the store is asked.
    if len(s.lstrip("0")) > 19 or int(s) > MAX_ID:
        raise CommandError(f"{what} must be at most {MAX_ID} (the store's largest id), got {shown}")
    return int(s)


def result_or_active(store: Store, text: object) -> ResultRecord:
    """The result record named by ``text`` (an id), or the active one when ``text`` is None.

    Raises
    ------
    CommandError
        No such result, or none active.
    """
    if text is None:
        rec = store.active_result()
        if rec is None:
            have = [r.id for r in store.list_results(limit=5)]
            hint = f"; stored results: {', '.join(map(str, have))} (name one)" if have else "; there are no results yet"
            raise CommandError(f"no active result in {store.state_dir}{hint}")
        return rec
    rid = parse_id(text, "RESULT_ID")
    try:
        return store.get_result(rid)
    except UnknownRecord:
        raise CommandError(f"no result {rid} in {store.state_dir}") from None


def export_paths(state_dir: Path, result_id: int) -> list[Path]:
    """The files the daemon exported for a result (``exports/result_<id>.*`` and
    ``exports/result_<id>_*``; a result that failed its gates: under
    ``exports/GATES_FAILED_not_for_use/``), sorted; only those that exist."""
    found: set[Path] = set()
    for d in (Path(state_dir) / "exports", Path(state_dir) / "exports" / REFUSED_DIR):
        if d.is_dir():
            found |= {p for pat in (f"result_{result_id}.*", f"result_{result_id}_*") for p in d.glob(pat) if p.is_file()}
    return sorted(p for p in found if not p.name.endswith(".cellcal-tmp"))
