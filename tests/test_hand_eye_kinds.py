"""The camera hand-eye run kinds without a running cell (ADR 0031): their refusals at start and
before the first move, their gates in the result's own units, their stored record and what
``cellcal show`` and the report make of it. The end-to-end runs are
``tests/test_daemon_hand_eye_camera.py`` and ``tests/test_daemon_hand_eye_eye_to_hand.py``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _camera_views import SIZE, TARGET
from _hand_eye_views import kinematic_arm, scene

from cellcal.daemon import protocol as P
from cellcal.daemon import runs
from cellcal.daemon.config import load_config_text
from cellcal.daemon.runs import RunContext, camera_plan
from cellcal.daemon.runs.hand_eye_camera import INTRINSICS_KEY, RECORD_KEY, _stored_camera, camera_gates, camera_record
from cellcal.daemon.store import Store
from cellcal.drivers.kinematics import dh_model
from cellcal.sim.scenario import load_scenario
from cellcal.solver import CalibrationError, NotEnoughSamples, calibrate_hand_eye_camera
from cellcal.solver.errors import DegenerateGeometry
from cellcal.solver.se3 import so3_log
from cellcal.testing.harness import FAST_SCENARIO, camera_section, daemon_config, to_toml

MODEL = dh_model("ur5e")
SCENARIO = load_scenario(FAST_SCENARIO)


def _cfg(tmp_path, mounting: str | None, *, camera: dict | None = None, **plan):
    d = daemon_config(robot_url="rtde://127.0.0.1:30004", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    if mounting is not None:
        section = camera_section("gige://127.0.0.2", mounting, SCENARIO, tmp_path, n_views=12)
        section["plan"].update(plan)
        section.update(camera or {})
        d["camera"] = section
    return load_config_text(to_toml(d))


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "state") as s:
        yield s


def _ctx(cfg, store) -> RunContext:
    return RunContext(cfg, store, lambda: MODEL, P.MOTION_COMMAND)


def test_a_start_is_refused_naming_what_is_missing(tmp_path, store):
    he, eth = runs.get(P.KIND_HAND_EYE), runs.get(P.KIND_EYE_TO_HAND)
    bare = _ctx(_cfg(tmp_path, None), store)
    assert "start the run with its stations" in he.refuse_start(bare)  # the given-stations path stays
    assert "no [camera] section" in eth.refuse_start(bare)
    in_hand = _ctx(_cfg(tmp_path, "eye_in_hand"), store)
    assert "start a hand_eye run" in eth.refuse_start(in_hand)
    assert "run kind intrinsics first" in he.refuse_start(in_hand)  # use_intrinsics = "latest", none stored
    estimate = _ctx(_cfg(tmp_path, "eye_in_hand", camera={"use_intrinsics": "estimate"}), store)
    assert he.refuse_start(estimate) is None
    assert he.plan(estimate)[INTRINSICS_KEY] == {"use": "estimate"}


def _run(store, kind, plan):
    return store.get_run(store.create_run(kind, plan, config_sha256="0" * 64, devices={}))


def test_a_plan_turning_about_one_axis_or_too_short_is_refused_before_the_first_move(tmp_path, store):
    kind = runs.get(P.KIND_HAND_EYE)
    estimate = {"use_intrinsics": "estimate"}
    good = _ctx(_cfg(tmp_path, "eye_in_hand", camera=estimate), store)
    kind.check_plan(good, _run(store, P.KIND_HAND_EYE, kind.plan(good)))  # the default plan spreads its rotations
    # tilts of a hundredth of a degree: every view turns about the view axis only
    flat = _ctx(_cfg(tmp_path, "eye_in_hand", camera=estimate, max_tilt_deg=0.01), store)
    with pytest.raises(DegenerateGeometry) as ei:
        kind.check_plan(flat, _run(store, P.KIND_HAND_EYE, kind.plan(flat)))
    axis = good.cfg.camera.pivot / np.linalg.norm(good.cfg.camera.pivot)
    assert abs(float(ei.value.axis @ axis)) > 0.99 and ei.value.frame == "flange", ei.value
    assert "max_tilt_deg" in str(ei.value)
    few = _ctx(_cfg(tmp_path, "eye_in_hand", camera=estimate, n_views=4), store)
    with pytest.raises(NotEnoughSamples):
        kind.check_plan(few, _run(store, P.KIND_HAND_EYE, kind.plan(few)))


def _solve(rng, **kw):
    s = scene("eye_in_hand", 10, rng, noise_px=0.1, **kw)
    return calibrate_hand_eye_camera(s.views, TARGET, s.G, image_size=SIZE, n_bootstrap=0)


def test_the_gates_are_in_the_results_own_units_and_model_error_is_a_test_not_a_length(tmp_path):
    cfg = _cfg(tmp_path, "eye_in_hand")
    clean = _solve(np.random.default_rng(4))
    report = camera_gates(clean, cfg)
    checks = {c.name: c for c in report.checks}
    assert report.passed, report.reason
    assert checks["reprojection_rms"].unit == "px" and checks["sigma_translation"].unit == "m"
    assert checks["model_error"].unit == "bool" and checks["model_error"].value == 0.0
    assert checks["cross_solver"].applies is False  # no bootstrap: not judged, so not failed
    assert "sigma_at_task_points" not in checks
    # an arm whose kinematics are off by 0.3 deg / 3 mm: the chain's robot test fires
    arm = kinematic_arm(np.random.default_rng(2), joint_deg=0.3, link_mm=3.0)
    bent = _solve(np.random.default_rng(5), kinematic_error=arm)
    assert bent.camera_tests.model_error
    failed = {c.name: c for c in camera_gates(bent, cfg).checks}["model_error"]
    assert not failed.passed and failed.value == 1.0 and "model_error:" in failed.message
    # the refusal names the way forward: the keys an integrator changes, and today's value
    assert "[camera.hand_eye] robot_accuracy_mm, now 0" in failed.message
    assert "allow_model_error = true" in failed.message
    allowed = dataclasses.replace(cfg, camera=dataclasses.replace(
        cfg.camera, hand_eye=dataclasses.replace(cfg.camera.hand_eye, allow_model_error=True)))
    assert {c.name: c for c in camera_gates(bent, allowed).checks}["model_error"].applies is False


def test_the_record_show_and_report_carry_the_camera_chain(tmp_path):
    r = _solve(np.random.default_rng(6))
    body = camera_record(r, list(range(100, 110)), {"use": "estimate"})
    d = body[RECORD_KEY]
    assert d["views"] == list(range(100, 110)) and d["setup"] == "eye_in_hand" and d["cross_check"] is not None
    assert body["image_size"] == list(SIZE) and set(body["transforms"]) == {"flange_T_camera", "base_T_target"}
    assert "robot_accuracy_undeclared" in {w["code"] for w in body["warnings"]}
    kind = runs.for_body({**body, "kind": P.KIND_HAND_EYE})
    lines = "\n".join(kind.show_lines(body))
    for word in ("reprojection", "closure", "cross-check", "estimated with the hand-eye", "tracker check"):
        assert word in lines, (word, lines)
    # where the declared accuracy came from (finish() sets it): the summary line says so
    d["robot"]["accuracy_source"] = {"from": "kinematics", "result_id": 7}
    assert "(from kinematics result 7, held-out)" in "\n".join(kind.show_lines(body))
    html = kind.report_sections(body, None).after_summary
    assert 'id="camera-hand-eye"' in html and html.count("<figure") == 2
    given = {k: v for k, v in body.items() if k != RECORD_KEY}  # a hand_eye result from given stations
    assert kind.show_lines(given) == [] and kind.report_sections(given, None).after_summary == ""


def test_a_solve_whose_rotations_share_an_axis_gets_a_view_turning_across_it(tmp_path, store):
    kind = runs.get(P.KIND_HAND_EYE)
    ctx = _ctx(_cfg(tmp_path, "eye_in_hand", camera={"use_intrinsics": "estimate"}), store)
    axis = np.asarray(ctx.cfg.camera.pivot) / np.linalg.norm(ctx.cfg.camera.pivot)  # the view axis
    exc = DegenerateGeometry("rotations about the view axis only", axis=axis, frame="flange", axis_spread=0.0,
                             unrecoverable=("rotation about axis",), max_rotation_rad=0.5)
    planned = kind.plan(ctx)["stations"]
    stations = [type("S", (), {"plan_index": i})() for i in range(len(planned))]
    extra = kind.extra_station(ctx, stations, exc)
    assert extra is not None and extra.index == len(planned)
    np.testing.assert_allclose(MODEL.forward(extra.q_rad), extra.base_T_flange, atol=1e-9)  # reachable
    _q, T_view = camera_plan.view_pose(ctx.cfg, MODEL)
    r = so3_log(T_view[:3, :3].T @ extra.base_T_flange[:3, :3])
    across = np.linalg.norm(r - (r @ axis) * axis)
    assert np.degrees(across) > 10.0, np.degrees(across)  # a tilt of the plan's size, not a roll
    observe = RunContext(ctx.cfg, store, lambda: MODEL, P.MOTION_OBSERVE)
    assert kind.extra_station(observe, stations, exc) is None  # the cell's program moves the robot


def _intrinsics_body(K, size):
    C = np.diag([0.25, 0.25, 0.4, 0.3, 1e-6, 1e-5, 1e-8, 1e-8, 0.0])
    return {"camera_matrix": K.tolist(), "dist_coeffs": [0.0] * 5, "image_size": list(size),
            "intrinsics": {"covariance": {"shape": [9, 9], "values": C.reshape(-1).tolist()}},
            "gates": {"passed": True, "checks": []}}


def test_stored_intrinsics_are_taken_as_a_prior_only_for_the_camera_they_calibrated(tmp_path, store):
    kind = runs.get(P.KIND_HAND_EYE)
    ctx = _ctx(_cfg(tmp_path, "eye_in_hand"), store)
    K = np.array([[900.0, 0.0, 400.0], [0.0, 900.0, 300.0], [0.0, 0.0, 1.0]])
    rid = store.add_result(None, P.KIND_INTRINSICS, _intrinsics_body(K, SIZE),
                           {"devices": {P.DEVICE_CAMERA: {"serial": "CAM-A"}}})
    assert kind.refuse_start(ctx) is None  # "latest" finds it
    source = kind.plan(ctx)[INTRINSICS_KEY]
    assert source == {"use": "result", "result_id": rid}

    def station(serial):
        return type("S", (), {"camera": {"device": {"serial": serial}}})()

    model, C = _stored_camera(store, source, [station("CAM-A")])
    np.testing.assert_array_equal(model.camera_matrix, K)
    assert C.shape == (9, 9) and C[8, 8] == 0.0  # k3 held: zero variance
    with pytest.raises(CalibrationError, match="camera CAM-A.*CAM-B"):
        _stored_camera(store, source, [station("CAM-B")])
