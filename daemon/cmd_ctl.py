"""``cellcal ctl <cmd> [key=value ...] [--json-args '{...}']``: send one command to the daemon.

Prints the reply (``{id, ok, result}`` or ``{id, ok: false, error}``) as JSON on stdout.
Values of ``key=value`` are JSON when they parse as JSON (``limit=5``, ``point_m=[1,0,0.5]``,
``flag=true``) and strings otherwise (``kind=base_frame``); ``--json-args`` gives them all
as one JSON object (``key=value`` pairs override it).

Where to connect: ``--endpoint``, or ``[zmq] cmd_endpoint`` of ``--config FILE``, or the
production default ``ipc:///run/cellcal/cmd.sock``. Under CURVE: ``--key CLIENT.key_secret``
and ``--server-key`` (the daemon's ``.key`` file or Z85 key; with ``--config`` it is read
from ``server_secret_key_file`` when that file is readable).

Exit codes: 0 ok reply, 1 error reply, 2 bad usage, 3 no reply (timeout).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cellcal.daemon import protocol as P
from cellcal.daemon.client import Client, ClientTimeout, load_keypair, load_public_key
from cellcal.solver.errors import CellcalError


class UsageError(CellcalError):
    """Bad command line or configuration: exit 2."""


def add_connection_arguments(p: argparse.ArgumentParser, *, pub: bool) -> None:
    """Options shared by ``ctl`` and ``watch``: endpoints, config, CURVE keys, timeouts."""
    if pub:
        p.add_argument("--endpoint", help="PUB endpoint (default: from --config, else ipc:///run/cellcal/pub.sock)")
        p.add_argument("--cmd-endpoint", help="command endpoint, for snapshots (default: from --config, else ipc:///run/cellcal/cmd.sock)")
    else:
        p.add_argument("--endpoint", help="command endpoint (default: from --config, else ipc:///run/cellcal/cmd.sock)")
    p.add_argument("--config", help="daemon configuration (TOML) to read [zmq] from")
    p.add_argument("--key", help="this client's secret certificate (NAME.key_secret) for CURVE")
    p.add_argument("--server-key", help="the daemon's public certificate (.key) or Z85 public key")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait per attempt (default 2)")
    p.add_argument("--retries", type=int, default=1, help="re-sends after a timeout (default 1)")


def make_client(args: argparse.Namespace, *, pub: bool) -> Client:
    """A :class:`Client` from the connection options (raises :class:`UsageError`)."""
    from cellcal.daemon.config import ConfigError, Zmq, load_config

    zcfg = Zmq()
    if args.config:
        try:
            zcfg = load_config(args.config).zmq
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    if pub:
        pub_ep = args.endpoint or zcfg.pub_endpoint
        cmd_ep = args.cmd_endpoint or zcfg.cmd_endpoint
    else:
        pub_ep, cmd_ep = None, args.endpoint or zcfg.cmd_endpoint
    server_key = keypair = None
    if args.key or args.server_key or (args.config and zcfg.curve):
        if not args.key:
            raise UsageError("CURVE is on: give --key CLIENT.key_secret")
        try:
            keypair = load_keypair(args.key)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--key: {exc}") from None
        source = args.server_key or (zcfg.server_secret_key_file if args.config else None)
        if not source:
            raise UsageError("CURVE is on: give --server-key (the daemon's .key file or Z85 key)")
        try:
            server_key = load_public_key(source)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--server-key: {exc}") from None
    if args.timeout <= 0 or args.retries < 0:
        raise UsageError("--timeout must be > 0 and --retries >= 0")
    return Client(cmd_ep, pub_ep, curve_server_key=server_key, curve_keypair=keypair,
                  timeout_s=args.timeout, retries=args.retries)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("cmd", help="command: " + ", ".join(P.COMMANDS))
    p.add_argument("args", nargs="*", metavar="key=value", help="arguments (values parsed as JSON when they can be)")
    p.add_argument("--json-args", help="arguments as one JSON object")
    add_connection_arguments(p, pub=False)
    # key=value pairs may follow options (`ctl to_base --endpoint X point_m=[1,0,0]`); plain
    # parse_args stops filling a nargs="*" positional at the first option. cli.main calls
    # parser.parse_args, so this parser answers it with the intermixed parse.
    p.parse_args = p.parse_intermixed_args  # type: ignore[method-assign]


def parse_args_list(pairs: list[str], json_args: str | None) -> dict[str, Any]:
    """``key=value`` strings (and an optional JSON object) into the command's ``args``."""
    out: dict[str, Any] = {}
    if json_args:
        try:
            obj = json.loads(json_args)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--json-args is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise UsageError("--json-args must be a JSON object")
        out.update(obj)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    if args.cmd not in P.COMMANDS:
        print(f"cellcal ctl: unknown command {args.cmd!r} (known: {', '.join(P.COMMANDS)})", file=sys.stderr)
        return 2
    try:
        cmd_args = parse_args_list(args.args, args.json_args)
        client = make_client(args, pub=False)
    except UsageError as exc:
        print(f"cellcal ctl: {exc}", file=sys.stderr)
        return 2
    with client:
        try:
            reply = client.request(args.cmd, cmd_args)
        except ClientTimeout as exc:
            print(f"cellcal ctl: {exc}", file=sys.stderr)
            return 3
    print(json.dumps(reply, indent=2, default=repr))
    return 0 if reply.get("ok") is True else 1
