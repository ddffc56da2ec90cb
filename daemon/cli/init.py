"""``cellcal init [--robot ur|cia402|sim] [-o FILE]``: write a commented starting configuration.

The file is the shipped example for that robot (``config/``, installed as ``cellcal.examples``: ``cellcal.toml`` for a
UR arm over RTDE, ``cellcal-can.toml`` for CiA 402 drives over CANopen, ``demo.toml`` for
the simulated cell) with a header saying what to edit and how to check it; so it has every
key, each commented as in the examples, and ``cellcal check-config`` accepts it as written.
For ``sim`` the device addresses are the fixed loopback ports of the ``cellcal sim`` command
line the header gives, and the state goes to ``.cellcal-sim/`` in the working directory.

Without ``-o`` the file goes to standard output. An existing file is never replaced unless
``--force`` is given. Exit codes: 0 written, 2 refused (the message says why).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from cellcal.daemon.cli.examples import example_path
from cellcal.daemon.cli.output import OutputRefused, write_output

#: --robot -> (example file, what it is).
ROBOTS = {
    "ur": ("cellcal.toml", "a Universal Robots arm over RTDE and a laser tracker on a serial port"),
    "cia402": ("cellcal-can.toml", "CiA 402 drives over CANopen and a laser tracker on a serial port"),
    "sim": ("demo.toml", "the simulated cell (`cellcal sim`) on loopback"),
}

#: Fixed loopback ports of the simulated cell (the UR controller's own port numbers).
SIM_PORTS = {"robot": 30004, "urscript": 30002, "dashboard": 29999, "primary": 30001, "tracker": 4000}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--robot", choices=tuple(ROBOTS), default="ur",
                   help="ur: UR arm over RTDE (default); cia402: CiA 402 drives over CANopen; sim: the simulated cell")
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="write here (default: standard output)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")


def _body(text: str) -> str:
    """The example without its own leading comment block (the header replaces it)."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and (lines[i].startswith("#") or not lines[i].strip()):
        i += 1
    return "".join(lines[i:])


def _set(text: str, table: str, key: str, value: str, comment: str) -> str:
    """``key = value  # comment`` inside ``[table]`` (the first one, which the examples have)."""
    pattern = re.compile(rf"(^\[{re.escape(table)}\]\n(?:(?!\[).*\n)*?){re.escape(key)} = [^\n]*\n", re.M)
    new, n = pattern.subn(lambda m: f"{m.group(1)}{key} = {value}    # {comment}\n", text, count=1)
    if n != 1:  # an example without the key: a packaging bug, not a user error
        raise RuntimeError(f"example has no {table}.{key}")
    return new


def render(robot: str) -> str:
    """The configuration text for ``robot`` (a key of :data:`ROBOTS`)."""
    name, what = ROBOTS[robot]
    body = _body(example_path(name).read_text(encoding="utf-8"))
    head = [
        f"# cellcal starting configuration: {what}.",
        f"# Written by `cellcal init --robot {robot}` from the example {name}. Units are in every key",
        "# name (mm, deg, s); cellcal converts to SI on load. Every key: docs/configuration.md.",
    ]
    if robot == "sim":
        sp = SIM_PORTS
        scenario = example_path("demo-scenario.toml")
        body = _set(body, "service", "name", '"sim"', "cell name, in every message and result")
        body = _set(body, "service", "state_dir", '".cellcal-sim/state"', "relative to the daemon's working directory")
        body = _set(body, "service", "runtime_dir", '".cellcal-sim/run"', "ipc sockets (none: the endpoints are TCP)")
        body = _set(body, "robot", "url", f'"rtde://127.0.0.1:{sp["robot"]}?model=ur5e"',
                    "the simulator's RTDE port; URScript, dashboard and primary on the UR defaults")
        body = _set(body, "tracker", "url", f'"socket://127.0.0.1:{sp["tracker"]}"', "the simulator's tracker port")
        head += [
            "#",
            "# Start the simulated cell first, in another terminal (it serves until Ctrl-C):",
            f"#   cellcal sim --scenario {scenario} --robot-port {sp['robot']} \\",
            f"#       --urscript-port {sp['urscript']} --dashboard-port {sp['dashboard']} "
            f"--primary-port {sp['primary']} \\",
            f"#       --tracker-transport tcp --tracker-port {sp['tracker']}",
            "# then the daemon:   cellcal run --config FILE",
            "# and watch it:      cellcal watch --config FILE   (cellcal ctl --config FILE start_run kind=base_frame)",
        ]
    else:
        head += [
            "#",
            "# Edit before the first run: robot.url (the controller's address or CAN channel),",
            "# tracker.url (the tracker's port), [plan] (a workspace box your robot can reach",
            "# without collisions), and [zmq] (who may command the daemon).",
        ]
    head += ["# Check it with:  cellcal check-config FILE", ""]
    return "\n".join(head) + "\n" + body


def run(args: argparse.Namespace) -> int:
    text = render(args.robot)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.output)
    if out.is_dir():
        print(f"cellcal init: {out} is a directory; give a file name (-o {out / 'cellcal.toml'})", file=sys.stderr)
        return 2
    try:
        # Never replace a file someone wrote, nor write through a link, unless told to.
        write_output(out, text, force=args.force)
    except OutputRefused as exc:
        print(f"cellcal init: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"cellcal init: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"cellcal init: wrote {out} ({ROBOTS[args.robot][1]}); check it with: cellcal check-config {os.fspath(out)}",
          file=sys.stderr)
    return 0
