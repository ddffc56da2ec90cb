"""Full measurement covariances (ADR 0004, "Weights"): a laser tracker's anisotropic noise,
built by :class:`cellcal.solver.TrackerNoiseModel`, used by the refinement.

Geometry: one fixed synthetic cell (20 stations, base 2 m from the tracker at the cell
origin, so every line of sight is oblique to the cell axes), noise from the ISO 10360-10
example MPEs read as k = 2 (radial 5.4 um, transverse 15 um at 2 m: a factor 2.8) and, for
the 6-DoF case, 0.005 deg of probe orientation. Noise is drawn from the model's own
covariances, 200 seeded trials per case.

* **Efficiency**: the full-covariance fit's mean squared error of ``cell_T_base``
  (translation and rotation separately) within 1.2x of the Cramer-Rao bound of the
  full-covariance model, which is built here by *finite differences* of the measurement
  model (not the solver's Jacobian). The MSE estimate over 200 trials of a 3-D error has a
  relative standard deviation of about ``sqrt(2 / (3 * 200)) = 5.8 %``, so 1.2 is 3.4 sigmas
  above an efficient estimator, and 0.85 (the lower bound asserted, which a bound that is
  too loose would break) 2.6 sigmas below.
* **Against per-axis figures**: the fit given only each station's per-cell-axis standard
  deviations (the diagonal of the same covariance) has a larger MSE (measured 1.3-1.5x the
  bound): the full covariance is what reaches the bound.
* The reported covariance is honest: mean NEES inside the chi-square 95 % band of 6 x 200.
"""

import math

import numpy as np
import pytest

from cellcal.solver import TrackerNoiseModel, Workspace, calibrate_base_frame, calibrate_base_frame_points
from cellcal.solver.se3 import se3_exp, se3_inverse, se3_log, so3_exp, so3_log
from cellcal.solver.synthetic import base_frame_scene

TRIALS = 200
Z975 = 1.959963984540054


def chi2_band(dof: int) -> tuple[float, float]:
    """Central 95 % interval of chi-square(dof) (Wilson-Hilferty)."""
    def q(z):
        return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return q(-Z975), q(Z975)


@pytest.fixture(scope="module")
def cell():
    rng = np.random.default_rng(7)
    sc = base_frame_scene(20, rng)
    tracker = TrackerNoiseModel.from_mpe(np.zeros(3), rotation_mpe_rad=math.radians(0.01))
    return sc, tracker, rng


def _fisher(J: np.ndarray, C: np.ndarray) -> np.ndarray:
    return np.einsum("nri,nrs,nsj->ij", J, np.linalg.inv(C), J)


def test_tracker_model_maps_mpe_to_sigma_and_beam_coordinates():
    t = TrackerNoiseModel.from_mpe([0.0, 0.0, 0.0])
    sr, st = t.stds(np.array([[3.0, 0.0, 0.0]]))
    assert sr[0] == pytest.approx((10e-6 + 3 * 0.3e-6) / 2) and st[0] == pytest.approx((15e-6 + 3 * 6e-6) / 2)
    p = np.array([[1.0, 2.0, 2.0]])  # range 3 m
    C = t.point_covariance(p)[0]
    u = p[0] / 3.0
    assert u @ C @ u == pytest.approx(sr[0] ** 2)  # along the beam: the radial figure
    v = np.cross(u, [0.0, 0.0, 1.0])
    v /= np.linalg.norm(v)
    assert v @ C @ v == pytest.approx(st[0] ** 2)  # across it: the transverse one
    rect = TrackerNoiseModel.from_mpe([0, 0, 0], coverage_factor=math.sqrt(3))
    assert rect.stds(p)[0][0] == pytest.approx(sr[0] * 2 / math.sqrt(3))
    with pytest.raises(ValueError, match="rotation_std_rad"):
        t.pose_covariance(np.eye(4)[None])
    with pytest.raises(ValueError, match="instrument"):
        t.point_covariance(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="transverse"):
        TrackerNoiseModel(cell_p_instrument=np.zeros(3), radial_std_m=1e-5, transverse_std_m=0.0)
    draws = t.sample(np.random.default_rng(0), np.repeat(p, 4000, axis=0))
    assert np.allclose(np.cov(draws.T), C, rtol=0.1, atol=0.1 * np.max(C))


def test_points_reach_the_bound_with_the_full_covariance_and_not_with_per_axis_figures(cell):
    sc, tracker, rng = cell
    G, X = sc.base_T_flange, sc.X
    y = np.array([0.02, 0.05, 0.12])
    p0 = (X @ G @ np.append(y, 1.0))[:, :3]
    C = tracker.point_covariance(p0)
    h = 1e-7
    J = np.empty((20, 3, 9))
    for k in range(9):
        e = np.zeros(9)
        e[k] = h
        plus = (X @ se3_exp(e[:6]) @ G @ np.append(y + e[6:], 1.0))[:, :3]
        minus = (X @ se3_exp(-e[:6]) @ G @ np.append(y - e[6:], 1.0))[:, :3]
        J[:, :, k] = (plus - minus) / (2 * h)
    crb = np.linalg.inv(_fisher(J, C))[:6, :6]
    L = np.linalg.cholesky(C)
    std = np.sqrt(np.diagonal(C, axis1=1, axis2=2))
    ws = Workspace(20)
    full, diag, nees = [], [], []
    for _ in range(TRIALS):
        p = p0 + np.einsum("nij,nj->ni", L, rng.normal(size=(20, 3)))
        r = calibrate_base_frame_points(G, p, cell_p_target_cov=C, holdout=False, workspace=ws)
        d = se3_log(se3_inverse(X) @ r.cell_T_base)
        full.append(d)
        nees.append(float(d @ np.linalg.solve(r.cell_T_base_covariance, d)))
        rd = calibrate_base_frame_points(G, p, cell_p_target_std=std, holdout=False, workspace=ws)
        diag.append(se3_log(se3_inverse(X) @ rd.cell_T_base))
    _check(np.array(full), np.array(diag), crb, np.array(nees))


def test_poses_reach_the_bound_with_the_full_covariance(cell):
    sc, tracker, rng = cell
    G, X, Y = sc.base_T_flange, sc.X, sc.Y
    M0 = X @ G @ Y
    C = tracker.pose_covariance(M0)

    def residual(P):  # in the covariance's convention: cell-frame dp and dphi (R = Exp(dphi) R0)
        rot = np.array([so3_log(P[i, :3, :3] @ M0[i, :3, :3].T) for i in range(20)])
        return np.concatenate([P[:, :3, 3] - M0[:, :3, 3], rot], axis=1)

    h = 1e-7
    J = np.empty((20, 6, 12))
    for k in range(12):
        e = np.zeros(12)
        e[k] = h
        J[:, :, k] = (residual(X @ se3_exp(e[:6]) @ G @ Y @ se3_exp(e[6:]))
                      - residual(X @ se3_exp(-e[:6]) @ G @ Y @ se3_exp(-e[6:]))) / (2 * h)
    crb = np.linalg.inv(_fisher(J, C))[:6, :6]
    L = np.linalg.cholesky(C)
    std = np.sqrt(np.diagonal(C, axis1=1, axis2=2))
    ws = Workspace(20)
    full, diag, nees = [], [], []
    for _ in range(TRIALS):
        z = np.einsum("nij,nj->ni", L, rng.normal(size=(20, 6)))
        M = M0.copy()
        M[:, :3, 3] += z[:, :3]
        for i in range(20):
            M[i, :3, :3] = so3_exp(z[i, 3:]) @ M0[i, :3, :3]
        r = calibrate_base_frame(G, M, cell_T_target_cov=C, holdout=False, workspace=ws)
        d = se3_log(se3_inverse(X) @ r.cell_T_base)
        full.append(d)
        nees.append(float(d @ np.linalg.solve(r.cell_T_base_covariance, d)))
        rd = calibrate_base_frame(G, M, cell_T_target_std=std, holdout=False, workspace=ws)
        diag.append(se3_log(se3_inverse(X) @ rd.cell_T_base))
    _check(np.array(full), np.array(diag), crb, np.array(nees))


def _check(full, diag, crb, nees):
    def ratio(e, a):
        return float(np.mean(np.sum(e[:, a] ** 2, axis=1)) / np.trace(crb[a, a]))

    t, r = slice(0, 3), slice(3, 6)
    rf, rd = (ratio(full, t), ratio(full, r)), (ratio(diag, t), ratio(diag, r))
    assert 0.85 <= rf[0] <= 1.2 and 0.85 <= rf[1] <= 1.2, rf
    assert rd[0] > 1.15 * rf[0] and rd[1] > 1.1 * rf[1], (rf, rd)
    lo, hi = chi2_band(6 * TRIALS)
    assert lo <= nees.sum() <= hi, nees.mean()


def test_full_covariance_validation_names_the_station():
    sc = base_frame_scene(6, np.random.default_rng(1))
    C = np.tile(np.eye(6) * 1e-8, (6, 1, 1))
    C[4, 0, 1] = 1.0  # not symmetric
    with pytest.raises(ValueError, match=r"cell_T_target_cov\[4\].*symmetric"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_cov=C)
    C = np.tile(np.eye(6) * 1e-8, (6, 1, 1))
    C[2, 5, 5] = -1e-8
    with pytest.raises(ValueError, match=r"cell_T_target_cov\[2\].*positive definite"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_cov=C)
    with pytest.raises(ValueError, match="shape"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_cov=np.zeros((6, 3, 3)))
    with pytest.raises(ValueError, match="not both"):
        calibrate_base_frame(sc.base_T_flange, sc.measured, cell_T_target_cov=np.tile(np.eye(6), (6, 1, 1)),
                             noise_translation_m=1e-4)
    with pytest.raises(ValueError, match=r"cell_p_target_cov\[0\]"):
        calibrate_base_frame_points(sc.base_T_flange, sc.measured[:, :3, 3],
                                    cell_p_target_cov=np.tile(np.full((3, 3), np.nan), (6, 1, 1)))


def test_sampled_poses_follow_the_pose_covariance_convention():
    """``sample_poses``: ``p' = p + dp``, ``R' = Exp(dphi) R`` with (dp, dphi) the returned
    draws, the covariance that of the true poses, and the draws' spread that covariance."""
    model = TrackerNoiseModel.from_mpe(np.array([3.0, 1.0, 0.5]), rotation_mpe_rad=math.radians(0.01))
    rng = np.random.default_rng(5)
    T = np.stack([se3_exp(np.r_[rng.uniform(-0.5, 0.5, 3), rng.uniform(-1.0, 1.0, 3)]) for _ in range(4000)])
    M, C, e = model.sample_poses(np.random.default_rng(6), T)
    assert M.shape == T.shape and C.shape == (4000, 6, 6) and e.shape == (4000, 6)
    assert np.allclose(C, model.pose_covariance(T))
    assert np.allclose(M[:, :3, 3] - T[:, :3, 3], e[:, :3], atol=1e-15)
    for k in (0, 1, 3999):
        assert np.allclose(so3_log(M[k, :3, :3] @ T[k, :3, :3].T), e[k, 3:], atol=1e-12)
    # whitened draws have unit covariance (4000 draws: each entry within 0.1)
    w = np.einsum("nij,nj->ni", np.linalg.inv(np.linalg.cholesky(C)), e)
    assert np.allclose(np.cov(w.T), np.eye(6), atol=0.1)
    with pytest.raises(ValueError, match="rotation_std_rad"):
        TrackerNoiseModel.from_mpe(np.array([3.0, 1.0, 0.5])).sample_poses(rng, T)
