"""``cellcal run --config FILE``: the long-running service (what systemd starts).

Start-up order (sd_notify READY only after all of it): configuration valid, store opened
and unfinished runs queued for resumption, ZeroMQ sockets bound. Then the supervising loop
runs until SIGTERM/SIGINT, which finishes the current transaction and exits 0.

Exit codes: 0 clean stop; 2 bad configuration; 1 the service could not start (the message
says why: store not writable, endpoint refused, ...).
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import sys

from cellcal.daemon.config import ConfigError, load_config
from cellcal.solver.errors import CellcalError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="TOML configuration file")
    p.add_argument("--log-level", default=None, help="override service.log_level")


def build_service(cfg, *, notifier=None):
    """The service with its ZeroMQ server (when the transport is available)."""
    from cellcal.daemon.service import Service

    svc = Service(cfg, notifier=notifier)
    server = None
    try:
        from cellcal.daemon import zmq_glue
    except ImportError:  # ZeroMQ transport not installed in this build
        zmq_glue = None
    if zmq_glue is not None:
        server = zmq_glue.attach(svc, cfg)
    return svc, server


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"cellcal run: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=(args.log_level or cfg.service.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    faulthandler.enable()  # a watchdog SIGABRT then leaves every thread's stack in the journal
    from cellcal.daemon.sdnotify import Notifier

    notifier = Notifier()
    try:
        svc, server = build_service(cfg, notifier=notifier)
        svc.install_signal_handlers()
        svc.start()
        if server is not None:
            server.start()
    except (CellcalError, OSError) as exc:
        print(f"cellcal run: cannot start: {exc}", file=sys.stderr)
        return 1
    svc.ready()
    try:
        svc.serve()
    finally:
        svc.shutdown()
        if server is not None:
            server.stop()
    return 0
