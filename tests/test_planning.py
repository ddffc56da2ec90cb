"""Observability planning with a real arm's forward kinematics."""

import math

import numpy as np
import pytest

from cellcal.drivers.kinematics import dh_model
from cellcal.solver import DegenerateGeometry, calibrate_base_frame, planning
from cellcal.solver.planning import plan_stations, suggest_next_station, visible
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.solver.synthetic import perturb

UR = dh_model("ur5e")
LIMITS = np.array([[-math.pi, math.pi]] * 6)
BOX = ([0.2, -0.5, 0.0], [0.7, 0.5, 0.7])
X = make_transform(so3_exp([0.0, 0.0, 0.3]), [2.0, 0.5, 0.0])  # base 2 m from the tracker
TRACKER = np.zeros(3)
Y = make_transform(so3_exp([0.05, -0.02, 0.0]), [0.0, 0.0, 0.05])


@pytest.fixture(scope="module")
def plan():
    return plan_stations(UR.forward, LIMITS, BOX, TRACKER, X, 12, flange_T_target=Y)


def test_planned_stations_are_reachable_inside_the_box_and_in_sight(plan):
    assert plan.q_rad.shape == (12, 6) and plan.base_T_flange.shape == (12, 4, 4)
    assert np.all(plan.q_rad >= LIMITS[:, 0]) and np.all(plan.q_rad <= LIMITS[:, 1])
    for q, G in zip(plan.q_rad, plan.base_T_flange, strict=True):
        assert np.allclose(UR.forward(q), G)
    p = plan.base_T_flange[:, :3, 3]
    assert np.all(p >= BOX[0]) and np.all(p <= BOX[1])
    assert visible(X @ plan.base_T_flange @ Y, TRACKER).all()
    assert plan.n_feasible >= 12 and plan.n_candidates >= plan.n_feasible
    assert len({tuple(q) for q in plan.q_rad}) == 12  # no station twice


def test_plan_beats_random_feasible_stations(plan):
    rng = np.random.default_rng(1)
    Q, G, _ = planning._candidates(UR.forward, LIMITS, BOX, TRACKER, X, Y, (0, 0, 1), 45.0, 1000, rng)
    lams = []
    for _ in range(15):
        sel = rng.choice(len(Q), 12, replace=False)
        F = planning.information(G[sel], X, flange_T_target=Y)
        lams.append(planning._min_eig(F, "cell_T_base")[0])
    assert plan.min_eigenvalue > 1.5 * np.median(lams), (plan.min_eigenvalue, np.median(lams))
    assert plan.min_eigenvalue >= max(lams)
    assert plan.worst_sigma_m == pytest.approx(1 / math.sqrt(plan.min_eigenvalue))
    assert "cell_T_base" in plan.weakest_description


def test_predicted_uncertainty_is_what_the_calibration_then_reports(plan):
    # Same noise in the plan and in the data: the refined result's 1-sigma matches.
    rng = np.random.default_rng(2)
    G = plan.base_T_flange
    st, sr = planning.DEFAULT_PLAN_NOISE_M, planning.DEFAULT_PLAN_NOISE_RAD
    M = np.array([perturb(X @ g @ Y, rng, st * 1e3, math.degrees(sr)) for g in G])
    r = calibrate_base_frame(G, M, noise_translation_m=st, noise_rotation_rad=sr)
    assert r.sigma_translation_mm == pytest.approx(plan.predicted_sigma_translation_mm, rel=0.05)
    assert r.sigma_rotation_deg == pytest.approx(plan.predicted_sigma_rotation_deg, rel=0.05)


def test_same_inputs_same_plan(plan):
    again = plan_stations(UR.forward, LIMITS, BOX, TRACKER, X, 12, flange_T_target=Y)
    assert np.array_equal(again.q_rad, plan.q_rad)


def test_suggestion_fixes_a_degenerate_station_set():
    # Only the wrist turns: every rotation is about the flange z axis, so the base-frame
    # calibration refuses; the suggested station must make it solvable.
    q0 = np.array([0.3, -1.2, 1.6, -1.9, -1.57, 0.0])
    S = np.array([UR.forward(q0 + [0, 0, 0, 0, 0, a]) for a in (-1.0, 0.0, 0.8, 1.5)])
    M = X @ S @ Y
    with pytest.raises(DegenerateGeometry):
        calibrate_base_frame(S, M)
    nxt = suggest_next_station(S, UR.forward, LIMITS, BOX, TRACKER, X, flange_T_target=Y)
    assert nxt.min_eigenvalue_before < 1e-6 * nxt.min_eigenvalue_after
    assert math.isinf(nxt.worst_sigma_before_m) and math.isfinite(nxt.worst_sigma_after_m)
    assert np.allclose(UR.forward(nxt.q_rad), nxt.base_T_flange)
    G2 = np.concatenate([S, nxt.base_T_flange[None]])
    r = calibrate_base_frame(G2, X @ G2 @ Y)
    assert np.linalg.norm(r.cell_T_base[:3, 3] - X[:3, 3]) < 1e-9
    assert "cell_T_base" in nxt.weakest_description


def test_suggestion_from_nothing_and_after_a_plan(plan):
    first = suggest_next_station(np.zeros((0, 4, 4)), UR.forward, LIMITS, BOX, TRACKER, X)
    assert first.base_T_flange.shape == (4, 4)
    more = suggest_next_station(plan, UR.forward, LIMITS, BOX, TRACKER, X, flange_T_target=Y)
    assert more.min_eigenvalue_after > more.min_eigenvalue_before > 0


def test_point_tracker_plans_too():
    p = plan_stations(UR.forward, LIMITS, BOX, TRACKER, X, 8, measurement="point",
                      flange_T_target=make_transform(np.eye(3), [0, 0, 0.1]), cone_deg=40)
    assert p.information.shape == (9, 9) and p.min_eigenvalue > 0
    assert p.measurement == "point"


def test_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="box"):
        plan_stations(UR.forward, LIMITS, ([0, 0, 0], [0, 1, 1]), TRACKER, X, 6)
    with pytest.raises(ValueError, match="joint_limits"):
        plan_stations(UR.forward, LIMITS[:, ::-1], BOX, TRACKER, X, 6)
    with pytest.raises(ValueError, match="n_stations"):
        plan_stations(UR.forward, LIMITS, BOX, TRACKER, X, 2)
    with pytest.raises(ValueError, match="line of sight"):
        plan_stations(UR.forward, LIMITS, BOX, TRACKER, X, 6, cone_deg=0.01, n_candidates=200)
    with pytest.raises(ValueError, match="measurement"):
        plan_stations(UR.forward, LIMITS, BOX, TRACKER, X, 6, measurement="laser")
    with pytest.raises(ValueError, match="focus"):
        suggest_next_station(np.zeros((0, 4, 4)), UR.forward, LIMITS, BOX, TRACKER, X, focus="Y")


def test_visibility_cone_definition():
    T = np.eye(4)[None].repeat(3, axis=0)
    T[:, :3, 3] = [[0, 0, -1], [1, 0, -1], [0, 0, 1]]  # target facing +z, tracker at origin
    v = visible(T, np.zeros(3), cone_deg=45.1)
    assert v.tolist() == [True, True, False]  # 0 deg, 45 deg, behind
    assert not visible(T[1:2], np.zeros(3), cone_deg=44.9)[0]
    assert visible(T[1:2], np.zeros(3), target_axis=(-1, 0, 1), cone_deg=0.1)[0]  # facing it exactly
