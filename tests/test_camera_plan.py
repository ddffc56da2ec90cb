"""The views a camera run plans (``cellcal.daemon.runs.camera_plan``, ADR 0030) and the refusals
of the intrinsics kind before its first move.

The plan's tilt prediction is checked against the solver's own figure on the views the
simulated camera would see of them (the board projected by the true camera, no rendering):
a plan the kind lets through is one the solve does not refuse for tilt, and one it refuses
the solve would refuse too.
"""

from __future__ import annotations

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon import runs
from cellcal.daemon.config import load_config_text
from cellcal.daemon.runs import RunContext, camera_plan
from cellcal.daemon.runs.plan import PlanError, PlannedStation
from cellcal.daemon.store import Store
from cellcal.drivers.kinematics import dh_model
from cellcal.sim.camera_device import default_camera
from cellcal.sim.scenario import load_scenario
from cellcal.solver import NotEnoughSamples, calibrate_intrinsics
from cellcal.solver.camera_model import CameraModel, project
from cellcal.solver.camera_planning import camera_station_information
from cellcal.solver.errors import InsufficientTilt
from cellcal.solver.se3 import se3_inverse
from cellcal.testing.harness import FAST_SCENARIO, camera_section, daemon_config, to_toml

MODEL = dh_model("ur5e")
SCENARIO = load_scenario(FAST_SCENARIO)


def _cfg(tmp_path, mounting, **plan):
    d = daemon_config(robot_url="rtde://127.0.0.1:30004", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    section = camera_section("gige://127.0.0.2", mounting, SCENARIO, tmp_path, n_views=15)
    section["plan"].update(plan)
    d["camera"] = section
    return load_config_text(to_toml(d))


def _seen(mounting, stations):
    """The board's corners as the scenario's default camera sees them at each planned flange pose."""
    cam = default_camera(SCENARIO, mounting)
    cell_T_base = SCENARIO.truth.cell_T_base
    views = []
    for st in stations:
        cell_T_flange = cell_T_base @ st.base_T_flange
        if mounting == "eye_in_hand":
            T = se3_inverse(cell_T_flange @ cam.flange_T_camera) @ cam.cell_T_target
        else:
            T = se3_inverse(cam.cell_T_camera) @ cell_T_flange @ cam.flange_T_target
        uv = project(cam.camera.parameters, T, cam.target.corners_m).uv
        ok = np.all(np.isfinite(uv), axis=1) & cam.camera.in_image(uv)
        ids = np.flatnonzero(ok)
        views.append((ids, uv[ids] + np.random.default_rng(len(views)).normal(0.0, 0.05, (ids.size, 2))))
    return cam, views


@pytest.mark.parametrize("mounting", ["eye_in_hand", "eye_to_hand"])
def test_the_plan_turns_about_the_target_and_its_tilt_is_the_solvers(tmp_path, mounting):
    cfg = _cfg(tmp_path, mounting)
    plan = camera_plan.camera_views(cfg, MODEL)
    assert len(plan) == 15 and [s.index for s in plan] == list(range(15))
    q_view, T_view = camera_plan.view_pose(cfg, MODEL)
    np.testing.assert_allclose(plan[0].base_T_flange, T_view, atol=1e-6)  # the first view is the view pose
    for st in plan:  # every view reachable: its joints reproduce its pose
        np.testing.assert_allclose(MODEL.forward(st.q_rad), st.base_T_flange, atol=1e-9)
    again = camera_plan.camera_views(cfg, MODEL)
    assert all(np.array_equal(a.q_rad, b.q_rad) for a, b in zip(plan, again, strict=True))  # deterministic
    cam, views = _seen(mounting, plan)
    assert min(ids.size for ids, _ in views) >= 12  # the target stays in view: every view has most corners
    r = calibrate_intrinsics(views, cam.target, cam.camera.image_size, holdout_folds=0)
    predicted, _axis = camera_plan.predicted_tilt_deg(cfg, [se3_inverse(T_view) @ s.base_T_flange for s in plan])
    assert abs(predicted - r.tilt_deg) < 2.0, (predicted, r.tilt_deg)
    assert r.tilt_deg > 8.0 and r.coverage.fraction >= 0.5


def _true_marginal_sigma_mm(mounting, stations):
    """1 / sqrt(smallest eigenvalue) of the camera transform's information on ``stations``
    under the true mounting (intrinsics held): what the plan is to make small."""
    cam = default_camera(SCENARIO, mounting)
    base_T_cell = se3_inverse(SCENARIO.truth.cell_T_base)
    A, B = ((cam.flange_T_camera, base_T_cell @ cam.cell_T_target) if mounting == "eye_in_hand"
            else (base_T_cell @ cam.cell_T_camera, cam.flange_T_target))
    G = np.array([s.base_T_flange for s in stations])
    F = camera_station_information(mounting, G, cam.camera, cam.target, A, B).sum(axis=0)
    # the board transform marginalised, the intrinsics held
    a, b = slice(0, 6), slice(6, 12)
    M = F[a, a] - F[a, b] @ np.linalg.solve(F[b, b], F[b, a])
    s = 1.0 / np.array([1, 1, 1, 0.5, 0.5, 0.5])
    return 1e3 / np.sqrt(np.linalg.eigvalsh(M * s[:, None] * s[None, :])[0])


@pytest.mark.parametrize("mounting", ["eye_in_hand", "eye_to_hand"])
def test_the_information_plan_determines_the_camera_better_than_the_first_views(tmp_path, mounting):
    cfg = _cfg(tmp_path, mounting)
    cam = default_camera(SCENARIO, mounting)
    plan, fig = camera_plan.information_views(cfg, MODEL, mounting, cam.camera, cam.target)
    assert len(plan) == 15 and [s.index for s in plan] == list(range(15))
    assert fig["name"] == camera_plan.PLANNER_INFORMATION and fig["n_candidates"] == 15 * camera_plan.INFORMATION_CANDIDATES
    assert 0.0 < fig["predicted_sigma_translation_mm"] < 1.0 and fig["axis_spread"] > 0.3
    for st in plan:
        np.testing.assert_allclose(MODEL.forward(st.q_rad), st.base_T_flange, atol=1e-9)
    again, _ = camera_plan.information_views(cfg, MODEL, mounting, cam.camera, cam.target)
    assert all(np.array_equal(a.q_rad, b.q_rad) for a, b in zip(plan, again, strict=True))  # deterministic
    # judged on a drawing of the mounting, yet the true camera sees the board in every view
    _cam, views = _seen(mounting, plan)
    assert min(ids.size for ids, _ in views) >= 12
    first = camera_plan.camera_views(cfg, MODEL)
    chosen, baseline = _true_marginal_sigma_mm(mounting, plan), _true_marginal_sigma_mm(mounting, first)
    assert chosen < 0.9 * baseline, (chosen, baseline)
    # the drawing's prediction is of the size the truth gives
    assert 0.2 < fig["predicted_sigma_translation_mm"] / chosen < 5.0, (fig, chosen)


@pytest.mark.parametrize("planner", ["information", "views"])
def test_a_hand_eye_plan_without_stored_intrinsics_takes_the_first_views_and_says_why(tmp_path, planner):
    d = daemon_config(robot_url="rtde://127.0.0.1:30004", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    section = camera_section("gige://127.0.0.2", "eye_in_hand", SCENARIO, tmp_path, n_views=15)
    section["plan"]["planner"] = planner
    section["use_intrinsics"] = "estimate"
    d["camera"] = section
    cfg = load_config_text(to_toml(d))
    ctx, store = _ctx(tmp_path, cfg)
    try:
        plan = runs.for_new_run(P.KIND_HAND_EYE, cfg.tracker.measure).plan(ctx)
    finally:
        store.close()
    assert plan["planner"]["name"] == camera_plan.PLANNER_VIEWS
    assert ("estimate" if planner == "information" else "planner") in plan["planner"]["reason"]
    if planner == "information":
        assert "focal_px" in plan["planner"]["reason"]  # names what would let it judge the views
    first = camera_plan.camera_views(cfg, MODEL)
    assert [s["q_rad"] for s in plan["stations"]] == [[float(v) for v in s.q_rad] for s in first]


@pytest.mark.parametrize("mounting", ["eye_in_hand", "eye_to_hand"])
def test_estimated_intrinsics_are_planned_on_a_nominal_camera_when_one_is_given(tmp_path, mounting):
    """``use_intrinsics = "estimate"`` with ``[camera.plan] focal_px`` and ``image_size_px``
    (a datasheet's figures, here 8 % off the true focal length): the information plan judges
    the views on that nominal camera (its intrinsics loose, marginalised) and still beats the
    first views under the truth, with the board in every view."""
    true = default_camera(SCENARIO, mounting).camera
    d = daemon_config(robot_url="rtde://127.0.0.1:30004", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    section = camera_section("gige://127.0.0.2", mounting, SCENARIO, tmp_path, n_views=15)
    section["plan"].update(focal_px=1.08 * float(true.camera_matrix[0, 0]), image_size_px=list(true.image_size))
    section["use_intrinsics"] = "estimate"
    d["camera"] = section
    cfg = load_config_text(to_toml(d))
    nominal = camera_plan.nominal_camera(cfg)
    assert nominal is not None and nominal[0].image_size == tuple(true.image_size) and nominal[1].shape == (9, 9)
    ctx, store = _ctx(tmp_path, cfg)
    try:
        plan = runs.for_new_run(P.KIND_HAND_EYE if mounting == "eye_in_hand" else P.KIND_EYE_TO_HAND,
                                cfg.tracker.measure).plan(ctx)
    finally:
        store.close()
    assert plan["planner"]["name"] == camera_plan.PLANNER_INFORMATION, plan["planner"]
    assert plan["planner"]["camera"] == "nominal ([camera.plan] focal_px)"
    chosen = [PlannedStation(int(s["index"]), np.asarray(s["q_rad"], dtype=float),
                             np.asarray(s["base_T_flange"], dtype=float).reshape(4, 4)) for s in plan["stations"]]
    _cam, views = _seen(mounting, chosen)
    assert min(ids.size for ids, _ in views) >= 12
    first = camera_plan.camera_views(cfg, MODEL)
    a, b = _true_marginal_sigma_mm(mounting, chosen), _true_marginal_sigma_mm(mounting, first)
    assert a < 0.95 * b, (a, b)


def test_a_nominal_camera_needs_both_its_focal_length_and_image_size(tmp_path):
    with pytest.raises(ValueError, match="camera.plan.image_size_px"):
        _cfg(tmp_path, "eye_in_hand", focal_px=1200.0)
    with pytest.raises(ValueError, match="camera.plan.image_size_px"):
        _cfg(tmp_path, "eye_in_hand", image_size_px=[800, 600])


def test_an_information_plan_whose_drawing_sees_too_few_views_is_a_plan_error_naming_why(tmp_path):
    cfg = _cfg(tmp_path, "eye_in_hand")
    cam = default_camera(SCENARIO, "eye_in_hand")
    tiny = CameraModel(cam.camera.camera_matrix, cam.camera.dist_coeffs, (16, 12))  # the board never fits
    with pytest.raises(PlanError, match="information plan.*only 0 of 60 candidate"):
        camera_plan.information_views(cfg, MODEL, "eye_in_hand", tiny, cam.target)


def test_an_unknown_planner_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match="camera.plan.planner"):
        _cfg(tmp_path, "eye_in_hand", planner="best")


def _ctx(tmp_path, cfg):
    store = Store(tmp_path / "state").open()
    return RunContext(cfg, store, lambda: MODEL, P.MOTION_COMMAND), store


def test_a_plan_that_cannot_tilt_enough_is_refused_before_the_first_move(tmp_path):
    kind = runs.get(P.KIND_INTRINSICS)
    cfg = _cfg(tmp_path, "eye_in_hand", max_tilt_deg=1.0, max_roll_deg=30.0)
    ctx, store = _ctx(tmp_path, cfg)
    try:
        plan = kind.plan(ctx)
        run = store.get_run(store.create_run(P.KIND_INTRINSICS, plan, config_sha256=cfg.sha256, devices={}))
        with pytest.raises(InsufficientTilt, match="max_tilt_deg") as ei:
            kind.check_plan(ctx, run)
        assert ei.value.tilt_deg < 5.0 and ei.value.required_deg == 5.0
        # ... which the solve would refuse too, on what the camera would see of those views
        cam, views = _seen("eye_in_hand", [PlannedStation(i, None, np.asarray(s["base_T_flange"]).reshape(4, 4))
                                            for i, s in enumerate(plan["stations"])])
        with pytest.raises(InsufficientTilt):
            calibrate_intrinsics(views, cam.target, cam.camera.image_size)
        ok_cfg = _cfg(tmp_path, "eye_in_hand")
        ok_ctx = RunContext(ok_cfg, store, lambda: MODEL, P.MOTION_COMMAND)
        run = store.get_run(store.create_run(P.KIND_INTRINSICS, kind.plan(ok_ctx), config_sha256="", devices={}))
        kind.check_plan(ok_ctx, run)  # the default plan passes
        two = kind.plan(ok_ctx, camera_plan.camera_views(ok_cfg, MODEL)[:2])
        run = store.get_run(store.create_run(P.KIND_INTRINSICS, two, config_sha256="", devices={}))
        with pytest.raises(NotEnoughSamples):
            kind.check_plan(ok_ctx, run)
    finally:
        store.close()


def test_an_unreachable_plan_says_what_to_change(tmp_path):
    q_view, _T = camera_plan.view_pose(_cfg(tmp_path, "eye_in_hand"), MODEL)
    d = daemon_config(robot_url="rtde://127.0.0.1:30004", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    d["camera"] = camera_section("gige://127.0.0.2", "eye_in_hand", SCENARIO, tmp_path)
    # joint limits that hold the view pose and hardly anything around it
    d["plan"]["joint_min_deg"] = [float(v) for v in np.degrees(q_view) - 0.5]
    d["plan"]["joint_max_deg"] = [float(v) for v in np.degrees(q_view) + 0.5]
    d["plan"]["home_q_deg"] = [float(v) for v in np.degrees(q_view)]
    with pytest.raises(PlanError, match="max_tilt_deg, max_shift_mm"):
        camera_plan.camera_views(load_config_text(to_toml(d)), MODEL)
