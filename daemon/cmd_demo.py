"""``cellcal demo``: the simulated cell calibrated end to end (what ``make demo`` runs).

Starts the simulated cell of ``config/demo-scenario.toml`` (a UR5e-like robot served over
RTDE on loopback with its URScript port, and a laser tracker on loopback TCP, both moving
in one shared world), starts the daemon on ``config/demo.toml`` pointed at them, runs a
base-frame calibration in command mode with one progress line per station on stderr,
prints the report (``cell_T_base`` in mm and deg, residuals, axis_spread and the error
against the scenario's hidden truth), runs one drift check, and shuts everything down.

Honesty (``cellcal.daemon.truth``): the report says whether the error against the truth
lies inside the result's own reported uncertainty (the NEES of ``cell_T_base`` against the
3-sigma bound of a chi-square with 6 degrees of freedom), how the residual RMS compares
with the tracker's noise floor, and the result's warnings (``result["warnings"]``) in words.

With ``--json`` stdout carries exactly one JSON object at the end: the result as the
daemon publishes it on ``cellcal/v1/result``, plus ``truth_error`` (with ``nees``,
``within_3_sigma``), ``residual_vs_noise`` and ``drift_check``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _default(name: str) -> str:
    # The example files live in the repository's config/: next to the package folders for an
    # editable install, or in the working directory (a checkout) for a regular install.
    for base in (ROOT, Path.cwd()):
        if (base / "config" / name).exists():
            return str(base / "config" / name)
    return str(Path("config") / name)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default=_default("demo-scenario.toml"), help="simulated cell (TOML)")
    p.add_argument("--config", default=_default("demo.toml"), help="daemon configuration (TOML)")
    p.add_argument("--state-dir", default=None, help="keep the store here (default: a fresh temporary directory)")
    p.add_argument("--stations", type=int, default=None, help="override plan.n_stations")
    p.add_argument("--timeout-s", type=float, default=300.0, help="give up after this long (wall clock)")
    p.add_argument("--json", action="store_true", help="print the published result as one JSON object")
    p.add_argument("--no-drift-check", action="store_true", help="skip the drift check after the calibration")


def _free_if_taken(endpoint: str) -> str:
    """``endpoint`` if its loopback TCP port can be bound now, else the same host on a free port."""
    import re
    import socket

    m = re.fullmatch(r"tcp://(127\.0\.0\.1|localhost):(\d+)", endpoint)
    if not m:
        return endpoint
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", int(m.group(2))))
            return endpoint
        except OSError:
            s.bind(("127.0.0.1", 0))
            return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def honesty_lines(honest: dict, versus_noise: dict, warnings: object) -> list[str]:
    """The truth-and-honesty part of the text report, one line each."""
    out = []
    if honest.get("nees") is None:
        out.append("within the reported uncertainty: unknown (the result has no usable covariance)")
    else:
        st, sr = honest.get("sigma_translation_m"), honest.get("sigma_rotation_rad")
        sig = (f"reported 1-sigma along the error {st * 1e3:.4f} mm, {math.degrees(sr):.5f} deg; "
               if st is not None and sr is not None else "")
        out.append(f"within 3 sigma: {'yes' if honest['within_3_sigma'] else 'NO'} ({sig}NEES {honest['nees']:.2f}, "
                   f"3-sigma bound {honest['nees_3sigma_bound']:.2f} for 6 dof)")
    if versus_noise.get("ratio") is not None:
        out.append(f"residual vs tracker noise: RMS {versus_noise['rms_translation_m'] * 1e3:.4f} mm is "
                   f"{versus_noise['ratio']:.1f}x the tracker's noise floor {versus_noise['tracker_noise_m'] * 1e3:.4f} mm"
                   + (" (structured: the robot's kinematics, not the tracker)" if versus_noise["ratio"] > 3 else ""))
    for w in warnings if isinstance(warnings, list) else []:
        if isinstance(w, dict):
            out.append(f"warning {w.get('code')}: {w.get('message')}")
    return out


def run(args: argparse.Namespace) -> int:
    from cellcal.daemon import protocol as P
    from cellcal.daemon.app import App
    from cellcal.daemon.config import ConfigError, load_config
    from cellcal.daemon.report import transform_from_wire
    from cellcal.daemon.store import RunStatus
    from cellcal.daemon.truth import residual_vs_noise, truth_error
    from cellcal.sim.robot_sim import start_sim_robot
    from cellcal.sim.scenario import load_scenario
    from cellcal.sim.tracker_sim import SimTracker
    from cellcal.solver.errors import CellcalError
    from cellcal.solver.se3 import so3_log

    try:
        scenario = load_scenario(args.scenario)
        cfg = load_config(args.config)
    except (ConfigError, CellcalError, ValueError) as exc:
        print(f"cellcal demo: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    tmp = None
    state_dir = args.state_dir
    if state_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="cellcal-demo-")
        state_dir = tmp.name
    world = scenario.make_world()
    robot_sim = start_sim_robot(world, scenario.robot, transport="rtde")
    tracker_sim = SimTracker(world, scenario.tracker, transport="tcp", seed=scenario.seed)
    tracker_sim.__enter__()
    app = None
    try:
        plan = cfg.plan if args.stations is None else dataclasses.replace(cfg.plan, n_stations=args.stations)
        # The demo's loopback ports may be taken (another demo, another program): use free
        # ones then, and say which, so `cellcal watch` can still follow it.
        zcfg = dataclasses.replace(cfg.zmq, pub_endpoint=_free_if_taken(cfg.zmq.pub_endpoint),
                                   cmd_endpoint=_free_if_taken(cfg.zmq.cmd_endpoint))
        cfg = dataclasses.replace(
            cfg,
            robot=dataclasses.replace(cfg.robot, url=robot_sim.url),
            tracker=dataclasses.replace(cfg.tracker, url=tracker_sim.url),
            service=dataclasses.replace(cfg.service, state_dir=str(Path(state_dir) / "state"), runtime_dir=str(Path(state_dir) / "run")),
            plan=plan,
            zmq=zcfg,
        )
        _say(f"cellcal demo: simulated robot {robot_sim.url}, tracker {tracker_sim.url}, time x{scenario.time_scale:g}")
        _say(f"cellcal demo: ZeroMQ PUB {zcfg.pub_endpoint}, commands {zcfg.cmd_endpoint}")
        done = threading.Event()
        outcome: dict = {}

        def on_event(topic: str, body: dict) -> None:
            el = time.monotonic() - t0
            if topic == P.TOPIC_STATION:
                if body.get("accepted"):
                    s = body.get("settle", {})
                    _say(f"[{el:6.1f} s] station {body['index'] + 1:2d}/{body['planned']}: accepted "
                         f"(tracker std {1e3 * (s.get('tracker_std_translation_m') or 0):.4f} mm, robot at rest {s.get('robot_rest_s', 0):.2f} s)")
                else:
                    _say(f"[{el:6.1f} s] station {body['index'] + 1:2d}/{body['planned']}: rejected, {body['reason']} (attempt {body.get('attempt')}), retrying")
            elif topic == P.TOPIC_RESULT:
                outcome["result"] = body
                done.set()
            elif topic == P.TOPIC_DRIFT:
                outcome["drift"] = body
                done.set()
            elif topic == P.TOPIC_FAULT:
                _say(f"[{el:6.1f} s] fault: {body.get('message')}")
            elif topic == P.TOPIC_STATE and body.get("state") in (P.STATE_SOLVING, P.STATE_CHECKING):
                _say(f"[{el:6.1f} s] {body['state'].lower()} {body.get('detail', '')}")

        app = App(cfg, listeners=[on_event], supervise=True).open()
        svc = app.service
        run_id = svc.start_run(P.KIND_BASE_FRAME, reason="demo")
        deadline = t0 + args.timeout_s
        run = svc.store.get_run(run_id)
        while time.monotonic() < deadline:
            run = svc.store.get_run(run_id)
            if not run.is_open and svc.wait_idle(0.0):
                break
            done.wait(0.1)
        if run.status != RunStatus.DONE or "result" not in outcome:
            _say(f"cellcal demo: run {run_id} ended {run.status.value}: {run.status_reason or 'no result before the timeout'}")
            return 1
        result = outcome["result"]
        truth = world.cell_T_base()
        X = transform_from_wire(result["transforms"]["cell_T_base"])
        honest = truth_error(result, X, truth)
        err_t, err_r = honest["translation_m"], honest["rotation_rad"]
        versus_noise = residual_vs_noise(result, [st.tracker_std_translation_m for st in svc.store.stations(run_id)])
        if not args.no_drift_check and svc.store.active_result() is not None:
            done.clear()
            svc.request_drift_check("demo")
            while "drift" not in outcome and time.monotonic() < deadline:
                done.wait(0.1)
        el = time.monotonic() - t0
        if args.json:
            out = dict(result)
            out["truth_error"] = honest
            out["residual_vs_noise"] = versus_noise
            out["drift_check"] = outcome.get("drift")
            print(json.dumps(out))
        else:
            t = X[:3, 3] * 1e3
            rv = np.degrees(so3_log(X[:3, :3]))
            q = result["transforms"]["cell_T_base"]["quaternion"]
            print(f"cellcal demo: base-frame calibration of the simulated cell ({result['n_stations']} stations, {el:.1f} s)")
            print(f"  cell_T_base translation_mm [{t[0]:10.3f} {t[1]:10.3f} {t[2]:10.3f}]")
            print(f"  cell_T_base rotvec_deg     [{rv[0]:10.4f} {rv[1]:10.4f} {rv[2]:10.4f}]  "
                  f"quat_wxyz [{q['w']:.6f} {q['x']:.6f} {q['y']:.6f} {q['z']:.6f}]")
            print(f"  residual translation: RMS {result['rms_translation_m'] * 1e3:.4f} mm, "
                  f"worst {result['max_translation_m'] * 1e3:.4f} mm")
            print(f"  residual rotation:    RMS {math.degrees(result['rms_rotation_rad']):.5f} deg, "
                  f"worst {math.degrees(result['max_rotation_rad']):.5f} deg")
            gates = result.get("gates", {})
            verdict = "passed" if gates.get("passed") else "FAILED: " + "; ".join(gates.get("failed", []))
            print(f"  axis_spread {result['axis_spread']:.4f}; gates {verdict}")
            prov = result.get("provenance", {})
            if prov.get("robot_serial") or prov.get("kinematics_digest"):
                print(f"  robot serial {prov.get('robot_serial') or 'unknown'}; kinematics "
                      f"{(prov.get('devices', {}).get('robot') or {}).get('kinematics', '?')} "
                      f"{prov.get('kinematics_digest') or ''}")
            print(f"  error against the scenario's truth: {err_t * 1e3:.4f} mm, {math.degrees(err_r):.5f} deg")
            for line in honesty_lines(honest, versus_noise, result.get("warnings")):
                print("  " + line)
            d = outcome.get("drift")
            if d:
                print(f"  drift check: {d['status']} ({d['deviation_translation_m'] * 1e3:.4f} mm, "
                      f"{math.degrees(d['deviation_rotation_rad']):.5f} deg; warn {d['warn_translation_m'] * 1e3:.3f} mm, "
                      f"fail {d['fail_translation_m'] * 1e3:.3f} mm)")
        return 0
    finally:
        if app is not None:
            app.close()
        tracker_sim.__exit__(None, None, None)
        robot_sim.close()
        if tmp is not None:
            tmp.cleanup()
