"""Render -> detect -> hand-eye on the image, against the simulator's truth (slow; ADR 0027).

Both setups on the simulated camera's images (shot and read noise, lens blur), intrinsics
estimated jointly from the same images: the transforms within their sigmas of the truth,
OpenCV's five agreeing within the paired bootstrap's gate, the held-out views reprojecting
as the fitted ones, a tracker's view of the target closing; then frames taken while the arm
moves (exposed mid-motion, rendered with its blur) stamped 5 ms early: the latency recovered.
"""

from __future__ import annotations

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE
from _hand_eye_views import scene

from cellcal.drivers.detect import TargetDetector
from cellcal.sim.camera import CameraConfig, SimCamera
from cellcal.sim.world import World
from cellcal.solver import calibrate_eye_to_hand_camera, calibrate_hand_eye_camera, estimate_latency, tracker_check
from cellcal.solver._camera_chain import log_batch
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.se3 import make_transform, se3_exp, se3_inverse, so3_exp, so3_log

pytestmark = pytest.mark.slow

CAM = CameraModel.from_parameters(TRUE, SIZE)
SOLVE = {"eye_in_hand": calibrate_hand_eye_camera, "eye_to_hand": calibrate_eye_to_hand_camera}


def _cell(setup, sc, seed, **kw):
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4))  # base = cell
    if setup == "eye_in_hand":
        cfg = CameraConfig(camera=CAM, target=TARGET, mounting=setup, flange_T_camera=sc.X, cell_T_target=sc.Z, **kw)
    else:
        cfg = CameraConfig(camera=CAM, target=TARGET, mounting=setup, cell_T_camera=sc.X, flange_T_target=sc.Z, **kw)
    return world, SimCamera(world, cfg, seed=seed)


def _rendered(setup, n, seed):
    sc = scene(setup, n, np.random.default_rng(seed), robot_sd=(1e-5, 1.5e-5), min_corners=54)
    world, cam = _cell(setup, sc, seed)
    det = TargetDetector(TARGET)
    views = []
    for G in sc.G_true:
        world.set_flange(G)
        views.append(det.detect(cam.frame().image))
    return sc, views


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_rendered_views_calibrate_to_the_truth_and_every_check_agrees(setup):
    sc, views = _rendered(setup, 14, seed=21 if setup == "eye_in_hand" else 22)
    assert min(v.n_corners for v in views) >= 30  # a ChArUco corner near the edge may go unseen
    r = SOLVE[setup](views, TARGET, sc.G, image_size=SIZE, n_bootstrap=20, seed=1)
    assert r.converged and r.intrinsics_mode == "joint"
    assert not [w.code for w in r.warnings], [w.message for w in r.warnings]
    assert r.reprojection_rms_px < 0.1  # the detector's few hundredths of a pixel
    for name, T in sc.truth.items():
        e = r.transforms()[name]
        z = log_batch(se3_inverse(e.value) @ T) / np.sqrt(np.diag(e.covariance))
        assert np.all(np.abs(z) < 4.0), (name, np.round(z, 2))
    assert r.cross_check is not None and r.cross_check.agrees is True
    assert 0.9 < r.holdout_reprojection_rms_px / r.reprojection_rms_px < 1.4
    assert r.bootstrap is not None and 0.4 < r.bootstrap.sigma_ratio_translation < 2.0
    # the tracker sees reflectors on the board (eye-in-hand) or the flange's board (eye-to-hand)
    rng = np.random.default_rng(3)
    cell_T_base = se3_exp(np.array([1.4, -0.5, 0.1, 0.0, 0.0, -0.4]))
    sig = 2e-5
    if setup == "eye_in_hand":
        refl = TARGET.corners_m[[0, 8, 45, 53]]
        meas = (cell_T_base @ sc.Z @ np.c_[refl, np.ones(4)].T).T[:, :3] + rng.normal(0, sig, (4, 3))
        chk = tracker_check(r, meas, target_p=refl, cell_T_base=cell_T_base, tracker_noise_m=sig)
    else:
        p = TARGET.corners_m[22]
        meas = np.array([(cell_T_base @ g @ sc.Z @ np.r_[p, 1.0])[:3] for g in sc.G_true]) + rng.normal(0, sig, (14, 3))
        chk = tracker_check(r, meas, target_p=p, cell_T_base=cell_T_base, tracker_noise_m=sig, via="camera")
    assert chk.passed, (chk.p_value, chk.distances_m)


def test_the_latency_of_frames_exposed_while_moving_is_recovered():
    sc, views = _rendered("eye_in_hand", 12, seed=41)
    r = calibrate_hand_eye_camera(views, TARGET, sc.G, image_size=SIZE, n_bootstrap=0, holdout=False)
    world, cam = _cell("eye_in_hand", sc, 2, exposure_s=0.002)
    det = TargetDetector(TARGET)
    Gc = sc.G_true[0]
    passes = [(+1, 0.05), (-1, 0.05), (+1, 0.12), (-1, 0.12)]  # (direction, m/s): both ways, two speeds

    def traj(t):
        k = min(int(t // 1.0), 3)
        u = t - k - 0.5
        sgn, v = passes[k]
        M = make_transform(so3_exp(np.array([0.0, 0.0, sgn * 1.25 * v * u])), np.array([sgn * v * u, 0.3 * sgn * v * u, 0.0]))
        return M @ Gc

    world.set_flange_trajectory(traj)
    tau, h = 0.005, 1e-4
    frames, Gs, Vs = [], [], []
    for k in range(4):
        for u in (-0.3, -0.1, 0.1, 0.3):
            f = cam.frame(int(round(world.clock_s_at(k + 0.5 + u) * 1e9)))
            ts = f.t_mid_s - tau  # the robot state the frame was paired with: stamped 5 ms early
            a, b = traj(ts - h), traj(ts + h)
            Vs.append(np.r_[(b[:3, 3] - a[:3, 3]) / (2 * h), so3_log(b[:3, :3] @ a[:3, :3].T) / (2 * h)])
            Gs.append(traj(ts))
            frames.append(det.detect(f.image))
    est = estimate_latency(r, frames, np.array(Gs), np.array(Vs))
    assert abs(est.latency_ms - 5.0) < 4 * est.sigma_ms + 0.1, (est.latency_ms, est.sigma_ms)
    assert est.sigma_ms < 0.2 and [w.code for w in est.warnings] == ["latency"]
