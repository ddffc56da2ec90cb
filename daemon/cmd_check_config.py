"""``cellcal check-config FILE``: load a configuration and say what is wrong, or print it.

Exit codes: 0 valid (the configuration is printed back in SI units as JSON), 2 invalid (the
message names the file, the dotted key path and what was expected).
"""

from __future__ import annotations

import argparse
import json
import sys

from cellcal.daemon.config import ConfigError, as_toml_dict, check_devices, load_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="TOML configuration file")
    p.add_argument("--no-devices", action="store_true", help="do not build the drivers to check URLs and options")
    p.add_argument("--quiet", action="store_true", help="print nothing when valid")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file)
        if not args.no_devices:
            try:
                check_devices(cfg)
            except ConfigError as exc:
                raise ConfigError(exc.path, str(exc).split(": ", 1)[-1], file=args.file) from None
    except ConfigError as exc:
        print(f"cellcal check-config: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        out = as_toml_dict(cfg)
        out["sha256"] = cfg.sha256
        print(json.dumps(out, indent=2))
    return 0
