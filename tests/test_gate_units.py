"""The generic ``model_error`` gate compares like units or judges a test (issue 25 audit).

A camera-chain result's ``model_error`` warnings carry millimetres of robot correction or
pixels of an image field; ``[solve] max_model_error_mm`` is a length of a pose fit's
structured residual. Fed to :func:`cellcal.daemon.gates.check_gates` (the camera run kinds
use their own ``camera_gates``; any other caller must not be more lenient), a camera result
is judged by its tests: refused when they fired however large the mm limit, passed when they
did not, and the check says it is a test (unit ``bool``). Real solves of synthetic scenes
(``_hand_eye_views``): a clean arm, an arm with kinematic error (robot corrections, mm) and a
lens that is not the one held fixed (an image field, px).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE
from _hand_eye_views import kinematic_arm, scene

from cellcal.daemon.config import Solve
from cellcal.daemon.gates import check_gates
from cellcal.solver import calibrate_hand_eye_camera
from cellcal.solver.camera_model import CameraModel

CAM = CameraModel.from_parameters(TRUE, SIZE)
ONLY = dict(holdout=False, n_bootstrap=0, cross_check=False)
#: A limit no structured residual of these scenes comes near, read as a length: a gate that
#: took a warning's px or mm value for it would pass every one of them.
LENIENT = dataclasses.replace(Solve(), max_model_error_m=10e-3)


def _solve(case: str, seed: int = 5):
    rng = np.random.default_rng(seed)
    params = TRUE.copy()
    kw = {}
    if case == "arm":
        kw["kinematic_error"] = kinematic_arm(rng, joint_deg=0.05, link_mm=0.3)
    elif case == "lens":
        params[4] = -0.22  # k1 of the true lens; the solve holds TRUE's -0.25
    sc = scene("eye_in_hand", 12, rng, noise_px=0.1, robot_sd=(1e-5, 1.5e-5), params=params, **kw)
    return calibrate_hand_eye_camera(sc.views, TARGET, sc.G, intrinsics=CAM, noise_px=0.1, **ONLY)


@pytest.mark.parametrize("case", ["arm", "lens"])
def test_a_camera_results_model_error_is_a_test_not_a_length(case):
    r = _solve(case)
    warned = [w for w in r.warnings if w.code == "model_error"]
    assert r.camera_tests.model_error and warned
    # every warning's value is far inside the lenient limit read as mm: a length comparison would pass
    assert all(w.value is not None and w.value < LENIENT.max_model_error_m * 1e3 for w in warned)
    check = {c.name: c for c in check_gates(r, LENIENT).checks}["model_error"]
    assert check.unit == "bool" and check.value == 1.0 and not check.passed
    assert "judged as a test" in check.message and "max_model_error_mm = 10" in check.message
    assert all(w.message in check.message for w in warned)
    if case == "lens":
        assert any("px" in w.message for w in warned)  # the figure that must never be read as mm


def test_a_clean_camera_result_passes_the_test():
    r = _solve("clean")
    assert not r.camera_tests.model_error
    check = {c.name: c for c in check_gates(r, Solve()).checks}["model_error"]
    assert check.unit == "bool" and check.value == 0.0 and check.passed
    assert "noise only" in check.message


def test_allowed_model_error_is_no_check_for_camera_results_either():
    r = _solve("arm")
    allowed = dataclasses.replace(Solve(), allow_model_error=True)
    assert "model_error" not in {c.name for c in check_gates(r, allowed).checks}
