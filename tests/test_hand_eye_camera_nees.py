"""Honest covariance of the camera hand-eye over many seeded trials (slow; ADR 0027).

NEES of both transforms jointly (12 dimensions) against the truth of exact projections with
0.1 px of corner noise: with the robot at its declared repeatability (the mean in the
chi-square's band, few beyond its 99 % point, the 1 % false-alarm rate of ``model_error``
kept), and on arms with kinematic error (the true arm's joints and links off the nominal
model the poses come from), with the arm's accuracy declared. The absorbed-error factor was
chosen on other seeds and a smaller arm error (ADR 0027); these trials are held out from it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE
from _hand_eye_views import kinematic_arm, scene

from cellcal.solver import _stats, calibrate_eye_to_hand_camera, calibrate_hand_eye_camera
from cellcal.solver._camera_chain import inverse_batch, log_batch
from cellcal.solver.camera_model import CameraModel

pytestmark = pytest.mark.slow

CAM = CameraModel.from_parameters(TRUE, SIZE)
SOLVE = {"eye_in_hand": calibrate_hand_eye_camera, "eye_to_hand": calibrate_eye_to_hand_camera}
ONLY = dict(holdout=False, n_bootstrap=0, cross_check=False)
Q99 = _stats.chi2_ppf(0.99, 12)


def _band(trials: int, dof: int = 12, z: float = 3.3) -> tuple[float, float]:
    """Band of the mean of ``trials`` chi-square(dof) draws (normal approximation, ~99.9 %)."""
    sd = math.sqrt(2.0 * dof / trials)
    return dof - z * sd, dof + z * sd


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_nees_in_band_with_the_robot_at_its_repeatability(setup):
    trials = 60
    nees, alarms = [], 0
    for t in range(trials):
        rng = np.random.default_rng(7000 + t)
        sc = scene(setup, 12, rng, noise_px=0.1, robot_sd=(1e-5, 1.5e-5))
        r = SOLVE[setup](sc.views, TARGET, sc.G, intrinsics=CAM, noise_px=0.1, **ONLY)
        nees.append(r.nees(sc.truth))
        alarms += any(w.code == "model_error" for w in r.warnings)
    nees = np.array(nees)
    lo, hi = _band(trials)
    assert lo < nees.mean() < hi, nees.mean()
    assert np.mean(nees > Q99) <= 0.05
    assert alarms <= 3  # 1 % designed: 0.6 expected of 60, 3 is its 99.7 % point


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_nees_with_kinematic_error_and_the_arms_accuracy_declared(setup):
    trials = 24
    nees = []
    for t in range(trials):
        rng = np.random.default_rng(9000 + t)
        arm = kinematic_arm(rng, joint_deg=0.05, link_mm=0.3)
        sc = scene(setup, 20, rng, noise_px=0.1, robot_sd=(1e-5, 1.5e-5), kinematic_error=arm)
        # what the arm's accuracy test would state: its RMS pose error per axis over these poses
        e = log_batch(inverse_batch(sc.G) @ sc.G_true)
        acc_m, acc_rad = float(np.sqrt(np.mean(e[:, :3] ** 2))), float(np.sqrt(np.mean(e[:, 3:] ** 2)))
        r = SOLVE[setup](sc.views, TARGET, sc.G, intrinsics=CAM, robot_accuracy_m=acc_m, robot_accuracy_rad=acc_rad,
                         **ONLY)
        nees.append(r.nees(sc.truth))
    nees = np.array(nees)
    # the absorbed part is a declared bound, not a measurement: erring conservative is allowed,
    # optimistic is not
    assert 3.0 < nees.mean() < _band(trials)[1], nees.mean()
    assert np.mean(nees > Q99) <= 0.1, np.sort(nees)[-5:]


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_kinematic_error_undeclared_is_found_and_widens_the_covariance(setup):
    trials = 20
    nees, found = [], 0
    for t in range(trials):
        rng = np.random.default_rng(11000 + t)
        sc = scene(setup, 20, rng, noise_px=0.1, robot_sd=(1e-5, 1.5e-5),
                   kinematic_error=kinematic_arm(rng, joint_deg=0.05, link_mm=0.3))
        r = SOLVE[setup](sc.views, TARGET, sc.G, intrinsics=CAM, **ONLY)
        nees.append(r.nees(sc.truth))
        found += any(w.code == "model_error" for w in r.warnings)
    assert found == trials
    # without a declared accuracy the absorbed part is a guess from the visible one (twice it):
    # the median honest, a tail the data cannot bound (ADR 0027 says so)
    assert np.median(nees) < 2 * 12, np.median(nees)
    assert np.mean(np.array(nees) > Q99) <= 0.25
