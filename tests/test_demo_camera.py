"""`cellcal demo --camera eye_in_hand|eye_to_hand --json`: the demo's cell with the rendered camera,
calibrated end to end in a child process (the simulated robot, tracker and GigE Vision camera on
loopback), its result checked here against the simulator's truth independently of the demo's own
``truth_error``."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.cli import demo_camera as dc
from cellcal.daemon.cli.examples import example_path
from cellcal.sim.camera_device import default_camera
from cellcal.sim.scenario import load_scenario
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


def _demo(tmp_path, setup: str) -> tuple[subprocess.CompletedProcess, dict]:
    r = subprocess.run([*DEMO, "--camera", setup, "--stations", "6", "--timeout-s", "150", "--json",
                        "--time-scale", "20"],
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
    # the tracker check is not defined for an eye-in-hand camera: the result says why, the gate does not apply
    assert d["tracker_check"] is None and "eye-in-hand" in d["tracker_check_note"]
    gate = {c["name"]: c for c in out["gates"]["checks"]}["tracker_check"]
    assert gate.get("applies") is False
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
