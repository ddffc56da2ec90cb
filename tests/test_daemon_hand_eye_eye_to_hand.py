"""An ``eye_to_hand`` run end to end through the daemon (ADR 0031): a rendered camera fixed in
the simulated cell looks at the target on the flange, reached through GigE Vision on a
loopback address of its own. The cell keeps ``[camera] use_intrinsics = "latest"`` (the
default), so the run takes the intrinsics of a stored ``intrinsics`` result as a prior: the
module first shows the refusals at start (no intrinsics stored yet; a ``hand_eye`` run for a
camera mounted eye-to-hand), then runs ``base_frame``, ``intrinsics`` and ``eye_to_hand`` on the
same cell. The tracker's target rides on the camera's board (``[camera.hand_eye]
tracker_target_mm``), so every camera station also measures it, and the result carries the
tracker check: the camera chain's prediction of those points against the tracker; the
daemon exports the result's integrator files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _hand_eye_export_files import check_hand_eye_exports

from cellcal.daemon import protocol as P
from cellcal.daemon import runs
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.service import ServiceError
from cellcal.daemon.wire.client import Client, CommandFailed
from cellcal.sim.camera_device import default_camera
from cellcal.sim.scenario import load_scenario
from cellcal.solver.se3 import se3_inverse, se3_log
from cellcal.testing.harness import FAST_SCENARIO, FAST_TIME_SCALE, inprocess_cell

pytestmark = pytest.mark.slow

N_VIEWS = 10
CHI2_6_999 = 22.46


SCENARIO = load_scenario(FAST_SCENARIO)


def _tracker_target_mm() -> list[float]:
    """Where the simulated tracker's target sits on the camera's board (the board's frame, mm):
    what an integrator reads off the fixture's drawing."""
    board = default_camera(SCENARIO, "eye_to_hand").flange_T_target
    p = se3_inverse(board) @ np.append(SCENARIO.truth.flange_T_target[:3, 3], 1.0)
    return [float(v) * 1e3 for v in p[:3]]


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    work = tmp_path_factory.mktemp("eye_to_hand")
    over = {"camera": {"hand_eye": {"tracker_target_mm": _tracker_target_mm()}}}
    with inprocess_cell(work, camera="eye_to_hand", camera_views=N_VIEWS, validate_bodies=True, overrides=over,
                        time_scale=FAST_TIME_SCALE) as c:
        c.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT and b["devices"].get("camera", {}).get("connected"), 60,
                   "the camera connected")
        with pytest.raises(ServiceError) as ei:
            c.svc.start_run(P.KIND_EYE_TO_HAND)
        c.no_intrinsics = ei.value  # type: ignore[attr-defined]
        with pytest.raises(ServiceError) as ei:
            c.svc.start_run(P.KIND_HAND_EYE)
        c.wrong_mounting = ei.value  # type: ignore[attr-defined]
        # the robot base in the cell first (the tracker check's cell_T_base), then the camera's intrinsics
        c.base_frame = c.wait_result(c.svc.start_run(P.KIND_BASE_FRAME), timeout_s=240)  # type: ignore[attr-defined]
        c.intrinsics = c.wait_result(c.svc.start_run(P.KIND_INTRINSICS), timeout_s=240)  # type: ignore[attr-defined]
        c.run_id = c.svc.start_run(P.KIND_EYE_TO_HAND)  # type: ignore[attr-defined]
        c.result = c.wait_result(c.run_id, timeout_s=240)  # type: ignore[attr-defined]
        yield c


def test_a_start_without_intrinsics_or_for_the_other_mounting_is_refused_naming_why(cell):
    assert cell.no_intrinsics.code == P.E_STATE and "run kind intrinsics first" in str(cell.no_intrinsics)
    assert cell.wrong_mounting.code == P.E_STATE and "start an eye_to_hand run" in str(cell.wrong_mounting)


def test_the_fixed_camera_is_found_within_its_reported_covariance_from_stored_intrinsics(cell):
    r = cell.result
    assert cell.intrinsics["gates"]["passed"], cell.intrinsics["gates"]
    assert r["kind"] == P.KIND_EYE_TO_HAND and r["active"] and r["gates"]["passed"], r["gates"]
    d = r["camera_hand_eye"]
    assert d["setup"] == "eye_to_hand" and d["intrinsics_mode"] == "prior"
    # with intrinsics stored, the views were chosen by what they determine, and the plan says so
    planner = cell.svc.store.get_run(cell.run_id).plan["planner"]
    assert planner["name"] == "information" and 0.0 < planner["predicted_sigma_translation_mm"] < 1.0, planner
    assert d["planner"] == planner  # the result carries it, beside its own sigma
    assert d["intrinsics_source"] == {"use": "result", "result_id": int(cell.intrinsics["result_id"])}
    cam = default_camera(cell.scenario, "eye_to_hand")
    truth = {"base_T_camera": se3_inverse(cell.scenario.truth.cell_T_base) @ cam.cell_T_camera,
             "flange_T_target": cam.flange_T_target}
    for name, T_true in truth.items():
        T = transform_from_wire(r["transforms"][name])
        C = np.array(r["uncertainty"]["covariance"][name]["values"], dtype=float).reshape(6, 6)
        xi = se3_log(se3_inverse(T) @ T_true)
        assert float(xi @ np.linalg.solve(C, xi)) < CHI2_6_999, (name, xi)
        assert np.linalg.norm(T[:3, 3] - T_true[:3, 3]) < 3.0 * np.sqrt(np.trace(C[:3, :3])), name
    assert d["cross_check"]["agrees"] is True and r["holdout"]["method"] == "k-fold refit"
    assert {c["name"] for c in r["gates"]["checks"]} >= {"reprojection_rms", "sigma_translation", "holdout_p90",
                                                         "model_error", "cross_solver"}
    assert not cell.nonconforming()


def test_to_base_takes_a_pose_in_the_fixed_cameras_frame(cell):
    r = cell.result
    X = transform_from_wire(r["transforms"]["base_T_camera"])
    camera_T_part = np.eye(4)
    camera_T_part[:3, 3] = [0.02, 0.01, 0.5]
    with Client(cell.cfg.zmq.cmd_endpoint, cell.cfg.zmq.pub_endpoint, timeout_s=5.0) as c:
        out = c.call("to_base", pose={"matrix": camera_T_part.reshape(16).tolist()}, frame="camera", child_frame="part")
        assert out["pose"]["parent_frame"] == "base" and out["pose"]["child_frame"] == "part"
        assert np.allclose(transform_from_wire(out["pose"]), X @ camera_T_part, atol=1e-12)
        with pytest.raises(CommandFailed) as ei:  # a fixed camera needs no flange pose, and is refused one
            c.call("to_base", point_m=[0.0, 0.0, 0.5], frame="camera", flange_pose={"matrix": np.eye(4).reshape(16).tolist()})
        assert ei.value.code == P.E_BAD_REQUEST


def test_the_tracker_check_closes_the_camera_chain_against_the_tracker(cell):
    r = cell.result
    tc = r["camera_hand_eye"]["tracker_check"]
    why = [s.raw.get("tracker_check") for s in cell.svc.store.stations(cell.run_id)]
    assert tc is not None, (r["camera_hand_eye"]["tracker_check_note"], why)
    # a station whose tracker measurement was refused or came after the robot moved keeps its
    # frame and says why in its raw (hand_eye_tracker.with_tracker); under load one of ten can
    measured = [w for w in why if w == "measured"]
    assert all(isinstance(w, str) and w for w in why), why
    assert tc["via"] == "camera" and tc["n"] == len(measured) >= r["n_stations"] - 2 and tc["passed"], (tc, why)
    assert tc["cell_T_base_result_id"] == int(cell.base_frame["result_id"])
    assert tc["rms_m"] < 0.5e-3 and tc["dof"] == 3 * tc["n"]
    gate = {c["name"]: c for c in r["gates"]["checks"]}["tracker_check"]
    assert gate["passed"] and gate["unit"] == "p" and gate.get("applies", True)
    html = runs.for_body(r).report_sections(r, None).after_summary
    assert 'id="fig-hand-eye-tracker"' in html and "tracker check" in html
    stations = cell.svc.store.stations(cell.run_id)
    assert all(s.cell_T_target is not None and s.camera is not None for s in stations)


def test_the_exports_hold_the_hand_eye_files_of_the_result(cell):
    exports = Path(cell.cfg.service.state_dir) / "exports"
    check_hand_eye_exports(exports, cell.result, "eye_to_hand", cell.cfg.export)
    # the base-frame result before it keeps only the common files
    rid = int(cell.base_frame["result_id"])
    assert (exports / f"result_{rid}.urdf").is_file() and not list(exports.glob(f"result_{rid}_hand_eye*"))
