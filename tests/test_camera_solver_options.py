"""The options record on the image solves (issue 23, item 5; ADR 0004 amendment of 2026-12-06).

``calibrate_hand_eye_camera``, ``calibrate_eye_to_hand_camera`` and ``calibrate_intrinsics``
take ``options=``: the same settings through the record or as keywords give the same result
bit for bit, a keyword overrides the record, the record's defaults leave the solves' own, a
field the solve cannot honour is refused by name, a field it has no use for is ignored.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE, synthetic_views
from _hand_eye_views import scene

from cellcal.solver import (
    DegenerateGeometry,
    SolverOptions,
    calibrate_eye_to_hand_camera,
    calibrate_hand_eye_camera,
    calibrate_intrinsics,
)
from cellcal.solver.camera_model import CameraModel

CAM = CameraModel.from_parameters(TRUE, SIZE)
SETUPS = ("eye_in_hand", "eye_to_hand")
SOLVE = {"eye_in_hand": calibrate_hand_eye_camera, "eye_to_hand": calibrate_eye_to_hand_camera}
FAST = dict(n_bootstrap=0, cross_check=False)
HAND_EYE_REFUSED = dict(refine=False, reject_k=4.0)
#: the tracker's noise in a cell's record: ignored by the image fits (one record serves a cell)
TRACKER_NOISE = dict(noise_translation_m=2e-5, noise_rotation_rad=1e-4)
INTRINSICS_REFUSED = dict(HAND_EYE_REFUSED, huber=3.0)


@pytest.fixture(scope="module", params=SETUPS)
def chain(request):
    setup = request.param
    sc = scene(setup, 8, np.random.default_rng(31), noise_px=0.2, robot_sd=(2e-5, 2e-5))
    return setup, sc


@pytest.fixture(scope="module")
def views():
    return synthetic_views(np.random.default_rng(32), 6, noise_px=0.1)[0]


def _solve(chain, **kw):
    setup, sc = chain
    return SOLVE[setup](sc.views, TARGET, sc.G, intrinsics=CAM, **FAST, **kw)


def _same(a, b):
    for name, est in a.transforms().items():
        assert np.array_equal(est.value, b.transforms()[name].value), name
    assert np.array_equal(a.covariance, b.covariance)
    assert np.array_equal(a.joint_covariance, b.joint_covariance)
    assert np.array_equal(a.robot_corrections, b.robot_corrections)
    assert a.iterations == b.iterations and a.noise_px == b.noise_px
    assert a.robot_accuracy_m == b.robot_accuracy_m
    assert [w.code for w in a.warnings] == [w.code for w in b.warnings]
    assert (a.holdout is None) == (b.holdout is None)


def _same_intrinsics(a, b):
    assert np.array_equal(a.parameters, b.parameters)
    assert np.array_equal(a.covariance, b.covariance)
    assert a.iterations == b.iterations and a.holdout.folds == b.holdout.folds
    assert np.array_equal(a.holdout.view_rms_px, b.holdout.view_rms_px, equal_nan=True)
    assert [w.code for w in a.warnings] == [w.code for w in b.warnings]


# -- the same settings, two ways -----------------------------------------------------------------


def test_a_default_record_is_no_record(chain, views):
    # the record's max_iterations default (20, the pose solves') leaves the image fit's 50,
    # its robot_accuracy_m None the camera's 0
    _same(_solve(chain, holdout=False), _solve(chain, options=SolverOptions(holdout=False)))
    _same(_solve(chain), _solve(chain, options=SolverOptions()))
    r = _solve(chain, options=SolverOptions(holdout=False))
    assert r.robot_accuracy_m == 0.0
    _same_intrinsics(calibrate_intrinsics(views, TARGET, SIZE),
                     calibrate_intrinsics(views, TARGET, SIZE, options=SolverOptions()))


def test_a_record_and_the_same_keywords_give_the_same_result(chain):
    acc = 3e-4  # the record's: 3-D RMS; the keyword's: 1-sigma per axis
    kw = dict(huber=3.0, holdout=False, max_iterations=7, robot_accuracy_m=acc / math.sqrt(3.0),
              min_axis_spread=1e-3, min_rotation_rad=1e-2, pairs="ring", translation="pairs", max_reach_m=2.0,
              max_target_offset_m=0.5)
    opts = SolverOptions(huber=3.0, holdout=False, max_iterations=7, robot_accuracy_m=acc, min_axis_spread=1e-3,
                         min_rotation_rad=1e-2, pairs="ring", translation="pairs", max_reach_m=2.0,
                         max_target_offset_m=0.5)
    a, b = _solve(chain, **kw), _solve(chain, options=opts)
    _same(a, b)
    assert b.robot_accuracy_m == acc / math.sqrt(3.0)
    assert "ring" in b.pose_level.solver and "pairs translation" in b.pose_level.solver


def test_intrinsics_record_and_keywords_give_the_same_result(views):
    _same_intrinsics(calibrate_intrinsics(views, TARGET, SIZE, holdout_folds=0, max_iterations=7),
                     calibrate_intrinsics(views, TARGET, SIZE, options=SolverOptions(holdout=False, max_iterations=7)))
    r = calibrate_intrinsics(views, TARGET, SIZE, options=SolverOptions(holdout=False))
    assert r.holdout.folds == 0


def test_fields_a_solve_has_no_use_for_are_ignored(chain, views):
    # one record serves the cell: the prior tolerances (no prior taken), the points' spread,
    # uncertainty (always computed), the tracker's declared noise; for the intrinsics the robot's and the AX=XB solve's too
    unused = dict(uncertainty=False, expected_tolerance_m=1e-3, expected_tolerance_rad=1e-3, min_point_spread=0.1,
                  **TRACKER_NOISE)
    _same(_solve(chain, holdout=False), _solve(chain, options=SolverOptions(holdout=False, **unused)))
    robot = dict(unused, pairs="star", translation="pairs", min_axis_spread=0.9, min_rotation_rad=1.0,
                 max_reach_m=0.01, max_target_offset_m=0.01, robot_accuracy_m=0.01)
    _same_intrinsics(calibrate_intrinsics(views, TARGET, SIZE, holdout_folds=0),
                     calibrate_intrinsics(views, TARGET, SIZE, options=SolverOptions(holdout=False, **robot)))


# -- precedence ----------------------------------------------------------------------------------


def test_a_keyword_overrides_the_record(chain):
    opts = SolverOptions(holdout=False, huber=3.0, max_iterations=7, robot_accuracy_m=3e-4, min_axis_spread=0.999)
    # the record reaches the AX=XB start: no data spread its axes that evenly
    with pytest.raises(DegenerateGeometry):
        _solve(chain, options=opts)
    r = _solve(chain, options=opts, holdout=True, huber=None, max_iterations=50, robot_accuracy_m=0.0,
               min_axis_spread=1e-4)
    _same(r, _solve(chain))
    assert r.holdout is not None


def test_intrinsics_keyword_overrides_the_record(views):
    opts = SolverOptions(holdout=False, max_iterations=7)
    r = calibrate_intrinsics(views, TARGET, SIZE, options=opts, holdout_folds=3, max_iterations=100)
    assert r.holdout.folds == 3
    _same_intrinsics(r, calibrate_intrinsics(views, TARGET, SIZE, holdout_folds=3))


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(HAND_EYE_REFUSED))
@pytest.mark.parametrize("setup", SETUPS)
def test_a_field_the_image_solve_cannot_honour_is_refused(setup, field):
    sc = scene(setup, 4, np.random.default_rng(33))
    opts = SolverOptions(**{field: HAND_EYE_REFUSED[field]})
    fn = SOLVE[setup].__name__
    with pytest.raises(ValueError, match=rf"{fn}\(\) cannot honour options\.{field}="):
        SOLVE[setup](sc.views, TARGET, sc.G, intrinsics=CAM, options=opts, **FAST)


@pytest.mark.parametrize("field", sorted(INTRINSICS_REFUSED))
def test_a_field_the_intrinsics_cannot_honour_is_refused(views, field):
    opts = SolverOptions(**{field: INTRINSICS_REFUSED[field]})
    with pytest.raises(ValueError, match=rf"calibrate_intrinsics\(\) cannot honour options\.{field}="):
        calibrate_intrinsics(views, TARGET, SIZE, options=opts)


def test_a_record_that_is_not_solver_options_is_a_type_error(chain, views):
    setup, sc = chain
    for bad in ({"huber": 3.0}, "huber=3"):
        with pytest.raises(TypeError, match=rf"{SOLVE[setup].__name__}\(\) options must be a SolverOptions"):
            SOLVE[setup](sc.views, TARGET, sc.G, intrinsics=CAM, options=bad, **FAST)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"calibrate_intrinsics\(\) options must be a SolverOptions"):
            calibrate_intrinsics(views, TARGET, SIZE, options=bad)  # type: ignore[arg-type]


def test_a_keyword_the_image_solve_cannot_use_is_a_type_error(chain, views):
    with pytest.raises(TypeError, match="unexpected keyword argument 'noise_translation_m'"):
        _solve(chain, noise_translation_m=2e-5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'hubr'"):
        _solve(chain, hubr=3.0)
    with pytest.raises(TypeError, match="huber"):
        calibrate_intrinsics(views, TARGET, SIZE, huber=3.0)  # type: ignore[call-arg]
