"""The camera model: OpenCV's projection, analytic Jacobians by finite differences, undistortion."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from cellcal.solver.camera_model import (
    PARAMETER_NAMES,
    CameraModel,
    distort,
    project,
    undistort,
)
from cellcal.solver.se3 import make_transform, se3_exp, so3_exp

# a strongly barrel-distorted 8 mm lens (k1 -0.3) and a mild one with decentering
LENSES = [
    np.array([900.0, 905.0, 410.0, 295.0, -0.30, 0.12, 0.0008, -0.0005, -0.02]),
    np.array([2320.0, 2318.0, 1230.0, 1010.0, -0.08, 0.02, -0.0002, 0.0003, 0.0]),
]


def _scene(rng, n=40):
    T = make_transform(so3_exp(rng.normal(0, 0.4, 3)), np.array([0.03, -0.02, 0.55]))
    P = np.column_stack([rng.uniform(-0.15, 0.15, (n, 2)), rng.uniform(-0.02, 0.02, n)])
    return T, P


@pytest.mark.parametrize("params", LENSES)
def test_projection_is_opencvs(params):
    rng = np.random.default_rng(0)
    T, P = _scene(rng)
    K = np.array([[params[0], 0, params[2]], [0, params[1], params[3]], [0, 0, 1.0]])
    uv_cv, _ = cv2.projectPoints(P, cv2.Rodrigues(T[:3, :3])[0], T[:3, 3], K, params[4:])
    np.testing.assert_allclose(project(params, T, P).uv, uv_cv[:, 0], atol=1e-9)


@pytest.mark.parametrize("params", LENSES)
def test_jacobians_match_central_differences(params):
    rng = np.random.default_rng(1)
    T, P = _scene(rng)
    pr = project(params, T, P, jacobians=True)
    # steps relative to each parameter's scale: px for the camera matrix, unitless distortion
    for k, name in enumerate(PARAMETER_NAMES):
        h = 1e-4 if k < 4 else 1e-5
        d = np.zeros(9)
        d[k] = h
        num = (project(params + d, T, P).uv - project(params - d, T, P).uv) / (2 * h)
        np.testing.assert_allclose(pr.J_uv_intrinsics[..., k], num, rtol=1e-6, atol=1e-6, err_msg=name)
    for k in range(6):
        h = 1e-6
        d = np.zeros(6)
        d[k] = h
        num = (project(params, T @ se3_exp(d), P).uv - project(params, T @ se3_exp(-d), P).uv) / (2 * h)
        np.testing.assert_allclose(pr.J_uv_pose[..., k], num, rtol=1e-5, atol=1e-4, err_msg=f"pose {k}")
    for k in range(3):
        h = 1e-7
        d = np.zeros(3)
        d[k] = h
        num = (project(params, T, P + d).uv - project(params, T, P - d).uv) / (2 * h)
        np.testing.assert_allclose(pr.J_uv_point[..., k], num, rtol=1e-5, atol=1e-3, err_msg=f"point {k}")


def test_batched_over_views_and_corners_equals_one_by_one():
    rng = np.random.default_rng(2)
    params = LENSES[0]
    Ts = np.stack([_scene(rng)[0] for _ in range(3)])
    P = _scene(rng, 7)[1]
    batch = project(params, Ts[:, None], P[None], jacobians=True)
    assert batch.uv.shape == (3, 7, 2) and batch.J_uv_pose.shape == (3, 7, 2, 6)
    for v in range(3):
        one = project(params, Ts[v], P, jacobians=True)
        np.testing.assert_allclose(batch.uv[v], one.uv)
        np.testing.assert_allclose(batch.J_uv_intrinsics[v], one.J_uv_intrinsics)


def test_points_behind_the_camera_are_flagged_not_projected():
    T = np.eye(4)
    P = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, -1.0], [0.1, 0.0, 0.0]])
    pr = project(LENSES[0], T, P)
    assert pr.in_front.tolist() == [True, False, False]
    assert np.all(np.isfinite(pr.uv[0])) and np.all(np.isnan(pr.uv[1:]))


@pytest.mark.parametrize("params", LENSES)
def test_undistort_inverts_distort_to_the_bound(params):
    cam = CameraModel.from_parameters(params, (int(2 * params[2]), int(2 * params[3])))
    w, h = cam.image_size
    uv = np.stack(np.meshgrid(np.linspace(0, w - 1, 41), np.linspace(0, h - 1, 31)), axis=-1)
    xy, ok = undistort(params, uv)
    assert ok.all()
    np.testing.assert_allclose(distort(params, xy), uv, atol=1e-8)
    # agrees with OpenCV's iterative undistortion where that one converges well
    K, d = cam.camera_matrix, cam.dist_coeffs
    cv_xy = cv2.undistortPointsIter(uv.reshape(-1, 1, 2), K, d, None, None,
                                    (cv2.TERM_CRITERIA_COUNT | cv2.TERM_CRITERIA_EPS, 100, 1e-14))
    np.testing.assert_allclose(cv_xy.reshape(xy.shape), xy, atol=1e-6)


def test_undistort_refuses_pixels_past_the_fold():
    # k1 = -0.5: r_d = r (1 - 0.5 r^2) peaks at r = 0.816 (r_d = 0.544); a pixel farther out
    # than that has no ray: flagged, NaN, never a wrong ray
    params = np.array([1000.0, 1000.0, 0.0, 0.0, -0.5, 0.0, 0.0, 0.0, 0.0])
    uv = np.array([[300.0, 0.0], [540.0, 0.0], [600.0, 0.0], [0.0, 700.0]])
    xy, ok = undistort(params, uv)
    assert ok.tolist() == [True, True, False, False]
    assert np.all(np.isnan(xy[2:]))
    np.testing.assert_allclose(distort(params, xy[:2]), uv[:2], atol=1e-8)


def test_camera_model_validates_its_fields():
    K = np.array([[900.0, 0, 400], [0, 900, 300], [0, 0, 1]])
    cam = CameraModel(K, [0.1, 0.0, 0.0, 0.0], (800, 600))  # k3 omitted: 0
    assert cam.dist_coeffs.shape == (5,) and cam.parameters[8] == 0.0
    with pytest.raises(ValueError, match="no skew"):
        CameraModel(K + np.array([[0, 1.0, 0], [0, 0, 0], [0, 0, 0]]), np.zeros(5), (800, 600))
    with pytest.raises(ValueError, match="fx and fy"):
        CameraModel(np.diag([-1.0, 900, 1]), np.zeros(5), (800, 600))
    with pytest.raises(ValueError, match="image_size"):
        CameraModel(K, np.zeros(5), (800.0, 600))
    with pytest.raises(ValueError, match="dist_coeffs"):
        CameraModel(K, np.zeros(8), (800, 600))
