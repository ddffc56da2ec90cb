"""Eye-to-hand (robot-world / hand-eye, X O_i = G_i Y) under the solver contract."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from cellcal.solver import (
    CalibrationError,
    DegenerateGeometry,
    EyeToHandResult,
    NotEnoughSamples,
    Workspace,
    calibrate_base_frame,
    calibrate_eye_to_hand,
)
from cellcal.solver.se3 import make_transform, rotation_angle, se3_inverse, so3_exp
from cellcal.solver.synthetic import perturb, random_rotation


def t_err(A, B):
    return float(np.linalg.norm(A[:3, 3] - B[:3, 3]))


def r_err(A, B):
    return rotation_angle(A[:3, :3].T @ B[:3, :3])


def scene(n, rng, noise_mm=0.0, noise_deg=0.0):
    """Camera fixed at ``X = base_T_camera``, target on the flange at ``Y``."""
    X = make_transform(random_rotation(rng), rng.uniform(-2, 2, 3))
    Y = make_transform(random_rotation(rng), rng.uniform(-0.2, 0.2, 3))
    G = np.array([make_transform(random_rotation(rng), rng.uniform(-1, 1, 3)) for _ in range(n)])
    O = np.array([perturb(se3_inverse(X) @ g @ Y, rng, noise_mm, noise_deg) for g in G])
    return X, Y, G, O


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.integers(3, 30))
def test_noise_free_recovery_at_machine_precision(seed, n):
    X, Y, G, O = scene(n, np.random.default_rng(seed))
    try:
        r = calibrate_eye_to_hand(G, O)
    except DegenerateGeometry:
        assume(False)
    assume(r.axis_spread >= 1e-2)
    assert t_err(r.base_T_camera, X) < 1e-10 and r_err(r.base_T_camera, X) < 1e-10
    assert t_err(r.flange_T_target, Y) < 1e-10 and r_err(r.flange_T_target, Y) < 1e-10
    lin = calibrate_eye_to_hand(G, O, refine=False, holdout=False)
    assert t_err(lin.base_T_camera, X) < 1e-10 and r_err(lin.flange_T_target, Y) < 1e-10
    assert r.rms_translation_m < 1e-10 and isinstance(r, EyeToHandResult)


def test_it_shares_the_base_frame_solve():
    # X O_i = G_i Y is the base frame's M_i = X G_i Y' with the robot measured: the linear
    # answers must be exactly each other's.
    X, Y, G, O = scene(15, np.random.default_rng(50), 0.1, 0.05)
    e = calibrate_eye_to_hand(G, O, refine=False, holdout=False)
    b = calibrate_base_frame(O, G, refine=False, holdout=False)
    assert np.array_equal(e.base_T_camera, b.cell_T_base)
    assert np.allclose(e.flange_T_target, se3_inverse(b.flange_T_target), atol=1e-15)


def test_noise_residuals_are_in_the_camera_frame_and_refinement_helps():
    rng = np.random.default_rng(51)
    lin_e, ref_e = [], []
    for _ in range(10):
        X, Y, G, O = scene(20, rng, 0.2, 0.1)
        lin = calibrate_eye_to_hand(G, O, refine=False, holdout=False)
        ref = calibrate_eye_to_hand(G, O, holdout=False)
        lin_e.append(t_err(lin.base_T_camera, X))
        ref_e.append(t_err(ref.base_T_camera, X))
        # residuals: camera_T_target against inv(X) G Y, for both answers
        for r in (lin, ref):
            P = se3_inverse(r.base_T_camera) @ G @ r.flange_T_target
            assert np.allclose(r.residuals.translation_m, np.linalg.norm(O[:, :3, 3] - P[:, :3, 3], axis=1),
                               rtol=1e-9, atol=1e-15)
    assert np.median(ref_e) < np.median(lin_e)
    assert 0.1e-3 < np.median(ref_e) < 1e-3


def test_single_axis_flange_motion_is_degenerate_in_the_base_frame():
    rng = np.random.default_rng(52)
    X = make_transform(random_rotation(rng), [1.5, 0.3, 1.0])
    Y = make_transform(so3_exp([0.1, 0.2, 0.3]), [0.0, 0.05, 0.1])
    axis = np.array([0.0, 0.0, 1.0])
    G = np.array([make_transform(so3_exp(axis * rng.uniform(-2.5, 2.5)), rng.uniform(-0.5, 0.5, 3))
                  for _ in range(10)])
    O = np.array([se3_inverse(X) @ g @ Y for g in G])
    with pytest.raises(DegenerateGeometry) as ei:
        calibrate_eye_to_hand(G, O)
    e = ei.value
    assert e.frame == "base" and abs(abs(float(e.axis @ axis)) - 1.0) < 1e-9
    assert "eye-to-hand" in str(e) and any("camera" in u for u in e.unrecoverable)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_too_few_stations(n):
    X, Y, G, O = scene(3, np.random.default_rng(0))
    with pytest.raises(NotEnoughSamples) as ei:
        calibrate_eye_to_hand(G[:n], O[:n])
    assert isinstance(ei.value, CalibrationError) and ei.value.n_required == 3


def test_bad_input_names_the_station():
    X, Y, G, O = scene(8, np.random.default_rng(53))
    Ob = O.copy()
    Ob[6, 2, 1] = np.nan
    with pytest.raises(ValueError, match=r"camera_T_target\[6\]: contains NaN"):
        calibrate_eye_to_hand(G, Ob)
    Gb = G.copy()
    Gb[2, :3, 0] *= -1.0
    with pytest.raises(ValueError, match=r"base_T_flange\[2\]: rotation has determinant"):
        calibrate_eye_to_hand(Gb, O)
    with pytest.raises(ValueError, match="pair up"):
        calibrate_eye_to_hand(G, O[:7])
    std = np.full((8, 6), 1e-4)
    std[1, 0] = 0.0
    with pytest.raises(ValueError, match=r"camera_T_target_std\[1\]"):
        calibrate_eye_to_hand(G, O, camera_T_target_std=std)


def test_workspace_reuse_and_read_only_views():
    X, Y, G, O = scene(12, np.random.default_rng(54), 0.1, 0.05)
    ws = Workspace(20)
    a = calibrate_eye_to_hand(G, O, workspace=ws)
    with pytest.raises(ValueError):
        a.holdout.translation_m[0] = 0.0
    b = calibrate_eye_to_hand(G, O)
    assert np.allclose(a.base_T_camera, b.base_T_camera, atol=1e-14)
    assert a.base_T_camera_covariance.shape == (6, 6) and a.covariance.shape == (12, 12)
    assert a.sigma_rotation_deg < math.degrees(1e-3)


def test_linear_answer_without_uncertainty_still_reports_its_residuals():
    # The linear eye-to-hand answer reports the model's residuals in the camera frame; they
    # must not depend on whether the covariance was evaluated too.
    X, Y, G, O = scene(12, np.random.default_rng(7), 0.02, 0.01)
    fast = calibrate_eye_to_hand(G, O, refine=False, holdout=False, uncertainty=False)
    full = calibrate_eye_to_hand(G, O, refine=False, holdout=False)
    assert np.array_equal(fast.base_T_camera, full.base_T_camera)
    assert np.allclose(fast.residuals.translation_m, full.residuals.translation_m, rtol=1e-12, atol=0)
    assert np.allclose(fast.residuals.rotation_rad, full.residuals.rotation_rad, rtol=1e-12, atol=0)
    assert fast.rms_translation_m == pytest.approx(full.rms_translation_m, rel=1e-12)
    assert not np.any(np.isfinite(fast.covariance))
