"""Point-based base-frame calibration for 3-DoF trackers (one reflector on the flange).

Model: ``cell_p_target_i = cell_T_base @ base_T_flange_i @ flange_p_target``; unknown
``X = cell_T_base`` (6 DoF) and ``y = flange_p_target`` (3), 3 equations per station.

Linear initialisation: block coordinate descent on the least-squares cost, each block in
closed form. Given ``y`` the target positions in the base frame ``q_i = R_G_i y + t_G_i``
are known and ``X`` is a rigid registration of ``q`` onto ``p`` (Horn/Kabsch, here the
chordal mean of the cross-covariance through the shared eigen kernel); given ``R_X`` the
model is the pivot form ``R_G_i y + t_G_i - R_X^T p_i = -R_X^T t_X`` (the tool-point kernel,
fixed 6x6 normal equations). Starting from ``y = 0`` (the flange origin), a few rounds land
close enough for the Gauss-Newton refinement (:mod:`cellcal.solver.refine`), which then
weights by the tracker's noise and gives the covariance. ``refine=False`` runs the
alternation to convergence: the unweighted least-squares answer.

Observability (both are refused with :class:`DegenerateGeometry`, ADR 0002):

* **Rotation of the flange about 2+ axes.** If every flange rotation is about one axis
  ``a`` (flange frame), ``R_G_i a`` is the same for all stations, so the target offset along
  ``a`` moves every modelled point by the same vector: it trades against the base
  translation and cannot be recovered. Same figure as the tool point (``axis_spread``).
* **Spread of target positions.** If the measured points lie on a line, the base's rotation
  about that line changes no modelled point. ``point_spread = lambda_2 / lambda_1`` of the
  points' scatter matrix (middle over largest eigenvalue, in [0, 1]; 0 for collinear points,
  1 for an isotropic cloud; coplanar points are fine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Unpack

import numpy as np

from cellcal.solver import _core, _validate
from cellcal.solver import _observability as _obs
from cellcal.solver import diagnostics as _diag
from cellcal.solver import refine as _refine
from cellcal.solver import sanity as _sanity
from cellcal.solver import validation as _validation
from cellcal.solver._pose_solve import (
    POINT_KEYS,
    _check_determined,
    _common_warnings,
    _field_spec,
    _input_checks,
    _nan_tests,
    _pairing_check,
    _PoseOutcome,
    _readonly,
    _residuals,
    _transform,
)
from cellcal.solver.errors import CalibrationError, DegenerateGeometry, NotEnoughSamples
from cellcal.solver.options import SolverOptions, SolverOptionsKeywords, resolve_options
from cellcal.solver.pose_results import CalibrationResult, Estimate, _estimates
from cellcal.solver.uncertainty import PredictedError, point_error, sigma_figures
from cellcal.solver.workspace import Workspace

__all__ = ["PointBaseFrameResult", "calibrate_base_frame_points", "DEFAULT_MIN_POINT_SPREAD", "MIN_POINT_STATIONS"]

#: Refuse target positions whose ``point_spread`` is below this: the points' extent across
#: their main line is under 1 % of their extent along it.
DEFAULT_MIN_POINT_SPREAD = 1e-4
#: Alternation before the refinement takes over: until a round moves ``y`` by less than
#: 0.1 um, at most this many rounds (fewer rounds leave some random scenes in a local
#: minimum of the refinement; measured on 1,200 seeded scenes).
_INIT_ROUNDS = 50
_INIT_TOL_M = 1e-7
#: ``refine=False`` runs it to convergence.
_MAX_ROUNDS = 200
_FINAL_TOL_M = 1e-13
#: Three stations give 9 equations for the 9 unknowns, a system that generally has several
#: exact solutions (seen in tests): four are needed for a unique answer.
MIN_POINT_STATIONS = 4


@dataclass(frozen=True, kw_only=True)
class PointBaseFrameResult(CalibrationResult):
    """Result of :func:`calibrate_base_frame_points`.

    Attributes
    ----------
    cell_T_base : numpy.ndarray, shape (4, 4)
        Robot base in the cell (tracker) frame, metres.
    flange_p_target : numpy.ndarray, shape (3,)
        The reflector's centre in the flange frame, metres.
    cell_T_base_covariance : numpy.ndarray, shape (6, 6)
        Right perturbation, twist ``(rho, phi)`` (m, rad).
    flange_p_target_covariance : numpy.ndarray, shape (3, 3)
        m^2, flange frame. ``covariance`` (9, 9) is the joint one, ordered
        ``[cell_T_base (rho, phi), flange_p_target]``.
    point_spread : float
        ``lambda_2 / lambda_1`` of the measured points' scatter (module docstring).
    """

    cell_T_base: np.ndarray
    flange_p_target: np.ndarray
    cell_T_base_covariance: np.ndarray
    flange_p_target_covariance: np.ndarray
    point_spread: float

    def transforms(self) -> dict[str, Estimate]:
        """``cell_T_base``, ``flange_p_target`` (see :meth:`CalibrationResult.transforms`)."""
        return _estimates(
            ("cell_T_base", self.cell_T_base, self.cell_T_base_covariance),
            ("flange_p_target", self.flange_p_target, self.flange_p_target_covariance),
        )

    def predicted_error_at(self, cell_p_task) -> PredictedError:
        """Error of a cell-frame task point expressed in the robot base with this result
        (as :meth:`cellcal.solver.BaseFrameResult.predicted_error_at`)."""
        X = self.cell_T_base
        p = np.asarray(cell_p_task, dtype=float).reshape(3)
        pb = X[:3, :3].T @ (p - X[:3, 3])
        return point_error(np.eye(4), self.cell_T_base_covariance, pb, "base")


def _validate_points(p: object, n: int, ws: Workspace) -> np.ndarray:
    a = np.asarray(p, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"cell_p_target: expected shape (N, 3), got {a.shape}")
    if a.shape[0] != n:
        raise ValueError(f"base_T_flange has {n} stations but cell_p_target has {a.shape[0]}: they must pair up")
    if not math.isfinite(float(np.add.reduce(a, axis=None))):
        ok = ws.ball[:n]
        np.isfinite(a[:, 0], out=ok)
        for j in (1, 2):
            np.logical_and(ok, np.isfinite(a[:, j], out=ws.b16[:n, 0, 0]), out=ok)
        i = int(np.argmin(ok))
        raise ValueError(f"cell_p_target[{i}]: contains NaN or inf")
    return a


def _point_spread(p: np.ndarray, n: int, ws: Workspace) -> tuple[float, np.ndarray]:
    """``(lambda_2 / lambda_1, main direction)`` of the scatter of points ``p`` (n, 3)."""
    S = ws.S3
    np.matmul(p.T, p, out=S)
    m = ws.u3
    np.einsum("ij->j", p, out=m)
    m /= n
    S -= n * np.outer(m, m)
    w, V = np.linalg.eigh(S)
    axis = V[:, 2].copy()
    j = int(np.argmax(np.abs(axis)))
    if axis[j] < 0:
        axis = -axis
    if not w[2] > 0.0:
        return 0.0, axis
    return max(0.0, float(w[1] / w[2])), axis


#: The distance initialisation's 9x9 normal matrix is trusted below this condition number.
_MAX_DISTANCE_COND = 1e10


def _distance_pass(G: np.ndarray, p: np.ndarray, m: int, ws: Workspace, N9: np.ndarray, b9: np.ndarray) -> None:
    """Add the distance equations of the pairs ``(ws.pi, ws.pj)[:m]`` to ``N9``, ``b9``."""
    Gi, Gj = ws.T44a[:m], ws.T44b[:m]
    np.take(G, ws.pi[:m], axis=0, out=Gi, mode="clip")
    np.take(G, ws.pj[:m], axis=0, out=Gj, mode="clip")
    dR = ws.M33[:m]
    np.subtract(Gi[:, :3, :3], Gj[:, :3, :3], out=dR)
    dt = ws.v3a[:m]
    np.subtract(Gi[:, :3, 3], Gj[:, :3, 3], out=dt)
    dp = ws.v3b[:m]
    np.take(p, ws.pi[:m], axis=0, out=dp, mode="clip")
    np.take(p, ws.pj[:m], axis=0, out=ws.v3c[:m], mode="clip")
    np.subtract(dp, ws.v3c[:m], out=dp)
    rows = ws.r9[:m]
    # a = 2 dR^T dt (y's coefficients); S = dR^T dR enters as tr(S Y), Y = y y^T symmetric.
    np.matmul(dR.transpose(0, 2, 1), dt[:, :, None], out=rows[:, 0:3, None])
    np.multiply(rows[:, 0:3], 2.0, out=rows[:, 0:3])
    S = ws.M33b[:m]
    np.matmul(dR.transpose(0, 2, 1), dR, out=S)
    np.copyto(rows[:, 3], S[:, 0, 0])
    np.copyto(rows[:, 4], S[:, 1, 1])
    np.copyto(rows[:, 5], S[:, 2, 2])
    np.multiply(S[:, 0, 1], 2.0, out=rows[:, 6])
    np.multiply(S[:, 0, 2], 2.0, out=rows[:, 7])
    np.multiply(S[:, 1, 2], 2.0, out=rows[:, 8])
    b = ws.s1[:m]
    np.einsum("ij,ij->i", dp, dp, out=b)
    np.einsum("ij,ij->i", dt, dt, out=ws.s2[:m])
    np.subtract(b, ws.s2[:m], out=b)
    N9 += rows.T @ rows
    b9 += rows.T @ b


def _distance_init(G: np.ndarray, p: np.ndarray, n: int, ws: Workspace) -> np.ndarray | None:
    """The reflector offset ``y`` from distances alone, or None when they do not fix it.

    Rigid motions keep distances: ``|p_i - p_j| = |q_i - q_j|`` with ``q_i = R_G_i y + t_G_i``
    (base frame), whatever ``cell_T_base`` is. Expanded, ``|dp|^2 - |dt|^2 = 2 dt^T dR y +
    y^T dR^T dR y`` (``dR = R_G_i - R_G_j``, ``dt = t_G_i - t_G_j``) is linear in ``y`` and
    ``Y = y y^T`` (9 unknowns): least squares over all pairs up to 6 stations, over a ring
    and a star of pairs (2N equations, O(N)) beyond. Exact without noise, so it starts the
    alternation near the right minimum whatever the offset and the tilts; the alternation
    from the flange origin lands in a wrong minimum for reflectors 0.5-1 m off the flange.
    """
    N9 = np.zeros((9, 9))
    b9 = np.zeros(9)
    if n <= 6:
        for i in range(n - 1):  # all pairs: a star from each station
            m = n - 1 - i
            ws.pi[:m] = i
            ws.pj[:m] = ws.iota[i + 1 : n]
            _distance_pass(G, p, m, ws, N9, b9)
    else:
        for scheme in ("ring", "star"):
            m = _core.make_pairs(n, scheme, ws)
            _distance_pass(G, p, m, ws, N9, b9)
    w = np.linalg.eigvalsh(N9)
    if not (w[0] > 0.0 and w[-1] / w[0] < _MAX_DISTANCE_COND):
        return None
    sol = np.linalg.solve(N9, b9)
    return sol[:3].copy()


#: Up to this many stations the distance equations barely (or do not) fix the offset, and
#: the alternation is also started from the flange origin and from 0.5 m along each flange
#: axis; the start whose alternation closes best wins (four stations with a reflector 1 m
#: off the flange otherwise end in a wrong minimum about one time in ten).
_MULTISTART_STATIONS = 6
_STARTS = tuple(np.concatenate([np.zeros((1, 3)), 0.5 * np.eye(3), -0.5 * np.eye(3)]))


def _best_start(G: np.ndarray, p: np.ndarray, n: int, ws: Workspace, y0: np.ndarray | None) -> np.ndarray | None:
    best, best_rms = y0, math.inf
    for cand in ((y0,) if y0 is not None else ()) + _STARTS:
        try:
            _, _, y, _ = _alternate(G, p, n, ws, _INIT_ROUNDS, _INIT_TOL_M, cand)
        except (np.linalg.LinAlgError, FloatingPointError):
            continue
        rms = float(np.vdot(ws.res_t[:n], ws.res_t[:n]))
        if rms < best_rms:
            best, best_rms = y, rms
    return best


def _alternate(G: np.ndarray, p: np.ndarray, n: int, ws: Workspace, rounds: int, tol: float,
               y0: np.ndarray | None = None):
    """Kabsch / pivot alternation from ``y0`` (default ``y = 0``, the flange origin).

    Returns ``(R_X, t_X, y, converged)``; leaves the position closure of the last pivot
    step in ``ws.res_t``. Stops early (``converged``) once a round changes ``y`` by less
    than ``tol`` (m).
    """
    RG = G[:, :3, :3]
    y4 = np.ones(4)
    y4[:3] = 0.0 if y0 is None else y0
    Rx = np.eye(3)
    y = y4[:3].copy()
    tx = np.zeros(3)
    pc = ws.meas3[:n]  # contiguous copy of the points, made by the caller
    psum = np.empty(3)  # not ws.t3 / ws.u3: pivot_solve uses those
    np.einsum("ij->j", pc, out=psum)
    qs = np.empty(3)
    u = ws.v3a[:n]
    tGc = ws.v3d[:n]
    np.copyto(tGc, G[:, :3, 3])
    for _ in range(rounds):
        q4 = ws.q4[:n]
        np.matmul(G, y4, out=q4)
        q = q4[:, :3]
        K = ws.R3
        np.matmul(pc.T, q, out=K)  # sum p q^T
        np.einsum("ij->j", q, out=qs)
        K -= np.outer(psum, qs) / n  # centred cross-covariance
        Rx = _core.rot_from_quat_into(_core.chordal_mean_quat(K, ws), np.empty((3, 3)))
        # Pivot form: R_G y + (t_G - R_X^T p) = -R_X^T t_X.
        np.matmul(pc, Rx, out=u)  # rows R_X^T p
        np.subtract(tGc, u, out=u)
        y_new, c = _core.pivot_solve(RG, u, ws)
        tx = -(Rx @ c)
        step = max(abs(float(a) - float(b)) for a, b in zip(y_new, y, strict=True))  # Python floats: 3 values
        y = y_new
        y4[:3] = y
        if step < tol:
            return Rx, tx, y, True
    return Rx, tx, y, False


@_core.bounded_buffers
def calibrate_base_frame_points(
    base_T_flange: np.ndarray,
    cell_p_target: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    noise_m: float | None = None,
    cell_p_target_std: np.ndarray | None = None,
    cell_p_target_cov: np.ndarray | None = None,
    expected_cell_T_base: np.ndarray | None = None,
    capture_time_s: np.ndarray | None = None,
    capture_speed_m_s: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> PointBaseFrameResult:
    """Where the robot base sits in the cell, from a 3-DoF tracker's points.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    cell_p_target : array_like, shape (N, 3)
        The reflector's centre measured by the tracker at each station, cell frame, m.
    options, workspace, capture_time_s, capture_speed_m_s, **overrides
        As for :func:`~cellcal.solver.calibrate_base_frame` (:class:`~cellcal.solver.SolverOptions`;
        points use ``min_point_spread`` too, and not ``pairs``, ``translation``,
        ``uncertainty`` or ``noise_rotation_rad``). ``refine=False`` returns the converged
        alternation (unweighted least squares). ``huber``: 3.4 is the 99 % point of a 3-D
        Gaussian's length. ``max_target_offset_m`` applies to the reflector's distance from
        the flange.
    noise_m : float, optional
        Another name of ``noise_translation_m`` (per-axis 1-sigma of the measured points, m;
        give at most one); estimated from the residuals when neither is given.
    cell_p_target_std : array_like, shape (N, 3) or (N,), optional
        Per-station 1-sigma from the tracker (per cell axis, or isotropic), m.
    cell_p_target_cov : array_like, shape (N, 3, 3), optional
        Per-station covariance of each point in the cell frame, m^2 (e.g. from
        :class:`~cellcal.solver.TrackerNoiseModel`): the refinement whitens each station by
        its Cholesky factor, so a tracker's anisotropy along and across the beam is used.
    expected_cell_T_base : array_like, shape (4, 4), optional
        Input sanity, as for :func:`~cellcal.solver.calibrate_base_frame` (ADR 0014).

    Returns
    -------
    PointBaseFrameResult
        ``cell_T_base``, ``flange_p_target``, residuals ``|p_i - X G_i y|`` (rotation
        residuals are zero), covariances and held-out closure.

    Raises
    ------
    ValueError
        Bad shapes, N mismatch, NaN/inf (naming the station), a bad pose, bad noise.
    NotEnoughSamples
        N < 4 (three stations generally admit several exact solutions).
    DegenerateGeometry
        The flange rotates about fewer than two axes (``.frame == "flange"``: the target
        offset along ``.axis`` is undetermined), or the target positions are collinear
        (``.frame == "cell"``: the base's rotation about that line is undetermined).
    """
    o = resolve_options("calibrate_base_frame_points", options, overrides, POINT_KEYS)
    refine, holdout, huber, reject_k, max_iterations = o.refine, o.holdout, o.huber, o.reject_k, o.max_iterations
    min_axis_spread, min_rotation_rad, min_point_spread = o.min_axis_spread, o.min_rotation_rad, o.min_point_spread
    max_reach_m, noise_translation_m = o.max_reach_m, (o.noise_translation_m if "noise_translation_m" in overrides
                                                         or noise_m is None else None)
    problem = "point base-frame calibration"
    G = _validate.as_stack(base_T_flange, "base_T_flange")
    n = G.shape[0]
    p_shape = np.shape(cell_p_target)
    if len(p_shape) == 2 and p_shape[0] != n:
        raise ValueError(f"base_T_flange has {n} stations but cell_p_target has {p_shape[0]}: they must pair up")
    if n < MIN_POINT_STATIONS:
        raise NotEnoughSamples(n, MIN_POINT_STATIONS, problem)
    ws = Workspace(n, transient=True) if workspace is None else workspace
    ws.check(n)
    _validate.validate_stack(G, "base_T_flange", ws)
    _sanity.check_magnitudes(G, "base_T_flange", n, ws)
    p = _validate_points(cell_p_target, n, ws)
    if noise_m is not None and noise_translation_m is not None:
        raise ValueError("give noise_m or noise_translation_m (the same figure), not both")
    masked, extra = _input_checks(G, None, n, ws, max_reach_m, "cell_p_target")
    extra += _point_units(p, n, ws)
    noise = _refine.prepare_noise(cell_p_target_std, "cell_p_target_std",
                                  noise_m if noise_m is not None else noise_translation_m, None, n, ws, 3,
                                  cov=cell_p_target_cov, cov_name="cell_p_target_cov")
    field = _field_spec(G, o, n, capture_time_s, capture_speed_m_s, cov=cell_p_target_cov)

    # Observability of the flange rotations (the tool point's test: same unknown kind).
    np.einsum("kij->ij", G[:, :3, :3], out=ws.R3)
    obs = _obs.observability(ws.R3, n, "right", G[:, :3, :3], ws)
    if obs.max_rotation_rad < min_rotation_rad or obs.axis_spread < min_axis_spread:
        a = obs.axis
        none = obs.max_rotation_rad < min_rotation_rad
        raise DegenerateGeometry(
            f"{problem}: " + (
                f"the flange never rotates more than {math.degrees(obs.max_rotation_rad):.4g} deg: "
                "the target offset on the flange cannot be recovered"
                if none else
                f"every flange rotation is about (nearly) the same axis [{a[0]:.4f}, {a[1]:.4f}, "
                f"{a[2]:.4f}] in the flange frame (axis_spread {obs.axis_spread:.3g} < "
                f"{min_axis_spread:.3g}): the target offset along that axis trades against the "
                "base translation and cannot be recovered; add stations that turn the flange "
                "about a different axis"
            ),
            axis=a, frame="flange", axis_spread=obs.axis_spread,
            unrecoverable=(("target offset along every axis",) if none else
                           ("target offset along axis", "base translation along its image")),
            max_rotation_rad=obs.max_rotation_rad,
        )
    np.copyto(ws.meas3[:n], p)
    spread, line = _point_spread(ws.meas3[:n], n, ws)
    if spread < min_point_spread:
        raise DegenerateGeometry(
            f"{problem}: the measured target positions lie on (nearly) one line "
            f"[{line[0]:.4f}, {line[1]:.4f}, {line[2]:.4f}] in the cell frame (point_spread "
            f"{spread:.3g} < {min_point_spread:.3g}): the base's rotation about that line cannot "
            "be recovered; add stations off that line",
            axis=line, frame="cell", axis_spread=spread,
            unrecoverable=("base rotation about the line of target positions",),
            max_rotation_rad=obs.max_rotation_rad,
        )

    y0 = _distance_init(G, ws.meas3[:n], n, ws)
    init = "distance-initialised Kabsch/pivot alternation" if y0 is not None else "Kabsch/pivot alternation"
    np.copyto(ws.meas3[:n], p)
    if n <= _MULTISTART_STATIONS:
        y0 = _best_start(G, p, n, ws, y0)
        init += f" (best of {len(_STARTS) + 1} starts)"
    Rx, tx, y, alt_converged = (_alternate(G, p, n, ws, _INIT_ROUNDS, _INIT_TOL_M, y0) if refine
                                else _alternate(G, p, n, ws, _MAX_ROUNDS, _FINAL_TOL_M, y0))
    X0 = _transform(Rx, tx)
    ws.res_r[:n] = 0.0
    stats = _core.closure_stats(n, ws)

    def fit_subset(idx, k):
        Gs = ws.Gx[:k]
        np.take(G, idx, axis=0, out=Gs, mode="clip")
        np.take(p, idx, axis=0, out=ws.meas3[:k], mode="clip")
        try:
            R, t, yy, _ = _alternate(Gs, ws.meas3[:k], k, ws, _MAX_ROUNDS, _FINAL_TOL_M)
        except (CalibrationError, np.linalg.LinAlgError, FloatingPointError):
            return None
        finally:
            np.copyto(ws.meas3[:n], p)  # the model's contiguous copy of every station
        return _transform(R, t), yy

    model = _refine.PointModel(p, G, n, ws)
    refined = False
    if refine:
        fit = _refine.refine(model, (X0, y), noise, huber=huber, reject_k=reject_k,
                             max_iterations=max_iterations, masked=masked)
        refined = fit.ok
        converged = fit.converged
    else:
        fit = _refine.covariance_at(model, (X0, y), noise, huber=huber, masked=masked)
        converged = alt_converged
    assessment = None
    if fit.ok:
        np.copyto(ws.v3d[:n], ws.q4[:n, :3])  # target positions in the base frame
        assessment = _diag.assess(model, fit, noise, n, ws, robot_p=ws.v3d[:n], a_cols=slice(0, 6),
                                  huber=huber, masked=masked or reject_k is not None,
                                  converged=converged, estimated_ok=not noise.reset,
                                  blocks=((0, 6), (6, 3)), field=field)
    if refined:
        model.norms(ws.res_t[:n], ws.res_r[:n])
        stats = _core.closure_stats(n, ws)
    ho = None
    if holdout and n >= _validation.MIN_HOLDOUT_STATIONS:
        if refined or fit.ok:
            # A linear answer too: the workspace holds the Jacobian and residual at it.
            _validation.loo_linearised(model, n, ws, fit.covariance)
            ho = _validation.closure_from_buffers("linearised leave-one-out", n, n, ws, workspace is None, stats[0])
        else:
            np.copyto(ws.bk_t[:n], ws.res_t[:n])
            k = _validation.kfold_refit(model, fit_subset, n, ws)
            np.copyto(ws.res_t[:n], ws.bk_t[:n])
            ws.res_r[:n] = 0.0
            ho = _validation.closure_from_buffers("k-fold refit", k, n, ws, workspace is None, stats[0])
    X, yo = fit.state if refined else (X0, y)
    cov = assessment.covariance if assessment is not None else fit.covariance
    noise_covX = cov[:6, :6].copy()
    if assessment is not None and assessment.absorbed is not None:
        cov = cov + assessment.absorbed
    elif assessment is not None and assessment.model_error:
        cov = cov.copy()
        cov[:6, :6] += _diag.absorbed_error_covariance(assessment.centroid, assessment.tau_t, assessment.tau_r)
        cov[6:, 6:] += assessment.tau_t ** 2 * np.eye(3)
    covX = cov[:6, :6].copy()
    _check_determined(noise_covX, problem, "cell", obs, X)
    _sanity.check_prior(X, expected_cell_T_base, o.expected_tolerance_m, o.expected_tolerance_rad, "cell_T_base")
    if not any(w.code == "units" for w in extra):
        _sanity.check_offset(yo, o.max_target_offset_m, "flange_p_target", "the reflector")
    _pairing_check(None, assessment, extra, lambda g, m_: calibrate_base_frame_points(
        g, m_, refine=False, holdout=False, max_target_offset_m=None, min_axis_spread=0.0,
        min_point_spread=0.0).rms_translation_m, G, p, capture_time_s)
    st, sr = sigma_figures(covX)
    rms_t, max_t, _, _ = stats
    solver = f"{init}" + ("" if refine else " (converged)" if alt_converged else " (not converged)")
    if refined:
        h = f", Huber {huber:g} sigma" if huber is not None else ""
        h += f", reject beyond {reject_k:g} sigma" if reject_k is not None else ""
        state = "" if converged else f", NOT CONVERGED: {fit.stop_reason}"
        solver += f"; maximum-likelihood Gauss-Newton refinement ({fit.iterations} iterations{h}{state})"
    elif fit.message:
        solver += f" ({fit.message})"
    out = _PoseOutcome(X, yo, cov, stats, fit, ho, refined, noise, assessment, converged)
    if not refine:
        fit.stop_reason = ("closed-form alternation converged, not refined" if alt_converged else
                           f"alternation stopped after {_MAX_ROUNDS} rounds without converging")
    return PointBaseFrameResult(
        n_stations=n, n_motions=0,
        rms_translation_m=rms_t, max_translation_m=max_t, rms_rotation_rad=0.0, max_rotation_rad=0.0,
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="flange",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver=solver,
        covariance=cov, sigma_translation_mm=st, sigma_rotation_deg=sr,
        noise_translation_m=noise.sigma_t, noise_rotation_rad=math.nan, noise_source=noise.describe(),
        chi2=fit.chi2, dof=fit.dof, refined=refined, iterations=fit.iterations if refined else 0,
        converged=bool(converged), stop_reason=fit.stop_reason,
        downweighted=_readonly(fit.downweighted, workspace is None),
        warnings=_common_warnings(out, extra),
        residual_tests=_diag.with_inflation(assessment.tests, noise_covX, covX) if assessment is not None
        else _nan_tests(noise),
        holdout=ho,
        linear_agreement=_validation.agreement(X0, X, covX) if refined else None,
        cell_T_base=X, flange_p_target=np.array(yo, dtype=float),
        cell_T_base_covariance=covX, flange_p_target_covariance=cov[6:, 6:].copy(),
        point_spread=spread,
    )


def _point_units(p: np.ndarray, n: int, ws: Workspace) -> list:
    """The ``"units"`` warning for measured points far beyond a cell (ADR 0014)."""
    srt = ws.srt[:n]
    np.einsum("ij,ij->i", p, p, out=srt)
    np.sqrt(srt, out=srt)
    srt.sort()
    med = 0.5 * (float(srt[(n - 1) // 2]) + float(srt[n // 2]))
    if med <= _sanity.UNITS_MEASURED_M:
        return []
    from cellcal.solver.diagnostics import SolveWarning

    return [SolveWarning(code="units", message=(
        f"cell_p_target: the target is a median {med:.4g} m from the tracker, far beyond a robot cell: are "
        "these points in millimetres? cellcal works in metres"), value=med)]
