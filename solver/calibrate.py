"""The three calibrations of DESIGN.md section 3, on one shared AX=XB solve.

* :func:`calibrate_base_frame`: ``cell_T_target_i = cell_T_base @ base_T_flange_i @
  flange_T_target`` (seed 000). Motions ``A = M_j M_i^-1`` (cell frame),
  ``B = G_j G_i^-1`` (base frame), ``A X = X B`` with ``X = cell_T_base``.
* :func:`calibrate_hand_eye` (eye-in-hand): ``base_T_flange_i @ flange_T_camera @
  camera_T_target_i = base_T_target``. Motions ``A = G_j^-1 G_i`` (flange frame),
  ``B = O_j O_i^-1`` (camera frame), ``A X = X B`` with ``X = flange_T_camera``.
* :func:`calibrate_tool_point` (pivot): ``R_i p_tip + t_i = p_pivot``, solved through the
  Schur complement of its fixed 6x6 normal equations.

The first two differ only in which side each relative motion is taken on and in how the
constant edge is recovered afterwards; both run :func:`_solve_axxb`. The pivot shares the
workspace, the validation and the observability test. Every failure follows ADR 0002.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver import _core
from cellcal.solver.errors import DegenerateGeometry, NotEnoughSamples
from cellcal.solver.workspace import Workspace

__all__ = [
    "Residuals",
    "CalibrationResult",
    "BaseFrameResult",
    "HandEyeResult",
    "ToolPointResult",
    "calibrate_base_frame",
    "calibrate_hand_eye",
    "calibrate_tool_point",
    "DEFAULT_MIN_AXIS_SPREAD",
    "DEFAULT_MIN_ROTATION_RAD",
    "MIN_STATIONS",
]

#: Below this ``axis_spread`` the motions are refused as parallel (ADR 0002). A cone of
#: rotation axes with half-angle a has a spread of about 1.5 sin(a)^2: 1e-4 is a cone of
#: about 0.5 degrees, which tracker-grade noise (0.01-0.1 deg) already fills.
DEFAULT_MIN_AXIS_SPREAD = 1e-4
#: If no motion rotates more than this, nothing is determined (1 mrad = 0.057 deg).
DEFAULT_MIN_ROTATION_RAD = 1e-3
#: Two motions with non-parallel axes need three stations.
MIN_STATIONS = 3


@dataclass(frozen=True)
class Residuals:
    """Per-station closure of the fitted model.

    Attributes
    ----------
    translation_m : numpy.ndarray, shape (N,)
        Distance between the measured and the modelled position, metres.
    rotation_rad : numpy.ndarray, shape (N,)
        Angle between the measured and the modelled orientation, radians (zeros for the
        tool point, which has no orientation to close).

    Notes
    -----
    When the solve was given a ``workspace`` these are read-only views into it, valid until
    its next solve (that is what keeps a warmed-up solve allocation-free); copy them to keep.
    """

    translation_m: np.ndarray
    rotation_rad: np.ndarray

    def __len__(self) -> int:
        return int(self.translation_m.shape[0])

    def worst(self, k: int = 3) -> list[int]:
        """Indices of the ``k`` stations with the largest translation closure, worst first."""
        k = max(0, min(int(k), len(self)))
        return [int(i) for i in np.argsort(self.translation_m)[::-1][:k]]


@dataclass(frozen=True)
class CalibrationResult:
    """Figures every calibration reports.

    Attributes
    ----------
    n_stations : int
        Stations used.
    n_motions : int
        Motion pairs in the rotation solve (0 for the tool point, which uses stations).
    rms_translation_m, max_translation_m : float
        RMS and worst per-station translation closure, metres.
    rms_rotation_rad, max_rotation_rad : float
        RMS and worst per-station rotation closure, radians.
    axis_spread : float
        ``3 lambda_min(C) / trace(C)`` of the relative rotations, in [0, 1] (ADR 0002).
    weakest_axis : numpy.ndarray, shape (3,)
        Unit eigenvector of ``lambda_min(C)`` in ``axis_frame``: the direction the data
        determine least well.
    axis_frame : str
        Frame of ``weakest_axis``.
    max_motion_rad : float
        Largest relative rotation among the motions, radians.
    residuals : Residuals
        Per-station closure.
    solver : str
        Which solve produced the result, for provenance.
    """

    n_stations: int
    n_motions: int
    rms_translation_m: float
    max_translation_m: float
    rms_rotation_rad: float
    max_rotation_rad: float
    axis_spread: float
    weakest_axis: np.ndarray
    axis_frame: str
    max_motion_rad: float
    residuals: Residuals
    solver: str


@dataclass(frozen=True)
class BaseFrameResult(CalibrationResult):
    """Result of :func:`calibrate_base_frame`.

    Attributes
    ----------
    cell_T_base : numpy.ndarray, shape (4, 4)
        Robot base in the cell (tracker) frame, metres.
    flange_T_target : numpy.ndarray, shape (4, 4)
        Tracker target on the flange, metres.
    """

    cell_T_base: np.ndarray = None  # type: ignore[assignment]
    flange_T_target: np.ndarray = None  # type: ignore[assignment]


@dataclass(frozen=True)
class HandEyeResult(CalibrationResult):
    """Result of :func:`calibrate_hand_eye` (eye-in-hand).

    Attributes
    ----------
    flange_T_camera : numpy.ndarray, shape (4, 4)
        Camera on the flange, metres.
    base_T_target : numpy.ndarray, shape (4, 4)
        The static calibration target in the robot base frame, metres.
    """

    flange_T_camera: np.ndarray = None  # type: ignore[assignment]
    base_T_target: np.ndarray = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ToolPointResult(CalibrationResult):
    """Result of :func:`calibrate_tool_point` (pivot).

    Attributes
    ----------
    flange_p_tip : numpy.ndarray, shape (3,)
        Tool tip in the flange frame, metres.
    base_p_pivot : numpy.ndarray, shape (3,)
        The fixed pivot point in the base frame, metres.
    """

    flange_p_tip: np.ndarray = None  # type: ignore[assignment]
    base_p_pivot: np.ndarray = None  # type: ignore[assignment]


# --- shared plumbing ----------------------------------------------------------------------------


def _prepare(stacks: list[tuple[object, str]], workspace: Workspace | None, problem: str):
    arrays = [_core.as_stack(a, name) for a, name in stacks]
    n = arrays[0].shape[0]
    for a, (_, name) in zip(arrays[1:], stacks[1:]):
        if a.shape[0] != n:
            raise ValueError(
                f"{stacks[0][1]} has {n} stations but {name} has {a.shape[0]}: they must pair up"
            )
    if n < MIN_STATIONS:
        raise NotEnoughSamples(n, MIN_STATIONS, problem)
    ws = Workspace(n) if workspace is None else workspace
    ws.check(n)
    for a, (_, name) in zip(arrays, stacks):
        _core.validate_stack(a, name, ws)
    return arrays, n, ws


def _check_observable(
    obs: _core.Observability,
    *,
    frame: str,
    problem: str,
    what_rot: str,
    what_trans: str,
    min_axis_spread: float,
    min_rotation_rad: float,
) -> None:
    """Raise ``DegenerateGeometry`` per ADR 0002, else return."""
    if obs.max_rotation_rad < min_rotation_rad:
        raise DegenerateGeometry(
            f"{problem}: no motion rotates more than {math.degrees(obs.max_rotation_rad):.4g} deg "
            f"(threshold {math.degrees(min_rotation_rad):.4g} deg): neither rotation nor "
            f"translation can be recovered",
            axis=obs.axis,
            frame=frame,
            axis_spread=obs.axis_spread,
            unrecoverable=("rotation about every axis", "translation along every axis"),
            max_rotation_rad=obs.max_rotation_rad,
        )
    if obs.axis_spread < min_axis_spread:
        a = obs.axis
        raise DegenerateGeometry(
            f"{problem}: every motion rotates about (nearly) the same axis "
            f"[{a[0]:.4f}, {a[1]:.4f}, {a[2]:.4f}] in the {frame} frame "
            f"(axis_spread {obs.axis_spread:.3g} < {min_axis_spread:.3g}): {what_rot} about "
            f"that axis and {what_trans} along it cannot be recovered; add stations that "
            f"rotate about a different axis",
            axis=a,
            frame=frame,
            axis_spread=obs.axis_spread,
            unrecoverable=(f"{what_rot} about axis", f"{what_trans} along axis"),
            max_rotation_rad=obs.max_rotation_rad,
        )


def _residuals(ws: Workspace, n: int, owned: bool) -> Residuals:
    rt, rr = ws.res_t[:n], ws.res_r[:n]
    if not owned:
        # Views into a caller's workspace: read-only so nobody edits the next solve's buffer.
        rt, rr = rt.view(), rr.view()
        rt.flags.writeable = False
        rr.flags.writeable = False
    return Residuals(rt, rr)


TRANSLATION_MODES = ("stations", "pairs")


def _solve_axxb(
    TA: np.ndarray, side_A: str, TB: np.ndarray, side_B: str, n: int, ws: Workspace, pairs: str,
    *, frame: str, problem: str, what_rot: str, what_trans: str,
    min_axis_spread: float, min_rotation_rad: float, pair_translation: bool,
) -> tuple[np.ndarray, np.ndarray | None, int, _core.Observability]:
    """The shared solve: pairs, relative motions, observability gate, rotation of ``X``.

    Returns ``(R_X (3, 3), t_X from the pairwise 3x3 system or None, n_motions,
    observability)``. The station-wise translation (the default, ADR 0003) is solved by
    the caller with :func:`cellcal.solver._core.pivot_solve`, because which per-station
    terms enter it depends on the problem.
    """
    RP, RQ = TA[:, :3, :3], TB[:, :3, :3]
    np.einsum("kij->ij", RP, out=ws.R3)  # strided np.sum would buffer 64 KiB
    obs = _core.observability(ws.R3, n, side_A, RP, ws)
    _check_observable(
        obs, frame=frame, problem=problem, what_rot=what_rot, what_trans=what_trans,
        min_axis_spread=min_axis_spread, min_rotation_rad=min_rotation_rad,
    )
    # Explicit subsets are solved from their own pairs; "all" needs no pair list (the O(N)
    # identity) unless the pairwise translation system asks for one (then the ring).
    m = n * (n - 1) // 2
    if pairs != "all" or pair_translation:
        m = _core.make_pairs(n, "ring" if pairs == "all" else pairs, ws)
        _core.relative_motions(TA, side_A, m, ws, ws.RA, ws.tA)
        _core.relative_motions(TB, side_B, m, ws, ws.RB, ws.tB)
    qX0 = _core.kronecker_estimate(RP, side_A, RQ, ws)
    if pairs == "all":
        qX = _core.solve_rotation_all_pairs(RP, side_A, RQ, qX0, ws)
    else:
        _core.quats_from_rotations(ws.RA[:m], ws.qA[:m], ws)
        _core.quats_from_rotations(ws.RB[:m], ws.qB[:m], ws)
        qX = _core.solve_rotation(m, qX0, ws)
    Rx = _core.rot_from_quat_into(qX, np.empty((3, 3)))
    tx = np.array(_core.solve_translation(m, Rx, ws)) if pair_translation else None
    return Rx, tx, m, obs


def _check_translation_mode(translation: str, pairs: str) -> bool:
    _core.check_pair_scheme(pairs)
    if translation not in TRANSLATION_MODES:
        raise ValueError(f"translation must be one of {TRANSLATION_MODES}, got {translation!r}")
    return translation == "pairs"


def _mean_translation_closure(tZ: np.ndarray, ws: Workspace) -> np.ndarray:
    """Mean of per-station translations ``tZ`` (n, 3) and each one's distance from it."""
    n = tZ.shape[0]
    mean = tZ.mean(axis=0)
    d = ws.v3b[:n]
    np.subtract(tZ, mean, out=d)
    rt = ws.res_t[:n]
    np.einsum("ij,ij->i", d, d, out=rt)
    np.sqrt(rt, out=rt)
    return mean


def _contiguous(a: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """``a`` in a contiguous workspace buffer: binary ufuncs on strided views buffer up to
    2 x 64 KiB internally, an allocation that grows with N until it hits that cap."""
    np.copyto(buf, a)
    return buf


def _transform(R: np.ndarray, t: np.ndarray) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = t
    return T


# --- public API ------------------------------------------------------------------------------------


@_core.bounded_buffers
def calibrate_base_frame(
    base_T_flange: np.ndarray,
    cell_T_target: np.ndarray,
    *,
    workspace: Workspace | None = None,
    pairs: str = "all",
    translation: str = "stations",
    min_axis_spread: float = DEFAULT_MIN_AXIS_SPREAD,
    min_rotation_rad: float = DEFAULT_MIN_ROTATION_RAD,
) -> BaseFrameResult:
    """Where the robot base sits in the cell, from paired robot and tracker stations.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame from the controller's forward kinematics, m.
    cell_T_target : array_like, shape (N, 4, 4)
        The same stations measured by the tracker: target pose in the cell frame, m.
    workspace : Workspace, optional
        Preallocated buffers (capacity >= N). With one, a warmed-up solve allocates nothing
        that grows with N, and ``residuals`` are views into it.
    pairs : {"all", "ring", "consecutive", "star"}
        Motion pairs for the AX=XB rotation solve (ADR 0003). ``"all"`` (default) uses every
        ordered station pair at O(N) cost; the others are explicit O(N) subsets.
    translation : {"stations", "pairs"}
        ``"stations"`` (default) solves the translations of both unknowns from the
        stations in the fixed 6x6 (Schur 3x3) pivot form; ``"pairs"`` uses DESIGN.md's
        pairwise system ``sum (R_A - I)^T (R_A - I) t_X = ...``, which multiplies the
        tracker's orientation noise by the cell-to-robot lever arm (ADR 0003 has numbers).
    min_axis_spread : float
        Refuse motions whose ``axis_spread`` is below this (ADR 0002).
    min_rotation_rad : float
        Refuse data in which no motion rotates more than this.

    Returns
    -------
    BaseFrameResult
        ``cell_T_base`` and ``flange_T_target`` with the closure figures; residuals are the
        closure of each ``cell_T_target[i]`` against ``cell_T_base @ base_T_flange[i] @
        flange_T_target``.

    Raises
    ------
    ValueError
        Wrong shape, N mismatch, NaN/inf, a non-orthonormal rotation or a bad last row
        (the message names the array and station index).
    NotEnoughSamples
        N < 3.
    DegenerateGeometry
        No rotation, or all rotation axes parallel: ``.axis`` is in the cell frame; the
        base's rotation about it and its translation along it are undetermined.
    """
    problem = "base-frame calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, M), n, ws = _prepare(
        [(base_T_flange, "base_T_flange"), (cell_T_target, "cell_T_target")], workspace, problem
    )
    Rx, tx, m, obs = _solve_axxb(
        M, "left", G, "left", n, ws, pairs, frame="cell", problem=problem,
        what_rot="base rotation", what_trans="base translation",
        min_axis_spread=min_axis_spread, min_rotation_rad=min_rotation_rad,
        pair_translation=pair_t,
    )
    RG, tG, RM, tM = G[:, :3, :3], G[:, :3, 3], M[:, :3, :3], M[:, :3, 3]
    # Rotation of flange_T_target_i = R_G^T R_X^T R_M, chordal mean, rotation closure.
    np.matmul(Rx.T, RM, out=ws.RB[:n])
    np.matmul(RG.transpose(0, 2, 1), ws.RB[:n], out=ws.RA[:n])
    Ry = _core.rotation_edge(ws.RA[:n], ws)
    u = ws.v3a[:n]
    np.matmul(tM, Rx, out=u)  # rows R_X^T t_M
    tG = _contiguous(tG, ws.v3d[:n])
    if tx is None:
        # M_i = X G_i Y in translation, times R_X^T: R_G t_Y + (t_G - R_X^T t_M) = -R_X^T t_X,
        # the pivot form; its residual is the cell-frame position closure.
        np.subtract(tG, u, out=u)
        ty, c = _core.pivot_solve(RG, u, ws)
        tx = -(Rx @ c)
    else:
        # t_Y_i = R_G^T (R_X^T (t_M - t_X) - t_G); closure = scatter about their mean.
        np.subtract(u, Rx.T @ tx, out=u)
        np.subtract(u, tG, out=u)
        np.matmul(RG.transpose(0, 2, 1), u[:, :, None], out=ws.tA[:n, :, None])
        ty = _mean_translation_closure(ws.tA[:n], ws)
    rms_t, max_t, rms_r, max_r = _core.closure_stats(n, ws)
    return BaseFrameResult(
        n_stations=n, n_motions=m,
        rms_translation_m=rms_t, max_translation_m=max_t,
        rms_rotation_rad=rms_r, max_rotation_rad=max_r,
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="cell",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver=f"quaternion-linear AX=XB rotation ({pairs} pairs), {translation} translation",
        cell_T_base=_transform(Rx, tx), flange_T_target=_transform(Ry, ty),
    )


@_core.bounded_buffers
def calibrate_hand_eye(
    base_T_flange: np.ndarray,
    camera_T_target: np.ndarray,
    *,
    workspace: Workspace | None = None,
    pairs: str = "all",
    translation: str = "stations",
    min_axis_spread: float = DEFAULT_MIN_AXIS_SPREAD,
    min_rotation_rad: float = DEFAULT_MIN_ROTATION_RAD,
) -> HandEyeResult:
    """Eye-in-hand calibration: the camera on the flange, from views of a static target.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    camera_T_target : array_like, shape (N, 4, 4)
        The static target as the camera sees it at each station, m.
    workspace, pairs, min_axis_spread, min_rotation_rad
        As for :func:`calibrate_base_frame`.

    Returns
    -------
    HandEyeResult
        ``flange_T_camera`` and ``base_T_target``; residuals are the closure of each
        ``base_T_flange[i] @ flange_T_camera @ camera_T_target[i]`` against ``base_T_target``.

    Raises
    ------
    ValueError, NotEnoughSamples, DegenerateGeometry
        As for :func:`calibrate_base_frame`; ``DegenerateGeometry.axis`` is in the flange
        frame (the camera's rotation about it and translation along it are undetermined).
    """
    problem = "hand-eye calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, O), n, ws = _prepare(
        [(base_T_flange, "base_T_flange"), (camera_T_target, "camera_T_target")], workspace, problem
    )
    Rx, tx, m, obs = _solve_axxb(
        G, "right", O, "left", n, ws, pairs, frame="flange", problem=problem,
        what_rot="camera rotation", what_trans="camera translation",
        min_axis_spread=min_axis_spread, min_rotation_rad=min_rotation_rad,
        pair_translation=pair_t,
    )
    RG, tG, RO, tO = G[:, :3, :3], G[:, :3, 3], O[:, :3, :3], O[:, :3, 3]
    # Rotation of base_T_target_i = R_G R_X R_O, chordal mean, rotation closure.
    np.matmul(Rx, RO, out=ws.RB[:n])
    np.matmul(RG, ws.RB[:n], out=ws.RA[:n])
    Rz = _core.rotation_edge(ws.RA[:n], ws)
    u = ws.v3a[:n]
    np.matmul(tO, Rx.T, out=u)  # rows R_X t_O
    tG = _contiguous(tG, ws.v3d[:n])
    if tx is None:
        # G_i X O_i = Z in translation: R_G t_X + (t_G + R_G R_X t_O) = t_Z, the pivot form.
        np.matmul(RG, u[:, :, None], out=ws.tA[:n, :, None])
        np.add(ws.tA[:n], tG, out=ws.tA[:n])
        tx, tz = _core.pivot_solve(RG, ws.tA[:n], ws)
    else:
        np.add(u, tx, out=u)
        np.matmul(RG, u[:, :, None], out=ws.tA[:n, :, None])
        np.add(ws.tA[:n], tG, out=ws.tA[:n])
        tz = _mean_translation_closure(ws.tA[:n], ws)
    rms_t, max_t, rms_r, max_r = _core.closure_stats(n, ws)
    return HandEyeResult(
        n_stations=n, n_motions=m,
        rms_translation_m=rms_t, max_translation_m=max_t,
        rms_rotation_rad=rms_r, max_rotation_rad=max_r,
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="flange",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver=f"quaternion-linear AX=XB rotation ({pairs} pairs), {translation} translation",
        flange_T_camera=_transform(Rx, tx), base_T_target=_transform(Rz, tz),
    )


@_core.bounded_buffers
def calibrate_tool_point(
    base_T_flange: np.ndarray,
    *,
    workspace: Workspace | None = None,
    pairs: str = "all",
    min_axis_spread: float = DEFAULT_MIN_AXIS_SPREAD,
    min_rotation_rad: float = DEFAULT_MIN_ROTATION_RAD,
) -> ToolPointResult:
    """Pivot calibration: the tool tip on the flange, held at one point while the flange turns.

    Solves ``[R_i  -I] [p_tip; p_pivot] = -t_i`` in least squares through its fixed 6x6
    normal equations (eliminating ``p_pivot`` leaves a 3x3 SPD system).

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    workspace, pairs, min_axis_spread, min_rotation_rad
        As for :func:`calibrate_base_frame`; ``pairs`` picks the relative rotations the
        observability test looks at.

    Returns
    -------
    ToolPointResult
        ``flange_p_tip`` and ``base_p_pivot``; residuals are the tip position scatter
        ``|R_i p_tip + t_i - p_pivot|`` (rotation residuals are zero).

    Raises
    ------
    ValueError, NotEnoughSamples
        As for :func:`calibrate_base_frame`.
    DegenerateGeometry
        All relative rotations about one axis (flange frame): the tip position along it
        cannot be recovered.
    """
    problem = "tool-point calibration"
    _core.check_pair_scheme(pairs)
    (G,), n, ws = _prepare([(base_T_flange, "base_T_flange")], workspace, problem)
    np.einsum("kij->ij", G[:, :3, :3], out=ws.R3)
    obs = _core.observability(ws.R3, n, "right", G[:, :3, :3], ws)
    _check_observable(
        obs, frame="flange", problem=problem, what_rot="(nothing:) the flange",
        what_trans="tip position", min_axis_spread=min_axis_spread,
        min_rotation_rad=min_rotation_rad,
    )
    p_tip, p_pivot = _core.pivot_solve(G[:, :3, :3], G[:, :3, 3], ws)
    ws.res_r[:n] = 0.0
    rms_t, max_t, _, _ = _core.closure_stats(n, ws)
    return ToolPointResult(
        n_stations=n, n_motions=0,
        rms_translation_m=rms_t, max_translation_m=max_t,
        rms_rotation_rad=0.0, max_rotation_rad=0.0,
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="flange",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver="pivot least squares (6x6 normal equations, Schur complement)",
        flange_p_tip=p_tip, base_p_pivot=p_pivot,
    )
