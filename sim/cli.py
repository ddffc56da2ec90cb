"""``cellcal sim``: serve the simulated cell's devices until SIGTERM or SIGINT.

Prints exactly one JSON line on stdout once every device is listening, mapping device
names to the URL a driver connects to (``null`` for a device this build does not
simulate), e.g.::

    {"tracker": "/dev/pts/5", "robot": "rtde://127.0.0.1:41234?urscript_port=41235&dashboard_port=41236&primary_port=41237&model=ur5e",
     "dashboard": 41236, "primary": 41237}

``dashboard`` and ``primary`` are the UR controller's dashboard-server and primary-interface
ports (``null`` for the CiA 402 transport); the robot URL's query carries them too.

``--instrument emscon|geocom`` serves the tracker in that protocol instead of cellcal's, from
the same world; its URL then names the protocol (``emscon://127.0.0.1:PORT``,
``geocom:///dev/pts/5``, ``geocom+socket://127.0.0.1:PORT``).

then serves until SIGTERM or SIGINT and exits 0. Logs go to stderr.

Adding a device is one entry in :data:`DEVICE_STARTERS`: a function taking the parsed
arguments, the scenario and the shared world, returning a started context manager with a
``url`` attribute.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from cellcal.sim.link import Transport
from cellcal.sim.scenario import Scenario, ScenarioError, load_scenario
from cellcal.sim.world import World

log = logging.getLogger("cellcal.sim")


#: ``--instrument`` -> (module, class) of the simulated instrument served as the tracker.
INSTRUMENTS: dict[str, tuple[str, str]] = {
    "cellcal": ("cellcal.sim.tracker_sim", "SimTracker"),
    "emscon": ("cellcal.sim.emscon_sim", "SimEmscon"),
    "geocom": ("cellcal.sim.geocom_sim", "SimGeocom"),
}


def _start_tracker(args: argparse.Namespace, scenario: Scenario, world: World) -> Any:
    import importlib

    module, name = INSTRUMENTS[args.instrument]
    cls = getattr(importlib.import_module(module), name)
    transport = args.tracker_transport or cls.TRANSPORTS[0]
    if transport not in cls.TRANSPORTS:
        print(f"cellcal sim: --instrument {args.instrument} is served on "
              f"{', '.join(cls.TRANSPORTS)} only, not {transport}", file=sys.stderr)
        raise SystemExit(2)
    sim = cls(world, scenario.tracker, transport=transport, seed=scenario.seed, port=args.tracker_port)
    return sim.start()


def _start_robot(args: argparse.Namespace, scenario: Scenario, world: World) -> Any:
    from cellcal.sim.robot_sim import start_sim_robot

    return start_sim_robot(
        world,
        scenario.robot,
        transport=args.robot_transport,
        rtde_port=args.robot_port,
        urscript_port=args.urscript_port,
        can_channel=args.can_channel or f"cellcal-sim-{os.getpid()}",
        can_interface="virtual",
        can_bridge=None if args.can_bridge == "none" else args.can_bridge,
        can_bridge_port=args.can_port,
        dashboard_port=args.dashboard_port,
        primary_port=args.primary_port,
        realtime_port=args.realtime_port,
    )


def _start_camera(args: argparse.Namespace, scenario: Scenario, world: World) -> Any:
    """``--camera MOUNTING``: the scenario's ``[camera]`` (it must be mounted so), or a default
    camera of that mounting (``cellcal.sim.camera_device.default_camera``), served as a GigE
    Vision device on ``--camera-address``."""
    if args.camera is None:
        return None
    from cellcal.sim.camera_device import default_camera, start_sim_camera  # only a cell with a camera needs it

    if not ipaddress.ip_address(args.camera_address).is_loopback:
        # The simulator serves loopback only: a simulated camera on a real network would answer
        # whoever discovers cameras there.
        print(f"cellcal sim: --camera-address {args.camera_address} is not a loopback address", file=sys.stderr)
        raise SystemExit(2)
    config = scenario.camera if scenario.camera is not None else default_camera(scenario, args.camera)
    if config.mounting != args.camera:
        print(f"cellcal sim: the scenario's [camera] is mounted {config.mounting}, not {args.camera}", file=sys.stderr)
        raise SystemExit(2)
    return start_sim_camera(world, config, args.camera_address, seed=scenario.seed)


#: device name -> starter, in start order; ``None`` (or a starter returning None) prints
#: ``null`` (not simulated).
DEVICE_STARTERS: dict[str, Callable[[argparse.Namespace, Scenario, World], Any] | None] = {
    "tracker": _start_tracker,
    "robot": _start_robot,
    "camera": _start_camera,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", required=True, help="scenario TOML (see docs/simulation.md)")
    parser.add_argument(
        "--instrument", choices=sorted(INSTRUMENTS), default="cellcal",
        help="the tracker's protocol: cellcal tracker protocol 1.0 (default), Leica emScon TPI "
             "(TCP only) or Leica GeoCOM (docs/protocols/)",
    )
    parser.add_argument(
        "--tracker-transport",
        choices=Transport.ALL,
        default=None,
        help="serve the tracker on a pty (default; emscon: TCP only) or on loopback TCP",
    )
    parser.add_argument(
        "--tracker-port", type=int, default=0, help="TCP port for --tracker-transport tcp (0: any free port)"
    )
    parser.add_argument(
        "--robot-transport", choices=("rtde", "canopen"), default="rtde",
        help="serve the robot as a UR RTDE controller (default) or as six CiA 402 drives on CAN",
    )
    parser.add_argument("--robot-port", type=int, default=0, help="RTDE TCP port (0: any free port)")
    parser.add_argument("--urscript-port", type=int, default=0, help="URScript TCP port (0: any free port)")
    parser.add_argument("--dashboard-port", type=int, default=0, help="UR dashboard server TCP port (0: any free port)")
    parser.add_argument("--primary-port", type=int, default=0, help="UR primary interface TCP port (0: any free port)")
    parser.add_argument("--realtime-port", type=int, default=None,
                        help="also take scripts on this TCP port, as a UR's realtime interface (30003) does (default: off)")
    parser.add_argument(
        "--can-bridge", choices=("tcp", "pty", "none"), default="tcp",
        help="--robot-transport canopen: serve the drives' bus as an SLCAN adapter on "
             "socket://127.0.0.1:PORT (tcp, the default) or a pty; none keeps it in this process",
    )
    parser.add_argument("--can-port", type=int, default=0, help="SLCAN bridge TCP port (0: any free port)")
    parser.add_argument("--can-channel", default="",
                        help="name of the drives' in-process virtual bus (default: cellcal-sim-<pid>)")
    parser.add_argument(
        "--camera", choices=("eye_in_hand", "eye_to_hand"), default=None,
        help="also serve a rendered camera as a GigE Vision device: on the flange looking at a board in the cell, "
             "or in the cell looking at a board on the flange (the scenario's [camera], else a default one)",
    )
    parser.add_argument("--camera-address", default="127.0.0.1",
                        help="loopback address the camera's GVCP port 3956 listens on (default 127.0.0.1)")
    parser.add_argument("--log-level", default="WARNING", help="stderr log level (default WARNING)")


def run(args: argparse.Namespace) -> int:
    # The CLI is an application edge: configuring logging here is the caller's choice.
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        scenario = load_scenario(args.scenario)
    except (ScenarioError, OSError) as exc:
        print(f"cellcal sim: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with contextlib.ExitStack() as stack:
            world = scenario.make_world()
            urls: dict[str, str | int | None] = {}
            extra: dict[str, int | None] = {}
            for name, starter in DEVICE_STARTERS.items():
                if starter is None:
                    urls[name] = None
                    continue
                device = starter(args, scenario, world)
                if device is None:
                    urls[name] = None
                    continue
                stack.callback(device.close)
                urls[name] = device.url
                if name == "robot":
                    # the UR controller's other interfaces (None for CiA 402 drives)
                    extra["dashboard"] = getattr(device, "dashboard_port", None)
                    extra["primary"] = getattr(device, "primary_port", None)
            urls.update(extra)
            sys.stdout.write(json.dumps(urls) + "\n")
            sys.stdout.flush()
            while not stop.wait(0.5):
                pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
