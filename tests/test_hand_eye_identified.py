"""Hand-eye with a camera on an arm whose kinematics a tracker identified (slow; ADR 0027).

The arm of the kinematic-error tests (joints and links off the nominal model) is identified
first (``_hand_eye_views.IdentifiedArm``: 40 planned tracker stations, 0.02 mm / 0.01 deg);
the hand-eye then runs on the identified model's poses. Its answer is in that model's base
and flange frames (the gauge: what identification cannot tell from the base frame and the
target stays nominal), so it is judged against the truth moved into them. What the arm's
error cost on the nominal model (0.5-1 mm, ``bench/RESULTS.md``) becomes the repeatability's
order, inside the result's own covariance.
"""

from __future__ import annotations

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE
from _hand_eye_views import IdentifiedArm, scene

from cellcal.solver import _stats, calibrate_eye_to_hand_camera, calibrate_hand_eye_camera
from cellcal.solver._camera_chain import inverse_batch, log_batch
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.kinematics import UR5E
from cellcal.solver.se3 import se3_inverse

pytestmark = pytest.mark.slow

CAM = CameraModel.from_parameters(TRUE, SIZE)
SOLVE = {"eye_in_hand": calibrate_hand_eye_camera, "eye_to_hand": calibrate_eye_to_hand_camera}
ONLY = dict(holdout=False, n_bootstrap=0, cross_check=False)
Q99 = _stats.chi2_ppf(0.99, 12)


def _rms(e: np.ndarray) -> tuple[float, float]:
    return float(np.sqrt(np.mean(e[:, :3] ** 2))), float(np.sqrt(np.mean(e[:, 3:] ** 2)))


def test_the_identified_model_is_the_true_arm_in_its_gauge():
    arm = IdentifiedArm(np.random.default_rng(31))
    q = np.random.default_rng(32).uniform(-1.5, 1.5, (30, 6))
    true = arm.truth.forward(q)
    # the nominal model is off by the arm's error; the identified one, moved by the gauge, is not
    nominal_m, _ = _rms(log_batch(inverse_batch(UR5E.forward(q)) @ true))
    e = log_batch(inverse_batch(arm.result.model.forward(q)) @ se3_inverse(arm.gauge_base) @ true @ arm.gauge_flange)
    identified_m, identified_rad = _rms(e)
    assert nominal_m > 1e-4, nominal_m
    assert identified_m < 3e-5 and identified_rad < np.radians(0.005), (identified_m, identified_rad)
    assert identified_m < nominal_m / 5


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_hand_eye_on_identified_poses_is_accurate_and_inside_its_covariance(setup):
    trials = 10
    nees, raw, err_mm = [], [], []
    for t in range(trials):
        rng = np.random.default_rng(13000 + t)
        arm = IdentifiedArm(rng, joint_deg=0.05, link_mm=0.3)
        sc = scene(setup, 15, rng, noise_px=0.1, robot_sd=(1e-5, 1.5e-5), kinematic_error=arm)
        acc_m, acc_rad = _rms(log_batch(arm.reported_error(sc.G, sc.G_true)))
        r = SOLVE[setup](sc.views, TARGET, sc.G, intrinsics=CAM, robot_accuracy_m=acc_m, robot_accuracy_rad=acc_rad,
                         **ONLY)
        X, Z = arm.in_gauge(setup, sc.X, sc.Z)
        names = list(sc.truth)
        truth = {names[0]: X, names[1]: Z}
        nees.append(r.nees(truth))
        raw.append(r.nees(sc.truth))  # the true frames: not where the identified model's poses put it
        err_mm.append(1e3 * float(np.linalg.norm(r.transforms()[names[0]].value[:3, 3] - X[:3, 3])))
    nees = np.array(nees)
    assert np.median(err_mm) < 0.1, err_mm  # the nominal model's poses leave 0.5-1 mm on such arms
    assert nees.mean() < 12 + 3.3 * np.sqrt(24 / trials), nees
    assert np.mean(nees > Q99) <= 0.1, np.sort(nees)[-3:]
    assert np.median(raw) > Q99, raw  # the gauge is not a nicety
