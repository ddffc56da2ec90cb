"""Render -> detect -> calibrate: the simulated camera's images calibrated by ours and by OpenCV
on the same detections, against the simulator's truth; the robot's motion seen by the camera."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE, board_pose
from test_sim_camera import _cell

from cellcal.drivers.detect import TargetDetector
from cellcal.sim.camera import SimCamera
from cellcal.sim.robot_sim import SimRobot
from cellcal.sim.world import World
from cellcal.solver import calibrate_intrinsics
from cellcal.solver.camera_model import PARAMETER_NAMES

pytestmark = pytest.mark.slow


def _rendered_views(n, seed):
    rng = np.random.default_rng(seed)
    world, cam = _cell(read_noise_e=2.5)
    det = TargetDetector(TARGET)
    views = []
    while len(views) < n:
        T = board_pose(rng.normal(0.0, 0.4, 3), [rng.uniform(-0.1, 0.1), rng.uniform(-0.07, 0.07),
                                                 rng.uniform(0.33, 0.55)])
        world.set_flange(T)
        d = det.detect(cam.frame().image)
        if d.n_corners >= 12:
            views.append(d)
    return views


def test_rendered_views_calibrate_to_the_truth_and_to_opencvs_answer():
    views = _rendered_views(14, seed=11)
    r = calibrate_intrinsics(views, TARGET, SIZE)
    assert r.converged and not [w.code for w in r.warnings if w.code != "edges"]
    # the detector's sub-pixel error on these images is a few hundredths of a pixel
    assert r.reprojection_rms_px < 0.1
    obj = [d.object_points(TARGET).astype(np.float32) for d in views]
    img = [d.image_points_px.astype(np.float32) for d in views]
    crit = (cv2.TERM_CRITERIA_COUNT + cv2.TERM_CRITERIA_EPS, 500, 1e-15)
    _rms, K, dist, *_ = cv2.calibrateCamera(obj, img, SIZE, None, None, criteria=crit)
    p_cv = np.array([K[0, 0], K[1, 1], K[0, 2], K[1, 2], *dist.ravel()[:5]])
    np.testing.assert_allclose(r.parameters[:4], p_cv[:4], atol=1e-3)
    np.testing.assert_allclose(r.parameters[4:], p_cv[4:], atol=1e-5)
    # both are right: within a few of our sigmas of the truth (the rendered corners carry a
    # small bias of the detector's beside their noise, so "a few", not a chi-square bound)
    z = (r.parameters - TRUE) / r.sigmas
    assert np.all(np.abs(z) < 4.0), dict(zip(PARAMETER_NAMES, np.round(z, 2), strict=True))
    assert abs(r.parameters[0] - TRUE[0]) < 1.0 and abs(r.parameters[2] - TRUE[2]) < 1.0
    assert 0.9 < r.holdout.inflation < 1.4


def test_the_camera_sees_the_robot_where_its_motion_puts_it():
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4))
    robot = SimRobot(world)
    q0 = robot.physical_joints(world.now_s())[0]
    robot.command_joints(q0 + np.radians([20, -10, 15, 5, 10, 30]), max_speed_rad_s=1.0, max_accel_rad_s2=2.0)
    t = world.now_s() + 0.3  # mid-move, not yet written into the world by the robot's thread
    np.testing.assert_allclose(world.base_T_flange_at(t), robot.true_flange(t)[0], atol=1e-12)
    _, cam = _cell()
    T = SimCamera(world, cam.config).camera_T_target(t)  # the same camera, in the robot's world
    np.testing.assert_allclose(T, robot.flange_at(t), atol=1e-12)  # eye-to-hand at the cell origin
