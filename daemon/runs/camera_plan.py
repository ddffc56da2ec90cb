"""The views a camera run visits: the robot turns the camera about its target, or the target
in front of the camera, for tilt and image coverage (ADR 0030).

Every camera kind plans from one **view pose** (``[camera.plan] view_q_deg``, or
``view_flange_xyz_mm`` + ``view_flange_quat_wxyz``, default ``[plan] home_q_deg``): the
robot pose at which the camera sees the target about centred, and from one **pivot**
(``[camera.plan] pivot_mm``, flange frame at the view pose): a point of the target, half a
metre along the flange's z for a camera on the flange (the target it looks at), 50 mm along
it for a target on the flange (its centre), unless given. View ``i`` is the flange at

    base_T_flange_i = base_T_view @ Trans(c) @ Rot(tilt_i, roll_i) @ Trans(-c) @ Trans(s_i)

with ``c`` the pivot, ``Rot`` a tilt about an axis across the view axis (up to
``max_tilt_deg``, its direction turning by the golden angle from view to view, so the tilts
spread over every image direction) times a roll about the view axis (up to
``max_roll_deg``), and ``s_i`` a shift in the turned flange frame: sideways up to
``max_shift_mm`` (the target moves across the image toward its edges and corners) and along
the view axis up to ``max_approach_mm`` (nearer and farther). Turning about a point of the
target keeps that point where the camera sees it, whichever of the two carries the camera; so
the same plan serves both mountings. The first view is the view pose itself. The sizes come
from a seeded Halton sequence (a deterministic function of the configuration); a view the
arm cannot reach within ``[plan]``'s joint limits is skipped for the next one.

:func:`predicted_tilt_deg` is the tilt figure of ``calibrate_intrinsics``'s refusal (ADR
0022: the RMS over the views of the target normal's tilt along its weakest image direction)
for the planned views, taking the target to face the camera at the view pose and the camera
to look along the pivot's direction; a kind refuses, before the first move, a plan whose
figure is below the solver's limit (``RunKind.check_plan``). Image coverage depends on the
lens, which the plan does not know: the solve judges it. :func:`extra_view` is the view a
hand-eye run adds when its solve finds the rotations sharing one axis (``RunKind.extra_station``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from cellcal.daemon.config import Config
from cellcal.daemon.runs.plan import PlanError, PlannedStation, joint_limits
from cellcal.drivers.kinematics import DHModel
from cellcal.solver.se3 import make_transform, matrix_from_quat, so3_exp, so3_log

__all__ = ["view_pose", "camera_views", "view_offsets", "predicted_tilt_deg", "optical_axis", "extra_view"]

_GOLDEN = math.pi * (3.0 - math.sqrt(5.0))
#: Candidate views drawn per view wanted before the plan gives up (unreachable ones skipped).
_DRAWS_PER_VIEW = 6


def _halton(i: int, base: int) -> float:
    f, r = 1.0, 0.0
    while i > 0:
        f /= base
        r += f * (i % base)
        i //= base
    return r


def view_pose(cfg: Config, model: DHModel) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(q_rad (6,), base_T_flange (4, 4))`` of the view pose (module docstring).

    Raises
    ------
    PlanError
        No ``[camera]`` section, or a view pose the arm cannot reach.
    """
    if cfg.camera is None:
        raise PlanError("a camera plan needs a [camera] section")
    p = cfg.camera.plan
    home = np.asarray(cfg.plan.home_q_rad, dtype=float)
    if p.view_q_rad:
        q = np.asarray(p.view_q_rad, dtype=float)
        return q, np.asarray(model.forward(q), dtype=float)
    if p.view_flange_xyz_m:
        T = make_transform(matrix_from_quat(np.asarray(p.view_flange_quat_wxyz, float)), np.asarray(p.view_flange_xyz_m))
        try:
            q = np.asarray(model.inverse(T, home), dtype=float)
        except ValueError as exc:
            raise PlanError(f"[camera.plan] view_flange_xyz_mm / view_flange_quat_wxyz: the {model.name} cannot reach "
                            f"it ({exc})") from None
        return q, T
    return home, np.asarray(model.forward(home), dtype=float)


def view_offsets(cfg: Config, n: int, start: int = 0) -> list[npt.NDArray[np.float64]]:
    """``view_T_flange`` (4, 4) of candidate views ``start .. start + n - 1`` (module
    docstring); candidate 0 is the view pose itself."""
    assert cfg.camera is not None
    p = cfg.camera.plan
    c = np.asarray(cfg.camera.pivot, dtype=float)
    axis = optical_axis(c)
    e1 = np.cross(axis, [1.0, 0.0, 0.0] if abs(axis[0]) < 0.9 else [0.0, 1.0, 0.0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(axis, e1)
    rng = np.random.default_rng(int(p.seed))
    shift = rng.uniform(0.0, 1.0, 5)  # a seeded Cranley-Patterson rotation of the Halton points
    out = []
    for i in range(start, start + n):
        if i == 0:
            out.append(np.eye(4))
            continue
        u = [(_halton(i, b) + s) % 1.0 for b, s in zip((2, 3, 5, 7, 11), shift, strict=True)]
        phi = _GOLDEN * i
        tilt = p.max_tilt_rad * (0.45 + 0.55 * u[0])
        roll = p.max_roll_rad * (2.0 * u[1] - 1.0)
        tilt_axis = math.cos(phi) * e1 + math.sin(phi) * e2
        R = so3_exp(tilt_axis * tilt) @ so3_exp(axis * roll)
        # sideways toward a direction that turns against the tilt's, so tilts and image
        # positions do not come in fixed pairs
        psi = -_GOLDEN * 2.0 * i + 2.0 * math.pi * u[2]
        side = p.max_shift_m * math.sqrt(u[3]) * (math.cos(psi) * e1 + math.sin(psi) * e2)
        along = p.max_approach_m * (2.0 * u[4] - 1.0) * axis
        orbit = make_transform(np.eye(3), c) @ make_transform(R, np.zeros(3)) @ make_transform(np.eye(3), -c)
        out.append(orbit @ make_transform(np.eye(3), side + along))
    return out


def optical_axis(pivot_m: Sequence[float] | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The direction the plan takes the camera to look along, in the flange frame: the
    pivot's (a pivot at the flange's origin: the flange's z)."""
    c = np.asarray(pivot_m, dtype=float).reshape(3)
    n = float(np.linalg.norm(c))
    return c / n if n > 1e-9 else np.array([0.0, 0.0, 1.0])


def camera_views(cfg: Config, model: DHModel) -> list[PlannedStation]:
    """The ``[camera.plan] n_views`` stations of a camera run (module docstring), with joints
    by the model's inverse kinematics from the view pose, in plan order.

    Raises
    ------
    PlanError
        Fewer reachable views than wanted (names what to change).
    """
    assert cfg.camera is not None
    n = int(cfg.camera.plan.n_views)
    q_view, T_view = view_pose(cfg, model)
    lim = joint_limits(q_view, cfg.plan.joint_min_rad, cfg.plan.joint_max_rad)
    stations: list[PlannedStation] = []
    seed = q_view
    tried = 0
    for D in view_offsets(cfg, n * _DRAWS_PER_VIEW):
        if len(stations) == n:
            break
        tried += 1
        T = T_view @ D
        try:
            q = np.asarray(model.inverse(T, seed, tol_m=1e-6, tol_rad=1e-6, max_iter=80), dtype=float)
        except ValueError:
            try:
                q = np.asarray(model.inverse(T, q_view, tol_m=1e-6, tol_rad=1e-6, max_iter=80), dtype=float)
            except ValueError:
                continue
        if np.any(q < lim[:, 0]) or np.any(q > lim[:, 1]):
            continue
        stations.append(PlannedStation(len(stations), q, np.asarray(model.forward(q), dtype=float)))
        seed = q
    if len(stations) < n:
        raise PlanError(f"only {len(stations)} of {n} camera views reachable in {tried} tries from the view pose: "
                        "reduce [camera.plan] max_tilt_deg, max_shift_mm or max_approach_mm, or move the view pose "
                        "nearer the middle of the arm's reach")
    return stations


def extra_view(cfg: Config, model: DHModel, axis: npt.NDArray[np.float64], frame: str, index: int, start: int,
               n_candidates: int = 60) -> PlannedStation | None:
    """A view that turns the flange about a direction across ``axis`` (the one the views so
    far share, ``DegenerateGeometry.axis``; ``frame`` ``"flange"`` or ``"base"``): of the
    candidate views ``start ..`` (:func:`view_offsets`, beyond the plan's), the reachable one
    whose rotation from the view pose has the largest part across ``axis``; None if none is
    reachable. Its ``index`` is ``index``."""
    q_view, T_view = view_pose(cfg, model)
    lim = joint_limits(q_view, cfg.plan.joint_min_rad, cfg.plan.joint_max_rad)
    a = np.asarray(axis, dtype=float).reshape(3)
    a = a / max(float(np.linalg.norm(a)), 1e-12)
    best: tuple[float, npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None
    for D in view_offsets(cfg, n_candidates, start=start):
        # the turn in the axis' frame: the flange's for a camera on it, the base's otherwise
        R = D[:3, :3] if frame == "flange" else T_view[:3, :3] @ D[:3, :3] @ T_view[:3, :3].T
        r = so3_log(R)
        across = float(np.linalg.norm(r - (r @ a) * a))
        if best is not None and across <= best[0]:
            continue
        try:
            q = np.asarray(model.inverse(T_view @ D, q_view, tol_m=1e-6, tol_rad=1e-6, max_iter=80), dtype=float)
        except ValueError:
            continue
        if np.any(q < lim[:, 0]) or np.any(q > lim[:, 1]):
            continue
        best = (across, q, np.asarray(model.forward(q), dtype=float))
    return None if best is None else PlannedStation(index, best[1], best[2])


def predicted_tilt_deg(cfg: Config, view_T_flange: Sequence[npt.NDArray[np.float64]]) -> tuple[float, npt.NDArray[np.float64]]:
    """The tilt figure of the refusal for views whose flange poses relative to the view pose
    are ``view_T_flange``, and the image direction it is weakest along (module docstring)."""
    assert cfg.camera is not None
    axis = optical_axis(cfg.camera.pivot)
    e1 = np.cross(axis, [1.0, 0.0, 0.0] if abs(axis[0]) < 0.9 else [0.0, 1.0, 0.0])
    e1 /= np.linalg.norm(e1)
    Rc = np.column_stack([e1, np.cross(axis, e1), axis])  # the camera frame, in the flange's
    normals = []
    for D in view_T_flange:
        R = np.asarray(D, dtype=float)[:3, :3]
        # The target's normal in the camera frame: turned by the flange's turn (the sign and
        # the direction of the turn do not change the figure).
        normals.append(Rc.T @ R @ Rc @ np.array([0.0, 0.0, 1.0]))
    n = np.array(normals)
    if n.shape[0] == 0:
        return 0.0, np.array([1.0, 0.0])
    nxy = n[:, :2]
    evals, evecs = np.linalg.eigh(nxy.T @ nxy / nxy.shape[0])
    weak = math.degrees(math.asin(min(1.0, math.sqrt(max(float(evals[0]), 0.0)))))
    return weak, evecs[:, 0]
