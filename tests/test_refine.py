"""Maximum-likelihood refinement (ADR 0004): Jacobians, recovery, weighting, Huber,
noise estimation, the refine=False contract and allocation."""

import math

import numpy as np
import pytest
from _alloc import peak_bytes
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cellcal.solver import (
    DegenerateGeometry,
    Workspace,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver import refine as R
from cellcal.solver import refine_models as RM
from cellcal.solver._pose_solve import _absolute_linear
from cellcal.solver.se3 import make_transform, rotation_angle, se3_exp, se3_inverse, so3_exp, so3_log
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, perturb, pivot_scene, random_rotation


def t_err(A, B):
    return float(np.linalg.norm(A[:3, 3] - B[:3, 3]))


def r_err(A, B):
    return rotation_angle(A[:3, :3].T @ B[:3, :3])


def _raw_pose_residual(M, G, A, B):
    P = A @ G @ B
    et = M[:, :3, 3] - P[:, :3, 3]
    er = np.array([so3_log(p[:3, :3].T @ m[:3, :3]) for p, m in zip(P, M, strict=True)])
    return np.concatenate([et, er], axis=1)


# --- Jacobians against finite differences -----------------------------------------------------------


@pytest.mark.parametrize("resid_rad", [1e-3, 0.2, 0.8])
def test_pose_jacobian_matches_central_differences(resid_rad):
    rng = np.random.default_rng(3)
    n = 7
    A = make_transform(random_rotation(rng), rng.uniform(-2, 2, 3))
    B = make_transform(random_rotation(rng), rng.uniform(-0.2, 0.2, 3))
    G = np.array([make_transform(random_rotation(rng), rng.uniform(-1, 1, 3)) for _ in range(n)])
    # Residuals of the size asked for, so the inverse left Jacobian of SO(3) matters.
    M = np.array([A @ g @ B @ se3_exp(np.r_[rng.normal(scale=0.05, size=3), rng.normal(scale=resid_rad, size=3)])
                  for g in G])
    e, J = R.pose_residual_jacobian(M, G, A, B)
    assert np.allclose(e, _raw_pose_residual(M, G, A, B), atol=1e-12)
    h = 1e-6
    Jn = np.empty_like(J)
    for k in range(12):
        d = np.zeros(12)
        d[k] = h
        Ap, Bp = A @ se3_exp(d[:6]), B @ se3_exp(d[6:])
        Am, Bm = A @ se3_exp(-d[:6]), B @ se3_exp(-d[6:])
        Jn[:, :, k] = (_raw_pose_residual(M, G, Ap, Bp) - _raw_pose_residual(M, G, Am, Bm)) / (2 * h)
    assert np.max(np.abs(J - Jn)) < 2e-7 * max(1.0, np.max(np.abs(J)))


def test_point_jacobian_matches_central_differences():
    rng = np.random.default_rng(4)
    n = 6
    A = make_transform(random_rotation(rng), rng.uniform(-2, 2, 3))
    y = rng.uniform(-0.2, 0.2, 3)
    G = np.array([make_transform(random_rotation(rng), rng.uniform(-1, 1, 3)) for _ in range(n)])
    p = rng.uniform(-2, 2, (n, 3))

    def res(A_, y_):
        return p - (A_ @ G @ np.append(y_, 1.0))[:, :3]

    e, J = R.point_residual_jacobian(p, G, A, y)
    assert np.allclose(e, res(A, y), atol=1e-12)
    h = 1e-6
    for k in range(9):
        d = np.zeros(9)
        d[k] = h
        num = (res(A @ se3_exp(d[:6]), y + d[6:]) - res(A @ se3_exp(-d[:6]), y - d[6:])) / (2 * h)
        assert np.max(np.abs(J[:, :, k] - num)) < 1e-7


def test_fast_retraction_is_the_group_exponential():
    rng = np.random.default_rng(6)
    T = make_transform(random_rotation(rng), rng.uniform(-1, 1, 3))
    for scale in (0.0, 1e-9, 1e-5, 1e-3, 0.3, 2.5):
        xi = rng.normal(size=6) * scale
        assert np.allclose(RM.se3_exp_right(T, xi), T @ se3_exp(xi), rtol=0, atol=1e-15)


# --- recovery -----------------------------------------------------------------------------------------


@settings(max_examples=25)
@given(st.integers(0, 2**32 - 1), st.integers(3, 30))
def test_refined_noise_free_recovery_stays_at_machine_precision(seed, n):
    rng = np.random.default_rng(seed)
    X = make_transform(random_rotation(rng), rng.uniform(-3, 3, 3))
    Y = make_transform(random_rotation(rng), rng.uniform(-0.2, 0.2, 3))
    G = np.array([make_transform(random_rotation(rng), rng.uniform(-1, 1, 3)) for _ in range(n)])
    try:
        r = calibrate_base_frame(G, X @ G @ Y)
    except DegenerateGeometry:
        assume(False)
    assume(r.axis_spread >= 1e-2)
    assert r.refined
    assert t_err(r.cell_T_base, X) < 1e-10 and r_err(r.cell_T_base, X) < 1e-10
    assert t_err(r.flange_T_target, Y) < 1e-10 and r_err(r.flange_T_target, Y) < 1e-10
    assert np.all(np.isfinite(r.covariance))


def test_refinement_beats_the_linear_solve_at_tracker_noise():
    # Median over seeded scenes (N=20, 0.2 mm / 0.1 deg): the ML fit must be clearly better.
    lin, ref = [], []
    for seed in range(30):
        sc = base_frame_scene(20, np.random.default_rng(100 + seed), noise_mm=0.2, noise_deg=0.1)
        a = calibrate_base_frame(sc.base_T_flange, sc.measured, refine=False, holdout=False)
        b = calibrate_base_frame(sc.base_T_flange, sc.measured, holdout=False)
        lin.append(t_err(a.cell_T_base, sc.X))
        ref.append(t_err(b.cell_T_base, sc.X))
        assert b.iterations <= 6 and b.refined and not a.refined
    assert np.median(ref) < 0.6 * np.median(lin), (np.median(ref), np.median(lin))


def test_refine_false_is_the_linear_solve_untouched():
    sc = base_frame_scene(15, np.random.default_rng(5), noise_mm=0.2, noise_deg=0.1)
    G, M = sc.base_T_flange, sc.measured
    ws = Workspace(15)
    Rx, tx, Ry, ty, _, _ = _absolute_linear(G, M, 15, ws, "all", False, 1e-4, 1e-3)
    for kw in ({}, dict(holdout=False), dict(noise_translation_m=1e-3, noise_rotation_rad=0.1), dict(huber=1.0)):
        r = calibrate_base_frame(G, M, refine=False, **kw)
        assert np.array_equal(r.cell_T_base[:3, :3], Rx) and np.array_equal(r.cell_T_base[:3, 3], tx)
        assert np.array_equal(r.flange_T_target[:3, :3], Ry) and np.array_equal(r.flange_T_target[:3, 3], ty)
        assert not r.refined and r.iterations == 0 and r.linear_agreement is None
    # and the refined answer differs from it, but not by much
    rr = calibrate_base_frame(G, M)
    assert 0 < t_err(rr.cell_T_base, r.cell_T_base) < 2e-3
    assert rr.linear_agreement.translation_m == pytest.approx(t_err(rr.cell_T_base, r.cell_T_base))


def test_hand_eye_and_eye_to_hand_refinement_improve_and_recover():
    lin, ref, lin2, ref2 = [], [], [], []
    for seed in range(12):
        rng = np.random.default_rng(200 + seed)
        sc = hand_eye_scene(20, rng, noise_mm=0.2, noise_deg=0.1)
        a = calibrate_hand_eye(sc.base_T_flange, sc.measured, refine=False, holdout=False)
        b = calibrate_hand_eye(sc.base_T_flange, sc.measured, holdout=False)
        lin.append(t_err(a.flange_T_camera, sc.X))
        ref.append(t_err(b.flange_T_camera, sc.X))
        X = make_transform(random_rotation(rng), [1.2, 0.3, 0.8])  # base_T_camera
        Y = make_transform(so3_exp(rng.normal(scale=0.3, size=3)), [0.0, 0.02, 0.12])
        O = np.array([perturb(se3_inverse(X) @ g @ Y, rng, 0.2, 0.1) for g in sc.base_T_flange])
        c = calibrate_eye_to_hand(sc.base_T_flange, O, refine=False, holdout=False)
        d = calibrate_eye_to_hand(sc.base_T_flange, O, holdout=False)
        lin2.append(t_err(c.base_T_camera, X))
        ref2.append(t_err(d.base_T_camera, X))
    assert np.median(ref) < 0.9 * np.median(lin)
    assert np.median(ref2) < 0.9 * np.median(lin2)
    assert np.median(ref2) < 1e-3


def test_near_degenerate_noise_free_data_never_breaks_the_refinement():
    # A 2-degree cone of rotation axes: the information is nearly singular; the refined
    # answer must stay on the exact solution and report a large but finite uncertainty.
    rng = np.random.default_rng(4)
    X = make_transform(random_rotation(rng), [1.5, -0.5, 0.2])
    Y = make_transform(so3_exp([0.1, 0.0, 0.2]), [0.02, 0.03, 0.1])
    G = []
    for k in range(12):
        phi = 2 * math.pi * k / 12
        a = math.radians(2.0)
        ax = np.array([math.sin(a) * math.cos(phi), math.sin(a) * math.sin(phi), math.cos(a)])
        G.append(make_transform(so3_exp(ax * rng.uniform(0.5, 2.0)), rng.uniform(-0.5, 0.5, 3)))
    G = np.array(G)
    r = calibrate_base_frame(G, X @ G @ Y)
    assert t_err(r.cell_T_base, X) < 1e-8
    assert r.refined and np.all(np.isfinite(r.covariance))


# --- noise: estimated, given, per station ---------------------------------------------------------------


def test_noise_is_estimated_from_the_residuals():
    sc = base_frame_scene(60, np.random.default_rng(8), noise_mm=0.3, noise_deg=0.05)
    r = calibrate_base_frame(sc.base_T_flange, sc.measured, holdout=False)
    assert r.noise_translation_m == pytest.approx(0.3e-3, rel=0.15)
    assert r.noise_rotation_rad == pytest.approx(math.radians(0.05), rel=0.15)
    assert "estimated" in r.noise_source
    assert r.chi2 / r.dof == pytest.approx(1.0, abs=0.1)
    # Given noise is used as is; chi2/dof then tells whether it was right.
    wrong = calibrate_base_frame(sc.base_T_flange, sc.measured, holdout=False,
                                 noise_translation_m=0.1e-3, noise_rotation_rad=math.radians(0.05))
    assert wrong.noise_translation_m == 0.1e-3 and "given" in wrong.noise_source
    assert wrong.chi2 / wrong.dof > 2.0


def test_per_station_std_weights_a_noisy_station_down():
    sc = base_frame_scene(20, np.random.default_rng(9), noise_mm=0.02, noise_deg=0.01)
    M = sc.measured.copy()
    M[3, :3, 3] += [3e-3, -2e-3, 2e-3]  # one station 4 mm off...
    std = np.tile([2e-5] * 3 + [math.radians(0.01)] * 3, (20, 1))
    plain = calibrate_base_frame(sc.base_T_flange, M, cell_T_target_std=std, holdout=False)
    std[3, :3] = 5e-3  # ...and the tracker said so
    told = calibrate_base_frame(sc.base_T_flange, M, cell_T_target_std=std, holdout=False)
    assert t_err(told.cell_T_base, sc.X) < 0.2 * t_err(plain.cell_T_base, sc.X)
    assert "per-station" in told.noise_source


@pytest.mark.parametrize("bad", [np.nan, 0.0, -1e-3, np.inf])
def test_bad_per_station_std_names_the_station(bad):
    sc = base_frame_scene(8, np.random.default_rng(1))
    std = np.full((8, 6), 1e-4)
    std[5, 4] = bad
    with pytest.raises(ValueError, match=r"cell_T_target_std\[5\]"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_std=std)
    with pytest.raises(ValueError, match=r"shape"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_std=np.ones((8, 3)))
    with pytest.raises(ValueError, match="not both"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_std=np.ones((8, 6)),
                             noise_translation_m=1e-4)
    with pytest.raises(ValueError, match="noise_rotation_rad"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, noise_rotation_rad=-1.0)
    with pytest.raises(ValueError, match="huber"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, huber=0.0)


# --- Huber ----------------------------------------------------------------------------------------------


def test_huber_reports_and_resists_outlier_stations():
    sc = base_frame_scene(30, np.random.default_rng(10), noise_mm=0.05, noise_deg=0.02)
    M = sc.measured.copy()
    bad = [4, 17, 22]
    for i in bad:
        M[i] = M[i] @ se3_exp(np.r_[0.004, -0.003, 0.002, 0.01, -0.02, 0.0])  # mm and degree blunders
    kw = dict(noise_translation_m=0.05e-3, noise_rotation_rad=math.radians(0.02), holdout=False)
    plain = calibrate_base_frame(sc.base_T_flange, M, **kw)
    robust = calibrate_base_frame(sc.base_T_flange, M, huber=4.1, **kw)
    assert set(bad) <= set(robust.downweighted.tolist())
    assert len(robust.downweighted) <= len(bad) + 3  # clean stations are not thrown out wholesale
    assert t_err(robust.cell_T_base, sc.X) < 0.3 * t_err(plain.cell_T_base, sc.X)
    assert plain.downweighted.size == 0
    assert "Huber" in robust.solver


# --- allocation of the refined path ------------------------------------------------------------------------


_peak = peak_bytes


def _solve_fn(kind, n, kw):
    rng = np.random.default_rng(n)
    ws = Workspace(n)
    if kind == "base":
        sc = base_frame_scene(n, rng, noise_mm=0.05, noise_deg=0.02)
        return lambda: calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws, **kw)
    if kind == "hand_eye":
        sc = hand_eye_scene(n, rng, noise_mm=0.05, noise_deg=0.02)
        return lambda: calibrate_hand_eye(sc.base_T_flange, sc.measured, workspace=ws, **kw)
    if kind == "eye_to_hand":
        sc = hand_eye_scene(n, rng, noise_mm=0.05, noise_deg=0.02)
        X = make_transform(random_rotation(rng), [1.0, 0.2, 0.5])
        O = np.array([se3_inverse(X) @ g @ sc.X for g in sc.base_T_flange])
        return lambda: calibrate_eye_to_hand(sc.base_T_flange, O, workspace=ws, **kw)
    if kind == "points":
        sc = base_frame_scene(n, rng)
        p = (sc.X @ sc.base_T_flange @ np.array([0.0, 0.05, 0.1, 1.0]))[:, :3] + rng.normal(scale=2e-5, size=(n, 3))
        return lambda: calibrate_base_frame_points(sc.base_T_flange, p, workspace=ws, **kw)
    G, _, _ = pivot_scene(n, rng, noise_mm=0.05)
    return lambda: calibrate_tool_point(G, workspace=ws, **kw)


@pytest.mark.parametrize(
    "kind, kw",
    [
        ("base", {}),
        ("base", dict(huber=2.0)),
        ("base", dict(refine=False)),  # covariance and held-out closure at the linear answer
        ("base", dict(refine=False, uncertainty=False)),  # held-out closure without the covariance
        ("hand_eye", {}),
        ("eye_to_hand", {}),
        ("points", {}),
        ("points", dict(refine=False)),
        ("tool", {}),
    ],
)
def test_refined_solve_with_holdout_allocates_nothing_that_grows_with_n(kind, kw):
    peaks = {n: _peak(_solve_fn(kind, n, kw)) for n in (10, 5000)}
    assert peaks[5000] <= peaks[10] + 6 * 1024, peaks
    assert peaks[5000] < 64 * 1024, peaks
