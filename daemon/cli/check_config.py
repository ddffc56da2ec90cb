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

``--probe`` then opens each device (as the daemon's user, on the daemon's network), reads
its identity and one sample (the robot's state; one tracker measurement of the configured
``[tracker] measure``; with a ``[camera]``, one frame with the configured settings and the
target's corners found in it), closes it and prints one line per device instead of the JSON.
The robot is only read, never moved.

Exit codes: 0 valid (the configuration is printed back in SI units as JSON, with ``gates``:
each acceptance gate of ``[solve]`` in a sentence with its limit in mm and deg, or "off";
with ``--probe``: every device answered), 1 with ``--probe``: a device could not be opened or
read (its line says why), 2 invalid (the message names the file, the dotted key path and
what was expected).
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
from cellcal.drivers import connect_robot, connect_tracker
from cellcal.drivers.camera import connect_camera


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="TOML configuration file")
    p.add_argument("--no-devices", action="store_true",
                   help="do not build the drivers to check URLs and options (checks less than `cellcal run`)")
    p.add_argument("--quiet", action="store_true", help="print nothing when valid")
    p.add_argument("--probe", action="store_true",
                   help="also open each device, read its identity and one sample, and report (never moves the robot)")


def _probe_robot(cfg: Config) -> str:
    robot = connect_robot(cfg.robot.url, **cfg.robot.options)
    try:
        robot.open()
        ident = robot_identity(robot)
        state = robot.read_state(timeout_s=max(cfg.robot.read_timeout_s, 1.0))
    finally:
        robot.close()
    q = ", ".join(f"{math.degrees(float(v)):.2f}" for v in state.q_rad)
    x, y, z = (float(v) * 1e3 for v in state.base_T_flange[:3, 3])
    serial = ident.get("serial") or "not reported"
    return (f"{ident['driver']} model {ident['model']} serial {serial} kinematics {ident['kinematics']}; sample: "
            f"q = [{q}] deg, flange at ({x:.1f}, {y:.1f}, {z:.1f}) mm, mode {state.mode.name}"
            f"{', moving' if state.moving else ''}")


def _probe_tracker(cfg: Config) -> str:
    tracker = connect_tracker(cfg.tracker.url, **cfg.tracker.options)
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
        except Exception as exc:  # noqa: BLE001 - any failure of a device is the probe's finding
            out.append((name, False, f"{url}: {type(exc).__name__}: {exc}"))
    return out


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
    if not args.quiet:
        out: dict[str, object] = {**as_toml_dict(cfg), "sha256": cfg.sha256, "gates": describe_gates(cfg.solve)}
        print(json.dumps(out, indent=2, default=str))
    return 0
