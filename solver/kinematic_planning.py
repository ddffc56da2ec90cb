"""Station planning for kinematic identification: stations that make the arm observable.

:func:`plan_identification_stations` samples joint vectors within the joint limits, keeps
those whose flange is above the base plane (``min_height_m``) and whose target the tracker
sees (the line-of-sight cone of :mod:`cellcal.solver.planning`: the target's facing axis
within ``cone_deg`` of the direction to the tracker), and chooses ``n`` of them greedily for
**D-optimality** of the identification's whitened, column-normalised Jacobian (every DH
parameter the arm can reveal, with ``cell_T_base`` and the target: the unknowns of
:func:`~cellcal.solver.identify_kinematics`). Each step adds the candidate that most raises
``log det(J^T J)`` (the matrix determinant lemma over all candidates at once), from a small
ridge so that the first stations count. The Jacobian is evaluated with the nominal arm and
the approximate base and target given (planning needs no more precision than that).

Reported, as the literature names them (Borm and Menq; Nahvi and Hollerbach), on the
parameter columns with the base and target projected out:

* ``o1``: geometric mean of the singular values over ``sqrt(N)``; D-optimality's figure,
  comparable between plans of different sizes;
* ``o3``: the smallest singular value (the worst-determined combination of parameters);
* ``condition_number``: of the column-normalised Jacobian of everything estimated, the
  figure :func:`identify_kinematics` gates (100 by default).

Held-out validation stations (at least 30) are drawn at random from the feasible candidates
the plan did *not* choose, so they test the model where it was not fitted. A plan whose
joint limits fix a joint (``lo == hi``) still plans; its ``unidentifiable`` names what the
stations cannot determine, with the reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from cellcal.solver.identify import (
    _BASE_NAMES,
    _POINT_TOOL_NAMES,
    _POSE_TOOL_NAMES,
    DEFAULT_RANK_TOL,
    _cond,
    _normalise,
    _pivoted,
    _reasons,
    _still_columns,
    kinematic_jacobian,
    parameter_names,
)
from cellcal.solver.kinematics import N_JOINTS, DHParameters

__all__ = ["IdentificationPlan", "plan_identification_stations", "MIN_VALIDATION_STATIONS"]

#: Held-out stations a plan sets apart, at least.
MIN_VALIDATION_STATIONS = 30


@dataclass(frozen=True, kw_only=True)
class IdentificationPlan:
    """Planned identification and validation stations and what they determine.

    Attributes
    ----------
    q : numpy.ndarray, shape (n, 6)
        Fit stations, joint angles in rad.
    validation_q : numpy.ndarray, shape (m, 6)
        Held-out stations (never among ``q``), rad.
    parameters : tuple of str
        Parameters the fit stations determine (nominal arm).
    unidentifiable : tuple of str
        The others, with ``unidentifiable_reasons``.
    unidentifiable_reasons : dict of str to str
    o1, o3 : float
        Observability indices of the parameters (module docstring).
    condition_number : float
        Of the column-normalised Jacobian of everything estimated.
    n_candidates, n_feasible : int
        Joint vectors sampled, and those above the base plane and in line of sight.
    measurement : str
        ``"pose"`` or ``"point"``.
    """

    q: np.ndarray
    validation_q: np.ndarray
    parameters: tuple[str, ...]
    unidentifiable: tuple[str, ...]
    unidentifiable_reasons: dict[str, str]
    o1: float
    o3: float
    condition_number: float
    n_candidates: int
    n_feasible: int
    measurement: str


def _limits(joint_limits_rad: ArrayLike | None) -> np.ndarray:
    if joint_limits_rad is None:
        return np.tile([-math.pi, math.pi], (N_JOINTS, 1))
    lim = np.asarray(joint_limits_rad, dtype=np.float64)
    if lim.shape != (N_JOINTS, 2) or not np.all(np.isfinite(lim)) or np.any(lim[:, 1] < lim[:, 0]):
        raise ValueError(f"joint_limits_rad: expected ({N_JOINTS}, 2) finite (low, high) pairs with low <= high, "
                         f"got {np.shape(joint_limits_rad)}")
    return lim


def _observability(Jn: np.ndarray, n_frame: int, n: int) -> tuple[float, float]:
    Jf, Jp = Jn[:, :n_frame], Jn[:, n_frame:]
    if Jp.shape[1] == 0:
        return math.nan, math.nan
    Qf, _ = np.linalg.qr(Jf)
    s = np.linalg.svd(Jp - Qf @ (Qf.T @ Jp), compute_uv=False)
    return float(np.exp(np.mean(np.log(np.maximum(s, 1e-300)))) / math.sqrt(n)), float(s[-1])


def plan_identification_stations(
    model: DHParameters,
    n: int,
    *,
    n_validation: int = MIN_VALIDATION_STATIONS,
    measurement: str = "pose",
    cell_T_base: ArrayLike | None = None,
    flange_T_target: ArrayLike | None = None,
    flange_p_target: ArrayLike | None = None,
    cell_p_tracker: ArrayLike | None = None,
    cone_deg: float = 60.0,
    target_axis: ArrayLike = (0.0, 0.0, 1.0),
    joint_limits_rad: ArrayLike | None = None,
    min_height_m: float = 0.05,
    noise_translation_m: float = 20e-6,
    noise_rotation_rad: float = math.radians(0.005),
    n_candidates: int = 3000,
    rng: np.random.Generator | None = None,
) -> IdentificationPlan:
    """Choose ``n`` identification stations and ``n_validation`` held-out ones.

    Parameters
    ----------
    model : DHParameters
        The nominal arm.
    n : int
        Fit stations to choose.
    n_validation : int
        Held-out stations (at least :data:`MIN_VALIDATION_STATIONS`).
    measurement : {"pose", "point"}
        What the tracker measures (6-DoF probe or reflector).
    cell_T_base : array_like, shape (4, 4), optional
        Approximate base in the cell (default identity), m.
    flange_T_target, flange_p_target : array_like, optional
        Approximate target on the flange (defaults: 0.1 m along the flange z axis).
    cell_p_tracker : array_like, shape (3,), optional
        Tracker position in the cell for line of sight; None: no visibility check.
    cone_deg : float
        Line-of-sight cone half-angle about the target's ``target_axis`` (target frame).
    joint_limits_rad : array_like, shape (6, 2), optional
        ``(low, high)`` per joint (default ``+-pi``); ``low == high`` fixes a joint.
    min_height_m : float
        Stations whose target is lower than this above the base's xy plane are dropped.
    noise_translation_m, noise_rotation_rad : float
        Planning noise (weights translation against rotation).
    n_candidates : int
        Joint vectors sampled.
    rng : numpy.random.Generator, optional
        Seeded generator (default ``default_rng(0)``: the same plan every time).

    Returns
    -------
    IdentificationPlan

    Raises
    ------
    ValueError
        Bad arguments, or fewer feasible candidates than ``n + n_validation``.
    """
    if measurement not in ("pose", "point"):
        raise ValueError(f"measurement must be 'pose' or 'point', got {measurement!r}")
    if int(n) != n or n < 3:
        raise ValueError(f"n must be an integer >= 3, got {n!r}")
    if int(n_validation) != n_validation or n_validation < MIN_VALIDATION_STATIONS:
        raise ValueError(f"n_validation must be an integer >= {MIN_VALIDATION_STATIONS}, got {n_validation!r}")
    n, n_validation = int(n), int(n_validation)
    if not (0 < cone_deg <= 180) or not (noise_translation_m > 0 and noise_rotation_rad > 0):
        raise ValueError("cone_deg must be in (0, 180] and the planning noise positive")
    rng = np.random.default_rng(0) if rng is None else rng
    pose = measurement == "pose"
    lim = _limits(joint_limits_rad)
    base = np.eye(4) if cell_T_base is None else np.asarray(cell_T_base, dtype=np.float64)
    if base.shape != (4, 4):
        raise ValueError(f"cell_T_base: expected shape (4, 4), got {base.shape}")
    if pose:
        tool = np.eye(4) if flange_T_target is None else np.asarray(flange_T_target, dtype=np.float64)
        if flange_T_target is None:
            tool[2, 3] = 0.1
        if tool.shape != (4, 4):
            raise ValueError(f"flange_T_target: expected shape (4, 4), got {tool.shape}")
    else:
        tool = np.array([0.0, 0.0, 0.1]) if flange_p_target is None else np.asarray(flange_p_target, dtype=np.float64)
        if tool.shape != (3,):
            raise ValueError(f"flange_p_target: expected shape (3,), got {tool.shape}")
    q = rng.uniform(lim[:, 0], lim[:, 1], size=(int(n_candidates), N_JOINTS))
    bTf = model.forward(q)
    tool_T = tool if pose else np.block([[np.eye(3), tool[:, None]], [np.zeros((1, 3)), np.ones((1, 1))]])
    bTt = bTf @ tool_T
    ok = bTt[:, 2, 3] >= min_height_m
    if cell_p_tracker is not None:
        trk = np.asarray(cell_p_tracker, dtype=np.float64).reshape(3)
        cTt = np.einsum("ij,njk->nik", base, bTt)
        axis = np.asarray(target_axis, dtype=np.float64).reshape(3)
        axis = axis / np.linalg.norm(axis)
        facing = cTt[:, :3, :3] @ axis
        to_trk = trk - cTt[:, :3, 3]
        to_trk /= np.linalg.norm(to_trk, axis=1, keepdims=True)
        ok &= np.einsum("ni,ni->n", facing, to_trk) >= math.cos(math.radians(cone_deg))
    feas = np.flatnonzero(ok)
    if feas.size < n + n_validation:
        raise ValueError(f"only {feas.size} of {n_candidates} sampled joint vectors are above the base plane and "
                         f"in line of sight; {n + n_validation} needed (raise n_candidates or widen the limits)")
    qf = q[feas]
    names = parameter_names(model)
    P = len(names)
    r = 6 if pose else 3
    _, J = kinematic_jacobian(model, qf, names, base, tool)
    w = np.array([1 / noise_translation_m] * 3 + ([1 / noise_rotation_rad] * 3 if pose else []))
    Jw = J * w[None, :, None]
    Jw = np.concatenate([Jw[:, :, P:], Jw[:, :, :P]], axis=2)  # frames first
    n_frame = Jw.shape[2] - P
    # Structural dependencies (base and target folds, parallel-axis d): never in the design.
    Jn_all, scale = _normalise(Jw.reshape(-1, Jw.shape[2]))
    kept, _, _ = _pivoted(Jn_all, n_frame, DEFAULT_RANK_TOL)
    cols = sorted(kept)
    A = (Jw / scale[None, None, :])[:, :, cols] * math.sqrt(len(feas))  # unit columns over the pool: O(1) per row
    k = len(cols)
    M = 1e-6 * np.eye(k) * A.shape[0] / len(feas)
    chosen: list[int] = []
    avail = np.ones(len(feas), dtype=bool)
    for _ in range(n):
        Minv = np.linalg.inv(M)
        S = np.matmul(A @ Minv, A.transpose(0, 2, 1)) + np.eye(r)
        gain = np.linalg.slogdet(S)[1]
        gain[~avail] = -np.inf
        j = int(np.argmax(gain))
        chosen.append(j)
        avail[j] = False
        M = M + A[j].T @ A[j]
    rest = np.flatnonzero(avail)
    val = rng.choice(rest, size=n_validation, replace=False)
    q_fit, q_val = qf[chosen], qf[val]
    # What the chosen stations determine (as identify_kinematics will judge it).
    Jc = Jw[chosen].reshape(-1, Jw.shape[2])
    Jn, _ = _normalise(Jc)
    kept_c, dep_c, _ = _pivoted(Jn, n_frame, DEFAULT_RANK_TOL, deferred=_still_columns(q_fit, names, n_frame))
    est = [names[c - n_frame] for c in sorted(kept_c) if c >= n_frame]
    dep = [names[c - n_frame] for c in dep_c if c >= n_frame]
    W0 = np.diag(w)
    reasons = _reasons(model, names, dep, base, tool, pose, W0, n_frame, q_fit)
    sel = list(range(n_frame)) + [n_frame + names.index(p) for p in est]
    o1, o3 = _observability(Jn[:, sel], n_frame, n)
    frame_names = _BASE_NAMES + (_POSE_TOOL_NAMES if pose else _POINT_TOOL_NAMES)
    assert len(frame_names) == n_frame
    return IdentificationPlan(
        q=q_fit, validation_q=q_val, parameters=tuple(est), unidentifiable=tuple(dep),
        unidentifiable_reasons=reasons, o1=o1, o3=o3, condition_number=_cond(Jn[:, sel]),
        n_candidates=int(n_candidates), n_feasible=int(feas.size), measurement=measurement,
    )
