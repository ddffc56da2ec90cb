"""``cellcal run [--config FILE]``: the long-running service (what systemd starts).

The configuration: ``--config``, else ``$CELLCAL_CONFIG``, else ``/etc/cellcal/cellcal.toml``
(:func:`cellcal.daemon.config.find_config`; ``ctl`` and ``watch`` find it the same way).

Start-up order (sd_notify READY only after all of it; ``cellcal.daemon.app.App``):
configuration valid (:func:`load_checked`: exactly what ``cellcal check-config`` checks),
store opened and unfinished runs queued for resumption, ZeroMQ sockets
bound. Then the supervising loop runs until SIGTERM/SIGINT, which finishes the current
transaction and exits 0.

Exit codes: 0 clean stop; 2 bad configuration; 1 the service could not start (the message
says why: store not writable, endpoint refused, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import sys

from cellcal.daemon.app import App
from cellcal.daemon.config import (
    CONFIG_ENV,
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigError,
    find_config,
    load_config,
    preflight,
)
from cellcal.daemon.sdnotify import Notifier
from cellcal.solver.errors import CellcalError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help=f"TOML configuration file (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG_PATH})")
    p.add_argument("--log-level", default=None, help="override service.log_level")


def load_checked(path: str) -> Config:
    """The configuration ``cellcal run`` starts with: loaded and preflighted, the same path
    ``cellcal check-config`` takes (so the two agree on every file).

    Raises
    ------
    ConfigError
        Naming the file and the dotted key.
    """
    cfg = load_config(path)
    preflight(cfg)
    return cfg


def run(args: argparse.Namespace) -> int:
    path, tried = find_config(args.config)
    if path is None:
        print(f"cellcal run: no configuration file (tried: {'; '.join(tried)}); give --config FILE",
              file=sys.stderr)
        return 2
    try:
        cfg = load_checked(path)
    except ConfigError as exc:
        print(f"cellcal run: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=(args.log_level or cfg.service.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    faulthandler.enable()  # a watchdog SIGABRT then leaves every thread's stack in the journal
    notifier = Notifier()
    try:
        app = App(cfg, notifier=notifier)  # no I/O, but refuses an insecure [zmq] section
        app.service.install_signal_handlers()
        app.open()
    except (CellcalError, OSError) as exc:
        print(f"cellcal run: cannot start: {exc}", file=sys.stderr)
        return 1
    with contextlib.closing(app):
        app.service.ready()
        app.service.serve()
    return 0
