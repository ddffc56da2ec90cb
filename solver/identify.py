"""Kinematic identification: the arm's own DH geometry from tracker stations (ADR 0016).

A rigid base frame cannot absorb a robot's kinematic errors (0.1 deg joint zeros, 0.3 mm
links leave 0.5-1 mm that follows the pose). :func:`identify_kinematics` estimates the arm's
parameters jointly with ``cell_T_base`` and the target on the flange, from joint angles and
tracker measurements (6-DoF poses or 3-DoF points).

**Parameterisation.** Standard DH rows of :class:`~cellcal.solver.kinematics.DHParameters`
with Hayati's ``beta`` (tilt about y) on rows joining parallel joint axes, where classical DH
is singular. Names, 1-based rows, SI units: ``joint{i}.zero_offset`` (added to the joint
reading, ``theta_i = q_i + theta_i,nominal + zero_offset_i``), ``link{i}.a``, ``link{i}.d``,
``link{i}.alpha``, ``link{i}.beta`` (parallel rows only). Values are reported absolute
(``zero_offset`` is itself the correction, nominal 0) with their deltas from the nominal.

**Model of a station.** ``cell_T_target = cell_T_base @ base_T_flange(q) @ flange_T_target``
(or ``cell_p_target = cell_T_base @ base_T_flange(q) @ flange_p_target``). Residuals in the
cell frame, measured minus modelled: ``dp`` (m) and for poses ``dphi = log(R_meas R_model^T)``
(rad), whitened by the per-station measurement covariance (the convention of
``cell_T_target_cov`` in :func:`~cellcal.solver.calibrate_base_frame`).

**Derivatives.** Analytic: every parameter is an elementary screw (a rotation about or a
translation along an axis of an intermediate frame of the chain), so its derivative is that
screw expressed in the base frame, ``(v, w)``, moving the target by ``v + w x p`` and turning
it by ``w``. The base frame and the target are right perturbations (ADR 0001: twists in
their child frames, ``cell_T_base @ exp(xi)``), a point a shift in the flange frame. The tests check
them against finite differences.

**Identifiability.** On the whitened, column-normalised Jacobian at the start (nominal arm,
base and target from the rigid fit), the base and target columns are taken first, then the
parameters by QR with column pivoting (Businger-Golub: each step keeps the column with the
largest part orthogonal to those kept, ties to the earlier in a fixed preference order).
A parameter whose orthogonal part is below ``rank_tol`` of its norm is not identifiable from
these stations: it is named in ``unidentifiable`` with the reason and fixed at its nominal
value. The reason comes from the same test on a generic set of stations: a parameter
dependent there too is *structural* (folded into the base frame, e.g. ``joint1.zero_offset``
and ``link1.d``; into the target, e.g. the last row; or redundant on parallel axes, the
``d`` of rows 2-4 of a UR arm), otherwise it is *not excited by these stations*. Then the
condition number of the column-normalised Jacobian is gated: above ``max_condition``
(default 100) the weakest pivots are also fixed and named when the set was chosen
automatically, and :class:`~cellcal.solver.DegenerateGeometry` names them when the caller
asked for that set (``parameters=``).

**Estimation.** Levenberg-Marquardt on the column-scaled problem (Marquardt's scaling),
with optional Huber re-weighting of whole stations or hard rejection (``reject_k``: drop
and refit), both on the station's whitened norm converted to a normal-equivalent sigma. Covariance ``(J^T W J)^-1`` of the
whitened problem: declared noise is used as declared and checked against the residuals
(chi-square per degree of freedom; beyond its 99.9 % point a ``model_error`` warning, a
covariance inflated by that ratio, and the base frame's and target's blocks widened by what
the fit absorbs unseen of an error the model does not describe, as in the rigid
calibrations: ``_absorbed``, ADR 0016's amendment); without declared noise the covariance is scaled by the
residual variance (``noise_source = "estimated"``), with the small-sample ``r/(r-2)`` of the
other results. Correlations between estimated quantities above ``correlation_threshold``
are listed.

**Consider covariance** (:mod:`cellcal.solver.kinematic_consider`). A parameter fixed at its
nominal value is still wrong on the real arm, and its error goes into the estimated ones
(with a still joint, into the other members of the rigid group, leaving no residual). Every
fixed parameter that the estimate cannot absorb exactly on any station set (not structural:
not excited, weakly determined, or left out by ``parameters=``) is *considered*: its prior
(``parameter_prior``, default :data:`DEFAULT_PARAMETER_PRIOR`, a manufacturing tolerance
per kind) is carried into ``covariance`` through the sensitivity ``(J^T W J)^-1 J^T W J_c``
at the answer, ``full_covariance`` adds the considered parameters for
:meth:`KinematicResult.prediction_covariance`, and ``noise_sigmas`` keep the noise-only
figures. The estimate itself does not change. When the stations left parameters
undetermined, a ``weak_excitation`` warning names them and the joints whose motion would
determine them.

**Validation.** ``holdout``: linearised leave-one-out closure of the fit stations (as in
:mod:`cellcal.solver.validation`). With ``validation_q`` and its measurements, held-out RMS,
P50, P90 and max of position (and orientation) before (nominal arm, base and target fitted
on the same stations) and after, plus the error of all pairwise distances between the
validation stations (independent of the base frame).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from cellcal.solver._stats import chi2_ppf
from cellcal.solver.calibrate import Residuals, calibrate_base_frame
from cellcal.solver.diagnostics import ABSORBED_TO_VISIBLE, SolveWarning, absorbed_error_covariance
from cellcal.solver.errors import DegenerateGeometry, NotEnoughSamples
from cellcal.solver.kinematic_consider import (
    DEFAULT_PARAMETER_PRIOR,
    EXCITE_GAIN,
    consider_blocks,
    orthogonal_fractions,
    resolve_prior,
    sensitivity,
    unabsorbed,
)
from cellcal.solver.kinematic_parameters import (
    _apply,
    _as_model,
    _name,
    _parse,
    _residuals,
    _value,
    kinematic_jacobian,
    parameter_names,
)
from cellcal.solver.kinematic_results import KinematicResult, KinematicValidation, ValidationFigures
from cellcal.solver.kinematics import N_JOINTS, DHParameters, KinematicModel
from cellcal.solver.points import calibrate_base_frame_points
from cellcal.solver.se3 import se3_exp
from cellcal.solver.validation import HoldoutClosure

__all__ = [
    "identify_kinematics",
    "KinematicResult",
    "ValidationFigures",
    "KinematicValidation",
    "parameter_names",
    "kinematic_jacobian",
    "DEFAULT_MAX_CONDITION",
    "DEFAULT_PARAMETER_PRIOR",
]

#: Condition number of the column-normalised Jacobian above which an answer is refused.
DEFAULT_MAX_CONDITION = 100.0
#: Relative orthogonal part below which a Jacobian column counts as dependent.
DEFAULT_RANK_TOL = 1e-6
#: Default 1-sigma when nothing is declared (weights only: the scale is then estimated).
_DEFAULT_NOISE_T = 50e-6
_DEFAULT_NOISE_R = math.radians(0.01)
_BASE_NAMES = tuple(f"cell_T_base.{c}" for c in ("x", "y", "z", "rx", "ry", "rz"))
_POSE_TOOL_NAMES = tuple(f"flange_T_target.{c}" for c in ("x", "y", "z", "rx", "ry", "rz"))
_POINT_TOOL_NAMES = tuple(f"flange_p_target.{c}" for c in ("x", "y", "z"))
_KINDS = ("zero_offset", "a", "d", "alpha", "beta")
_HINT = ("a pose station gives 6 observations, a point 3; the unknowns are the identifiable parameters, "
         "the base frame and the target")


# --------------------------------------------------------------------------- checks
def _check_q(q: ArrayLike, name: str) -> np.ndarray:
    a = np.asarray(q, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != N_JOINTS:
        raise ValueError(f"{name}: expected joint angles of shape (N, {N_JOINTS}) in rad, got {np.shape(q)}")
    bad = np.flatnonzero(~np.all(np.isfinite(a), axis=1))
    if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}]: contains NaN or inf")
    if np.any(np.abs(a) > 4 * math.pi):
        k = int(np.argmax(np.any(np.abs(a) > 4 * math.pi, axis=1)))
        raise ValueError(f"{name}[{k}]: joint angle beyond 4 pi: degrees given where radians are expected?")
    return a


def _check_meas(meas: ArrayLike, n: int, pose: bool, name: str) -> np.ndarray:
    m = np.asarray(meas, dtype=np.float64)
    want = (n, 4, 4) if pose else (n, 3)
    if m.shape != want:
        raise ValueError(f"{name}: expected shape {want} (one per row of the joint angles), got {m.shape}")
    flat = m.reshape(n, -1)
    bad = np.flatnonzero(~np.all(np.isfinite(flat), axis=1))
    if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}]: contains NaN or inf")
    if pose:
        err = np.abs(np.einsum("nji,njk->nik", m[:, :3, :3], m[:, :3, :3]) - np.eye(3)).max(axis=(1, 2))
        if np.any(err > 1e-6):
            raise ValueError(f"{name}[{int(np.argmax(err))}]: rotation part is not orthonormal")
    return m


def _whiteners(n: int, pose: bool, cov: ArrayLike | None, noise_t: float | None, noise_r: float | None,
               name: str) -> tuple[np.ndarray, bool]:
    """Per-station ``L^-1`` (N, r, r) with ``C = L L^T``, and whether the noise is declared."""
    r = 6 if pose else 3
    if cov is not None:
        C = np.asarray(cov, dtype=np.float64)
        if C.shape != (n, r, r):
            raise ValueError(f"{name}: expected shape {(n, r, r)}, got {C.shape}")
        try:
            L = np.linalg.cholesky(C)
        except np.linalg.LinAlgError:
            bad = [k for k in range(n) if np.any(np.linalg.eigvalsh(0.5 * (C[k] + C[k].T)) <= 0)]
            raise ValueError(f"{name}[{bad[0] if bad else 0}]: not symmetric positive definite") from None
        return np.linalg.inv(L), True
    declared = noise_t is not None and (noise_r is not None or not pose)
    st = _DEFAULT_NOISE_T if noise_t is None else float(noise_t)
    sr = _DEFAULT_NOISE_R if noise_r is None else float(noise_r)
    if not (st > 0 and math.isfinite(st)) or not (sr > 0 and math.isfinite(sr)):
        raise ValueError("noise_translation_m and noise_rotation_rad must be positive finite numbers")
    d = np.array([1 / st] * 3 + ([1 / sr] * 3 if pose else []))
    return np.broadcast_to(np.diag(d), (n, r, r)).copy(), declared


# --------------------------------------------------------------------------- rank test
def _pivoted(Jn: np.ndarray, n_fixed_first: int, tol: float,
             deferred: Sequence[int] = ()) -> tuple[list[int], list[int], np.ndarray]:
    """Greedy QR with column pivoting on column-normalised ``Jn`` (rows, cols).

    The first ``n_fixed_first`` columns are taken in order (frames); then each step keeps
    the column with the largest orthogonal part (ties within 1e-9 go to the earlier one);
    ``deferred`` columns (:func:`_still_columns`) are judged only after the rest.
    Returns kept, dependent (column indices) and the orthogonal fraction of every column
    at the step it was judged.
    """
    m, k = Jn.shape
    Q = np.zeros((m, 0))
    frac = np.ones(k)
    kept: list[int] = []
    for c in range(n_fixed_first):
        v = Jn[:, c] - Q @ (Q.T @ Jn[:, c])
        v = v - Q @ (Q.T @ v)
        nv = np.linalg.norm(v)
        frac[c] = nv
        if nv > tol:
            Q = np.column_stack([Q, v / nv])
            kept.append(c)
    for group in ([c for c in range(n_fixed_first, k) if c not in deferred], [c for c in deferred if c < k]):
        rest = list(group)
        R = Jn[:, rest] - Q @ (Q.T @ Jn[:, rest])
        while rest:
            norms = np.linalg.norm(R, axis=0)
            best = float(norms.max())
            j = int(np.flatnonzero(norms >= best * (1 - 1e-9))[0])
            if best <= tol:
                for jj, c in enumerate(rest):
                    frac[c] = norms[jj]
                break
            c = rest.pop(j)
            frac[c] = best
            qv = R[:, j] / best
            R = np.delete(R, j, axis=1)
            R = R - np.outer(qv, qv @ R)
            Q = np.column_stack([Q, qv])
            kept.append(c)
    dependent = [c for c in range(k) if c not in kept]
    return kept, dependent, frac


def _still_columns(q: np.ndarray, names: Sequence[str], offset: int) -> list[int]:
    """Columns (``offset`` + index in ``names``) of the zero offset and link row of every
    joint that never moves in ``q``. Such a joint's angle and the link behind it are one
    rigid piece with the link before it, so the group loses degrees of freedom; fixing the
    still joint's own offset and row first names what a person expects ("joint 5 never
    moves: joint5.zero_offset, link5.a, ...") instead of an arbitrary member of the group."""
    out = []
    for i in range(N_JOINTS):
        if np.ptp(q[:, i]) < 1e-6:
            own = [_name("zero_offset", i)] + [_name(k, i) for k in ("a", "alpha", "beta", "d")]
            out += [offset + names.index(n) for n in own if n in names]
    return out


def _normalise(J: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    nrm = np.linalg.norm(J, axis=0)
    nrm = np.where(nrm > 0, nrm, 1.0)
    return J / nrm, nrm


def _cond(Jn: np.ndarray) -> float:
    s = np.linalg.svd(Jn, compute_uv=False)
    return float(s[0] / s[-1]) if s[-1] > 0 else math.inf


# --------------------------------------------------------------------------- fitting
@dataclass
class _Fit:
    model: DHParameters
    base: np.ndarray
    tool: np.ndarray
    res: np.ndarray  # (N, r) unwhitened
    Jw: np.ndarray  # (N*r, k) whitened at the answer
    ew: np.ndarray  # (N*r,) whitened residual
    weights: np.ndarray  # (N,) Huber
    iterations: int
    converged: bool
    stop_reason: str


def _perturb(nominal: DHParameters, names: Sequence[str], x: np.ndarray, base: np.ndarray, tool: np.ndarray,
             step: np.ndarray, pose: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    P = len(names)
    x2 = x + step[:P]
    b2 = base @ se3_exp(step[P:P + 6])
    t2 = tool @ se3_exp(step[P + 6:P + 12]) if pose else tool + step[P + 6:P + 9]
    return x2, b2, t2


def _tail_threshold(k: float, r: int) -> float:
    """Whitened station norm as unlikely as a ``k``-sigma normal deviation: the ``erf(k /
    sqrt 2)`` quantile of chi with ``r`` degrees of freedom (k = 3: 3.0 for r = 1, 3.76 for
    r = 3, 4.41 for r = 6), so ``k`` means the same for points and poses."""
    return math.sqrt(chi2_ppf(math.erf(k / math.sqrt(2.0)), r))


def _station_u(ew: np.ndarray, n: int, r: int, declared: bool, mask: np.ndarray) -> np.ndarray:
    """Whitened station norms over a robust scale (median of the kept stations' norms over
    the chi median), declared noise or not: a blunder spreads into every residual of the fit
    it spoils, so the declared scale would condemn all stations."""
    nu = np.linalg.norm(ew.reshape(n, r), axis=1)
    kept = nu[mask > 0]
    scale = max(float(np.median(kept if kept.size else nu)) / math.sqrt(chi2_ppf(0.5, r)), 1e-300)
    return nu / scale


def _huber_weights(ew: np.ndarray, n: int, r: int, k: float | None, declared: bool,
                   mask: np.ndarray) -> np.ndarray:
    if k is None:
        return mask.copy()
    u = _station_u(ew, n, r, declared, mask)
    t = _tail_threshold(k, r)
    return np.where(u > t, t / np.maximum(u, 1e-300), 1.0) * mask


def _lm(nominal: DHParameters, names: Sequence[str], q: np.ndarray, meas: np.ndarray, Winv: np.ndarray,
        base0: np.ndarray, tool0: np.ndarray, pose: bool, huber: float | None, declared: bool,
        max_iterations: int, mask: np.ndarray | None = None) -> _Fit:
    n, r = q.shape[0], (6 if pose else 3)
    mask = np.ones(n) if mask is None else mask
    x = np.zeros(len(names))
    base, tool = base0.copy(), tool0.copy()

    def evaluate(x: np.ndarray, base: np.ndarray, tool: np.ndarray) -> tuple[DHParameters, np.ndarray, np.ndarray]:
        m = _apply(nominal, names, x, nominal.name)
        pred, J = kinematic_jacobian(m, q, names, base, tool)
        return m, _residuals(pred, meas), J

    model, res, J = evaluate(x, base, tool)
    ew = np.einsum("nij,nj->ni", Winv, res).reshape(-1)
    w = _huber_weights(ew, n, r, huber, declared, mask)
    lam = 1e-3
    converged, stop = False, "iteration limit"
    it = 0
    for _ in range(max_iterations):
        it += 1
        sw = np.repeat(np.sqrt(w), r)
        Jw = np.einsum("nij,njk->nik", Winv, J).reshape(n * r, -1) * sw[:, None]
        e = ew * sw
        Js, D = _normalise(Jw)
        g = Js.T @ e
        H = Js.T @ Js
        cost = float(e @ e)
        accepted = False
        for _ in range(30):
            try:
                ds = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), g)
            except np.linalg.LinAlgError:
                lam *= 10
                continue
            step = ds / D
            x2, b2, t2 = _perturb(nominal, names, x, base, tool, step, pose)
            m2, res2, J2 = evaluate(x2, b2, t2)
            ew2 = np.einsum("nij,nj->ni", Winv, res2).reshape(-1)
            e2 = ew2 * sw
            cost2 = float(e2 @ e2)
            if cost2 <= cost * (1 + 1e-15):
                accepted = True
                x, base, tool, model, res, J, ew = x2, b2, t2, m2, res2, J2, ew2
                lam = max(lam / 10, 1e-12)
                break
            lam *= 10
        if not accepted:
            # No step lowers the cost: at a minimum to rounding, if the gradient agrees.
            converged = bool(np.linalg.norm(g) <= 1e-6 * max(1.0, math.sqrt(cost)))
            stop = "converged: no step lowers the cost" if converged else "stopped: rejected steps"
            break
        w_new = _huber_weights(ew, n, r, huber, declared, mask)
        reweighted = huber is not None and np.max(np.abs(w_new - w)) > 1e-6
        w = w_new
        # ds is in whitened units (1 = one sigma of the measurements): 1e-8 of a sigma is nothing.
        if not reweighted and (float(np.linalg.norm(ds)) < 1e-8 or cost - cost2 <= 1e-14 * max(cost, 1e-300)):
            converged, stop = True, "converged: step below tolerance"
            break
    sw = np.repeat(np.sqrt(w), r)
    Jw = np.einsum("nij,njk->nik", Winv, J).reshape(n * r, -1) * sw[:, None]
    return _Fit(model=model, base=base, tool=tool, res=res, Jw=Jw, ew=ew * sw, weights=w, iterations=it,
                converged=converged, stop_reason=stop)


def _initial_frames(q: np.ndarray, meas: np.ndarray, model: DHParameters, pose: bool,
                    cell_T_base: ArrayLike | None) -> tuple[np.ndarray, np.ndarray]:
    bTf = model.forward(q)
    if cell_T_base is not None:
        base = np.asarray(cell_T_base, dtype=float)
        if base.shape != (4, 4):
            raise ValueError(f"initial_cell_T_base: expected shape (4, 4), got {base.shape}")
        cTf = base @ bTf
        if pose:
            tools = np.linalg.inv(cTf) @ meas
            tool = tools[0].copy()
        else:
            loc = np.einsum("nji,nj->ni", cTf[:, :3, :3], meas - cTf[:, :3, 3])
            tool = loc.mean(axis=0)
        return base, tool
    if pose:
        res = calibrate_base_frame(bTf, meas, holdout=False)
        return np.array(res.cell_T_base), np.array(res.flange_T_target)
    pres = calibrate_base_frame_points(bTf, meas, holdout=False)
    return np.array(pres.cell_T_base), np.array(pres.flange_p_target)


def _stats(x: np.ndarray) -> tuple[float, float, float, float]:
    if x.size == 0:
        return (math.nan,) * 4
    return (float(np.sqrt(np.mean(x**2))), float(np.percentile(x, 50)), float(np.percentile(x, 90)),
            float(np.max(x)))


def _figures(pred: np.ndarray, meas: np.ndarray) -> ValidationFigures:
    res = _residuals(pred, meas)
    t = np.linalg.norm(res[:, :3], axis=1)
    rot = np.linalg.norm(res[:, 3:], axis=1) if res.shape[1] == 6 else np.array([])
    pm = meas[:, :3, 3] if meas.ndim == 3 else meas
    pp = pred[:, :3, 3] if pred.ndim == 3 else pred
    iu = np.triu_indices(pm.shape[0], 1)
    dm = np.linalg.norm(pm[:, None] - pm[None], axis=2)[iu]
    dp = np.linalg.norm(pp[:, None] - pp[None], axis=2)[iu]
    de = np.abs(dm - dp)
    rt, rr = _stats(t), _stats(rot)
    return ValidationFigures(
        n_stations=int(pm.shape[0]), rms_translation_m=rt[0], p50_translation_m=rt[1], p90_translation_m=rt[2],
        max_translation_m=rt[3], rms_rotation_rad=rr[0], p50_rotation_rad=rr[1], p90_rotation_rad=rr[2],
        max_rotation_rad=rr[3], pairwise_rms_m=float(np.sqrt(np.mean(de**2))) if de.size else math.nan,
        pairwise_max_m=float(de.max()) if de.size else math.nan,
    )


def _excess(res: np.ndarray, station_cov: np.ndarray, dof: int, n: int, r: int) -> float:
    """RMS length of one block of the residuals (translation or rotation) beyond what the
    declared noise explains: its expected share is the trace of each station's covariance
    times ``dof / observations``."""
    expected = float(np.mean(np.trace(station_cov, axis1=1, axis2=2))) * dof / (n * r)
    return math.sqrt(max(float(np.mean(np.sum(res ** 2, axis=1))) - expected, 0.0))


def _absorbed(cov: np.ndarray, P: int, fit: _Fit, q: np.ndarray, excess_t: float, excess_r: float) -> np.ndarray:
    """``cov`` plus the error the identification absorbed unseen into the base frame and the
    target, when its residuals exceed the declared noise.

    An error the DH model does not describe leaves a residual, and also moves the answer by
    what looks like a rigid motion of the robot: sag under the payload is mostly a drop
    of the base (on the realistic cell 0.11 mm of it, reported with 0.015 mm of sigma before
    this). As in the rigid calibrations (:mod:`cellcal.solver.diagnostics`, "Model error";
    ADR 0004), the absorbed part is taken as ``ABSORBED_TO_VISIBLE`` times the visible
    excess per axis, about the stations' centroid and the base origin in halves, and the
    target's block widened isotropically by it.
    """
    tau_t, tau_r = excess_t / math.sqrt(3.0), excess_r / math.sqrt(3.0)
    # Target positions in the base frame: where the stations pin the base.
    p = kinematic_jacobian(fit.model, q, [], np.eye(4), fit.tool)[0]
    p = p[:, :3, 3] if p.ndim == 3 else p
    c = p.mean(axis=0)
    spread = math.sqrt(float(np.mean(np.sum((p - c) ** 2, axis=1))))
    if spread > 0.0:
        tau_r = max(tau_r, tau_t / spread)
    tau_t *= ABSORBED_TO_VISIBLE
    tau_r *= ABSORBED_TO_VISIBLE
    out = cov.copy()
    out[P:P + 6, P:P + 6] += absorbed_error_covariance(c, tau_t, tau_r)
    k = out.shape[0] - (P + 6)
    out[P + 6:, P + 6:] += np.diag(([tau_t * tau_t] * 3 + [tau_r * tau_r] * 3)[:k])
    return out


def _holdout(fit: _Fit, Winv: np.ndarray, n: int, r: int) -> HoldoutClosure:
    Jw, e = fit.Jw, fit.ew
    Hinv = np.linalg.pinv(Jw.T @ Jw)
    t = np.empty(n)
    rot = np.zeros(n)
    for i in range(n):
        if fit.weights[i] == 0.0:  # dropped: already held out, its residual is its closure
            t[i] = float(np.linalg.norm(fit.res[i, :3]))
            rot[i] = float(np.linalg.norm(fit.res[i, 3:])) if r == 6 else 0.0
            continue
        Ji = Jw[i * r:(i + 1) * r]
        Pi = Ji @ Hinv @ Ji.T
        try:
            eloo = np.linalg.solve(np.eye(r) - Pi, e[i * r:(i + 1) * r])
        except np.linalg.LinAlgError:
            t[i] = rot[i] = math.inf
            continue
        wi = math.sqrt(fit.weights[i])
        raw = np.linalg.solve(Winv[i], eloo / wi)
        t[i] = float(np.linalg.norm(raw[:3]))
        if r == 6:
            rot[i] = float(np.linalg.norm(raw[3:]))
    ins = np.linalg.norm(fit.res[:, :3], axis=1)
    fin = t[np.isfinite(t)]
    pt = (np.percentile(fin, 50), np.percentile(fin, 90), fin.max()) if fin.size else (math.inf,) * 3
    pr = (np.percentile(rot, 50), np.percentile(rot, 90), rot.max())
    infl = float(np.sqrt(np.mean(fin**2)) / max(np.sqrt(np.mean(ins**2)), 1e-300)) if fin.size else math.inf
    t.setflags(write=False)
    rot.setflags(write=False)
    return HoldoutClosure(method="linearised leave-one-out", folds=n, translation_m=t, rotation_rad=rot,
                          p50_translation_m=float(pt[0]), p90_translation_m=float(pt[1]),
                          max_translation_m=float(pt[2]), p50_rotation_rad=float(pr[0]),
                          p90_rotation_rad=float(pr[1]), max_rotation_rad=float(pr[2]), inflation=infl)


def _generic_q(n: int = 60) -> np.ndarray:
    rng = np.random.default_rng(20260101)
    return rng.uniform(-math.pi, math.pi, size=(n, N_JOINTS))


def _degenerate(message: str, names: Sequence[str], q: np.ndarray) -> DegenerateGeometry:
    span = float(np.max(np.ptp(q, axis=0))) if q.shape[0] else 0.0
    return DegenerateGeometry(message, axis=np.full(3, np.nan), frame="base", axis_spread=0.0,
                              unrecoverable=tuple(names), max_rotation_rad=span, parameters=tuple(names))


def identify_kinematics(
    q: ArrayLike,
    model: DHParameters,
    *,
    cell_T_target: ArrayLike | None = None,
    cell_p_target: ArrayLike | None = None,
    parameters: Sequence[str] | None = None,
    cell_T_target_cov: ArrayLike | None = None,
    cell_p_target_cov: ArrayLike | None = None,
    noise_translation_m: float | None = None,
    noise_rotation_rad: float | None = None,
    validation_q: ArrayLike | None = None,
    validation_cell_T_target: ArrayLike | None = None,
    validation_cell_p_target: ArrayLike | None = None,
    initial_cell_T_base: ArrayLike | None = None,
    max_condition: float = DEFAULT_MAX_CONDITION,
    rank_tol: float = DEFAULT_RANK_TOL,
    correlation_threshold: float = 0.9,
    huber: float | None = None,
    reject_k: float | None = None,
    max_iterations: int = 100,
    parameter_prior: Mapping[str, float] | None = None,
) -> KinematicResult:
    """Identify a six-joint arm's DH parameters with ``cell_T_base`` and the flange target.

    Parameters
    ----------
    q : array_like, shape (N, 6)
        Joint angles at the stations, rad (the controller's readings).
    model : DHParameters
        The nominal arm (UR factory table when available, else the data sheet), m and rad.
    cell_T_target : array_like, shape (N, 4, 4), optional
        6-DoF measurements of the target in the cell, m.
    cell_p_target : array_like, shape (N, 3), optional
        3-DoF measurements (reflector), m. Exactly one of the two.
    parameters : sequence of str, optional
        The set to identify (names as in the module docstring). None: every parameter the
        stations determine (the rest named in ``unidentifiable``); given: refused with
        :class:`DegenerateGeometry` naming those the stations cannot determine.
    cell_T_target_cov : array_like, shape (N, 6, 6), optional
        Measurement covariance per station, cell frame, ``(dp m, dphi rad)``
        (:meth:`TrackerNoiseModel.pose_covariance`).
    cell_p_target_cov : array_like, shape (N, 3, 3), optional
        The same for points, m^2 (:meth:`TrackerNoiseModel.point_covariance`).
    noise_translation_m, noise_rotation_rad : float, optional
        Declared isotropic 1-sigma instead of covariances.
    validation_q, validation_cell_T_target, validation_cell_p_target : array_like, optional
        Held-out stations (never fitted) for ``result.validation``.
    initial_cell_T_base : array_like, shape (4, 4), optional
        Start for the base frame; default: the rigid fit with the nominal arm.
    max_condition : float
        Gate on the condition number of the column-normalised Jacobian (default 100).
    rank_tol : float
        Orthogonal fraction below which a parameter's column counts as dependent.
    correlation_threshold : float
        Correlations with ``|rho|`` above this are listed in ``result.correlations``.
    huber : float, optional
        Huber threshold ``k``: a station whose whitened residual norm is as unlikely as a
        ``k``-sigma normal deviation (chi quantile, so the same ``k`` for points and poses)
        is down-weighted; the scale is the declared noise or, undeclared, robust (median).
    reject_k : float, optional
        Hard rejection: stations beyond ``k`` sigmas (the same measure) are dropped and the
        fit repeated; named in ``downweighted`` and an ``outliers`` warning.
    max_iterations : int
        Levenberg-Marquardt iteration budget.
    parameter_prior : mapping of str to float, optional
        1-sigma (m or rad) of the parameters that are fixed at nominal, by kind
        (``"zero_offset"``, ``"a"``, ``"d"``, ``"alpha"``, ``"beta"``) or by name; the rest
        from :data:`DEFAULT_PARAMETER_PRIOR`. The fixed parameters the estimate cannot
        absorb exactly (``result.considered``) carry it into the sigmas, the frames'
        covariance and :meth:`KinematicResult.prediction_covariance` (consider covariance,
        :mod:`cellcal.solver.kinematic_consider`); 0: known exactly, not considered.

    Returns
    -------
    KinematicResult

    Raises
    ------
    ValueError
        Bad shapes, non-finite values, unknown parameter names, both or neither measurement.
    NotEnoughSamples
        Fewer observations than unknowns.
    DegenerateGeometry
        A requested parameter the stations cannot determine, or the condition gate
        (``.parameters`` and ``.unrecoverable`` name them).
    """
    nominal = _as_model(model)
    qa = _check_q(q, "q")
    n = qa.shape[0]
    if (cell_T_target is None) == (cell_p_target is None):
        raise ValueError("give exactly one of cell_T_target (6-DoF poses) and cell_p_target (3-DoF points)")
    pose = cell_T_target is not None
    given = cell_T_target if pose else cell_p_target
    assert given is not None
    meas = _check_meas(given, n, pose,
                       "cell_T_target" if pose else "cell_p_target")
    r = 6 if pose else 3
    Winv, declared = _whiteners(n, pose, cell_T_target_cov if pose else cell_p_target_cov,
                                noise_translation_m, noise_rotation_rad,
                                "cell_T_target_cov" if pose else "cell_p_target_cov")
    if not (max_condition > 1 and rank_tol > 0 and 0 < correlation_threshold <= 1):
        raise ValueError("max_condition must exceed 1, rank_tol be positive, correlation_threshold in (0, 1]")
    for key, val in (("huber", huber), ("reject_k", reject_k)):
        if val is not None and not (isinstance(val, (int, float)) and val > 0 and math.isfinite(val)):
            raise ValueError(f"{key} must be a positive number, got {val!r}")
    all_names = parameter_names(nominal)
    prior = resolve_prior(parameter_prior, all_names, {p: _parse(p)[0] for p in all_names})
    if parameters is not None:
        req = [str(p) for p in parameters]
        for p in req:
            _parse(p)
        unknown = [p for p in req if p not in all_names]
        if unknown:
            raise ValueError(f"parameters {unknown} are not part of this model's parameterisation "
                             f"(beta exists only on parallel rows {[i + 1 for i in nominal.parallel_rows()]})")
        if len(set(req)) != len(req):
            raise ValueError("parameters: a name is repeated")
        candidates = tuple(p for p in all_names if p in req)
    else:
        candidates = all_names
    n_frame = 6 + (6 if pose else 3)
    n_min_obs = n_frame + 1
    if n * r < n_min_obs or n < 3:
        raise NotEnoughSamples(n, max(3, -(-n_min_obs // r)), "kinematic identification", hint=_HINT)

    base0, tool0 = _initial_frames(qa, meas, nominal, pose, initial_cell_T_base)

    def frames_first(J: np.ndarray, P: int) -> np.ndarray:
        return np.concatenate([J[:, P:], J[:, :P]], axis=1)

    def whitened(Jraw: np.ndarray) -> np.ndarray:
        return np.einsum("nij,njk->nik", Winv, Jraw).reshape(Jraw.shape[0] * r, -1)

    P = len(candidates)
    _, J0 = kinematic_jacobian(nominal, qa, candidates, base0, tool0)
    Jn0, _ = _normalise(frames_first(whitened(J0), P))
    kept, dep, frac = _pivoted(Jn0, n_frame, rank_tol, deferred=_still_columns(qa, candidates, n_frame))
    if any(c < n_frame for c in dep):
        raise _degenerate("the stations do not determine the base frame and the target even with the nominal arm",
                          [(_BASE_NAMES + (_POSE_TOOL_NAMES if pose else _POINT_TOOL_NAMES))[c] for c in dep
                           if c < n_frame], qa)
    dep_names = [candidates[c - n_frame] for c in dep]
    reasons = _reasons(nominal, candidates, dep_names, base0, tool0, pose, Winv[0], n_frame, qa)
    if parameters is not None and dep_names:
        raise _degenerate(
            f"the stations cannot determine {', '.join(dep_names)} ("
            + "; ".join(f"{d}: {reasons[d]}" for d in dep_names) + ")", dep_names, qa)
    est = [candidates[c - n_frame] for c in sorted(c for c in kept if c >= n_frame)]
    # The condition gate: drop the weakest pivots when choosing automatically, refuse otherwise.
    while True:
        idx = [candidates.index(p) for p in est]
        Jn, _ = _normalise(frames_first(whitened(J0[:, :, idx + list(range(P, J0.shape[2]))]), len(idx)))
        cond = _cond(Jn)
        if cond <= max_condition or not est:
            break
        weakest = _weakest(Jn, est, n_frame)
        if parameters is not None:
            raise _degenerate(
                f"condition number {cond:.0f} of the column-normalised Jacobian exceeds {max_condition:g}: "
                f"the stations barely determine {', '.join(weakest)} (plan stations that move the joints "
                "involved, or pass max_condition)", weakest, qa)
        est.remove(weakest[0])
        dep_names.append(weakest[0])
        reasons[weakest[0]] = f"weakly determined (condition number {cond:.0f} above {max_condition:g})"
    est_t = tuple(p for p in candidates if p in est)
    unident = tuple(p for p in all_names if p not in est_t and (p in dep_names or parameters is None))
    if n * r <= n_frame + len(est_t):
        raise NotEnoughSamples(n, -(-(n_frame + len(est_t) + 1) // r), "kinematic identification", hint=_HINT)

    fit = _lm(nominal, est_t, qa, meas, Winv, base0, tool0, pose, huber, declared, max_iterations)
    rejected = np.zeros(0, dtype=int)
    if reject_k is not None:
        # Hard rejection: stations beyond k (robust) sigmas are dropped and the fit repeated,
        # then every station is judged again against the refit (a blunder spoils the first
        # fit's residuals of good stations too) until the set is stable.
        t_cut = _tail_threshold(reject_k, r)
        out = np.zeros(n, dtype=bool)
        for _ in range(5):
            raw_ew = np.einsum("nij,nj->ni", Winv, fit.res).reshape(-1)
            new_out = _station_u(raw_ew, n, r, declared, (~out).astype(float)) > t_cut
            if np.array_equal(new_out, out):
                break
            out = new_out
            if (n - int(out.sum())) * r <= n_frame + len(est_t) or n - int(out.sum()) < 3:
                raise NotEnoughSamples(n - int(out.sum()), -(-(n_frame + len(est_t) + 1) // r),
                                       "kinematic identification after rejecting outliers", hint=_HINT)
            fit = _lm(nominal, est_t, qa, meas, Winv, fit.base, fit.tool, pose, huber, declared, max_iterations,
                      mask=(~out).astype(float))
        rejected = np.flatnonzero(out)
    k = fit.Jw.shape[1]
    dof = (n - rejected.size) * r - k
    Jw_f, ew = fit.Jw, fit.ew
    chi2 = float(ew @ ew)
    chi2_dof = chi2 / dof if dof > 0 else math.nan
    Js, D = _normalise(Jw_f)
    cond_final = _cond(frames_first(Js, len(est_t)))
    Hinv_s = np.linalg.pinv(Js.T @ Js)
    cov = Hinv_s / np.outer(D, D)
    warnings: list[SolveWarning] = []
    if not fit.converged:
        noise_source = "default"
        warnings.append(SolveWarning(code="not_converged", message=f"the identification did not converge "
                                     f"({fit.stop_reason} after {fit.iterations} iterations)"))
    elif declared:
        noise_source = "declared"
        if dof > 0 and chi2 > chi2_ppf(0.999, dof):
            cov = cov * chi2_dof
            # value: RMS (mm) of the translation residual beyond what the declared noise explains.
            station_cov = np.linalg.inv(np.einsum("nji,njk->nik", Winv, Winv))
            excess = _excess(fit.res[:, :3], station_cov[:, :3, :3], dof, n, r)
            warnings.append(SolveWarning(
                code="model_error", value=excess * 1e3,
                message=(f"residuals are {math.sqrt(chi2_dof):.1f}x the declared noise after identification "
                         f"({excess * 1e3:.3f} mm RMS beyond it): "
                         "an error the model does not describe (thermal, compliance, gear backlash) or "
                         "understated noise; the covariance is inflated by that ratio and the base frame's "
                         "and target's widened by what the fit absorbed of it")))
            excess_r = _excess(fit.res[:, 3:], station_cov[:, 3:, 3:], dof, n, r) if pose else 0.0
            cov = _absorbed(cov, len(est_t), fit, qa, excess, excess_r)
    else:
        noise_source = "estimated"
        if dof > 2:
            cov = cov * chi2_dof * dof / (dof - 2)
        else:
            warnings.append(SolveWarning(code="noise_default", message="too few degrees of freedom to estimate "
                                         "the noise: the covariance uses the default weights"))
            noise_source = "default"
    # Consider covariance: what the fixed parameters' true errors do to the estimate.
    noise_sig = np.sqrt(np.maximum(np.diag(cov[:len(est_t), :len(est_t)]), 0.0))
    considered = _considered(nominal, est_t, [p for p in all_names if p not in est_t], base0, tool0, pose,
                             Winv[0], rank_tol, prior)
    full_cov = cov
    if considered:
        _, Jc = kinematic_jacobian(fit.model, qa, considered, fit.base, fit.tool)
        Jcw = whitened(Jc[:, :, :len(considered)]) * np.repeat(np.sqrt(fit.weights), r)[:, None]
        add, cross, Pc = consider_blocks(sensitivity(fit.Jw, Jcw), np.array([prior[p] for p in considered]))
        cov = cov + add
        full_cov = np.block([[cov, cross], [cross.T, Pc]])
    # Named in the warning: those the data left undetermined (a structural sibling of one,
    # like link2.d of a weak link4.d, is considered too, and named through it).
    weak = [p for p in considered if p in dep_names and reasons[p].startswith(("not excited", "weakly determined"))]
    weak_joints: tuple[int, ...] = ()
    if weak:
        sig_now = np.sqrt(np.maximum(np.diag(cov[:len(est_t), :len(est_t)]), 0.0))
        widen = sig_now / np.where(noise_sig > 0, noise_sig, 1.0)
        weak_joints = tuple(_missing_motion(nominal, est_t, weak, qa, base0, tool0, pose, Winv))
        warnings.append(_weak_warning(weak, weak_joints, est_t, widen))
    if cond_final > max_condition:
        warnings.append(SolveWarning(code="ill_conditioned", value=cond_final,
                                     message=f"condition number {cond_final:.0f} at the answer exceeds "
                                     f"{max_condition:g} (it was below at the start)"))
    frame_names = _BASE_NAMES + (_POSE_TOOL_NAMES if pose else _POINT_TOOL_NAMES)
    cov_names = tuple(est_t) + frame_names
    sig = np.sqrt(np.maximum(np.diag(cov), 0.0))
    corr = cov / np.outer(np.where(sig > 0, sig, 1), np.where(sig > 0, sig, 1))
    pairs = [(cov_names[i], cov_names[j], float(corr[i, j])) for i in range(k) for j in range(i + 1, k)
             if abs(corr[i, j]) > correlation_threshold]
    # Observability of the parameters alone: base and target projected out.
    o1 = o3 = math.nan
    if est_t:
        Jp, Jf = Js[:, :len(est_t)], Js[:, len(est_t):]
        Qf, _ = np.linalg.qr(Jf)
        s = np.linalg.svd(Jp - Qf @ (Qf.T @ Jp), compute_uv=False)
        o1 = float(np.exp(np.mean(np.log(np.maximum(s, 1e-300)))) / math.sqrt(n))
        o3 = float(s[-1])
    ident = fit.model
    params = {p: _value(ident, nominal, p) for p in est_t}
    deltas = {p: params[p] - _value(nominal, nominal, p) for p in est_t}
    sigmas = {p: float(sig[i]) for i, p in enumerate(est_t)}
    noise_sigmas = {p: float(noise_sig[i]) for i, p in enumerate(est_t)}
    ident = KinematicModel.from_dh(ident, name=f"{nominal.name} identified")
    tres = np.linalg.norm(fit.res[:, :3], axis=1)
    rres = np.linalg.norm(fit.res[:, 3:], axis=1) if pose else np.zeros(n)
    residuals = Residuals(translation_m=tres, rotation_rad=rres)
    holdout = _holdout(fit, Winv, n, r)
    downweighted = np.flatnonzero(fit.weights < 1.0)
    if downweighted.size:
        what = (f"{rejected.size} dropped beyond {reject_k:g} sigmas ({rejected.tolist()})" if rejected.size else "")
        soft = sorted(set(downweighted.tolist()) - set(rejected.tolist()))
        if soft:
            what += ("; " if what else "") + f"{len(soft)} down-weighted by the Huber loss ({soft})"
        warnings.append(SolveWarning(code="outliers", value=float(downweighted.size),
                                     message=f"outlying stations: {what}"))
    validation = None
    vm_given = validation_cell_T_target if pose else validation_cell_p_target
    if validation_q is not None or vm_given is not None:
        if validation_q is None or vm_given is None:
            raise ValueError("validation needs validation_q and the matching validation measurement "
                             f"({'validation_cell_T_target' if pose else 'validation_cell_p_target'})")
        vq = _check_q(validation_q, "validation_q")
        vm = _check_meas(vm_given, vq.shape[0], pose,
                         "validation_cell_T_target" if pose else "validation_cell_p_target")
        rigid = _lm(nominal, (), qa, meas, Winv, base0, tool0, pose, huber, declared, max_iterations)
        before = _figures(kinematic_jacobian(nominal, vq, [], rigid.base, rigid.tool)[0], vm)
        after = _figures(kinematic_jacobian(ident, vq, [], fit.base, fit.tool)[0], vm)
        validation = KinematicValidation(before=before, after=after)
    return KinematicResult(
        model=ident, nominal=KinematicModel.from_dh(nominal), parameters=params, deltas=deltas, sigmas=sigmas,
        noise_sigmas=noise_sigmas, estimated=est_t,
        unidentifiable=unident, unidentifiable_reasons={p: reasons[p] for p in unident if p in reasons},
        condition_number=cond_final, observability_o1=o1, observability_o3=o3, cell_T_base=fit.base,
        flange_T_target=fit.tool if pose else None, flange_p_target=None if pose else fit.tool,
        covariance=cov, covariance_names=cov_names, considered=considered,
        prior_sigmas={p: prior[p] for p in considered}, full_covariance=full_cov,
        full_covariance_names=cov_names + considered, weakly_excited=tuple(weak), weakly_excited_joints=weak_joints,
        correlations=tuple(pairs), residuals=residuals,
        rms_translation_m=float(np.sqrt(np.mean(tres**2))), holdout=holdout, validation=validation,
        converged=fit.converged, iterations=fit.iterations, stop_reason=fit.stop_reason,
        noise_source=noise_source, dof=int(dof), chi2_per_dof=chi2_dof, warnings=tuple(warnings),
        downweighted=downweighted, n_stations=n, measurement="pose" if pose else "point",
    )


def _considered(nominal: DHParameters, est: Sequence[str], fixed: Sequence[str], base: np.ndarray, tool: np.ndarray,
                pose: bool, W0: np.ndarray, tol: float, prior: Mapping[str, float]) -> tuple[str, ...]:
    """The fixed parameters with a prior that the frames and ``est`` do not absorb exactly
    on a generic station set (:mod:`cellcal.solver.kinematic_consider`)."""
    fixed = [p for p in fixed if prior[p] > 0]
    if not fixed:
        return ()
    qg = _generic_q()
    r = 6 if pose else 3
    _, J = kinematic_jacobian(nominal, qg, list(est) + fixed, base, tool)
    Jw = np.einsum("ij,njk->nik", W0, J).reshape(qg.shape[0] * r, -1)
    E, F = len(est), len(fixed)
    kept = np.concatenate([Jw[:, E + F:], Jw[:, :E]], axis=1)
    mask = unabsorbed(kept, Jw[:, E:E + F], tol)
    return tuple(p for p, m in zip(fixed, mask, strict=True) if m)


def _missing_motion(nominal: DHParameters, est: Sequence[str], weak: Sequence[str], q: np.ndarray,
                    base: np.ndarray, tool: np.ndarray, pose: bool, Winv: np.ndarray) -> list[int]:
    """Joints (1-based) whose motion over their whole range would determine ``weak``: with
    that joint's angles spread and the others as measured, the weak columns' part orthogonal
    to the estimated ones grows by ``EXCITE_GAIN`` (:mod:`cellcal.solver.kinematic_consider`)."""
    n, r = q.shape[0], (6 if pose else 3)
    E, W = len(est), len(weak)

    def fractions(qq: np.ndarray) -> np.ndarray:
        _, J = kinematic_jacobian(nominal, qq, list(est) + list(weak), base, tool)
        Jw = np.einsum("nij,njk->nik", Winv, J).reshape(n * r, -1)
        return orthogonal_fractions(np.concatenate([Jw[:, E + W:], Jw[:, :E]], axis=1), Jw[:, E:E + W])

    f0 = EXCITE_GAIN * np.maximum(fractions(q), DEFAULT_RANK_TOL)
    spread = np.random.default_rng(20260102).uniform(-math.pi, math.pi, n)
    out = []
    for j in range(N_JOINTS):
        qq = q.copy()
        qq[:, j] = spread
        if np.any(fractions(qq) >= f0):
            out.append(j + 1)
    return out


def _weak_warning(weak: Sequence[str], joints: Sequence[int], est: Sequence[str], widen: np.ndarray) -> SolveWarning:
    """``weak_excitation``: the joints, the parameters fixed for lack of motion, and how much
    their prior widened the estimated ones (``value``: the largest ratio of a sigma to its
    noise-only part)."""
    who = (f"joint{'s' if len(joints) > 1 else ''} {', '.join(map(str, joints))} "
           f"{'do' if len(joints) > 1 else 'does'} not move enough" if joints else "the stations do not excite enough")
    worst = [est[i] for i in np.argsort(widen)[::-1][:3] if widen[i] > 1.5]
    factor = float(widen.max()) if widen.size else 1.0
    msg = (f"{who} to identify {', '.join(weak)}: fixed at nominal, their prior uncertainty (parameter_prior) "
           "is in the sigmas of the estimated parameters, the frames and the predictions (consider covariance)")
    if worst:
        msg += f"; sigmas up to {factor:.1f}x the noise alone ({', '.join(worst)})"
    msg += (f"; plan stations that move joint{'s' if len(joints) > 1 else ''} {', '.join(map(str, joints))}"
            if joints else "; add stations")
    return SolveWarning(code="weak_excitation", value=factor, message=msg)


def _weakest(Jn: np.ndarray, est: list[str], n_frame: int) -> list[str]:
    """Parameters carrying the smallest singular direction of ``Jn`` (frames first), largest
    component first (those above a third of the largest)."""
    _, _, vt = np.linalg.svd(Jn, full_matrices=False)
    v = np.abs(vt[-1, n_frame:])
    if v.size == 0 or v.max() == 0:
        return est[:1]
    order = np.argsort(v)[::-1]
    return [est[i] for i in order if v[i] >= v.max() / 3]


def _reasons(nominal: DHParameters, candidates: Sequence[str], dep: Sequence[str], base: np.ndarray,
             tool: np.ndarray, pose: bool, W0: np.ndarray, n_frame: int, q: np.ndarray) -> dict[str, str]:
    """Why each dependent parameter is dependent (module docstring)."""
    if not dep:
        return {}
    still = [i + 1 for i in range(N_JOINTS) if np.ptp(q[:, i]) < 1e-6]
    n_obs = q.shape[0] * (6 if pose else 3)
    if n_obs < n_frame + len(candidates):
        few = (f"; {q.shape[0]} stations give {n_obs} observations for {n_frame + len(candidates)} unknowns: "
               "add stations")
    else:
        few = ""
    not_excited = "not excited by these stations" + few + (
        f" (joint{'s' if len(still) > 1 else ''} {', '.join(map(str, still))} never move{'' if len(still) > 1 else 's'})"
        if still else "")
    qg = _generic_q()
    r = 6 if pose else 3
    _, Jg = kinematic_jacobian(nominal, qg, candidates, base, tool)
    P = len(candidates)
    Jw = np.einsum("ij,njk->nik", W0, Jg).reshape(qg.shape[0] * r, -1)
    Jn, _ = _normalise(np.concatenate([Jw[:, P:], Jw[:, :P]], axis=1))
    kept, gdep, _ = _pivoted(Jn, n_frame, DEFAULT_RANK_TOL)
    structural = {candidates[c - n_frame] for c in gdep}
    kept_p = [c for c in kept if c >= n_frame]

    def residual_fraction(col: np.ndarray, cols: list[int]) -> float:
        if not cols:
            return 1.0
        A = Jn[:, cols]
        coef, *_ = np.linalg.lstsq(A, col, rcond=None)
        return float(np.linalg.norm(col - A @ coef))

    out: dict[str, str] = {}
    for name in dep:
        if name not in structural:
            out[name] = not_excited
            continue
        col = Jn[:, n_frame + candidates.index(name)]
        if residual_fraction(col, list(range(6))) < 1e-6:
            out[name] = "folded into the base frame (cell_T_base)"
        elif residual_fraction(col, list(range(6, n_frame))) < 1e-6:
            out[name] = f"folded into the target ({'flange_T_target' if pose else 'flange_p_target'})"
        elif residual_fraction(col, list(range(n_frame))) < 1e-6:
            out[name] = "folded into the base frame and the target together"
        else:
            A = Jn[:, kept_p]
            coef, *_ = np.linalg.lstsq(np.concatenate([Jn[:, :n_frame], A], axis=1), col, rcond=None)
            c = np.abs(coef[n_frame:])
            partners = [candidates[kept_p[i] - n_frame] for i in np.argsort(c)[::-1] if c[i] > 0.1]
            out[name] = (f"redundant with {', '.join(partners[:3]) or 'the others'} (they move the target alike "
                         "at every pose" + (": parallel joint axes)" if name.endswith(".d") and
                                             _parse(name)[1] in nominal.parallel_rows() else ")"))
    return out
