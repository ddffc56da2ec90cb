"""Synthetic hand-eye scenes for the camera-chain tests: exact projections plus noise.

Eye-in-hand: the board lies on the table in front of the robot (``base_T_target``), the camera
sits on the flange (``flange_T_camera``); each station puts the camera 0.3-0.55 m from the
board's centre, looking at a point near it from within ``cone_deg`` of the board's normal,
turned about its optical axis. Eye-to-hand: the camera stands fixed above the table
(``base_T_camera``) and each station holds the flange's board 0.35-0.6 m in front of it,
tilted within ``cone_deg`` and turned. Robot poses are the truth plus the repeatability's
noise (``robot_sd``: m and rad per axis, flange frame), or the truth seen through a wrong
kinematic model (``kinematic``: a callable ``q -> true base_T_flange`` beside the nominal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from _camera_views import SIZE, TARGET, TRUE

from cellcal.solver._camera_chain import correction_transforms
from cellcal.solver.camera_model import CameraModel, project
from cellcal.solver.se3 import make_transform, se3_exp, se3_inverse, so3_exp

X_EIH = se3_exp(np.array([0.04, -0.02, 0.06, 0.05, -0.03, 1.2]))  # flange_T_camera
Z_EIH = make_transform(np.diag([1.0, -1.0, -1.0]) @ so3_exp([0.0, 0.0, 0.3]), [0.45, -0.1, 0.02])  # base_T_target
X_ETH = make_transform(so3_exp([2.4, 0.0, 0.0]) @ so3_exp([0.0, 0.0, 0.2]), [0.55, 0.75, 0.55])  # base_T_camera
Y_ETH = se3_exp(np.array([-0.12, -0.08, 0.03, 0.0, 0.1, 0.2]))  # flange_T_target


@dataclass
class Scene:
    setup: str
    views: list  # (ids, image points)
    G: np.ndarray  # measured base_T_flange (N, 4, 4)
    G_true: np.ndarray
    O_true: np.ndarray  # camera_T_target (N, 4, 4)
    X: np.ndarray
    Z: np.ndarray
    params: np.ndarray

    @property
    def truth(self) -> dict:
        if self.setup == "eye_in_hand":
            return {"flange_T_camera": self.X, "base_T_target": self.Z}
        return {"base_T_camera": self.X, "flange_T_target": self.Y}

    @property
    def Y(self) -> np.ndarray:
        return self.Z


def _look_at(eye: np.ndarray, at: np.ndarray, roll: float, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """``frame_T_camera`` at ``eye`` with its optical axis (z) through ``at``, turned by ``roll``."""
    z = at - eye
    z /= np.linalg.norm(z)
    x = np.cross(np.asarray(up, float), z)
    if np.linalg.norm(x) < 1e-6:
        x = np.cross([1.0, 0.0, 0.0], z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    R = np.column_stack([x, y, z]) @ so3_exp([0.0, 0.0, roll])
    return make_transform(R, eye)


def _unit_cone(rng, axis: np.ndarray, cone_rad: float) -> np.ndarray:
    """A direction within ``cone_rad`` of ``axis`` (uniform on the cap)."""
    c = rng.uniform(math.cos(cone_rad), 1.0)
    a = rng.uniform(0, 2 * math.pi)
    s = math.sqrt(1 - c * c)
    local = np.array([s * math.cos(a), s * math.sin(a), c])
    z = axis / np.linalg.norm(axis)
    x = np.cross([0.3, 0.5, 0.8], z)
    x /= np.linalg.norm(x)
    return np.column_stack([x, np.cross(z, x), z]) @ local


def scene(setup: str, n: int, rng, *, noise_px: float = 0.0, robot_sd=(0.0, 0.0), params=TRUE, size=SIZE,
          target=TARGET, cone_deg: float = 35.0, max_roll_deg: float = 60.0, min_corners: int = 30,
          axis: np.ndarray | None = None, kinematic_error=None, distance_m=None) -> Scene:
    """``n`` views of the setup (module docstring). ``axis``: every camera (eye-in-hand) or
    board (eye-to-hand) rotation about this one base-frame axis only (degenerate)."""
    cam = CameraModel.from_parameters(params, size)
    centre = np.array([*(0.5 * np.asarray(target.size_m)), 0.0])
    views, G, Gt, Os = [], [], [], []
    tries = 0
    while len(views) < n:
        tries += 1
        if tries > 200 * n:
            raise RuntimeError("scene: too few visible views")
        if setup == "eye_in_hand":
            Zc = Z_EIH[:3, :3] @ centre + Z_EIH[:3, 3]
            normal = -Z_EIH[:3, 2]  # toward a viewer of the print
            if axis is None:
                d = _unit_cone(rng, normal, math.radians(cone_deg))
                eye = Zc + rng.uniform(*(distance_m or (0.3, 0.55))) * d
                at = Zc + rng.normal(0, 0.02, 3)
                base_T_cam = _look_at(eye, at, rng.uniform(-1, 1) * math.radians(max_roll_deg))
            else:
                ang = rng.uniform(-1, 1) * math.radians(cone_deg)
                R = so3_exp(np.asarray(axis, float) * ang)
                start = _look_at(Zc + 0.45 * normal, Zc, 0.0)
                base_T_cam = make_transform(R @ start[:3, :3], Zc + R @ (start[:3, 3] - Zc))
            Gi = base_T_cam @ se3_inverse(X_EIH)
            O = se3_inverse(Gi @ X_EIH) @ Z_EIH
        else:
            if axis is None:
                d = rng.uniform(*(distance_m or (0.35, 0.6)))
                p_cam = np.array([rng.uniform(-0.06, 0.06), rng.uniform(-0.05, 0.05), d])
                facing = _unit_cone(rng, np.array([0.0, 0.0, -1.0]), math.radians(cone_deg))  # board normal toward camera
                zt = -facing  # target z points away from the viewer
                xt = np.cross([0.0, 1.0, 0.0], zt)
                xt /= np.linalg.norm(xt)
                roll = rng.uniform(-1, 1) * math.radians(max_roll_deg)
                Rt = np.column_stack([xt, np.cross(zt, xt), zt]) @ so3_exp([0, 0, roll])
                O = make_transform(Rt, p_cam - Rt @ centre)
            else:
                ang = rng.uniform(-1, 1) * math.radians(cone_deg)
                ax_cam = X_ETH[:3, :3].T @ np.asarray(axis, float)
                R = so3_exp(ax_cam * ang)
                O = make_transform(R, np.array([0.0, 0.0, 0.45]) - R @ centre)
            Gi = X_ETH @ O @ se3_inverse(Y_ETH)
        Gm = Gi
        if kinematic_error is not None:  # the controller says Gi; the arm is where its true kinematics put it
            got = kinematic_error(Gm)
            if got is None:
                continue
            # an IdentifiedArm also says what its identified model reports for those joints
            Gi, Gm = got if isinstance(got, tuple) else (got, Gm)
        Otrue = se3_inverse(Gi @ X_EIH) @ Z_EIH if setup == "eye_in_hand" else se3_inverse(X_ETH) @ Gi @ Y_ETH
        uv = project(params, Otrue, target.corners_m).uv
        ok = cam.in_image(uv, margin_px=2.0) & np.all(np.isfinite(uv), axis=1)
        if ok.sum() < min_corners:
            continue
        ids = np.flatnonzero(ok)
        views.append((ids, uv[ids] + rng.normal(0.0, noise_px, (ids.size, 2)) if noise_px else uv[ids].copy()))
        if robot_sd[0] or robot_sd[1]:
            c = np.r_[rng.normal(0, robot_sd[0], 3), rng.normal(0, robot_sd[1], 3)]
            Gm = Gm @ correction_transforms(c[None])[0]
        G.append(Gm)
        Gt.append(Gi)
        Os.append(Otrue)
    X, Z = (X_EIH, Z_EIH) if setup == "eye_in_hand" else (X_ETH, Y_ETH)
    return Scene(setup, views, np.array(G), np.array(Gt), np.array(Os), X, Z, np.asarray(params, float))


def _true_arm(rng, joint_deg: float, link_mm: float):
    """(true DH arm, ``nominal base_T_flange -> joints`` by the nominal inverse kinematics, or None)."""
    from cellcal.drivers.kinematics import dh_model
    from cellcal.solver.kinematics import UR5E

    truth = UR5E.with_errors(delta_theta=rng.normal(0, math.radians(joint_deg), 6),
                             delta_a=rng.normal(0, link_mm * 1e-3, 6), delta_d=rng.normal(0, link_mm * 1e-3, 6),
                             delta_alpha=rng.normal(0, math.radians(joint_deg), 6))
    nominal = dh_model("ur5e")
    seeds = [np.array([0.0, -1.6, 1.6, -1.6, -1.6, 0.0]), np.array([0.8, -1.2, 1.2, -1.6, -1.6, 0.0]),
             np.array([-0.8, -1.2, 1.2, -1.6, -1.6, 0.0]), np.array([1.6, -1.6, 1.6, -1.6, -1.6, 0.0])]

    def joints(G):
        for q0 in seeds:
            try:
                return nominal.inverse(G, q0)
            except ValueError:
                continue
        return None

    return truth, joints


def kinematic_arm(rng, *, joint_deg: float = 0.03, link_mm: float = 0.2):
    """``nominal base_T_flange -> true base_T_flange`` of a UR5e whose true kinematics differ
    from the nominal model by seeded joint-zero and link errors (1-sigma ``joint_deg``,
    ``link_mm``; the order of a factory-calibrated arm's residual, ADR 0015): the joints the
    nominal inverse kinematics gives for the pose, through the true arm. None if unreachable."""
    truth, joints = _true_arm(rng, joint_deg, link_mm)

    def true_pose(G):
        q = joints(G)
        return None if q is None else truth.forward(q)[0]

    return true_pose


class IdentifiedArm:
    """The arm of :func:`kinematic_arm` after a tracker identified its kinematics.

    A laser tracker measures a 6-DoF target on the flange at ``n_stations`` planned stations
    (``plan_identification_stations``; noise ``noise_m`` / ``noise_rad`` per axis, as the
    tracker cells of the tests), and :func:`cellcal.solver.identify_kinematics` fits the arm
    with ``cell_T_base`` and the target. Called with a nominal command ``G`` it returns
    ``(true base_T_flange, what the identified model reports for those joints)``, or None.

    The identified model lives in its own gauge: the parameters it cannot tell from the base
    frame or the target (``joint1.zero_offset``, the last row, ...) stay nominal, so its
    base and flange frames are the true ones moved by fixed transforms,
    ``identified(q) = inv(gauge_base) @ true(q) @ gauge_flange``, with
    ``gauge_base = inv(true cell_T_base) @ identified cell_T_base`` and ``gauge_flange =
    true flange_T_target @ inv(identified flange_T_target)``. A hand-eye result computed from
    the identified poses estimates the truth in that gauge (:meth:`in_gauge`), which is the
    one the cell uses them in (through the identified model and base frame).
    """

    def __init__(self, rng, *, joint_deg: float = 0.03, link_mm: float = 0.2, n_stations: int = 40,
                 noise_m: float = 2e-5, noise_rad: float = math.radians(0.01)):
        from cellcal.solver.identify import identify_kinematics
        from cellcal.solver.kinematic_planning import plan_identification_stations
        from cellcal.solver.kinematics import UR5E

        self.truth, self._joints = _true_arm(rng, joint_deg, link_mm)
        cell_T_base = make_transform(so3_exp([0.0, 0.0, 0.4]), [2.0, 0.3, 0.1])  # tracker 2 m away
        flange_T_target = make_transform(np.eye(3), [0.05, 0.0, 0.12])
        plan = plan_identification_stations(UR5E, n_stations, cell_T_base=cell_T_base, flange_T_target=flange_T_target,
                                            rng=rng)

        def measure(q):
            c = np.c_[rng.normal(0, noise_m, (len(q), 3)), rng.normal(0, noise_rad, (len(q), 3))]
            return cell_T_base @ self.truth.forward(q) @ flange_T_target @ correction_transforms(c)

        self.result = identify_kinematics(plan.q, UR5E, cell_T_target=measure(plan.q), noise_translation_m=noise_m,
                                          noise_rotation_rad=noise_rad, validation_q=plan.validation_q,
                                          validation_cell_T_target=measure(plan.validation_q))
        self.gauge_base = se3_inverse(cell_T_base) @ self.result.cell_T_base
        self.gauge_flange = flange_T_target @ se3_inverse(self.result.flange_T_target)

    def __call__(self, G):
        q = self._joints(G)
        return None if q is None else (self.truth.forward(q)[0], self.result.model.forward(q))

    def in_gauge(self, setup: str, X: np.ndarray, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The scene's true ``(X, Z)`` (``flange_T_camera, base_T_target`` or ``base_T_camera,
        flange_T_target``) in the identified model's base and flange frames."""
        if setup == "eye_in_hand":
            return se3_inverse(self.gauge_flange) @ X, se3_inverse(self.gauge_base) @ Z
        return se3_inverse(self.gauge_base) @ X, se3_inverse(self.gauge_flange) @ Z

    def reported_error(self, G: np.ndarray, G_true: np.ndarray) -> np.ndarray:
        """``inv(reported) @ truth`` in the identified gauge, (N, 4, 4): what is left of the
        arm's error once its kinematics are identified."""
        return np.linalg.inv(G) @ se3_inverse(self.gauge_base) @ G_true @ self.gauge_flange
