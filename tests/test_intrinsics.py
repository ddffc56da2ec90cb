"""calibrate_intrinsics: OpenCV's answer on the same detections, honest sigmas, refusals, warnings."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE, board_pose, synthetic_views

from cellcal.solver import (
    InsufficientCoverage,
    InsufficientTilt,
    NotEnoughSamples,
    calibrate_intrinsics,
)
from cellcal.solver.camera_model import project
from cellcal.solver.se3 import se3_inverse, so3_log

CRIT = (cv2.TERM_CRITERIA_COUNT + cv2.TERM_CRITERIA_EPS, 500, 1e-15)


def _opencv(views, flags=0):
    obj = [TARGET.corner_points(ids).astype(np.float32) for ids, _ in views]
    img = [p.astype(np.float32) for _, p in views]
    rms, K, d, rvecs, tvecs, sd_intr, _sd_ext, per_view = cv2.calibrateCameraExtended(
        obj, img, SIZE, None, None, flags=flags, criteria=CRIT)
    params = np.array([K[0, 0], K[1, 1], K[0, 2], K[1, 2], *d.ravel()[:5]])
    return rms, params, sd_intr.ravel()[:9], per_view.ravel(), rvecs, tvecs


@pytest.fixture(scope="module")
def fifteen():
    views, poses = synthetic_views(np.random.default_rng(0), 15, noise_px=0.1)
    return views, poses, calibrate_intrinsics(views, TARGET, SIZE)


def test_same_answer_and_sigmas_as_opencv(fifteen):
    views, poses, r = fifteen
    rms, p_cv, sd_cv, per_view_cv, rvecs, tvecs = _opencv(views)
    assert r.converged
    # the same minimum: camera matrix to 1e-3 px, distortion to 1e-5 (the noise moves them
    # by about 0.7 px and 1e-2: two estimators of one likelihood, not two answers)
    np.testing.assert_allclose(r.parameters[:4], p_cv[:4], atol=1e-3)
    np.testing.assert_allclose(r.parameters[4:], p_cv[4:], atol=1e-5)
    # ours converges a little further (OpenCV stops on its own parameter-change test)
    assert r.reprojection_rms_px == pytest.approx(rms, rel=1e-5) and r.reprojection_rms_px <= rms * (1 + 1e-9)
    np.testing.assert_allclose(r.view_rms_px, per_view_cv, rtol=1e-4)
    # OpenCV's standard deviations come from the same Fisher information and noise estimate
    np.testing.assert_allclose(r.sigmas, sd_cv, rtol=1e-4)
    for k, (rv, tv) in enumerate(zip(rvecs, tvecs, strict=True)):
        np.testing.assert_allclose(r.camera_T_target[k, :3, 3], tv.ravel(), atol=1e-6)
        np.testing.assert_allclose(so3_log(r.camera_T_target[k, :3, :3]), rv.ravel(), atol=1e-6)
    # and both are right: the truth is within the (honest, next test file) covariance
    assert r.nees(TRUE) < 27.9  # chi2_9 at 99.9 %
    assert r.camera_matrix.shape == (3, 3) and r.dist_coeffs.shape == (5,) and r.image_size == SIZE


def test_fixing_k3_is_opencvs_fix_k3():
    views, _ = synthetic_views(np.random.default_rng(1), 10, noise_px=0.1,
                               params=np.r_[TRUE[:8], 0.0])
    r = calibrate_intrinsics(views, TARGET, SIZE, fix=("k3",))
    _rms, p_cv, sd_cv, *_ = _opencv(views, flags=cv2.CALIB_FIX_K3)
    np.testing.assert_allclose(r.parameters, p_cv, atol=1e-5 * 900)
    assert r.parameters[8] == 0.0 and r.covariance[8, 8] == 0.0 and r.fixed == ("k3",)
    np.testing.assert_allclose(r.sigmas[:8], sd_cv[:8], rtol=1e-4)


def test_calibrate_camera_charuco_where_bound(fifteen):
    views, _poses, r = fifteen
    if not hasattr(cv2.aruco, "calibrateCameraCharuco"):
        # removed from the main module in OpenCV 4.7 (board.matchImagePoints + calibrateCamera
        # is its replacement, which the test above compares with)
        assert tuple(int(x) for x in cv2.__version__.split(".")[:2]) >= (4, 7)
        return
    board = cv2.aruco.CharucoBoard((TARGET.squares_x, TARGET.squares_y), TARGET.square_m, TARGET.marker_m,
                                   cv2.aruco.getPredefinedDictionary(cv2.aruco.DICT_5X5_100))
    corners = [p.astype(np.float32).reshape(-1, 1, 2) for _, p in views]
    ids = [i.astype(np.int32).reshape(-1, 1) for i, _ in views]
    _rms, K, d, *_ = cv2.aruco.calibrateCameraCharuco(corners, ids, board, SIZE, None, None, criteria=CRIT)
    np.testing.assert_allclose(r.camera_matrix, K, atol=1e-3)


def test_result_keeps_every_corner_and_its_figures(fifteen):
    views, poses, r = fifteen
    n = sum(ids.size for ids, _ in views)
    assert r.n_corners == n == len(r.residuals) and r.residuals.residuals_px.shape == (n, 2)
    assert r.views == tuple(range(15)) and r.views_dropped == ()
    # residual = detection - reprojection, recomputable from the result
    v = r.residuals.view
    pred = project(r.parameters, r.camera_T_target[v], TARGET.corner_points(r.residuals.ids)).uv
    np.testing.assert_allclose(r.residuals.image_points_px - pred, r.residuals.residuals_px, atol=1e-9)
    rad, radial = r.residuals.radial_px(r.camera_matrix)
    assert rad.shape == radial.shape == (n,) and np.all(np.abs(radial) <= r.residuals.norm_px + 1e-12)
    assert 0.09 < r.noise_px < 0.11 and r.noise_source == "estimated"
    assert r.dof == 2 * n - 9 - 6 * 15
    assert r.coverage.fraction > 0.5 and r.coverage.occupied.shape == (10, 10)
    assert r.holdout.method == "k-fold refit" and r.holdout.folds == 5
    assert 0.95 < r.holdout.inflation < 1.3 and np.all(np.isfinite(r.holdout.view_rms_px))
    # each view's pose near the truth, within its covariance's reach
    for k, T in enumerate(poses):
        d = se3_inverse(r.camera_T_target[k]) @ T
        assert np.linalg.norm(d[:3, 3]) < 6 * np.sqrt(np.trace(r.camera_T_target_covariance[k][:3, :3]))
    assert not [w for w in r.warnings if w.code in ("holdout", "noise", "outliers", "not_converged")]


def test_declared_noise_is_tested():
    views, _ = synthetic_views(np.random.default_rng(2), 8, noise_px=0.3)
    honest = calibrate_intrinsics(views, TARGET, SIZE, noise_px=0.3, holdout_folds=0)
    assert honest.noise_source == "declared" and honest.noise_p_value > 0.005
    assert "noise" not in {w.code for w in honest.warnings}
    wrong = calibrate_intrinsics(views, TARGET, SIZE, noise_px=0.1, holdout_folds=0)
    warn = next(w for w in wrong.warnings if w.code == "noise")
    assert warn.value == pytest.approx(3.0, rel=0.15)
    np.testing.assert_allclose(wrong.parameters, honest.parameters)  # weights equal: same answer
    np.testing.assert_allclose(wrong.sigmas, honest.sigmas / 3.0)


def test_too_few_views_are_refused_with_their_count():
    views, _ = synthetic_views(np.random.default_rng(3), 3)
    views[2] = (views[2][0][:4], views[2][1][:4])  # 4 corners: dropped
    with pytest.raises(NotEnoughSamples, match="2 station.* at least 3") as exc:
        calibrate_intrinsics(views, TARGET, SIZE)
    assert (exc.value.n_given, exc.value.n_required) == (2, 3)


def test_dropped_views_are_named_and_results_indexed_by_the_callers_order():
    views, _ = synthetic_views(np.random.default_rng(4), 6)
    views.insert(1, (np.array([0, 1, 2]), np.zeros((3, 2)) + 100.0))
    r = calibrate_intrinsics(views, TARGET, SIZE, holdout_folds=0)
    assert r.views_dropped == (1,) and r.views == (0, 2, 3, 4, 5, 6)
    assert next(w for w in r.warnings if w.code == "views_dropped").value == 1.0


def test_fronto_parallel_views_are_refused_as_too_little_tilt():
    rng = np.random.default_rng(5)
    views, _ = synthetic_views(rng, 8, tilt_rad=0.0)
    with pytest.raises(InsufficientTilt, match=r"tilts \d\.\d deg \(RMS over 8 views\)") as exc:
        calibrate_intrinsics(views, TARGET, SIZE)
    # the figure comes from the start (homographies, no distortion yet), which the lens's
    # barrel distortion (k1 -0.25) tilts by a few degrees: still far from the 5 needed
    assert exc.value.tilt_deg < 4.0 and exc.value.required_deg == 5.0
    assert len(exc.value.view_tilt_deg) == 8 and max(exc.value.view_tilt_deg) < 10.0
    # a distortion-free lens: nearer the truth's 0 (the start's guessed focal length and
    # centred principal point still tilt the poses a little)
    views, _ = synthetic_views(rng, 8, tilt_rad=0.0, params=np.r_[TRUE[:4], np.zeros(5)])
    with pytest.raises(InsufficientTilt) as exc:
        calibrate_intrinsics(views, TARGET, SIZE)
    assert exc.value.tilt_deg < 2.0


def test_tilting_about_one_image_axis_only_is_refused():
    rng = np.random.default_rng(6)
    views = []
    for a in np.radians([-35, -20, 20, 35, -28, 28]):  # about the camera's x axis only
        T = board_pose([a, 0.0, 0.0], [rng.uniform(-0.05, 0.05), 0.0, 0.45])
        uv = project(TRUE, T, TARGET.corners_m).uv
        views.append((np.arange(TARGET.n_corners), uv + rng.normal(0, 0.1, uv.shape)))
    with pytest.raises(InsufficientTilt) as exc:
        calibrate_intrinsics(views, TARGET, SIZE)
    assert abs(exc.value.axis[0]) > 0.99  # the weak direction: tilting about y is missing
    assert max(exc.value.view_tilt_deg) > 30
    # the same views with a few tilted about y as well are accepted
    for b in np.radians([-30, 30]):
        T = board_pose([0.0, b, 0.0], [0.0, 0.0, 0.45])
        views.append((np.arange(TARGET.n_corners), project(TRUE, T, TARGET.corners_m).uv))
    assert calibrate_intrinsics(views, TARGET, SIZE, holdout_folds=0).tilt_deg > 5.0


def test_corners_in_the_middle_only_are_refused_as_too_little_coverage():
    views, _ = synthetic_views(np.random.default_rng(7), 8, lateral=(0.02, 0.02), depth=(1.2, 1.4))
    with pytest.raises(InsufficientCoverage, match=r"cover \d+% of the image") as exc:
        calibrate_intrinsics(views, TARGET, SIZE)
    assert exc.value.coverage < 0.25 and exc.value.grid == (10, 10)
    r = calibrate_intrinsics(views, TARGET, SIZE, min_coverage=0.05, holdout_folds=0)
    assert {"coverage", "edges"} <= {w.code for w in r.warnings}


def test_a_misdetected_corner_is_warned_with_its_view():
    views, _ = synthetic_views(np.random.default_rng(8), 8)
    views[3][1][5] += (6.0, -4.0)
    r = calibrate_intrinsics(views, TARGET, SIZE, holdout_folds=0)
    w = next(w for w in r.warnings if w.code == "outliers")
    # the bad corner pulls its view's pose, so a neighbour or two may cross the line too
    assert 1.0 <= w.value <= 4.0 and "views [3])" in w.message


def test_bad_input_names_the_view():
    views, _ = synthetic_views(np.random.default_rng(9), 4)
    bad = list(views)
    bad[2] = (bad[2][0], bad[2][1].copy())
    bad[2][1][0, 0] = np.nan
    with pytest.raises(ValueError, match="view 2: image points contain NaN"):
        calibrate_intrinsics(bad, TARGET, SIZE)
    bad[2] = (np.r_[views[2][0][:3], views[2][0][0]], views[2][1][:4])
    with pytest.raises(ValueError, match="view 2: a corner id appears twice"):
        calibrate_intrinsics(bad, TARGET, SIZE)
    bad[2] = (views[2][0], views[2][1][:-1])
    with pytest.raises(ValueError, match=r"view 2: image_points_px must have shape"):
        calibrate_intrinsics(bad, TARGET, SIZE)
    bad[2] = (views[2][0] + 1000, views[2][1])
    with pytest.raises(ValueError, match=r"view 2: corner ids must be in \[0, 54\)"):
        calibrate_intrinsics(bad, TARGET, SIZE)
    with pytest.raises(ValueError, match="fix: unknown parameter 'k4'"):
        calibrate_intrinsics(views, TARGET, SIZE, fix=("k4",))
    with pytest.raises(ValueError, match=r"fix: holding \['cx', 'cy'\] needs initial="):
        calibrate_intrinsics(views, TARGET, SIZE, fix=("cx", "cy"))


def test_a_fixed_principal_point_stays_where_it_is_put():
    views, _ = synthetic_views(np.random.default_rng(10), 8)
    start = np.r_[880.0, 880.0, 399.5, 299.5, np.zeros(5)]
    r = calibrate_intrinsics(views, TARGET, SIZE, fix=("cx", "cy"), initial=start, holdout_folds=0)
    assert r.parameters[2:4].tolist() == [399.5, 299.5] and np.all(r.sigmas[2:4] == 0.0)
    assert abs(r.parameters[0] - TRUE[0]) < 20.0  # the focal length absorbs the wrong centre, a little
