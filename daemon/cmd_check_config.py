"""``cellcal check-config FILE``: load a configuration and say what is wrong, or print it.

It makes exactly the checks ``cellcal run`` makes before it starts (one path:
:func:`cellcal.daemon.config.load_config` then :func:`cellcal.daemon.config.preflight`):
every key, type and bound, the ``[zmq]`` security rules, the device URLs and options (the
drivers are built, never opened) and, with CURVE, the server key file. So a file that
passes here is one ``cellcal run`` starts with, and a file ``run`` refuses fails here with
the same message. Run it as the daemon's user (``sudo -u cellcal cellcal check-config ...``)
so the key file is read with the daemon's rights. ``--no-devices`` skips the drivers (then
it checks less than ``run`` does, and says so).

Exit codes: 0 valid (the configuration is printed back in SI units as JSON, with ``gates``:
each acceptance gate of ``[solve]`` in a sentence with its limit in mm and deg, or "off"),
2 invalid (the message names the file, the dotted key path and what was expected).
"""

from __future__ import annotations

import argparse
import json
import sys

from cellcal.daemon.config import ConfigError, as_toml_dict, load_config, preflight
from cellcal.daemon.gates import describe_gates


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="TOML configuration file")
    p.add_argument("--no-devices", action="store_true",
                   help="do not build the drivers to check URLs and options (checks less than `cellcal run`)")
    p.add_argument("--quiet", action="store_true", help="print nothing when valid")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file)
        preflight(cfg, devices=not args.no_devices)
    except ConfigError as exc:
        print(f"cellcal check-config: {exc}", file=sys.stderr)
        return 2
    if args.no_devices:
        print("cellcal check-config: device URLs and options not checked (--no-devices)", file=sys.stderr)
    if not args.quiet:
        out = as_toml_dict(cfg)
        out["sha256"] = cfg.sha256
        out["gates"] = describe_gates(cfg.solve)
        print(json.dumps(out, indent=2, default=str))
    return 0
