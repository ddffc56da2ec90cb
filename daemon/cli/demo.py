"""``cellcal demo``: the simulated cell calibrated end to end (what ``make demo`` runs).

Starts the simulated cell of ``config/demo-scenario.toml`` (a UR5e-like robot served over
RTDE on loopback with its URScript port, and a laser tracker on loopback TCP, both moving
in one shared world), starts the daemon on ``config/demo.toml`` pointed at them, runs a
base-frame calibration in command mode with one progress line per station on stderr,
prints the report (``cell_T_base`` in mm and deg, residuals, axis_spread and the error
against the scenario's hidden truth), runs one drift check, writes the HTML report
(``cellcal.daemon.report.html``) beside the exports and prints its path, and shuts everything
down. The state directory (a new ``cellcal-demo-*`` directory in the system's temporary
directory unless ``--state-dir`` names one) is kept: the report, the exports and the store
stay there for ``cellcal show`` and ``cellcal report`` (its path is printed last).

Honesty (``cellcal.sim.truth``): the report says whether the error against the truth
lies inside the result's own reported uncertainty (the NEES of ``cell_T_base`` against the
3-sigma bound of a chi-square with 6 degrees of freedom), how the residual RMS compares
with the tracker's noise floor, and the result's warnings (``result["warnings"]``) in words.

Exit status: 0 when the calibration ran and its error against the truth lies inside its
own reported uncertainty (3 sigma), 4 when it lies outside (a confident wrong answer), 1
when the run failed, 2 for a usage error: a bad scenario or configuration, ``--time-scale``
outside (0, 50], ``--timeout-s`` not a positive number, ``--stations`` outside what the run
kind accepts, ``--stations`` without ``--camera`` and with an explicit ``[plan]`` (option
values are refused before any simulator starts and before the state directory is made; the
message names the option).

With ``--json`` stdout carries exactly one JSON object at the end: the result as the
daemon publishes it on ``cellcal/v1/result``, plus ``truth_error`` (with ``nees``,
``within_3_sigma``), ``residual_vs_noise`` and ``drift_check``.

``--instrument emscon|geocom`` puts a Leica instrument in the cell instead of the cellcal
tracker (``cellcal.daemon.cli.instruments``: an emScon laser tracker over TPI on loopback TCP, a
GeoCOM total station on a pty with checksums on) and runs the point-based (3-DoF)
calibration: ``cell_T_base`` and the reflector's ``flange_p_target``, each checked against
the hidden truth and against its own reported covariance (``truth_error``).

``--camera eye_in_hand|eye_to_hand`` also puts the rendered camera in the cell, as a GigE
Vision device on a loopback address of its own, and calibrates it instead of the base frame
(``cellcal.daemon.cli.demo_camera``): run kind ``hand_eye`` or ``eye_to_hand`` (after a
base-frame calibration, which the camera result's tracker check needs), the intrinsics
estimated with the hand-eye unless the state directory holds an intrinsics result. It prints
both transforms, the reprojection RMS, the held-out closure, OpenCV's cross-check, the
tracker check and its gate, the gates and each transform's error against the simulator's
truth with its NEES; ``--json`` carries ``truth_error`` by transform name. A camera result has
no drift check (its stations have no tracker pose): the demo says so and makes none. The exit
status is as above, 4 when a transform lies outside 3 sigma. ``--stations`` sets the camera
views (and, eye-to-hand, the base frame's stations): at least ``MIN_STATIONS`` (6, the
held-out closure's floor). ``--camera ... --instrument emscon|geocom`` makes the
base frame a point calibration and the tracker check one on that instrument's points (the
reflector on the board, or eye-in-hand the one on the flange, ``flange_p_target``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.app import App
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.cli import demo_camera as dc
from cellcal.daemon.cli.examples import example_path
from cellcal.daemon.cli.instruments import config_overrides, start_simulated
from cellcal.daemon.config import _BOUNDS, Config, ConfigError, load_config
from cellcal.daemon.config.security import BindError
from cellcal.daemon.report import human
from cellcal.daemon.report.html import export_report
from cellcal.daemon.report.reading import as_list, as_map, to_float, to_int
from cellcal.daemon.runs.hand_eye_camera import MIN_STATIONS as MIN_CAMERA_VIEWS
from cellcal.daemon.runs.intrinsics import stored_intrinsics
from cellcal.daemon.service import Service, ServiceError
from cellcal.daemon.store import DB_FILENAME, RunRecord, RunStatus, Store
from cellcal.daemon.wire.endpoints import free_port
from cellcal.solver.diagnostics import NEES_BOUND_3SIGMA
from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import se3_inverse, so3_log

if TYPE_CHECKING:  # the simulator itself is loaded in run() only
    from cellcal.sim.scenario import Scenario
    from cellcal.sim.world import World

ROOT = Path(__file__).resolve().parents[1]


def _default(name: str) -> str:
    # The example files are package data (cellcal.examples, mapped from config/): the same
    # files from a checkout, an editable install or a wheel, whatever the working directory.
    try:
        return str(example_path(name))
    except (OSError, ValueError):
        return str(Path("config") / name)  # a broken install: run() names the missing file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default=_default("demo-scenario.toml"), help="simulated cell (TOML)")
    p.add_argument("--config", default=_default("demo.toml"), help="daemon configuration (TOML)")
    p.add_argument("--state-dir", default=None,
                   help="keep the store, exports and report here (default: a new cellcal-demo-* directory in the "
                        "system's temporary directory, kept and printed at the end)")
    p.add_argument("--stations", type=int, default=None, help="override plan.n_stations")
    p.add_argument("--timeout-s", type=float, default=300.0, help="give up after this long (wall clock)")
    p.add_argument("--time-scale", type=float, default=None, metavar="X",
                   help="simulated seconds per wall second (default: the scenario's [time] scale); the "
                        "settle dwell keeps its simulated length (at least 50 ms)")
    p.add_argument("--json", action="store_true", help="print the published result as one JSON object")
    p.add_argument("--no-drift-check", action="store_true", help="skip the drift check after the calibration")
    p.add_argument("--instrument", choices=("cellcal", "emscon", "geocom"), default="cellcal",
                   help="the simulated tracker's protocol: cellcal tracker protocol (6-DoF, default), Leica emScon "
                        "TPI or Leica GeoCOM (both 3-DoF points)")
    p.add_argument("--camera", choices=dc.CAMERA_SETUPS, default=None,
                   help="also put the rendered camera in the cell (GigE Vision on loopback) and calibrate it, mounted "
                        "on the flange (eye_in_hand: run kind hand_eye) or fixed in the cell (eye_to_hand), after a "
                        "base-frame calibration for its tracker check; --stations sets the camera views")
    p.epilog = ("exit status: 0 the result lies within its own reported uncertainty of the simulator's truth; "
                "4 it lies outside (3 sigma); 1 the run failed; 2 a usage error (a bad scenario, configuration "
                "or option value, such as --stations below what the run kind needs), refused before any "
                "simulator starts")


#: Where the demo serves each instrument: loopback TCP, GeoCOM on a pty (its serial line).
_DEMO_TRANSPORT = {"cellcal": "tcp", "emscon": "tcp", "geocom": "pty"}


class _EstimateTruth(TypedDict, total=False):
    """One estimate of a point result against the truth (``--json``: ``truth_error.<name>``)."""

    error_m: float
    error_rad: float  # cell_T_base only
    nees: float | None
    dof: int
    within_uncertainty: bool


def _wire(result: Mapping[str, object], group: str, name: str) -> Mapping[str, object]:
    """``result[group][name]``: a transform's or a point's wire form."""
    return as_map(as_map(result[group], group)[name], f"{group}.{name}")


def _point_truth(result: Mapping[str, object], world: World) -> dict[str, _EstimateTruth]:
    """Errors of a point result against the scenario's truth, and whether each lies inside
    its own reported covariance (NEES below the 3-sigma chi-square quantile)."""
    cov = as_map(as_map(result["uncertainty"], "uncertainty")["covariance"], "uncertainty.covariance")

    def matrix(name: str) -> npt.NDArray[np.float64]:
        c = as_map(cov[name], name)
        shape = tuple(to_int(n) for n in as_list(c["shape"], "shape"))
        return np.array([np.nan if v is None else v for v in as_list(c["values"], "values")], dtype=float).reshape(shape)

    def nees(err: npt.NDArray[np.float64], C: npt.NDArray[np.float64]) -> float | None:
        try:
            v = float(err @ np.linalg.solve(C, err))
        except np.linalg.LinAlgError:
            return None
        return v if math.isfinite(v) else None

    X = transform_from_wire(dict(_wire(result, "transforms", "cell_T_base")))  # a plain dict, as it takes
    D = se3_inverse(world.cell_T_base()) @ X
    xi = np.concatenate([D[:3, 3], so3_log(D[:3, :3])])  # right perturbation: truth exp(xi) = X
    y = np.asarray(_wire(result, "points", "flange_p_target")["position_m"], dtype=float)
    ey = y - world.flange_T_target()[:3, 3]
    out: dict[str, _EstimateTruth] = {}
    for name, err, dof in (("cell_T_base", xi, 6), ("flange_p_target", ey, 3)):
        v = nees(err, matrix(name))
        out[name] = {"error_m": float(np.linalg.norm(err[:3])), "nees": v, "dof": dof,
                     "within_uncertainty": v is not None and v <= NEES_BOUND_3SIGMA[dof]}
    out["cell_T_base"]["error_rad"] = float(np.linalg.norm(xi[3:]))
    return out


def _free_if_taken(endpoint: str, *, taken: bool = False) -> str:
    """``endpoint`` if its loopback TCP port can be bound now (and is not known ``taken``),
    else the same host on a free port."""
    m = re.fullmatch(r"tcp://(127\.0\.0\.1|localhost):(\d+)", endpoint)
    if not m:
        return endpoint
    if taken:
        return f"tcp://127.0.0.1:{free_port()}"
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", int(m.group(2))))
            return endpoint
        except OSError:
            return f"tcp://127.0.0.1:{free_port()}"


#: Tries of the daemon's ZeroMQ endpoints before the demo gives up (:func:`_open_app`).
_BIND_ATTEMPTS = 3


def _open_app(cfg: Config, on_event: Callable[[str, Mapping[str, object]], None]) -> tuple[App, Config]:
    """The demo's daemon, opened, and the configuration it runs on. A loopback port found
    free (``_free_if_taken``) can be taken before the daemon binds it, by another demo
    starting at the same moment (two test workers): then free ones again, a few times."""
    for attempt in range(_BIND_ATTEMPTS):
        try:
            return App(cfg, listeners=[on_event], supervise=True).open(), cfg
        except BindError:
            if attempt == _BIND_ATTEMPTS - 1:
                raise
            cfg = dataclasses.replace(cfg, zmq=dataclasses.replace(
                cfg.zmq, pub_endpoint=_free_if_taken(cfg.zmq.pub_endpoint, taken=True),
                cmd_endpoint=_free_if_taken(cfg.zmq.cmd_endpoint, taken=True)))
    raise AssertionError("unreachable")  # the last attempt returned or raised


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def honesty_lines(honest: Mapping[str, object], versus_noise: Mapping[str, object], warnings: object) -> list[str]:
    """The truth-and-honesty part of the text report, one line each."""
    out = []
    if honest.get("nees") is None:
        out.append("within the reported uncertainty: unknown (the result has no usable covariance)")
    else:
        st, sr = honest.get("sigma_translation_m"), honest.get("sigma_rotation_rad")
        sig = (f"reported 1-sigma along the error {to_float(st) * 1e3:.4f} mm, {math.degrees(to_float(sr)):.5f} deg; "
               if st is not None and sr is not None else "")
        out.append(f"within 3 sigma: {'yes' if honest['within_3_sigma'] else 'NO'} ({sig}NEES {honest['nees']:.2f}, "
                   f"3-sigma bound {honest['nees_3sigma_bound']:.2f} for 6 dof)")
    ratio = versus_noise.get("ratio")
    if ratio is not None:
        rms_m, noise_m = to_float(versus_noise["rms_translation_m"]), to_float(versus_noise["tracker_noise_m"])
        out.append(f"residual vs tracker noise: RMS {rms_m * 1e3:.4f} mm is "
                   f"{ratio:.1f}x the tracker's noise floor {noise_m * 1e3:.4f} mm"
                   + (" (structured: the robot's kinematics, not the tracker)" if to_float(ratio) > 3 else ""))
    for w in warnings if isinstance(warnings, list) else []:
        if isinstance(w, dict):
            out.append(f"warning {w.get('code')}: {w.get('message')}")
    return out


def _write_report(svc: Service, result: Mapping[str, object], cfg: Config) -> Path | None:
    """The result's HTML report again, now with the demo's drift check in it, beside the
    exports (where the daemon wrote it when it stored the result)."""
    return export_report(svc.store, to_int(result["result_id"]), Path(cfg.service.state_dir) / "exports",
                         cell=cfg.service.name)


def _say_kept(report: Path | None, state_dir: str, say: Callable[[str], None]) -> None:
    if report is not None:
        say(f"  report: {report}")
    say(f"  kept: {Path(state_dir).parent} (store and exports in {state_dir}; "
        f"cellcal show --state-dir {state_dir})")


def _wait_run(svc: Service, run_id: int, deadline: float, done: threading.Event) -> RunRecord:
    """The run once it closed and the worker is idle, or as it stands at ``deadline``.

    ``done`` is set by the run's result: the store is then read at the pace of the worker
    winding down, never in a spin (a set event returns at once, and a loop paced by it
    alone reads the store as fast as it can, starving the devices' threads of the GIL)."""
    while True:
        run = svc.store.get_run(run_id)
        if (not run.is_open and svc.wait_idle(0.0)) or time.monotonic() >= deadline:
            return run
        if done.wait(0.1):
            time.sleep(0.02)


def _camera_config(args: argparse.Namespace, scenario: Scenario, url: str, state_dir: Path) -> Config:
    """The demo's configuration with the ``[camera]`` of the simulated camera at ``url``
    (``demo_camera.camera_overrides``): the intrinsics estimated with the hand-eye, unless
    the state directory's store holds an intrinsics result that passed its gates (a demo run
    again with ``--state-dir`` after an intrinsics run there: ``cellcal ctl start_run kind=intrinsics``)."""
    n_views = dc.DEFAULT_VIEWS if args.stations is None else args.stations
    base = config_overrides(args.instrument)

    def with_camera(use: str) -> Config:
        section = dc.camera_overrides(url, args.camera, scenario, state_dir, n_views=n_views, use_intrinsics=use)
        return load_config(args.config, overrides={**base, "camera": section})

    cfg = with_camera("latest")
    store_dir = state_dir / "state"
    if cfg.camera is not None and (store_dir / DB_FILENAME).exists():
        with Store(store_dir, read_only=True) as store:
            if stored_intrinsics(store, cfg.camera) is not None:
                return cfg
    return with_camera("estimate")


def _camera_report(args: argparse.Namespace, svc: Service, result: Mapping[str, object], scenario: Scenario,
                   cfg: Config, elapsed_s: float) -> int:
    """Print a camera result against the simulator's truth (text or ``--json``); the exit
    status (4: a transform outside 3 sigma of its own covariance)."""
    truth = dc.camera_truth(scenario, str(args.camera))
    honest = dc.camera_truth_error(result, truth)
    # A drift check re-measures a base frame's stations with the tracker; a camera result's
    # stations are views of its board, whose tracker points serve its tracker check only.
    no_drift = (f"drift check: not made (not defined for {result.get('kind')} results: a drift check re-measures a "
                "base frame's stations with the tracker)")
    report = _write_report(svc, result, cfg)
    if args.json:
        out: dict[str, object] = dict(result)
        out["report_path"] = None if report is None else str(report)
        out["truth_error"] = honest
        out["drift_check"] = None
        out["drift_check_note"] = no_drift
        print(json.dumps(out))
    else:
        for line in dc.camera_lines(result, honest, elapsed_s):
            print(line)
        print("  " + no_drift)
    _say_kept(report, cfg.service.state_dir, print if not args.json else _say)
    if honest["within_3_sigma"] is False:
        _say("cellcal demo: the error against the truth lies OUTSIDE the result's reported uncertainty (3 sigma): exit 4")
        return 4
    return 0


#: Faster than this, the simulated arm moves farther between two RTDE samples (125 Hz wall
#: time) than a settle window can follow.
_MAX_TIME_SCALE = 50.0
#: The daemon's floor of ``[robot.settle] dwell_s``.
_MIN_DWELL_S = 0.05


def _rescaled(scenario: Scenario, cfg: Config, time_scale: float) -> tuple[Scenario, Config]:
    """The scenario at ``time_scale`` and the configuration whose settle dwell keeps its
    length in simulated time (a dwell is about the arm's ringing, which is simulated)."""
    settle = cfg.robot.settle
    dwell_s = max(settle.dwell_s * scenario.time_scale / time_scale, _MIN_DWELL_S)
    cfg = dataclasses.replace(cfg, robot=dataclasses.replace(cfg.robot, settle=dataclasses.replace(settle, dwell_s=dwell_s)))
    return dataclasses.replace(scenario, time_scale=time_scale), cfg


def _camera_views_range(camera: str) -> tuple[int, int]:
    """``(smallest, largest)`` ``--stations`` a camera demo takes: the camera hand-eye kinds'
    ``MIN_STATIONS`` views (their held-out closure; the kind itself refuses fewer only after
    the simulators started, as a failed run) up to the configuration's bound of
    ``camera.plan.n_views``."""
    lo, hi = _BOUNDS["camera.plan.n_views"][:2]
    return max(MIN_CAMERA_VIEWS, int(lo)), int(hi)


def usage_refusal(args: argparse.Namespace, cfg: Config) -> str | None:
    """Why these arguments cannot run (the demo exits 2 with it, before any simulator
    starts), or None. ``cfg``: the demo's configuration with the instrument's keys.

    ``--stations`` for a camera is checked here against the camera kinds' floor; for the
    base-frame run before a camera kind, or the demo's own run, by the configuration's
    checks of ``plan.n_stations`` (:func:`_stations_refusal`)."""
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0.0):
        return f"--timeout-s must be a positive number of seconds, got {args.timeout_s:g}"
    if args.stations is None:
        return None
    if args.camera is not None:
        lo, hi = _camera_views_range(args.camera)
        if not lo <= args.stations <= hi:
            return (f"--stations {args.stations} cannot set the views of --camera {args.camera} (run kind "
                    f"{dc.SETUP_KINDS[args.camera]}): it needs at least {lo} camera views, at most {hi}")
        if args.camera == "eye_in_hand":
            return None  # no base-frame run: the plan's stations are not measured
    elif cfg.plan.kind != "generated":
        # --stations sets a generated plan's n_stations; an explicit plan would ignore it (with
        # an eye-to-hand camera it still sets the views).
        return (f"--stations sets the number of a generated plan's stations; the base-frame run's [plan] in "
                f"{args.config} is {cfg.plan.kind} ({len(cfg.plan.stations)} stations listed): leave out --stations")
    return _stations_refusal(args, cfg)


def _stations_refusal(args: argparse.Namespace, cfg: Config) -> str | None:
    """``--stations`` as the configuration's ``plan.n_stations`` checks it (its bounds, a
    point tracker's floor for a base frame), in words naming the option and the run."""
    if cfg.plan.kind != "generated":
        return None
    overrides = config_overrides(args.instrument)
    overrides["plan"] = {"n_stations": args.stations}
    try:
        load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        if exc.path != "plan.n_stations":
            raise
        before = f" before --camera {args.camera}" if args.camera is not None else ""
        return f"--stations {args.stations} cannot plan the {cfg.solve.kind} run{before}: {exc.message}"
    return None


def run(args: argparse.Namespace) -> int:
    # The simulator, loaded here only: the daemon's other commands never load it.
    from cellcal.sim.robot_sim import start_sim_robot  # lazy: the simulated robot
    from cellcal.sim.scenario import load_scenario  # lazy: the simulated cell
    from cellcal.sim.truth import residual_vs_noise, truth_error  # lazy: the simulator's hidden truth

    try:
        scenario = load_scenario(args.scenario)
        # The instrument's [tracker] keys (measure = "point" ...), checked as if the file said them.
        cfg = load_config(args.config, overrides=config_overrides(args.instrument))
    except (ConfigError, CellcalError, ValueError) as exc:
        print(f"cellcal demo: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the scenario file (load_config reports its own file as a ConfigError)
        print(f"cellcal demo: --scenario {args.scenario}: cannot read: {exc.strerror or exc} "
              f"(without --scenario the demo uses its own, {_default('demo-scenario.toml')})", file=sys.stderr)
        return 2
    if args.time_scale is not None:
        if not (math.isfinite(args.time_scale) and 0.0 < args.time_scale <= _MAX_TIME_SCALE):
            print(f"cellcal demo: --time-scale must be in (0, {_MAX_TIME_SCALE:g}], got {args.time_scale:g}",
                  file=sys.stderr)
            return 2
        scenario, cfg = _rescaled(scenario, cfg, args.time_scale)
    try:
        refused = usage_refusal(args, cfg)
    except ConfigError as exc:  # the configuration again, with --stations in it
        refused = str(exc)
    if refused is not None:
        print(f"cellcal demo: {refused}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    state_dir = args.state_dir
    if state_dir is None:
        # Kept after the demo (not a TemporaryDirectory): the report, the exports and the store
        # are what a person opens next (`cellcal show --state-dir DIR/state`).
        state_dir = tempfile.mkdtemp(prefix="cellcal-demo-")
    world = scenario.make_world()
    robot_sim = start_sim_robot(world, scenario.robot, transport="rtde")
    tracker_sim = start_simulated(args.instrument, world, scenario.tracker, seed=scenario.seed,
                                  transport=_DEMO_TRANSPORT[args.instrument])
    camera_sim = None
    app = None
    try:
        if args.camera is not None:
            from cellcal.sim.camera_cell import start_camera  # lazy: the simulated camera

            camera_sim = start_camera(world, scenario, args.camera)
            try:
                cfg = _camera_config(args, scenario, camera_sim.url, Path(state_dir))
            except (ConfigError, CellcalError, ValueError) as exc:
                print(f"cellcal demo: {exc}", file=sys.stderr)
                return 2
        plan = cfg.plan if args.stations is None else dataclasses.replace(cfg.plan, n_stations=args.stations)
        # The demo's loopback ports may be taken (another demo, another program): use free
        # ones then, and say which, so `cellcal watch` can still follow it.
        zcfg = dataclasses.replace(cfg.zmq, pub_endpoint=_free_if_taken(cfg.zmq.pub_endpoint),
                                   cmd_endpoint=_free_if_taken(cfg.zmq.cmd_endpoint))
        cfg = dataclasses.replace(
            cfg,
            robot=dataclasses.replace(cfg.robot, url=robot_sim.url),
            tracker=dataclasses.replace(cfg.tracker, url=tracker_sim.url),
            service=dataclasses.replace(cfg.service, state_dir=str(Path(state_dir) / "state"),
                                        runtime_dir=str(Path(state_dir) / "run")),
            plan=plan,
            zmq=zcfg,
        )
        _say(f"cellcal demo: simulated robot {robot_sim.url}, {args.instrument} instrument {tracker_sim.url} "
             f"({cfg.tracker.measure} stations), time x{scenario.time_scale:g}")
        if camera_sim is not None and cfg.camera is not None:
            took = "estimated with the hand-eye" if cfg.camera.use_intrinsics == "estimate" else "a stored result's"
            _say(f"cellcal demo: simulated camera {camera_sim.url} ({args.camera}), {cfg.camera.plan.n_views} views, "
                 f"intrinsics {took}")
        done = threading.Event()
        outcome: dict[str, Mapping[str, object]] = {}

        def on_event(topic: str, body: Mapping[str, object]) -> None:
            el = time.monotonic() - t0
            if topic == P.TOPIC_STATION:
                if "frame" in body:  # a camera station: what the frame showed, in words
                    _say(f"[{el:6.1f} s] {human.station_line(body)}")
                elif body.get("accepted"):
                    s = as_map(body.get("settle", {}), "settle")
                    _say(f"[{el:6.1f} s] station {to_int(body['index']) + 1:2d}/{body['planned']}: accepted "
                         f"(tracker std {1e3 * to_float(s.get('tracker_std_translation_m') or 0):.4f} mm, "
                         f"robot at rest {s.get('robot_rest_s', 0):.2f} s)")
                else:
                    _say(f"[{el:6.1f} s] station {to_int(body['index']) + 1:2d}/{body['planned']}: "
                         f"{human.outcome_words(body)}, {body['reason']}")
            elif topic == P.TOPIC_RESULT:
                outcome["result"] = body
                done.set()
            elif topic == P.TOPIC_DRIFT:
                outcome["drift"] = body
                done.set()
            elif topic == P.TOPIC_FAULT:
                _say(f"[{el:6.1f} s] fault: {body.get('message')}")
                if str(body.get("message", "")).startswith("drift check") and "result" in outcome:
                    outcome["drift_fault"] = body  # the check ended without a verdict
                    done.set()
            elif topic == P.TOPIC_STATE and body.get("state") in (P.STATE_SOLVING, P.STATE_CHECKING):
                _say(f"[{el:6.1f} s] {str(body['state']).lower()} {body.get('detail', '')}")

        try:
            app, cfg = _open_app(cfg, on_event)
        except BindError as exc:
            _say(f"cellcal demo: the daemon could not start: {exc}")
            return 1
        _say(f"cellcal demo: ZeroMQ PUB {cfg.zmq.pub_endpoint}, commands {cfg.zmq.cmd_endpoint}")
        svc = app.service
        deadline = t0 + args.timeout_s
        # None: the kind the demo's configuration names (base_frame). A camera's tracker check
        # needs the robot base in the cell (eye-in-hand: and the flange target): that first.
        kinds: list[str | None] = [None]
        if args.camera is not None:
            kinds = [None, dc.SETUP_KINDS[args.camera]]
        for kind in kinds:
            outcome.pop("result", None)
            done.clear()  # the last run's result set it
            try:
                run_id = svc.start_run(kind, reason="demo")
            except ServiceError as exc:  # refused at start (a camera kind says why)
                _say(f"cellcal demo: a {kind or cfg.solve.kind} run was refused: {exc}")
                _say_kept(None, cfg.service.state_dir, _say)
                return 1
            run = _wait_run(svc, run_id, deadline, done)
            if run.status != RunStatus.DONE or "result" not in outcome:
                _say(f"cellcal demo: run {run_id} ended {run.status.value}: "
                     f"{run.status_reason or 'no result before the timeout'}")
                _say_kept(None, cfg.service.state_dir, _say)
                return 1
            if kind is None and args.camera is not None:
                _say(f"[{time.monotonic() - t0:6.1f} s] base-frame result {outcome['result']['result_id']}: the robot "
                     "base in the cell, for the camera's tracker check")
        if args.camera is not None:
            return _camera_report(args, svc, outcome["result"], scenario, cfg, time.monotonic() - t0)
        result = outcome["result"]
        truth = world.cell_T_base()
        X = transform_from_wire(dict(_wire(result, "transforms", "cell_T_base")))
        honest = truth_error(result, X, truth)
        err_t, err_r = honest["translation_m"], honest["rotation_rad"]
        versus_noise = residual_vs_noise(result, [st.tracker_std_translation_m for st in svc.store.stations(run_id)])
        points = as_map(result.get("points", {}), "points")
        point_truth = _point_truth(result, world) if "flange_p_target" in points else None
        if not args.no_drift_check and svc.store.active_result() is not None:
            done.clear()
            svc.request_drift_check("demo")
            while "drift" not in outcome and "drift_fault" not in outcome and time.monotonic() < deadline:
                done.wait(0.1)
        el = time.monotonic() - t0
        report = _write_report(svc, result, cfg)
        if args.json:
            out: dict[str, object] = dict(result)
            out["report_path"] = None if report is None else str(report)
            out["truth_error"] = honest
            out["residual_vs_noise"] = versus_noise
            if point_truth is not None:
                honest.update(point_truth)  # out["truth_error"]
            out["drift_check"] = outcome.get("drift")
            if "drift_fault" in outcome:
                out["drift_check_fault"] = as_map(outcome["drift_fault"], "fault").get("message")
            print(json.dumps(out))
        else:
            t = X[:3, 3] * 1e3
            rv = np.degrees(so3_log(X[:3, :3]))
            q = as_map(_wire(result, "transforms", "cell_T_base")["quaternion"], "quaternion")
            print(f"cellcal demo: base-frame calibration of the simulated cell ({result['n_stations']} stations, {el:.1f} s)")
            print(f"  cell_T_base translation_mm [{t[0]:10.3f} {t[1]:10.3f} {t[2]:10.3f}]")
            print(f"  cell_T_base rotvec_deg     [{rv[0]:10.4f} {rv[1]:10.4f} {rv[2]:10.4f}]  "
                  f"quat_wxyz [{q['w']:.6f} {q['x']:.6f} {q['y']:.6f} {q['z']:.6f}]")
            print(f"  residual translation: RMS {to_float(result['rms_translation_m']) * 1e3:.4f} mm, "
                  f"worst {to_float(result['max_translation_m']) * 1e3:.4f} mm")
            if point_truth is None:
                print(f"  residual rotation:    RMS {math.degrees(to_float(result['rms_rotation_rad'])):.5f} deg, "
                      f"worst {math.degrees(to_float(result['max_rotation_rad'])):.5f} deg")
            else:
                print("  residual rotation:    none (point stations measure no orientation)")
            gates = as_map(result.get("gates", {}), "gates")
            failed = as_list(gates.get("failed", []), "gates.failed")
            verdict = "passed" if gates.get("passed") else "FAILED: " + "; ".join(str(f) for f in failed)
            print(f"  axis_spread {result['axis_spread']:.4f}; gates {verdict}")
            prov = as_map(result.get("provenance", {}), "provenance")
            if prov.get("robot_serial") or prov.get("kinematics_digest"):
                robot = as_map(as_map(prov.get("devices", {}), "devices").get("robot"), "devices.robot")
                print(f"  robot serial {prov.get('robot_serial') or 'unknown'}; kinematics "
                      f"{robot.get('kinematics', '?')} "
                      f"{prov.get('kinematics_digest') or ''}")
            print(f"  error against the scenario's truth: {err_t * 1e3:.4f} mm, {math.degrees(err_r):.5f} deg")
            if point_truth is not None:
                yp = np.asarray(_wire(result, "points", "flange_p_target")["position_m"]) * 1e3
                print(f"  flange_p_target_mm         [{yp[0]:10.3f} {yp[1]:10.3f} {yp[2]:10.3f}]  (the reflector)")
                for name, e in point_truth.items():
                    nees = "not computed" if e["nees"] is None else f"NEES {e['nees']:.2f} (dof {e['dof']})"
                    print(f"  {name} against the truth: {e['error_m'] * 1e3:.4f} mm, {nees}: "
                          f"{'within' if e['within_uncertainty'] else 'OUTSIDE'} its reported uncertainty (3 sigma)")
            for line in honesty_lines(honest, versus_noise, result.get("warnings")):
                print("  " + line)
            d = outcome.get("drift")
            if "drift_fault" in outcome:
                print(f"  drift check: not made ({as_map(outcome['drift_fault'], 'fault').get('message')})")
            if d:
                r = d["deviation_rotation_rad"]
                rot = "no rotation (points)" if r is None else f"{math.degrees(to_float(r)):.5f} deg"
                print(f"  drift check: {d['status']} ({to_float(d['deviation_translation_m']) * 1e3:.4f} mm, "
                      f"{rot}; warn {to_float(d['warn_translation_m']) * 1e3:.3f} mm, "
                      f"fail {to_float(d['fail_translation_m']) * 1e3:.3f} mm)")
        _say_kept(report, cfg.service.state_dir, print if not args.json else _say)
        outside = [name for name, e in (point_truth or {}).items() if not e["within_uncertainty"]]
        if honest.get("within_3_sigma") is False or outside:
            # The demo knows the truth: an answer outside its own reported uncertainty is a
            # confident wrong answer, and the demo says so with its exit status (a point
            # result: either estimate, by the same bound its lines print).
            what = f" ({', '.join(outside)})" if outside else ""
            _say(f"cellcal demo: the error against the truth lies OUTSIDE the result's reported "
                 f"uncertainty (3 sigma){what}: exit 4")
            return 4
        return 0
    finally:
        if app is not None:
            app.close()
        if camera_sim is not None:
            camera_sim.close()
        tracker_sim.close()
        robot_sim.close()
