"""The daemon behind ZeroMQ, end to end on the simulated cell.

Everything real: the simulated robot on loopback RTDE, the simulated tracker on a pty, the
service, its ZeroMQ server on loopback TCP, and clients (``cellcal.daemon.wire.client.Client``)
that know only the protocol.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.wire.client import Client, ClientTimeout, CommandFailed
from cellcal.sim.scenario import parse_scenario
from cellcal.solver.se3 import rotation_angle, se3_inverse
from cellcal.testing.harness import inprocess_cell

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """
name = "zmq-daemon-test"
seed = 7
[time]
scale = 10.0
[truth]
cell_T_base_xyz_m = [2.0, 0.5, 0.2]
cell_T_base_quat_wxyz = [0.9659258262890683, 0.0, 0.0, 0.25881904510252074]
flange_T_target_xyz_m = [0.0, 0.02, 0.06]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
base_T_flange_xyz_m = [-0.4919, -0.1333, 0.4879]
base_T_flange_quat_wxyz = [0.0, 0.7071067811865476, 0.7071067811865476, 0.0]
[tracker]
noise_mm = 0.01
noise_deg = 0.002
[robot]
settle_time_constant_s = 0.1
"""


@contextlib.contextmanager
def cell(*, drift: str = "", zmq_overrides: dict | None = None, plan_overrides: dict | None = None,
         drift_overrides: dict | None = None, n_stations: int = 8):
    """The simulated cell and the daemon serving ZeroMQ, on ``config/demo.toml`` made faster
    (harness.inprocess_cell); yields (svc, world, (cmd_endpoint, pub_endpoint)). Overrides
    are TOML keys."""
    overrides = {
        "robot": {"settle": {"dwell_s": 0.15}}, "tracker": {"average_s": 0.1}, "capture": {"move_speed": 1.0},
        "plan": dict(plan_overrides or {}), "drift": dict(drift_overrides or {}),
        "zmq": {"heartbeat_s": 0.2, **(zmq_overrides or {})},
    }
    with tempfile.TemporaryDirectory(prefix="cellcal-zmq-") as tmp, inprocess_cell(
            Path(tmp), scenario=parse_scenario(SCENARIO + drift), base_config=ROOT / "config" / "demo.toml",
            n_stations=n_stations, overrides=overrides) as c:
        yield c.svc, c.world, (c.cfg.zmq.cmd_endpoint, c.cfg.zmq.pub_endpoint)


def wait_for(sub, topic: str, pred, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = sub.recv(min(1.0, max(0.01, deadline - time.monotonic())))
        if msg is None:
            continue
        t, env = msg
        if t == topic and pred(env["body"]):
            return env
    pytest.fail(f"no matching {topic} within {timeout_s} s")


def test_calibrate_over_zmq_late_joiner_and_to_base_against_truth():
    with cell() as (svc, world, (cmd, pub)):
        bodies: list[tuple[str, dict]] = []
        svc.add_listener(lambda t, b: bodies.append((t, b)))
        with Client(cmd, pub, timeout_s=3.0) as c:
            sub = c.subscribe([P.TOPIC_RESULT, P.TOPIC_STATION])
            started = c.call("start_run", kind="base_frame")
            assert started["kind"] == "base_frame" and started["planned"] == 8
            env = wait_for(sub, P.TOPIC_RESULT, lambda b: b.get("result_id") is not None, 90.0)
            result = env["body"]
            assert result["active"] and result["n_stations"] == 8 and not result["retained"]
        # A client that joins now gets the current result from the snapshot, within 1 s.
        with Client(cmd, pub, timeout_s=3.0) as late:
            t0 = time.monotonic()
            sub = late.subscribe([P.TOPIC_RESULT])
            msg = sub.recv(1.0)
            assert msg is not None and time.monotonic() - t0 < 1.0
            assert msg[1]["body"]["result_id"] == result["result_id"]
            # to_base against the hidden truth: a cell point and a cell pose.
            truth = world.cell_T_base()
            p_cell = np.array([1.5, 0.8, 0.3])
            out = late.call("to_base", point_m=p_cell.tolist())
            expect = se3_inverse(truth) @ np.append(p_cell, 1.0)
            assert out["result_id"] == result["result_id"] and out["frame"] == "base"
            assert np.linalg.norm(np.array(out["point_m"]) - expect[:3]) < 0.05e-3
            cell_T_part = np.eye(4)
            cell_T_part[:3, 3] = p_cell
            out = late.call("to_base", pose={"matrix": cell_T_part.reshape(16).tolist()}, child_frame="part")
            base_T_part = transform_from_wire(out["pose"])
            assert out["pose"]["parent_frame"] == "base" and out["pose"]["child_frame"] == "part"
            assert rotation_angle((se3_inverse(truth) @ cell_T_part)[:3, :3].T @ base_T_part[:3, :3]) < math.radians(0.002)
            listed = late.call("list_results")
            assert listed["active_result_id"] == result["result_id"] and len(listed["results"]) == 1
            with pytest.raises(CommandFailed) as ei:
                late.call("get_result", result_id="999")
            assert ei.value.code == P.E_NOT_FOUND
            status = late.call("get_status")
            assert not P.check_result("get_status", status)
    # Every body the daemon published conforms to the protocol's TypedDicts.
    seen = {t for t, _ in bodies}
    assert {P.TOPIC_STATE, P.TOPIC_STATION, P.TOPIC_RESULT, P.TOPIC_HEARTBEAT} <= seen
    for topic, body in bodies:
        if topic == P.TOPIC_RESULT and body.get("ok") is False:
            continue
        assert not P.check_body(topic, body), (topic, P.check_body(topic, body))


def test_curve_roles_at_the_daemon(tmp_path):
    server_pub, server_sec = zmq.curve_keypair()
    obs_pub, obs_sec = zmq.curve_keypair()
    op_pub, op_sec = zmq.curve_keypair()
    stranger_pub, stranger_sec = zmq.curve_keypair()
    keyfile = tmp_path / "server.key_secret"
    keyfile.write_text(
        "metadata\ncurve\n"
        f'    public-key = "{server_pub.decode()}"\n    secret-key = "{server_sec.decode()}"\n'
    )
    keyfile.chmod(0o600)
    clients = [{"name": "watcher", "public_key": obs_pub.decode(), "role": "observer"},
               {"name": "ops", "public_key": op_pub.decode(), "role": "operator"}]
    with cell(zmq_overrides={"curve": True, "server_secret_key_file": str(keyfile), "clients": clients,
                             "null_role": "observer"}) as (svc, world, (cmd, pub)):
        handled = []
        svc.add_listener(lambda t, b: handled.append(t) if t == P.TOPIC_STATION else None)
        with Client(cmd, timeout_s=1.0, retries=1, curve_server_key=server_pub,
                    curve_keypair=(stranger_pub, stranger_sec)) as stranger:
            with pytest.raises(ClientTimeout):
                stranger.call("start_run", kind="base_frame")
        with Client(cmd, timeout_s=1.0, retries=1) as nobody:  # NULL security on a CURVE socket
            with pytest.raises(ClientTimeout):
                nobody.call("start_run", kind="base_frame")
        with Client(cmd, timeout_s=3.0, curve_server_key=server_pub, curve_keypair=(obs_pub, obs_sec)) as observer:
            assert observer.call("get_status")["state"] in P.STATES
            with pytest.raises(CommandFailed) as ei:
                observer.call("start_run", kind="base_frame")
            assert ei.value.code == P.E_FORBIDDEN
        assert svc.store.list_runs() == []  # nobody above changed anything
        with Client(cmd, timeout_s=3.0, curve_server_key=server_pub, curve_keypair=(op_pub, op_sec)) as operator:
            run = operator.call("start_run", kind="base_frame")
            assert len(svc.store.list_runs()) == 1 and run["run_id"] == str(svc.store.list_runs()[0].id)
            assert operator.call("abort")["aborted"] in (True, False)


def test_base_shift_is_drift_fail_and_recalibration_matches_the_shifted_truth():
    # The base slides 1.5 mm along cell y shortly after the first calibration (simulated
    # time ~120 s = 12 s wall at x10); checks every 2 s of wall time.
    drift = """
[[drift]]
at_s = 160.0
delta_xyz_m = [0.0, 0.0015, 0.0]
delta_rotvec_deg = [0.0, 0.0, 0.0]
"""
    with cell(drift=drift, drift_overrides={"interval_s": 2.0, "on_drift": "recalibrate"}) as (svc, world, (cmd, pub)):
        with Client(cmd, pub, timeout_s=3.0) as c:
            sub = c.subscribe([P.TOPIC_RESULT, P.TOPIC_DRIFT])
            c.call("start_run", kind="base_frame")
            first = wait_for(sub, P.TOPIC_RESULT, lambda b: b.get("result_id") is not None, 90.0)["body"]
            assert world.now_s() < 160.0, "the first calibration must finish before the shift"
            # Checks before the shift pass; the shift is reported as fail within two checks.
            t_shift_wall = (160.0 - world.now_s()) / world.time_scale
            fail = wait_for(sub, P.TOPIC_DRIFT, lambda b: b["status"] == "fail", t_shift_wall + 3 * 2.0 + 30.0)["body"]
            assert world.now_s() >= 160.0
            assert fail["result_id"] == first["result_id"] and fail["suspect"] and fail["action"] == "recalibrating"
            assert fail["deviation_translation_m"] > 1.0e-3
            hb = c.call("get_status")
            # The recalibration's result becomes active and matches the shifted truth.
            new = wait_for(sub, P.TOPIC_RESULT,
                           lambda b: b.get("result_id") not in (None, first["result_id"]) and b["active"], 90.0)["body"]
            X = transform_from_wire(new["transforms"]["cell_T_base"])
            truth = world.cell_T_base()
            assert np.linalg.norm(X[:3, 3] - truth[:3, 3]) < 0.1e-3
            assert new["provenance"]["parent_result_id"] == first["result_id"]
            old = c.call("get_result", result_id=first["result_id"])
            assert old["suspect"] and not old["active"]
            assert hb["active_result_id"] in (first["result_id"], new["result_id"])
            # The exports follow: the suspect result's files say so, exports/active is the new one's.
            exports = Path(svc.cfg.service.state_dir) / "exports"
            old_file = json.loads((exports / f"result_{first['result_id']}.json").read_text())
            assert old_file["suspect"] is True and old_file["active"] is False and old_file["suspect_reason"]
            assert "SUSPECT: true" in (exports / f"result_{first['result_id']}.urdf").read_text()
            active = json.loads((exports / "active" / "result.json").read_text())
            assert active["result_id"] == new["result_id"] and active["active"] is True and active["suspect"] is False


def test_degenerate_plan_is_completed_by_the_planner():
    # Every planned station differs only in the wrist's last joint: all motions share one
    # axis, so the solve alone would end in DegenerateGeometry. The daemon measures the
    # stations the planner suggests instead, and the run completes.
    home = [0.0, -90.0, 90.0, -90.0, -90.0]
    stations = [{"q_deg": home + [a]} for a in (-40.0, -10.0, 20.0, 50.0)]
    with cell(plan_overrides={"kind": "explicit", "stations": stations}) as (svc, world, (cmd, pub)):
        with Client(cmd, pub, timeout_s=3.0) as c:
            sub = c.subscribe([P.TOPIC_RESULT])
            c.call("start_run", kind="base_frame")
            res = wait_for(sub, P.TOPIC_RESULT, lambda b: b.get("result_id") is not None, 120.0)["body"]
            assert res["n_stations"] > 4 and res["axis_spread"] >= 1e-4 and res["active"]
            X = transform_from_wire(res["transforms"]["cell_T_base"])
            assert np.linalg.norm(X[:3, 3] - world.cell_T_base()[:3, 3]) < 0.5e-3
