"""Synthetic corner detections for the intrinsics tests: a target seen from random poses.

Not a renderer: corners are projected by the camera model and given Gaussian noise, so the
tests of the estimator (agreement with OpenCV, NEES, refusals) are exact about what the noise
is. The rendered path (sim camera -> detector -> solver) has its own tests.
"""

from __future__ import annotations

import numpy as np

from cellcal.solver.camera_model import CameraModel, project
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.solver.target import CalibrationTarget

TARGET = CalibrationTarget(kind="charuco", squares_x=10, squares_y=7, square_m=0.025, marker_m=0.018,
                           dictionary="DICT_5X5_100")
SIZE = (800, 600)
TRUE = np.array([900.0, 905.0, 410.0, 295.0, -0.25, 0.08, 0.0005, -0.0003, 0.01])


def board_pose(rotvec, centre_xyz_m, target: CalibrationTarget = TARGET) -> np.ndarray:
    """``camera_T_target`` putting the board's centre at ``centre_xyz_m`` (camera frame),
    turned by the rotation vector ``rotvec`` (rad) from facing the camera."""
    R = so3_exp(np.asarray(rotvec, dtype=float))
    c = np.array([*(0.5 * np.asarray(target.size_m)), 0.0])
    return make_transform(R, np.asarray(centre_xyz_m, dtype=float) - R @ c)


def synthetic_views(rng, n, *, noise_px=0.1, params=TRUE, size=SIZE, target=TARGET, tilt_rad=0.35,
                    lateral=(0.12, 0.09), depth=(0.35, 0.6), min_corners=20):
    """``n`` views as (ids, image points) with their true poses."""
    cam = CameraModel.from_parameters(params, size)
    views, poses = [], []
    while len(views) < n:
        T = board_pose(rng.normal(0.0, tilt_rad, 3),
                       [rng.uniform(-lateral[0], lateral[0]), rng.uniform(-lateral[1], lateral[1]),
                        rng.uniform(*depth)], target)
        uv = project(params, T, target.corners_m).uv
        ok = cam.in_image(uv) & np.all(np.isfinite(uv), axis=1)
        if ok.sum() < min_corners:
            continue
        ids = np.flatnonzero(ok)
        views.append((ids, uv[ids] + rng.normal(0.0, noise_px, (ids.size, 2))))
        poses.append(T)
    return views, poses
