"""``cellcal ctl <cmd> [key=value ...] [--json-args '{...}']``: send one command to the daemon.

Prints the reply in words (``cellcal.daemon.cli.replies``: mm, degrees, rotation vectors; an
error reply on stderr), or with ``--json`` the reply itself (``{id, ok, result}`` or ``{id, ok:
false, error}``) as JSON on stdout.
Values of ``key=value`` are JSON when they parse as JSON (``limit=5``, ``point_m=[1,0,0.5]``,
``flag=true``) and strings otherwise (``kind=base_frame``); ``--json-args`` gives them all
as one JSON object (``key=value`` pairs override it).

Where to connect: ``--endpoint``, or ``[zmq] cmd_endpoint`` of the configuration found as
``cellcal run`` finds it (``--config FILE``, ``$CELLCAL_CONFIG``, ``/etc/cellcal/cellcal.toml``),
or the production default ``ipc:///run/cellcal/cmd.sock``; with no reply it says what it
tried. ``cellcal ctl --help COMMAND`` lists a command's arguments (the protocol catalogue).
Ids are typed bare: ``cellcal ctl get_result result_id=1``. Under CURVE: ``--key CLIENT.key_secret``
and ``--server-key`` (the daemon's ``.key`` file or Z85 key; with ``--config`` it is read
from ``server_secret_key_file`` when that file is readable).

Exit codes: 0 ok reply, 1 error reply, 2 bad usage, 3 no reply (timeout).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from cellcal.daemon import protocol as P
from cellcal.daemon.cli.replies import reply_lines
from cellcal.daemon.cli.results import CommandError, parse_id
from cellcal.daemon.config import ConfigError, Zmq, find_config, load_config
from cellcal.daemon.wire.client import Client, ClientTimeout, load_keypair, load_public_key
from cellcal.solver.errors import CellcalError


class UsageError(CellcalError):
    """Bad command line or configuration: exit 2."""


# A record id that is a name, not a number (the wire's character set, P.v_record_id).
_NAME_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def add_connection_arguments(p: argparse.ArgumentParser, *, pub: bool) -> None:
    """Options shared by ``ctl`` and ``watch``: endpoints, config, CURVE keys, timeouts."""
    if pub:
        p.add_argument("--endpoint", help="PUB endpoint (default: from --config, else ipc:///run/cellcal/pub.sock)")
        p.add_argument("--cmd-endpoint", help="command endpoint, for snapshots (default: from --config, else ipc:///run/cellcal/cmd.sock)")
    else:
        p.add_argument("--endpoint", help="command endpoint (default: from --config, else ipc:///run/cellcal/cmd.sock)")
    p.add_argument("--config", help="daemon configuration (TOML) to read [zmq] from (default: $CELLCAL_CONFIG, else "
                                    "/etc/cellcal/cellcal.toml when it exists)")
    p.add_argument("--key", help="this client's secret certificate (NAME.key_secret) for CURVE")
    p.add_argument("--server-key", help="the daemon's public certificate (.key) or Z85 public key")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait per attempt (default 2)")
    p.add_argument("--retries", type=int, default=1, help="re-sends after a timeout (default 1)")


def _find_zmq(args: argparse.Namespace) -> tuple[Zmq, str | None, list[str]]:
    """The ``[zmq]`` section the endpoints come from, the file it was read from (None:
    built-in defaults) and what was tried, found the way ``cellcal run`` finds its file."""
    path, tried = find_config(args.config)
    if path is None:
        return Zmq(), None, tried
    try:
        return load_config(path).zmq, path, tried
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def make_client(args: argparse.Namespace, *, pub: bool) -> Client:
    """A :class:`Client` from the connection options (raises :class:`UsageError`).

    Endpoints: ``--endpoint`` (``--cmd-endpoint``), else ``[zmq]`` of the configuration
    found as ``cellcal run`` finds it (``--config``, ``$CELLCAL_CONFIG``,
    ``/etc/cellcal/cellcal.toml``), else the production defaults. ``args.tried`` is set to
    a sentence saying where the endpoints came from (for "no reply" messages).
    """
    zcfg, config_path, tried = _find_zmq(args)
    if pub:
        pub_ep = args.endpoint or zcfg.pub_endpoint
        cmd_ep = args.cmd_endpoint or zcfg.cmd_endpoint
    else:
        pub_ep, cmd_ep = None, args.endpoint or zcfg.cmd_endpoint
    explicit = args.endpoint is not None and (not pub or args.cmd_endpoint is not None)
    if explicit:
        origin = "--endpoint"
    elif config_path is not None:
        origin = f"[zmq] of {config_path}"
    else:
        origin = "the built-in defaults"
    args.tried = f"endpoints from {origin} (looked for the configuration: {'; '.join(tried)})"
    server_key = keypair = None
    if args.key or args.server_key or (config_path and zcfg.curve):
        if not args.key:
            raise UsageError(f"CURVE is on ([zmq] of {config_path}): give --key CLIENT.key_secret")
        try:
            keypair = load_keypair(args.key)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--key: {exc}") from None
        source = args.server_key or (zcfg.server_secret_key_file if config_path else None)
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


def command_help(name: str) -> str:
    """``cellcal ctl --help NAME``: the command's arguments from the protocol catalogue."""
    cmd = P.COMMANDS[name]
    usage = " ".join(f"{a.name}=..." if a.required else f"[{a.name}=...]" for a in cmd.args)
    lines = [f"usage: cellcal ctl {name} {usage}".rstrip(), "", f"{cmd.doc} (role: {cmd.role})", ""]
    if not cmd.args:
        lines.append("no arguments")
    else:
        lines.append("arguments:")
        width = max(len(a.name) for a in cmd.args)
        for a in cmd.args:
            need = "required" if a.required else ("optional" if a.default is None else f"default {a.default!r}")
            lines.append(f"  {a.name:<{width}}  {a.type_name}; {need}")
            if a.doc:
                lines.append(f"  {'':<{width}}  {a.doc}")
    for group in cmd.exclusive:
        lines.append(f"at most one of: {', '.join(group)}")
    if cmd.one_of:
        lines.append(f"exactly one of: {', '.join(cmd.one_of)}")
    lines += ["", "Values are JSON when they parse as JSON, else strings; ids may be typed bare (result_id=1)."]
    return "\n".join(lines)


def _catalogue_epilog() -> str:
    width = max(len(n) for n in P.COMMANDS)
    rows = [f"  {n:<{width}}  {c.doc}" for n, c in P.COMMANDS.items()]
    return "commands (`cellcal ctl --help COMMAND` for its arguments):\n" + "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _catalogue_epilog()
    p.add_argument("cmd", help="the command (listed below)")
    p.add_argument("args", nargs="*", metavar="key=value", help="arguments (values parsed as JSON when they can be)")
    p.add_argument("--json-args", help="arguments as one JSON object")
    p.add_argument("--json", action="store_true",
                   help="print the reply ({id, ok, result} or {id, ok: false, error}) as JSON instead of in words")
    add_connection_arguments(p, pub=False)
    # key=value pairs may follow options (`ctl to_base --endpoint X point_m=[1,0,0]`); plain
    # parse_args stops filling a nargs="*" positional at the first option. cli.main calls
    # parser.parse_args, so this parser answers it with the intermixed parse.
    # `ctl --help NAME` / `ctl NAME --help` print that command's arguments instead.
    def parse(args: list[str] | None = None, namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        argv = list(sys.argv[1:] if args is None else args)
        if any(a in ("-h", "--help") for a in argv):
            named = [a for a in argv if a in P.COMMANDS]
            if named:
                print(command_help(named[0]))
                raise SystemExit(0)
        return p.parse_intermixed_args(argv, namespace)

    p.parse_args = parse  # type: ignore[method-assign,assignment]


def _record_id(name: str, raw: object) -> str:
    """A record-id argument as the wire takes it: a decimal id as people type it (``7``,
    ``result_7``, ``#7``) becomes ``"7"``; anything numeric that is not such an id (``-1``,
    ``1e3``, ``7.0``, a Unicode digit, a number past the store's range) is refused here, naming
    the argument; another name (``r-404``) goes to the daemon as typed (ids are strings on the
    wire, ADR 0007; the daemon says whether it knows it)."""
    try:
        return str(parse_id(raw, name))
    except CommandError as exc:
        if isinstance(raw, str) and _NAME_ID.fullmatch(raw) and not _numeric(raw):
            return raw
        raise UsageError(str(exc)) from None


def _numeric(text: str) -> bool:
    """Whether ``text`` reads as a number in Python (``1e3``, ``-1``, ``0x10``, ``1_0``, ``inf``)."""
    for parse in (float, lambda t: int(t, 0)):
        try:
            parse(text)
        except ValueError:
            continue
        return True
    return False


def parse_args_list(pairs: list[str], json_args: str | None, cmd: str | None = None) -> P.JsonObject:
    """``key=value`` strings (and an optional JSON object) into the command's ``args``.

    An argument the catalogue types as a record id (``result_id``, ``run_id``: strings on
    the wire) is read by :func:`_record_id` from the text as typed (``result_id=1`` is sent
    as ``"1"``; ``result_id=1e3`` is refused, not sent as ``1000.0``).

    Raises
    ------
    UsageError
        Naming the pair or the argument.
    """
    out: P.JsonObject = {}
    typed: dict[str, object] = {}
    huge: dict[str, str] = {}
    if json_args:
        try:
            obj = json.loads(json_args)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--json-args is not JSON: {exc}") from None
        except RecursionError:
            raise UsageError("--json-args is nested too deep") from None
        except ValueError as exc:  # an integer of thousands of digits
            raise UsageError(f"--json-args: {exc}") from None
        if not isinstance(obj, dict):
            raise UsageError("--json-args must be a JSON object")
        out.update(obj)
        typed.update(obj)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
        except RecursionError:
            raise UsageError(f"{key}: the value is nested too deep") from None
        except ValueError as exc:  # an integer of thousands of digits: a record id says so, others here
            out[key] = value
            huge[key] = str(exc)
        typed[key] = value
    spec = P.COMMANDS.get(cmd) if cmd is not None else None
    for a in spec.args if spec is not None else ():
        if a.check is P.v_record_id and a.name in out:
            out[a.name] = _record_id(a.name, typed[a.name])
            huge.pop(a.name, None)
    for key, why in huge.items():
        raise UsageError(f"{key}: {why}")
    for key, v in out.items():
        try:
            P.pack(v)  # what the wire cannot carry (an integer past 64 bits) is the argument's error
        except (TypeError, ValueError, OverflowError) as exc:
            raise UsageError(f"{key}: cannot be sent ({exc}; integers must fit 64 bits)") from None
    return out


def run(args: argparse.Namespace) -> int:
    if args.cmd not in P.COMMANDS:
        print(f"cellcal ctl: unknown command {args.cmd!r} (known: {', '.join(P.COMMANDS)})", file=sys.stderr)
        return 2
    try:
        cmd_args = parse_args_list(args.args, args.json_args, args.cmd)
        client = make_client(args, pub=False)
    except UsageError as exc:
        print(f"cellcal ctl: {exc}", file=sys.stderr)
        return 2
    with client:
        try:
            reply = client.request(args.cmd, cmd_args)
        except ClientTimeout as exc:
            print(f"cellcal ctl: {exc}; is the daemon running? {args.tried}", file=sys.stderr)
            return 3
    if args.json:
        print(json.dumps(reply, indent=2, default=repr))
    elif reply.get("ok") is True:
        print("\n".join(reply_lines(args.cmd, reply)))
    else:
        print(f"cellcal ctl: {reply_lines(args.cmd, reply)[0]}", file=sys.stderr)
    return 0 if reply.get("ok") is True else 1
