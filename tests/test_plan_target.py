"""Planning for the uncertainty asked: the one planner, its line of sight, and a daemon that
captures until the predicted error at the task points reaches ``[plan] target_sigma_mm``.

The daemon runs are the in-process cell of :func:`cellcal.testing.harness.inprocess_cell`
(the fast scenario: the demo's truth, a tracker with 10-15 um of raw noise, an arm without
hidden errors, so the result's covariance is the whole error and the error against the
truth must be consistent with it).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from cellcal.daemon.config import ConfigError, load_config, load_config_text
from cellcal.daemon.runs import plan as dplan
from cellcal.daemon.runs import to_target as target
from cellcal.drivers.kinematics import dh_model
from cellcal.sim.scenario import load_scenario
from cellcal.solver import calibrate_base_frame, planning
from cellcal.solver.se3 import se3_inverse
from cellcal.solver.synthetic import perturb
from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
UR = dh_model("ur5e")
HOME = np.radians([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])
LIMITS = np.array([[-2 * math.pi, 2 * math.pi]] * 6)
BOX = (np.array([-0.65, -0.35, 0.2]), np.array([-0.35, 0.15, 0.55]))


#: The demo cell's tracker where config/demo.toml's comment puts it (robot base frame, mm).
DEMO_TRACKER = {"plan": {"tracker_xyz_mm": [-1200.0, 2330.0, -100.0]}}


def _demo_truth() -> tuple[np.ndarray, np.ndarray]:
    sc = load_scenario(ROOT / "config" / "demo-scenario.toml")
    return np.asarray(sc.truth.cell_T_base, float), np.asarray(sc.truth.flange_T_target, float)


def _task_cell(X: np.ndarray) -> np.ndarray:
    """The middle of the workspace box, in the cell frame."""
    return (X @ np.r_[(BOX[0] + BOX[1]) / 2, 1.0])[:3]


# ---- the planner ---------------------------------------------------------------------------------


def test_generated_plan_of_the_demo_config_is_in_the_trackers_line_of_sight():
    """Every station of the demo's generated plan passes the planner's own line-of-sight test
    with the demo cell's true base, target and tracker, is in the box and within the joint
    limits, and is reached by the joints stored with it."""
    cfg = load_config(ROOT / "config" / "demo.toml", overrides=DEMO_TRACKER)
    X, Y = _demo_truth()
    stations = dplan.plan_from_config(cfg, UR)
    assert len(stations) == cfg.plan.n_stations
    G = np.array([s.base_T_flange for s in stations])
    Q = np.array([s.q_rad for s in stations])
    p = cfg.plan
    ok = planning.visible(X @ G @ Y, p.tracker_cell_xyz_m, target_axis=Y[:3, :3].T @ np.asarray(p.target_axis),
                          cone_deg=math.degrees(p.cone_rad))
    assert ok.all(), f"{(~ok).sum()} of {len(ok)} stations out of sight"
    assert np.all((G[:, :3, 3] >= np.array(p.workspace_min_m)) & (G[:, :3, 3] <= np.array(p.workspace_max_m)))
    assert np.all((Q >= np.array(p.joint_min_rad)) & (Q <= np.array(p.joint_max_rad)))
    for q, g in zip(Q, G, strict=True):
        assert np.allclose(UR.forward(q), g, atol=1e-12)
    # The same inputs give the same plan (a resumed run visits the stations it stored anyway).
    again = dplan.plan_from_config(cfg, UR)
    assert all(np.array_equal(a.q_rad, b.q_rad) for a, b in zip(stations, again, strict=True))
    # Without the tracker's position the plan tilts from the home pose (taken to face the
    # tracker): in this cell, whose home pose faces the floor, none of it is in sight.
    blind = dplan.plan_from_config(load_config(ROOT / "config" / "demo.toml"), UR)
    Gb = np.array([s.base_T_flange for s in blind])
    assert not planning.visible(X @ Gb @ Y, p.tracker_cell_xyz_m, cone_deg=math.degrees(p.cone_rad)).any()


def test_without_a_tracker_position_the_plan_stays_near_the_home_orientation():
    """Unknown tracker: the plan tilts from the home pose (taken to face the tracker), every
    station's target axis within max_tilt_deg of the home pose's."""
    tilt = math.radians(35.0)
    stations = dplan.generate_plan(UR, n=10, box_min_m=BOX[0], box_max_m=BOX[1], max_tilt_rad=tilt, home_q_rad=HOME)
    z_home = UR.forward(HOME)[:3, 2]
    for s in stations:
        angle = math.acos(np.clip(s.base_T_flange[:3, 2] @ z_home, -1.0, 1.0))
        assert angle <= tilt + 1e-9


def test_ik_candidates_face_the_tracker_and_respect_box_and_limits():
    X, Y = _demo_truth()
    lim = np.array([[-math.pi, math.pi]] * 6)
    Q, G = planning.candidate_stations(UR.forward, lim, BOX, np.zeros(3), X, flange_T_target=Y, cone_deg=30.0,
                                       ik=UR.inverse, q_seed_rad=HOME, n_candidates=60, rng=3)
    assert len(Q) == 60
    assert planning.visible(X @ G @ Y, np.zeros(3), cone_deg=30.0).all()
    assert np.all((Q >= lim[:, 0]) & (Q <= lim[:, 1]))
    assert np.all((G[:, :3, 3] >= BOX[0]) & (G[:, :3, 3] <= BOX[1]))
    # Uniform joint sampling with the same budget finds far fewer such stations.
    Qu, _ = planning.candidate_stations(UR.forward, lim, BOX, np.zeros(3), X, flange_T_target=Y, cone_deg=30.0,
                                        n_candidates=60, rng=3)
    assert len(Qu) < len(Q)


def test_candidates_given_are_filtered_by_the_line_of_sight():
    X, Y = _demo_truth()
    Q, G = planning.candidate_stations(UR.forward, LIMITS, BOX, np.zeros(3), X, flange_T_target=Y,
                                       ik=UR.inverse, q_seed_rad=HOME, n_candidates=40, rng=0)
    # A tracker on the other side of the robot sees none of them.
    behind = (X @ np.r_[0.5, -2.0, 0.4, 1.0])[:3]
    with pytest.raises(ValueError, match="line of sight"):
        planning.plan_stations(UR.forward, LIMITS, BOX, behind, X, 6, flange_T_target=Y, candidates=(Q, G))
    with pytest.raises(ValueError, match="candidates"):
        planning.plan_stations(UR.forward, LIMITS, BOX, np.zeros(3), X, 6, candidates=(Q, G[:3]))


def test_task_point_sigma_is_what_the_refined_calibration_reports():
    """The planner's prediction at a task point, for the noise the data then have, is the
    result's ``predicted_error_at`` (5 %), and the error against the truth is consistent with
    it over repeated noise draws."""
    X, Y = _demo_truth()
    Q, G = planning.candidate_stations(UR.forward, LIMITS, BOX, np.zeros(3), X, flange_T_target=Y,
                                       ik=UR.inverse, q_seed_rad=HOME, n_candidates=80, rng=1)
    pl = planning.plan_stations(UR.forward, LIMITS, BOX, np.zeros(3), X, 8, flange_T_target=Y, candidates=(Q, G))
    task = _task_cell(X)
    predicted = float(planning.task_point_sigma(pl.information, X, task)[0])
    st, sr = planning.DEFAULT_PLAN_NOISE_M, planning.DEFAULT_PLAN_NOISE_RAD
    rng = np.random.default_rng(5)
    z2 = []
    alarms = 0
    for _ in range(20):
        M = np.array([perturb(X @ g @ Y, rng, st * 1e3, math.degrees(sr)) for g in pl.base_T_flange])
        # An exact robot (robot_accuracy_m=0): the planner predicts the noise's part; with the
        # default accuracy, 8 stations at this noise cannot test for a real arm's error and the
        # result also carries that (ADR 0004, "A calibrated widening").
        r = calibrate_base_frame(pl.base_T_flange, M, noise_translation_m=st, noise_rotation_rad=sr,
                                 robot_accuracy_m=0.0)
        pe = r.predicted_error_at(task)
        if any(w.code == "model_error" for w in r.warnings):
            alarms += 1  # a false alarm widens the result: not the noise's part any more
            continue
        assert pe.sigma_m == pytest.approx(predicted, rel=0.05)
        err = (se3_inverse(r.cell_T_base) @ np.r_[task, 1.0])[:3] - (se3_inverse(X) @ np.r_[task, 1.0])[:3]
        z2.append(float(err @ err) / pe.sigma_m**2)
    # E|err|^2 = sigma^2 (sigma is the root of the trace): the mean of 20 draws is near 1.
    assert 0.4 < np.mean(z2) < 2.0, np.mean(z2)
    assert alarms <= 1, alarms  # the three tests' 1 % level: one in 20 is already unlucky (draw 13, p = 0.002)


def test_suggestion_for_task_points_lowers_their_error_more_than_the_eigenvalue_choice():
    X, Y = _demo_truth()
    Q, G = planning.candidate_stations(UR.forward, LIMITS, BOX, np.zeros(3), X, flange_T_target=Y,
                                       ik=UR.inverse, q_seed_rad=HOME, n_candidates=80, rng=2)
    S = planning.plan_stations(UR.forward, LIMITS, BOX, np.zeros(3), X, 5, flange_T_target=Y,
                               candidates=(Q, G)).base_T_flange
    task = _task_cell(X)
    kw = dict(flange_T_target=Y, candidates=(Q, G))
    by_task = planning.suggest_next_station(S, UR.forward, LIMITS, BOX, np.zeros(3), X, task_points=[task], **kw)
    by_eig = planning.suggest_next_station(S, UR.forward, LIMITS, BOX, np.zeros(3), X, **kw)

    def sigma(stations):
        return float(planning.task_point_sigma(planning.information(stations, X, flange_T_target=Y), X, task)[0])

    assert by_task.task_sigma_before_m == pytest.approx(sigma(S))
    assert by_task.task_sigma_after_m == pytest.approx(sigma(np.concatenate([S, by_task.base_T_flange[None]])))
    assert by_task.task_sigma_after_m < by_task.task_sigma_before_m
    assert by_task.task_sigma_after_m <= sigma(np.concatenate([S, by_eig.base_T_flange[None]])) + 1e-15
    assert math.isnan(by_eig.task_sigma_after_m)
    # A station already measured is never suggested again.
    assert not any(np.allclose(by_task.base_T_flange, s) for s in S)
    with pytest.raises(ValueError, match="task_points"):
        planning.suggest_next_station(S, UR.forward, LIMITS, BOX, np.zeros(3), X, task_points=[[1.0, 2.0]], **kw)


# ---- configuration -----------------------------------------------------------------------------

_BASE = (ROOT / "config" / "demo.toml").read_text()


def _with_plan(extra: str, solve: str = "") -> str:
    text = _BASE.replace("target_sigma_mm = 0.0\n", "").replace("task_points_mm = [[2217.2, -1224.3, 475.0]]\n", "")
    text = text.replace("[plan]\n", "[plan]\n" + extra + "\n", 1)
    return text.replace("[solve]\n", "[solve]\n" + solve, 1) if solve else text


def test_plan_target_keys_convert_to_si():
    cfg = load_config_text(_with_plan("target_sigma_mm = 0.05\ntracker_xyz_mm = [-1200.0, 2330.0, -100.0]",
                                      "task_points_mm = [[1000.0, -500.0, 250.0], [0, 0, 0]]\n"))
    assert cfg.plan.target_sigma_m == pytest.approx(5e-5)
    assert cfg.solve.task_points_m == [pytest.approx([1.0, -0.5, 0.25]), [0.0, 0.0, 0.0]]
    assert cfg.plan.cone_rad == pytest.approx(math.radians(45.0))
    assert cfg.plan.tracker_xyz_m == pytest.approx([-1.2, 2.33, -0.1])
    assert dplan.to_target(cfg.plan)
    assert not dplan.to_target(load_config(ROOT / "config" / "demo.toml").plan)


@pytest.mark.parametrize("extra, solve, path", [
    ("target_sigma_mm = 0.05", "", "solve.task_points_mm"),
    ("target_sigma_mm = -0.01", "", "plan.target_sigma_mm"),
    ("target_sigma_mm = 11.0", "", "plan.target_sigma_mm"),
    ("", "task_points_mm = [[1.0, 2.0]]\n", "solve.task_points_mm[0]"),
    ("", "task_points_mm = [1.0, 2.0, 3.0]\n", "solve.task_points_mm[0]"),
    ("", "task_points_mm = [[1.0, 2.0, 1e9]]\n", "solve.task_points_mm[0][2]"),
    ("", "task_points_mm = [[1.0, 2.0, 'x']]\n", "solve.task_points_mm[0][2]"),
    ("max_stations = 2", "", "plan.max_stations"),
    ("cone_deg = 0.0", "", "plan.cone_deg"),
    ("cone_deg = 120.0", "", "plan.cone_deg"),
    ("target_axis = [0.0, 0.0, 0.0]", "", "plan.target_axis"),
    ("target_axis = [0.0, 1.0]", "", "plan.target_axis"),
    ("tracker_xyz_mm = [1.0, 2.0]", "", "plan.tracker_xyz_mm"),
    ("target_sigma_mm = 0.05", "task_points_mm = [[0, 0, 0]]\n", None),
])
def test_plan_target_keys_are_bounded_and_named(extra, solve, path):
    text = _with_plan(extra, solve)
    # The demo file sets these keys already: the one under test replaces its line there.
    for line in ("target_axis = [0.0, 0.0, 1.0]\n",
                 "cone_deg = 45.0\n", "max_stations = 40\n"):
        if line.split(" ")[0] in extra:
            text = text.replace(line, "")
    if path is None:
        load_config_text(text)
        return
    with pytest.raises(ConfigError) as ei:
        load_config_text(text)
    assert ei.value.path == path, str(ei.value)


def test_a_target_needs_a_base_frame_calibration():
    text = _with_plan("target_sigma_mm = 0.05", "task_points_mm = [[0, 0, 0]]\n").replace(
        'kind = "base_frame"', 'kind = "tool_point"', 1)
    with pytest.raises(ConfigError) as ei:
        load_config_text(text)
    assert ei.value.path == "plan.target_sigma_mm"


# ---- the daemon --------------------------------------------------------------------------------

def _target_overrides(target_mm: float, max_stations: int = 30) -> dict:
    X, _Y = _demo_truth()  # the fast scenario has the demo's truth
    return {"plan": {"target_sigma_mm": target_mm,
                     "max_stations": max_stations, "tracker_xyz_mm": [-1200.0, 2330.0, -100.0]},
            # the fast scenario's arm repeats exactly: the declared noise is the tracker's alone
            "solve": {"robot_repeatability_mm": 0.0, "robot_repeatability_deg": 0.0,
                      "task_points_mm": [[float(v) for v in _task_cell(X) * 1e3]]}}


def test_daemon_captures_until_the_target_and_stops_there(tmp_path):
    """The run stops at the first station after which the predicted error at the task point
    is at most the target: with one station fewer it was above it. The result says so too,
    and its error against the truth at the task point is consistent with the prediction."""
    target_m = 2.5e-6  # a few stations more than the first four on this quiet tracker
    with inprocess_cell(tmp_path, n_stations=20, overrides=_target_overrides(target_m * 1e3), time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        body = cell.wait_result(run_id, timeout_s=240.0)
        records = cell.svc.store.stations(run_id)
        cfg = cell.cfg
        n = len(records)
        assert dplan.FIRST_STATIONS_POSE < n < 20, n  # neither the first plan nor the fixed count
        assert body["n_stations"] == n
        sigma, result = target.predicted_task_sigma(records, cfg)
        assert sigma <= target_m
        before, _ = target.predicted_task_sigma(records[:-1], cfg)
        assert before > target_m
        # The stations after the first plan are the planner's: in the tracker's line of sight.
        X = cell.world.cell_T_base()
        Y = cell.world.flange_T_target()
        G = np.array([r.base_T_flange for r in records])
        assert planning.visible(X @ G[dplan.FIRST_STATIONS_POSE:] @ Y, np.zeros(3)).all()
        # Error against the truth at the task point: within 4 sigma (3-D, sigma = root of
        # the trace: P(|e| > 4 sigma) < 1e-3 with a right covariance).
        task = np.asarray(cfg.solve.task_points_m[0])
        err = (se3_inverse(result.cell_T_base) @ np.r_[task, 1.0])[:3] - (se3_inverse(X) @ np.r_[task, 1.0])[:3]
        assert np.linalg.norm(err) <= 4.0 * sigma, (np.linalg.norm(err), sigma)
        assert cell.svc.store.get_run(run_id).status.value == "done"


def test_daemon_stops_at_max_stations_when_the_target_is_out_of_reach(tmp_path):
    with inprocess_cell(tmp_path, n_stations=20, overrides=_target_overrides(1e-6, max_stations=6),
                        time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        body = cell.wait_result(run_id, timeout_s=240.0)
        assert body["n_stations"] == 6
        sigma, _ = target.predicted_task_sigma(cell.svc.store.stations(run_id), cell.cfg)
        assert sigma > 1e-9


def test_next_station_decides_from_what_the_run_has(tmp_path):
    """The capture loop's decision on stored stations: None once the target is reached, a
    visible station of the planner's otherwise, never one visited already."""
    with inprocess_cell(tmp_path, n_stations=6, zmq=False, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        cell.wait_result(run_id, timeout_s=120.0)
        records = cell.svc.store.stations(run_id)
        base = cell.cfg
    X = cell.world.cell_T_base()
    Y = cell.world.flange_T_target()
    full = _target_overrides(0.0)
    ov = {**full["plan"], **full["solve"]}
    with_task = dataclasses.replace(
        base, solve=dataclasses.replace(base.solve, task_points_m=[[v / 1e3 for v in ov["task_points_mm"][0]]]))
    sigma, result = target.predicted_task_sigma(records, with_task)
    assert math.isfinite(sigma) and sigma > 0
    # The exact cell's arm is what its controller believes: no model error, no floor.
    assert not any(w.code == "model_error" for w in result.warnings)
    assert target.model_error_floor(result, records, with_task) == 0.0

    def cfg_for(target_m: float):
        return dataclasses.replace(
            base, plan=dataclasses.replace(base.plan, target_sigma_m=target_m,
                                           tracker_xyz_m=[v / 1e3 for v in ov["tracker_xyz_mm"]]),
            solve=dataclasses.replace(base.solve, task_points_m=[[v / 1e3 for v in ov["task_points_mm"][0]]]))

    assert target.next_station(records, [], cfg_for(sigma * 1.01), UR, 6) is None
    nxt = target.next_station(records, [], cfg_for(sigma * 0.5), UR, 6)
    assert nxt is not None and nxt.index == 6
    assert planning.visible(X @ nxt.base_T_flange @ Y, np.zeros(3))[0]
    assert not any(np.allclose(nxt.base_T_flange, r.base_T_flange) for r in records)
    again = target.next_station(records, [nxt], cfg_for(sigma * 0.5), UR, 7)
    assert again is not None and not np.allclose(again.base_T_flange, nxt.base_T_flange)
    # No stations yet: no prediction, the first station comes from the plan's stand-in.
    assert target.predicted_task_sigma([], cfg_for(1e-5))[0] == math.inf


def test_planned_stations_rotate_about_spread_axes():
    """What the solver's acceptance gate needs (ADR 0002): the chosen stations' relative
    rotations are not all about one axis."""
    from cellcal.solver.se3 import so3_log

    X, Y = _demo_truth()
    cfg = load_config(ROOT / "config" / "demo.toml", overrides=DEMO_TRACKER)
    G = np.array([s.base_T_flange for s in dplan.plan_from_config(cfg, UR)])
    axes = []
    for i in range(1, len(G)):
        w = so3_log(G[0, :3, :3].T @ G[i, :3, :3])
        if np.linalg.norm(w) > 1e-3:
            axes.append(w / np.linalg.norm(w))
    s = np.linalg.svd(np.array(axes), compute_uv=False)
    assert s[-1] / s[0] > 0.2, s


def test_daemon_stops_when_the_arms_model_error_alone_exceeds_the_target(tmp_path):
    """In the realistic cell the arm's kinematic error sets a floor far above 1 um: the result
    carries it (the absorbed robot error, ``diagnostics.absorbed_error_covariance``), more
    stations do not average it away, and the run stops at FLOOR_MIN_STATIONS instead of
    capturing until the prediction has visibly stopped falling (11-19 stations before)."""
    X, _Y = _demo_truth()
    ov = {"plan": {"target_sigma_mm": 0.001, "max_stations": 30, "tracker_xyz_mm": [-1200.0, 2330.0, -100.0]},
          "solve": {"task_points_mm": [[float(v) for v in _task_cell(X) * 1e3]]}}
    with inprocess_cell(tmp_path, scenario="realistic", n_stations=20, overrides=ov, zmq=False,
                        time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        body = cell.wait_result(run_id, timeout_s=300.0)
        records = cell.svc.store.stations(run_id)
        assert body["n_stations"] == len(records) == target.FLOOR_MIN_STATIONS
        assert any(w["code"] == "model_error" for w in body["warnings"])
        sigma, result = target.predicted_task_sigma(records, cell.cfg)
        floor = target.model_error_floor(result, records, cell.cfg)
        # The floor is most of the prediction, and far above the target.
        assert 0.001e-3 < floor <= sigma and floor > 0.5 * sigma, (floor, sigma)


def test_the_plateau_rule_fires_when_the_prediction_stops_falling():
    """``plan.plateau`` on a run's predicted errors (the k-th with k + 3 stations): a
    prediction that keeps falling as averaging does never fires; one that stays within
    PLATEAU_GAIN of averaging for PLATEAU_STATIONS stations does, naming both figures."""
    n = dplan.FIRST_STATIONS_POINT + target.PLATEAU_STATIONS + 3
    falling = [1.0 / math.sqrt(k + 3) for k in range(n - 2)]
    assert target.plateau(falling) is None
    flat = falling[:-target.PLATEAU_STATIONS] + [falling[-target.PLATEAU_STATIONS - 1] * 0.999] * target.PLATEAU_STATIONS
    got = target.plateau(flat)
    assert got is not None and got[0] == pytest.approx(falling[-target.PLATEAU_STATIONS - 1]) and got[1] < got[0]
    assert target.plateau(flat[:3]) is None  # too few stations to judge
    assert target.plateau([*flat[:-1], math.inf]) is None


def test_a_run_to_a_target_resumed_after_its_planned_stations_goes_on_to_the_target(tmp_path):
    """The daemon stops once the run's planned stations are stored (the target not yet
    reached); the restarted daemon resumes the run with the planner's stations, not with a
    fixed count, and stops at the target."""
    from cellcal.daemon import protocol as P
    from cellcal.daemon.store import Store

    target_m = 2.5e-6
    state = tmp_path / "state"
    ov = _target_overrides(target_m * 1e3)
    last_planned = dplan.FIRST_STATIONS_POSE - 1
    with inprocess_cell(tmp_path, state_dir=state, n_stations=20, overrides=ov, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        cell.wait_for(lambda t, b: t == P.TOPIC_STATION and b["accepted"] and b["index"] == last_planned, 90.0,
                      "the last planned station")
    with Store(state, read_only=True) as ro:
        run = ro.get_run(run_id)
        assert run.is_open and len(run.plan["stations"]) == dplan.FIRST_STATIONS_POSE
        n_before = run.n_stations
    with inprocess_cell(tmp_path / "again", state_dir=state, n_stations=20, overrides=ov, time_scale=FAST_TIME_SCALE) as cell:
        body = cell.wait_result(run_id, timeout_s=240.0)
        records = cell.svc.store.stations(run_id)
        assert len(records) >= max(n_before, dplan.FIRST_STATIONS_POSE)
        assert body["n_stations"] == len(records) < 20
        assert len({r.plan_index for r in records}) == len(records)
        sigma, _ = target.predicted_task_sigma(records, cell.cfg)
        assert sigma <= target_m
        assert target.predicted_task_sigma(records[:-1], cell.cfg)[0] > target_m


def test_without_the_trackers_position_a_run_to_a_target_estimates_it_from_its_first_stations(tmp_path):
    """No ``tracker_xyz_mm``: the first stations are the tilt plan from home; the planner's
    stations after them face the tracker where the first stations' calibration puts it (the
    cell origin here), and the run stops at the target."""
    target_m = 2.5e-6
    ov = _target_overrides(target_m * 1e3)
    del ov["plan"]["tracker_xyz_mm"]
    with inprocess_cell(tmp_path, n_stations=20, overrides=ov, zmq=False, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        cell.wait_result(run_id, timeout_s=240.0)
        records = cell.svc.store.stations(run_id)
        X, Y = cell.world.cell_T_base(), cell.world.flange_T_target()
        G = np.array([r.base_T_flange for r in records])
        first = dplan.FIRST_STATIONS_POSE
        assert first < len(records) < 20
        assert not planning.visible(X @ G[:first] @ Y, np.zeros(3)).any()  # home faces the floor
        assert planning.visible(X @ G[first:] @ Y, np.zeros(3)).all()
        assert target.predicted_task_sigma(records, cell.cfg)[0] <= target_m
