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

:func:`information_views` chooses instead (``[camera.plan] planner = "information"``, for
the hand-eye kinds with stored intrinsics): of :data:`INFORMATION_CANDIDATES` times
``n_views`` reachable candidate views, the ``n_views`` whose image-level information
determines the camera transform best (``solver.camera_planning.plan_camera_stations`` on
them, the target transform and the intrinsics under their stored covariance marginalised),
ordered for short moves. It judges them on a drawing (:func:`approximate_transforms`): the
camera at the flange's origin looking along the pivot's direction (eye-in-hand) or looking
back at the board from where it spans half the image (eye-to-hand), the board centred on the
pivot facing it. The drawing's errors change the figures a little, not which views see the
board: they turn about the pivot whatever the true mounting.

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

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.runs.plan import PlanError, PlannedStation, joint_limits
from cellcal.drivers.kinematics import DHModel
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.camera_planning import plan_camera_stations
from cellcal.solver.se3 import make_transform, matrix_from_quat, so3_exp, so3_log
from cellcal.solver.target import CalibrationTarget

__all__ = ["view_pose", "camera_views", "information_views", "nominal_camera", "approximate_transforms", "view_offsets",
           "predicted_tilt_deg", "optical_axis", "extra_view", "PLANNER_INFORMATION", "PLANNER_VIEWS",
           "INFORMATION_CANDIDATES"]

_GOLDEN = math.pi * (3.0 - math.sqrt(5.0))
#: Candidate views drawn per view wanted before the plan gives up (unreachable ones skipped).
_DRAWS_PER_VIEW = 6
#: Reachable candidate views per view wanted that the information plan chooses among.
INFORMATION_CANDIDATES = 4
#: The plan's ``planner.name``: views chosen by the information they give the camera transform ...
PLANNER_INFORMATION = "information"
#: ... or the first reachable views (no intrinsics to judge them with before the run).
PLANNER_VIEWS = "views"


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


def _reachable(cfg: Config, model: DHModel, draws: int, stop_at: int | None = None) -> tuple[list[PlannedStation], int]:
    """The reachable ones of candidate views ``0 .. draws - 1`` (joints by the model's inverse
    kinematics from the previous reachable one, else from the view pose, within ``[plan]``'s
    limits), in draw order, up to ``stop_at`` of them; and the number drawn."""
    q_view, T_view = view_pose(cfg, model)
    lim = joint_limits(q_view, cfg.plan.joint_min_rad, cfg.plan.joint_max_rad)
    found: list[PlannedStation] = []
    seed = q_view
    tried = 0
    for D in view_offsets(cfg, draws):
        if stop_at is not None and len(found) == stop_at:
            break
        tried += 1
        q = _solve(model, T_view @ D, seed, q_view)
        if q is None or np.any(q < lim[:, 0]) or np.any(q > lim[:, 1]):
            continue
        found.append(PlannedStation(len(found), q, np.asarray(model.forward(q), dtype=float)))
        seed = q
    return found, tried


def _solve(model: DHModel, T: npt.NDArray[np.float64], seed: npt.NDArray[np.float64],
           q_view: npt.NDArray[np.float64]) -> npt.NDArray[np.float64] | None:
    """Joints reaching flange pose ``T`` from ``seed``, else from the view pose; None if neither."""
    for s0 in (seed, q_view):
        try:
            return np.asarray(model.inverse(T, s0, tol_m=1e-6, tol_rad=1e-6, max_iter=80), dtype=float)
        except ValueError:
            continue
    return None


def _too_few(n_found: int, n: int, tried: int) -> PlanError:
    return PlanError(f"only {n_found} of {n} camera views reachable in {tried} tries from the view pose: "
                     "reduce [camera.plan] max_tilt_deg, max_shift_mm or max_approach_mm, or move the view pose "
                     "nearer the middle of the arm's reach")


def camera_views(cfg: Config, model: DHModel) -> list[PlannedStation]:
    """The ``[camera.plan] n_views`` stations of a camera run (module docstring), with joints
    by the model's inverse kinematics from the view pose, in plan order: the first reachable
    candidate views.

    Raises
    ------
    PlanError
        Fewer reachable views than wanted (names what to change).
    """
    assert cfg.camera is not None
    n = int(cfg.camera.plan.n_views)
    found, tried = _reachable(cfg, model, n * _DRAWS_PER_VIEW, stop_at=n)
    if len(found) < n:
        raise _too_few(len(found), n, tried)
    return found


def approximate_transforms(cfg: Config, setup: str, T_view: npt.NDArray[np.float64], camera: CameraModel,
                           target: CalibrationTarget) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The drawing the information plan judges views with (module docstring): eye-in-hand
    ``(flange_T_camera, base_T_target)``, the camera at the flange's origin looking along the
    pivot's direction and the board centred on the pivot facing it; eye-to-hand
    ``(base_T_camera, flange_T_target)``, the board centred on the pivot facing along that
    direction and the camera looking back at it from the distance at which the board spans
    half the image's diagonal. Centimetres and degrees off do not matter: only the figures'
    sizes depend on them, not which views see the board (the views turn about the pivot)."""
    assert cfg.camera is not None
    c = np.asarray(cfg.camera.pivot, dtype=float)
    axis = optical_axis(c)
    e1 = np.cross(axis, [1.0, 0.0, 0.0] if abs(axis[0]) < 0.9 else [0.0, 1.0, 0.0])
    e1 /= np.linalg.norm(e1)
    Rc = np.column_stack([e1, np.cross(axis, e1), axis])  # a camera looking along the axis, flange frame
    centre = np.array([*(0.5 * np.asarray(target.size_m, dtype=float)), 0.0])
    if setup == "eye_in_hand":
        flange_T_camera = make_transform(Rc, np.zeros(3))
        Rt = T_view[:3, :3] @ Rc  # the board's z away from the camera, as it sees it
        base_T_target = make_transform(Rt, T_view[:3, :3] @ c + T_view[:3, 3] - Rt @ centre)
        return flange_T_camera, base_T_target
    flip = np.diag([1.0, -1.0, -1.0])
    Rt = Rc @ flip  # the board faces along the axis; its z points back into the flange
    flange_T_target = make_transform(Rt, c - Rt @ centre)
    f = float(np.mean(np.diag(camera.camera_matrix)[:2]))
    distance = f * float(np.hypot(*target.size_m)) / (0.5 * float(np.hypot(*camera.image_size)))
    # the camera turned as the board, on the far side of it: it sees the board's centre at
    # (0, 0, distance)
    base_T_camera = T_view @ make_transform(Rt, c + distance * axis)
    return base_T_camera, flange_T_target


def information_views(cfg: Config, model: DHModel, setup: str, camera: CameraModel, target: CalibrationTarget,
                      intrinsics_covariance: npt.NDArray[np.float64] | None = None,
                      ) -> tuple[list[PlannedStation], P.JsonObject]:
    """The ``n_views`` of :data:`INFORMATION_CANDIDATES` times as many reachable candidate
    views that determine the camera transform best (``solver.camera_planning.plan_camera_stations``
    on them: E-optimal on the image-level model's information with the board transform and
    the intrinsics marginalised, ordered for short moves), and the plan's figures.

    Raises
    ------
    PlanError
        Fewer reachable, or seen, candidates than views wanted.
    """
    assert cfg.camera is not None
    n = int(cfg.camera.plan.n_views)
    found, tried = _reachable(cfg, model, n * _DRAWS_PER_VIEW, stop_at=n * INFORMATION_CANDIDATES)
    if len(found) < n:
        raise _too_few(len(found), n, tried)
    q_view, T_view = view_pose(cfg, model)
    A, B = approximate_transforms(cfg, setup, T_view, camera, target)
    h = cfg.camera.hand_eye
    eih = setup == "eye_in_hand"
    lim = joint_limits(q_view, cfg.plan.joint_min_rad, cfg.plan.joint_max_rad)
    try:
        plan = plan_camera_stations(
            model.forward, lim, ([-1e3] * 3, [1e3] * 3), camera, target, setup, n,
            candidates_q_rad=np.array([s.q_rad for s in found]), q_seed_rad=q_view,
            margin_px=0.0, min_target_fraction=0.0, cone_deg=89.0, min_axis_spread=0.0,
            noise_px=h.noise_px or 0.1, intrinsics="known", intrinsics_covariance=intrinsics_covariance,
            robot_repeatability_m=h.robot_repeatability_m, robot_repeatability_rad=h.robot_repeatability_rad,
            flange_T_camera=A if eih else None, base_T_target=B if eih else None,
            base_T_camera=None if eih else A, flange_T_target=None if eih else B)
    except ValueError as exc:
        raise PlanError(f"the information plan of the camera views: {exc}") from None
    stations = [PlannedStation(i, np.asarray(q, dtype=float), np.asarray(G, dtype=float))
                for i, (q, G) in enumerate(zip(plan.q_rad, plan.base_T_flange, strict=True))]
    figures: P.JsonObject = {
        "name": PLANNER_INFORMATION, "n_candidates": len(found), "n_seen": int(plan.n_feasible),
        "predicted_sigma_translation_mm": float(plan.predicted_sigma_translation_mm),
        "predicted_sigma_rotation_deg": float(plan.predicted_sigma_rotation_deg),
        "weakest": plan.weakest_description, "axis_spread": float(plan.axis_spread)}
    return stations, figures


#: The nominal camera's 1-sigma when the intrinsics are estimated with the run: a datasheet
#: focal length is good to a few per cent, the principal point to a few per cent of the image,
#: a lens's radial distortion to about 0.1 (the plan marginalises them, as the solve estimates them).
NOMINAL_FOCAL_SHARE = 0.1
NOMINAL_CENTRE_SHARE = 0.05
NOMINAL_RADIAL = 0.1
NOMINAL_TANGENTIAL = 0.005


def nominal_camera(cfg: Config) -> tuple[CameraModel, npt.NDArray[np.float64]] | None:
    """The camera ``[camera.plan] focal_px`` and ``image_size_px`` describe (principal point at
    the image's centre, no distortion) and the loose covariance (9 x 9, ``PARAMETER_NAMES``
    order) the information plan judges views under when the intrinsics are estimated with the
    run; None when they are not set."""
    assert cfg.camera is not None
    p = cfg.camera.plan
    if not p.focal_px > 0.0 or len(p.image_size_px) != 2:
        return None
    f = float(p.focal_px)
    w, h = int(p.image_size_px[0]), int(p.image_size_px[1])
    K = np.array([[f, 0.0, 0.5 * w], [0.0, f, 0.5 * h], [0.0, 0.0, 1.0]])
    sd = np.array([NOMINAL_FOCAL_SHARE * f] * 2 + [NOMINAL_CENTRE_SHARE * w, NOMINAL_CENTRE_SHARE * h]
                  + [NOMINAL_RADIAL] * 2 + [NOMINAL_TANGENTIAL] * 2 + [NOMINAL_RADIAL])
    return CameraModel(K, np.zeros(5), (w, h)), np.diag(sd * sd)


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
