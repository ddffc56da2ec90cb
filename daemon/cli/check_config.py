"""``cellcal check-config FILE``: load a configuration and say what is wrong, or print it.

It makes exactly the checks ``cellcal run`` makes before it starts (one path:
:func:`cellcal.daemon.config.load_config` then :func:`cellcal.daemon.config.preflight`):
every key, type and bound, the ``[zmq]`` security rules, the device URLs and options (the
drivers are built, never opened) and, with CURVE, the server key file. So a file that
passes here is one ``cellcal run`` starts with, and a file ``run`` refuses fails here with
the same message. Unknown URL schemes (``sokket://``) and python-can interfaces
(``interface=sockcan``) are refused here, named by their key. Run it as the daemon's user
(``sudo -u cellcal cellcal check-config ...``) so the key file is read with the daemon's
rights. ``--no-devices`` skips the drivers (then it checks less than ``run`` does, and says so).

Valid, it prints a short summary for people (the devices, the motion, the plan, the solve
and its gates, the interfaces, where the state goes); ``--json`` prints instead the whole
configuration in SI units as JSON, with ``gates``: each acceptance gate of ``[solve]`` in a
sentence with its limit in mm and deg, or "off".

``--probe`` then opens each device (as the daemon's user, on the daemon's network), reads
its identity and one sample (the robot's state; one tracker measurement of the configured
``[tracker] measure``; with a ``[camera]``, one frame with the configured settings and the
target's corners found in it), closes it and prints one line per device instead. The robot is
only read, never moved; in ``command`` motion mode it must also be one the daemon can command,
else its line says FAILED and why: a UR controller whose dashboard server cannot be reached
or says the robot may not move (not in remote control, not RUNNING, a protective stop), a
robot in a stop or fault mode, CiA 402 drives with ``enable=never``.

Exit codes: 0 valid (with ``--probe``: every device answered and the robot can be
commanded), 1 with ``--probe``: a device could not be opened or read, or the robot cannot be
commanded (its line says why), 2 invalid (the message names the file, the dotted key path
and what was expected).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from cellcal.daemon.camera_capture import CameraCapture
from cellcal.daemon.config import Config, ConfigError, as_toml_dict, load_config, preflight
from cellcal.daemon.devices import robot_identity
from cellcal.daemon.gates import describe_gates
from cellcal.drivers import connect_robot
from cellcal.drivers.camera import connect_camera
from cellcal.drivers.errors import DeviceError
from cellcal.drivers.robot import RobotDriver, RobotMode, RobotState
from cellcal.drivers.tracker import connect_configured_tracker
from cellcal.solver.errors import CellcalError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="TOML configuration file")
    p.add_argument("--no-devices", action="store_true",
                   help="do not build the drivers to check URLs and options (checks less than `cellcal run`)")
    p.add_argument("--quiet", action="store_true", help="print nothing when valid")
    p.add_argument("--json", action="store_true",
                   help="print the whole configuration in SI units as JSON (with its gates) instead of the summary")
    p.add_argument("--probe", action="store_true",
                   help="also open each device, read its identity and one sample, and report (never moves the robot)")


#: Robot modes in which no move is possible until someone acts at the robot.
_STOPPED = (RobotMode.PROTECTIVE_STOP, RobotMode.EMERGENCY_STOP, RobotMode.FAULT, RobotMode.POWER_OFF,
            RobotMode.DISCONNECTED, RobotMode.BOOTING)


class NotCommandable(CellcalError):
    """The robot answered but the daemon could not move it (``--probe`` in command mode)."""


def commandable(robot: RobotDriver, state: RobotState) -> str:
    """Why the daemon can command this open robot, in a phrase (asked now, nothing moves).

    Raises
    ------
    NotCommandable
        Saying why not: its mode, a UR dashboard that cannot be reached or refuses motion, CiA
        402 drives that may not be enabled.
    """
    if state.mode in _STOPPED:
        raise NotCommandable(f"mode {state.mode.name}: it cannot move until that is cleared at the robot")
    opts = getattr(robot, "opts", {})
    if opts.get("enable") == "never":
        raise NotCommandable("enable=never: this driver may not enable the drives, so it cannot move the robot")
    dashboard = getattr(robot, "dashboard_status", None)
    if callable(dashboard):
        if opts.get("dashboard_port") == 0:
            return "moves go without the dashboard's remote-control check (dashboard_port=0)"
        try:
            status = dashboard()
        except DeviceError as exc:
            raise NotCommandable(f"moves are refused: {exc}") from None
        if not status.motion_allowed:
            raise NotCommandable(f"moves are refused: the dashboard says {status.describe()} (it must be RUNNING, "
                                 "safety NORMAL or REDUCED, in remote control)")
        return f"can be commanded (dashboard: {status.describe()})"
    if state.mode is RobotMode.RUNNING:
        return "can be commanded (enabled for motion)"
    return f"mode {state.mode.name}: the drives are enabled at the first move"


def _probe_robot(cfg: Config) -> str:
    robot = connect_robot(cfg.robot.url, **cfg.robot.options)
    try:
        robot.open()
        ident = robot_identity(robot)
        state = robot.read_state(timeout_s=max(cfg.robot.read_timeout_s, 1.0))
        q = ", ".join(f"{math.degrees(float(v)):.2f}" for v in state.q_rad)
        x, y, z = (float(v) * 1e3 for v in state.base_T_flange[:3, 3])
        serial = ident.get("serial") or "not reported"
        text = (f"{ident['driver']} model {ident['model']} serial {serial} kinematics {ident['kinematics']}; sample: "
                f"q = [{q}] deg, flange at ({x:.1f}, {y:.1f}, {z:.1f}) mm, mode {state.mode.name}"
                f"{', moving' if state.moving else ''}")
        if cfg.capture.motion_mode != "command":
            return f"{text}; {cfg.capture.motion_mode} mode: the daemon does not move it"
        try:
            return f"{text}; {commandable(robot, state)}"
        except NotCommandable as exc:
            raise NotCommandable(f"{text}; CANNOT BE COMMANDED: {exc}") from None
    finally:
        robot.close()


def _probe_tracker(cfg: Config) -> str:
    tracker = connect_configured_tracker(cfg.tracker.url, cfg.tracker.options)
    try:
        tracker.open()
        info = tracker.identify()
        m = tracker.measure(cfg.tracker.measure, 0.0)
    finally:
        tracker.close()
    x, y, z = (float(v) * 1e3 for v in m.cell_p_target)
    return (f"{info.model} serial {info.serial} firmware {info.firmware} protocol {info.protocol_version}; sample: "
            f"{cfg.tracker.measure} at ({x:.3f}, {y:.3f}, {z:.3f}) mm")


def _probe_camera(cfg: Config) -> str:
    cc = cfg.camera
    assert cc is not None
    camera = connect_camera(cc.url, **cc.options)
    try:
        camera.open()
        capture = CameraCapture(camera, cfg)  # the configured settings applied, as the daemon does
        frame, _n = capture.settled_frame()
        det = capture.detect(frame)
    finally:
        camera.close()
    i = capture.info
    exposure = f"{frame.exposure_s * 1e3:.3f} ms" if frame.exposure_s is not None else "exposure not reported"
    return (f"{i.vendor} {i.model} serial {i.serial} firmware {i.firmware} at {i.address}; frame {frame.width} x "
            f"{frame.height} {frame.pixel_format}, {exposure}; target ({capture.target.describe()}): "
            f"{det.n_corners} of {capture.target.n_corners} corners found")


def probe(cfg: Config) -> list[tuple[str, bool, str]]:
    """Open each configured device, read its identity and one sample, close it.

    Returns
    -------
    list of (device, ok, text)
        One per device, ``text`` the identity and sample, or why it failed.
    """
    out = []
    devices = [("robot", _probe_robot, cfg.robot.url), ("tracker", _probe_tracker, cfg.tracker.url)]
    if cfg.camera is not None:
        devices.append(("camera", _probe_camera, cfg.camera.url))
    for name, fn, url in devices:
        try:
            out.append((name, True, fn(cfg)))
        except NotCommandable as exc:
            out.append((name, False, f"{url}: {exc}"))
        except Exception as exc:  # noqa: BLE001 - any failure of a device is the probe's finding
            out.append((name, False, f"{url}: {type(exc).__name__}: {exc}"))
    return out


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def summary(cfg: Config, path: str) -> list[str]:
    """What ``cellcal check-config FILE`` prints for a valid file: a few lines for people, in mm,
    deg and s (``--json`` has everything)."""
    r, t, c, p, s, z, d = cfg.robot, cfg.tracker, cfg.capture, cfg.plan, cfg.solve, cfg.zmq, cfg.drift
    plan = (f"{p.n_stations} generated stations" + (f" (up to {p.max_stations} for a {p.target_sigma_m * 1e3:g} mm "
                                                     "target sigma)" if p.target_sigma_m > 0 else "")
            if p.kind == "generated" else f"{len(p.stations)} explicit stations")
    moves = ("the daemon moves the robot" if c.motion_mode == "command"
             else "the cell's program moves the robot; the daemon captures when both rest")
    security = (f"CURVE with {len(z.clients)} client key(s)" if z.curve
                else f"no CURVE: clients get role {z.null_role}")
    plant = ", ".join(f"{name} {_on(sec.enabled)}" for name, sec in (("opcua", cfg.opcua), ("mqtt", cfg.mqtt),
                                                                     ("metrics", cfg.metrics)))
    drift = (f"every {d.interval_s:g} s at {d.check_stations} stations, warn {d.warn_translation_m * 1e3:g} mm / "
             f"fail {d.fail_translation_m * 1e3:g} mm, on drift: {d.on_drift}" if d.enabled else "off")
    lines = [
        f"{path}: valid (cell {cfg.service.name!r}, sha256 {cfg.sha256[:12]}...; --json prints every key in SI units)",
        f"  robot     {r.url}",
        f"  tracker   {t.url}, measures {t.measure}, averaging {t.average_s:g} s",
        f"  motion    {c.motion_mode}: {moves}; plan: {plan}",
        f"  solve     {s.kind}; gates:",
        *(f"              {g}" for g in describe_gates(s)),
        f"  drift     {drift}",
        f"  zmq       PUB {z.pub_endpoint}, commands {z.cmd_endpoint}; {security}",
        f"  plant     {plant}",
        f"  state     {cfg.service.state_dir}",
    ]
    return lines


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.file)
        preflight(cfg, devices=not args.no_devices)
    except ConfigError as exc:
        print(f"cellcal check-config: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "probe", False):
        if args.no_devices:
            print("cellcal check-config: --probe and --no-devices contradict each other", file=sys.stderr)
            return 2
        found = probe(cfg)
        for name, ok, text in found:
            print(f"{name}: {'ok' if ok else 'FAILED'}: {text}", flush=True)
        return 0 if all(ok for _n, ok, _t in found) else 1
    if args.no_devices:
        print("cellcal check-config: device URLs and options not checked (--no-devices)", file=sys.stderr)
    if args.quiet:
        return 0
    if getattr(args, "json", False):
        out: dict[str, object] = {**as_toml_dict(cfg), "sha256": cfg.sha256, "gates": describe_gates(cfg.solve)}
        print(json.dumps(out, indent=2, default=str))
    else:
        print("\n".join(summary(cfg, args.file)))
    return 0
