"""Uncertainty on every result: covariance conventions, 1-sigma figures,
predicted error at a task point (lever arm), checked against Monte Carlo."""

import math

import numpy as np
import pytest

from cellcal.solver import (
    PredictedError,
    Workspace,
    calibrate_base_frame,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver.se3 import make_transform, se3_exp, se3_inverse, se3_log, so3_exp
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, perturb, pivot_scene, random_rotation
from cellcal.solver.uncertainty import point_error, sigma_figures


def nees_band(dof_total):
    z = 1.959963984540054
    q = lambda s: dof_total * (1 - 2 / (9 * dof_total) + s * math.sqrt(2 / (9 * dof_total))) ** 3  # noqa: E731
    return q(-z), q(z)


def test_covariances_are_symmetric_positive_definite_and_sigmas_are_their_traces():
    sc = base_frame_scene(20, np.random.default_rng(30), noise_mm=0.1, noise_deg=0.05)
    r = calibrate_base_frame(sc.base_T_flange, sc.measured)
    for C in (r.covariance, r.cell_T_base_covariance, r.flange_T_target_covariance):
        assert np.allclose(C, C.T, rtol=1e-9, atol=0)
        assert np.linalg.eigvalsh(C)[0] > 0
    assert np.array_equal(r.cell_T_base_covariance, r.covariance[:6, :6])
    C = r.cell_T_base_covariance
    assert r.sigma_translation_mm == pytest.approx(1e3 * math.sqrt(np.trace(C[:3, :3])))
    assert r.sigma_rotation_deg == pytest.approx(math.degrees(math.sqrt(np.trace(C[3:, 3:]))))
    assert sigma_figures(C) == pytest.approx((r.sigma_translation_mm, r.sigma_rotation_deg))
    # Linear answers carry one too (the bound at that answer), and say they are not refined.
    lin = calibrate_base_frame(sc.base_T_flange, sc.measured, refine=False)
    assert not lin.refined and np.all(np.isfinite(lin.cell_T_base_covariance))


def test_point_error_formula_matches_sampling_the_covariance():
    rng = np.random.default_rng(31)
    T = make_transform(random_rotation(rng), [1.0, -0.5, 0.3])
    L = rng.normal(size=(6, 6))
    cov = L @ L.T * 1e-8
    p = np.array([0.4, -0.2, 0.9])
    pe = point_error(T, cov, p, "parent")
    xs = rng.multivariate_normal(np.zeros(6), cov, size=6000)
    pts = np.array([(T @ se3_exp(x) @ np.append(p, 1.0))[:3] for x in xs])
    emp = np.cov(pts.T)
    assert np.allclose(emp, pe.covariance_m2, rtol=0.05, atol=0.05 * np.max(np.abs(pe.covariance_m2)))
    assert pe.sigma_m == pytest.approx(math.sqrt(np.trace(pe.covariance_m2)))
    assert pe.lever_arm_m == pytest.approx(np.linalg.norm(p))
    assert pe.sigma_max_m <= pe.sigma_m


def test_predicted_error_grows_with_the_lever_arm():
    sc = base_frame_scene(20, np.random.default_rng(32), noise_mm=0.1, noise_deg=0.05)
    r = calibrate_base_frame(sc.base_T_flange, sc.measured)
    X = r.cell_T_base
    near = r.predicted_error_at(X[:3, 3])  # the base origin: only the translation error
    far = r.predicted_error_at((X @ np.array([0.0, 3.0, 0.0, 1.0]))[:3])
    assert isinstance(near, PredictedError) and near.frame == "base"
    assert near.lever_arm_m == pytest.approx(0.0, abs=1e-9)
    assert near.sigma_m == pytest.approx(r.sigma_translation_mm * 1e-3, rel=1e-9)
    assert far.sigma_m > near.sigma_m
    # |l x dphi| <= |l| |dphi|: bounded by translation + lever arm x rotation sigma.
    bound = near.sigma_m + far.lever_arm_m * math.radians(r.sigma_rotation_deg)
    assert far.sigma_m <= bound * (1 + 1e-9)
    sigma_m, *_ = far  # unpacks like a tuple
    assert sigma_m == far.sigma_m


def test_base_frame_task_point_error_agrees_with_monte_carlo():
    rng = np.random.default_rng(33)
    sc = base_frame_scene(15, rng)
    st, sr = 0.1e-3, math.radians(0.05)
    Mt = sc.X @ sc.base_T_flange @ sc.Y
    task_cell = (sc.X @ np.array([0.6, 0.8, 0.2, 1.0]))[:3]
    ws = Workspace(15)
    pts, preds = [], []
    for _ in range(300):
        M = np.array([perturb(m, rng, 0.1, 0.05) for m in Mt])
        r = calibrate_base_frame(sc.base_T_flange, M, workspace=ws, holdout=False,
                                 noise_translation_m=st, noise_rotation_rad=sr)
        pts.append(se3_inverse(r.cell_T_base)[:3, :3] @ task_cell + se3_inverse(r.cell_T_base)[:3, 3])
        preds.append(r.predicted_error_at(task_cell).covariance_m2)
    emp = np.cov(np.array(pts).T)
    pred = np.mean(preds, axis=0)
    assert np.trace(emp) / np.trace(pred) == pytest.approx(1.0, abs=0.15)


def _nees_trials(solve, truth_of, trials, rng):
    total, k = 0.0, 0
    for _ in range(trials):
        T_hat, cov = solve(rng)
        d = se3_log(se3_inverse(truth_of) @ T_hat)
        total += float(d @ np.linalg.solve(cov, d))
        k += 6
    return total, k


def test_hand_eye_covariance_of_the_inverted_unknown_is_consistent():
    # The refinement estimates inv(flange_T_camera); the reported covariance is mapped back
    # with the adjoint. A wrong map would show as a NEES far outside its band.
    rng = np.random.default_rng(34)
    sc = hand_eye_scene(15, rng)
    O0 = np.array([se3_inverse(g @ sc.X) @ sc.Y for g in sc.base_T_flange])
    st, sr = 0.1e-3, math.radians(0.05)
    ws = Workspace(15)

    def solve(rng):
        O = np.array([perturb(o, rng, 0.1, 0.05) for o in O0])
        r = calibrate_hand_eye(sc.base_T_flange, O, workspace=ws, holdout=False,
                               noise_translation_m=st, noise_rotation_rad=sr)
        return r.flange_T_camera, r.flange_T_camera_covariance

    total, k = _nees_trials(solve, sc.X, 200, rng)
    lo, hi = nees_band(k)
    assert lo <= total <= hi, total / k * 6


def test_eye_to_hand_covariance_is_consistent():
    rng = np.random.default_rng(35)
    sc = hand_eye_scene(15, rng)
    X = make_transform(random_rotation(rng), [1.2, 0.3, 0.8])  # base_T_camera
    Y = make_transform(so3_exp([0.2, -0.1, 0.3]), [0.0, 0.02, 0.12])
    O0 = np.array([se3_inverse(X) @ g @ Y for g in sc.base_T_flange])
    st, sr = 0.1e-3, math.radians(0.05)
    ws = Workspace(15)

    def solve(rng):
        O = np.array([perturb(o, rng, 0.1, 0.05) for o in O0])
        r = calibrate_eye_to_hand(sc.base_T_flange, O, workspace=ws, holdout=False,
                                  noise_translation_m=st, noise_rotation_rad=sr)
        return r.base_T_camera, r.base_T_camera_covariance

    total, k = _nees_trials(solve, X, 200, rng)
    lo, hi = nees_band(k)
    assert lo <= total <= hi, total / k * 6
    r = calibrate_eye_to_hand(sc.base_T_flange, O0, noise_translation_m=st, noise_rotation_rad=sr)
    pe = r.predicted_error_at([0.0, 0.0, 1.5])
    assert pe.frame == "base" and pe.lever_arm_m == pytest.approx(1.5)


def test_tool_tip_covariance_matches_its_scatter():
    rng = np.random.default_rng(36)
    tips = []
    covs = []
    for _ in range(300):
        G, tip, _ = pivot_scene(12, rng, noise_mm=0.1)
        r = calibrate_tool_point(G, holdout=False, noise_translation_m=0.1e-3)
        tips.append(r.flange_p_tip - tip)
        covs.append(r.flange_p_tip_covariance)
    emp = np.mean([np.outer(t, t) for t in tips], axis=0)
    pred = np.mean(covs, axis=0)
    assert np.trace(emp) / np.trace(pred) == pytest.approx(1.0, abs=0.15)
    pe = r.predicted_error_at()
    assert pe.frame == "flange" and pe.sigma_m == pytest.approx(r.sigma_translation_mm * 1e-3)
    # With the noise estimated instead, the figure is of the same size.
    est = calibrate_tool_point(G)
    assert est.noise_translation_m == pytest.approx(0.1e-3, rel=0.5)


def test_right_perturbation_convention_is_the_documented_one():
    # Shift the data by a known right perturbation of cell_T_base: the estimate moves by it.
    sc = base_frame_scene(20, np.random.default_rng(37))
    xi = np.array([1e-3, -2e-3, 0.5e-3, 2e-3, -1e-3, 3e-3])
    X2 = sc.X @ se3_exp(xi)
    M2 = X2 @ sc.base_T_flange @ sc.Y
    r = calibrate_base_frame(sc.base_T_flange, M2)
    assert np.allclose(se3_log(se3_inverse(sc.X) @ r.cell_T_base), xi, atol=1e-12)


def test_translation_covariance_lives_in_the_base_frame():
    # Tracker noise only along the cell's x axis: the base origin's error in the cell frame,
    # R_X Sigma_rho R_X^T (rho is in the base frame), must be (nearly) all along cell x.
    rng = np.random.default_rng(38)
    sc = base_frame_scene(20, rng)
    std = np.tile([0.2e-3, 1e-7, 1e-7, 1e-7, 1e-7, 1e-7], (20, 1))
    r = calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_std=std)
    R = r.cell_T_base[:3, :3]
    C_cell = R @ r.cell_T_base_covariance[:3, :3] @ R.T
    w, V = np.linalg.eigh(C_cell)
    assert abs(V[0, 2]) > 0.99 and w[1] < 1e-3 * w[2]
