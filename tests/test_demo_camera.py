"""`cellcal demo --camera eye_in_hand|eye_to_hand --json`: the demo's cell with the rendered camera,
calibrated end to end in a child process (the simulated robot, tracker and GigE Vision camera on
loopback), its result checked here against the simulator's truth independently of the demo's own
``truth_error``: with the cellcal tracker, with a Leica emScon tracker's points for the eye-to-hand
tracker check, and from intrinsics already stored in the state directory. Arguments a camera run
cannot take are refused as usage errors before anything starts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _camera_views import synthetic_views

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.cli import demo_camera as dc
from cellcal.daemon.cli.examples import example_path
from cellcal.daemon.runs.hand_eye_camera import MIN_STATIONS
from cellcal.daemon.runs.intrinsics import intrinsics_record
from cellcal.daemon.store import Store
from cellcal.sim.camera_device import default_camera
from cellcal.sim.scenario import load_scenario
from cellcal.solver.intrinsics import calibrate_intrinsics
from cellcal.solver.se3 import se3_inverse, se3_log

# The slow tier (make test, not make check): simulated devices in real time.
pytestmark = pytest.mark.slow

#: chi-square, 6 dof, 3 sigma (99.73 %): the demo's own bound (cellcal.sim.truth)
CHI2_6_3SIGMA = 20.06
DEMO = [sys.executable, "-m", "cellcal.daemon.cli", "demo"]


def _truth(setup: str) -> dict[str, np.ndarray]:
    sc = load_scenario(example_path("demo-scenario.toml"))
    cam = default_camera(sc, setup)
    base_T_cell = se3_inverse(sc.truth.cell_T_base)
    if setup == "eye_in_hand":
        return {"flange_T_camera": cam.flange_T_camera, "base_T_target": base_T_cell @ cam.cell_T_target}
    return {"base_T_camera": base_T_cell @ cam.cell_T_camera, "flange_T_target": cam.flange_T_target}


def _demo(tmp_path, setup: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    r = subprocess.run([*DEMO, "--camera", setup, "--stations", "6", "--timeout-s", "150", "--json",
                        "--time-scale", "20", *extra],
                       capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
                       env={**os.environ, "TMPDIR": str(tmp_path)})  # the demo keeps its state directory: here
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stdout[-2000:]  # one JSON object on stdout; progress went to stderr
    return r, json.loads(lines[0])


def _check_against_truth(out: dict, setup: str) -> None:
    truth = _truth(setup)
    assert list(out["transforms"]) == list(truth)  # the primary first
    for name, T_true in truth.items():
        parent, child = name.split("_T_")
        t = out["transforms"][name]
        assert (t["parent_frame"], t["child_frame"]) == (parent, child)
        T = transform_from_wire(t)
        C = np.array(out["uncertainty"]["covariance"][name]["values"], dtype=float).reshape(6, 6)
        xi = se3_log(se3_inverse(T) @ T_true)  # right perturbation, as the covariance (ADR 0004)
        nees = float(xi @ np.linalg.solve(C, xi))
        assert nees < CHI2_6_3SIGMA, (name, nees, xi)
        te = out["truth_error"][name]
        assert te["within_3_sigma"] is True and te["nees"] == pytest.approx(nees, rel=1e-6, abs=1e-9)
    assert out["truth_error"]["within_3_sigma"] is True


def test_demo_camera_eye_in_hand_finds_the_camera_on_the_flange_within_3_sigma(tmp_path):
    r, out = _demo(tmp_path, "eye_in_hand")
    assert out["kind"] == "hand_eye" and out["active"] and out["gates"]["passed"], out["gates"]
    assert out["n_stations"] == 6 and out["camera_hand_eye"]["setup"] == "eye_in_hand"
    assert out["camera_hand_eye"]["intrinsics_source"] == {"use": "estimate"}  # a new state directory: none stored
    _check_against_truth(out, "eye_in_hand")
    d = out["camera_hand_eye"]
    # after the demo's base frame, the tracker's flange target where the camera puts the flange
    tc = d["tracker_check"]
    assert tc is not None, d["tracker_check_note"]
    assert tc["via"] == "flange" and tc["passed"] and tc["n"] >= out["n_stations"] - 1, tc
    assert tc["cell_T_base_result_id"] == int(out["result_id"]) - 1 and "base-frame result" in r.stderr
    gate = {c["name"]: c for c in out["gates"]["checks"]}["tracker_check"]
    assert gate["passed"] and gate.get("applies", True)
    assert out["drift_check"] is None and "not made" in out["drift_check_note"]
    assert d["cross_check"]["spread_translation_m"] is not None and out["holdout"]["p90_translation_m"] > 0
    assert "simulated camera gige://127." in r.stderr and os.path.exists(out["report_path"])


def test_demo_camera_eye_to_hand_makes_the_tracker_check_after_a_base_frame(tmp_path):
    r, out = _demo(tmp_path, "eye_to_hand")
    assert out["kind"] == "eye_to_hand" and out["active"] and out["gates"]["passed"], out["gates"]
    assert out["camera_hand_eye"]["setup"] == "eye_to_hand"
    _check_against_truth(out, "eye_to_hand")
    tc = out["camera_hand_eye"]["tracker_check"]
    assert tc is not None, out["camera_hand_eye"]["tracker_check_note"]
    assert tc["passed"] and tc["n"] == out["n_stations"] and tc["cell_T_base_result_id"] == int(out["result_id"]) - 1
    gate = {c["name"]: c for c in out["gates"]["checks"]}["tracker_check"]
    assert gate["passed"] and gate.get("applies", True)
    assert "base-frame result" in r.stderr


def test_demo_camera_eye_to_hand_through_emscon_checks_the_camera_against_the_trackers_points(tmp_path):
    # A Leica emScon tracker measures the reflector's position only: the base frame before the
    # camera is a point calibration, and the tracker check closes the camera chain on its points.
    r, out = _demo(tmp_path, "eye_to_hand", "--instrument", "emscon")
    assert out["kind"] == "eye_to_hand" and out["gates"]["passed"], out["gates"]
    _check_against_truth(out, "eye_to_hand")
    assert "emscon instrument" in r.stderr and "(point stations)" in r.stderr
    tc = out["camera_hand_eye"]["tracker_check"]
    assert tc is not None, out["camera_hand_eye"]["tracker_check_note"]
    assert tc["passed"] and tc["n"] >= 3 and tc["dof"] == 3 * tc["n"], tc
    assert tc["cell_T_base_result_id"] == int(out["result_id"]) - 1
    with Store(Path(out["report_path"]).parents[1], read_only=True) as store:
        base = store.get_result(tc["cell_T_base_result_id"])
    assert base.kind == P.KIND_BASE_FRAME and "flange_p_target" in base.result["points"]  # the point fit's


def test_demo_camera_eye_in_hand_through_geocom_checks_the_flange_reflector_where_the_camera_puts_it(tmp_path):
    # A total station measures the flange's reflector only: the base frame is a point
    # calibration, and its flange_p_target is the point the camera chain carries to the cell.
    r, out = _demo(tmp_path, "eye_in_hand", "--instrument", "geocom")
    assert out["kind"] == "hand_eye" and out["gates"]["passed"], out["gates"]
    _check_against_truth(out, "eye_in_hand")
    tc = out["camera_hand_eye"]["tracker_check"]
    assert tc is not None, out["camera_hand_eye"]["tracker_check_note"]
    assert tc["via"] == "flange" and tc["passed"] and tc["n"] >= 3 and tc["dof"] == 3 * tc["n"], tc
    assert tc["cell_T_base_result_id"] == int(out["result_id"]) - 1


def _store_intrinsics(state_dir: Path) -> tuple[int, np.ndarray, np.ndarray]:
    """An intrinsics result of the demo's camera stored as the daemon stores one, in the
    store a demo with ``--state-dir state_dir`` opens: ``(result id, parameters, sigmas)``.
    Fitted on corners the camera's true model projects with noise: near the truth, not it."""
    cam = default_camera(load_scenario(example_path("demo-scenario.toml")), "eye_in_hand")
    views, _ = synthetic_views(np.random.default_rng(26), 12, noise_px=0.1, params=cam.camera.parameters,
                               size=cam.camera.image_size, target=cam.target, lateral=(0.06, 0.05), depth=(0.4, 0.6))
    fit = calibrate_intrinsics(views, cam.target, cam.camera.image_size)
    record = intrinsics_record(fit, list(range(len(views))))
    record["gates"] = {"passed": True, "failed": [], "checks": []}
    record["check_stations"] = []
    with Store(state_dir / "state") as store:
        run = store.create_run(P.KIND_INTRINSICS, {"stations": []}, config_sha256="0" * 64, devices={})
        rid = store.add_result(run, P.KIND_INTRINSICS, record, {}, activate=True)
    return rid, np.asarray(fit.parameters), np.asarray(fit.sigmas)


def test_demo_camera_takes_the_intrinsics_stored_in_its_state_directory(tmp_path):
    rid, stored, sigmas = _store_intrinsics(tmp_path / "demo")
    r, out = _demo(tmp_path, "eye_in_hand", "--state-dir", str(tmp_path / "demo"))
    assert "intrinsics a stored result's" in r.stderr
    d = out["camera_hand_eye"]
    assert d["intrinsics_source"] == {"use": "result", "result_id": rid} and d["intrinsics_mode"] == "prior"
    assert out["kind"] == "hand_eye" and out["gates"]["passed"], out["gates"]
    _check_against_truth(out, "eye_in_hand")
    # The stored intrinsics are the prior the views refine: the result's lie within a few of the
    # stored sigmas of them, no less certain than the prior (an estimate from 6 views alone is far less).
    ii = d["intrinsics"]
    assert ii["parameter_names"] == ["fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3"]
    got, got_sigma = np.array(ii["parameters"]), np.array(ii["sigmas"], dtype=float)
    assert np.all(np.abs(got - stored) <= 3.0 * sigmas), (got - stored) / sigmas
    assert np.all(got_sigma <= sigmas * 1.001), got_sigma / sigmas
    assert np.allclose(np.array(out["camera_matrix"])[[0, 1, 0, 1], [0, 1, 2, 2]], got[:4])


@pytest.mark.parametrize(("argv", "said"), [
    (["--camera", "eye_in_hand", "--stations", str(MIN_STATIONS - 1)],
     [f"--stations {MIN_STATIONS - 1}", "eye_in_hand", "hand_eye", f"at least {MIN_STATIONS}"]),
    # eye-to-hand: the same count for the base frame before it and the views, the camera's floor
    (["--camera", "eye_to_hand", "--stations", "3"], ["--stations 3", "eye_to_hand", f"at least {MIN_STATIONS}"]),
    (["--camera", "eye_in_hand", "--stations", "501"], ["--stations 501", "hand_eye", "at most 500"]),
    (["--camera", "eye_to_hand", "--instrument", "emscon", "--stations", "501"], ["--stations 501", "at most 500"]),
])
def test_camera_arguments_a_run_cannot_take_exit_2_before_anything_starts(argv, said, tmp_path):
    # before: a run that failed (exit 1) after the simulators started, or the configuration's key named
    r = subprocess.run([*DEMO, *argv], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert all(w in r.stderr for w in said), r.stderr
    assert "Traceback" not in r.stderr and "simulated" not in r.stderr and r.stdout == ""
    assert not list(tmp_path.glob("cellcal-demo-*"))  # refused before anything started


def test_demo_camera_text_report_names_what_it_printed(tmp_path):
    # the text report of a camera run from a result body: no third simulated cell
    lines = dc.camera_lines(_FAKE, dc.camera_truth_error(_FAKE, {"flange_T_camera": np.eye(4)}), 1.0)
    text = "\n".join(lines)
    assert "flange_T_camera translation_mm" in text and "OUTSIDE 3 sigma" in text and "gates FAILED: x" in text


def test_a_bad_camera_value_exits_2_naming_the_choices():
    r = subprocess.run([*DEMO, "--camera", "on_the_wall"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert "eye_in_hand" in r.stderr and "eye_to_hand" in r.stderr and "on_the_wall" in r.stderr
    assert r.stdout == ""


#: A hand-eye result body as little as the text report reads: a camera 1 mm off the truth
#: with a 0.01 mm sigma (outside 3 sigma), its gates failed.
_T = np.eye(4)
_T[0, 3] = 1e-3
_FAKE: dict = {
    "kind": "hand_eye", "n_stations": 6,
    "transforms": {"flange_T_camera": {"parent_frame": "flange", "child_frame": "camera",
                                       "matrix": _T.reshape(16).tolist(), "translation_m": [1e-3, 0.0, 0.0],
                                       "quaternion": {"w": 1.0, "x": 0.0, "y": 0.0, "z": 0.0}}},
    "uncertainty": {"covariance": {"flange_T_camera": {"shape": [6, 6],
                                                       "values": (np.eye(6) * 1e-10).reshape(36).tolist()}}},
    "camera_hand_eye": {"setup": "eye_in_hand", "tracker_check": None, "tracker_check_note": "no tracker check"},
    "gates": {"passed": False, "failed": ["x"], "checks": []},
    "warnings": [],
}
