"""The pose calibrations' shared pipeline (:mod:`cellcal.solver.calibrate`): preparing the
stacks, the observability test, the one AX=XB solve (ADR 0003), the absolute and hand-eye
linear forms, refinement's finish (covariance, model-error widening, hold-out, warnings; ADR
0004) and the options each kind accepts. Private to the solver: the points solver and the
camera hand-eye solves reuse these pieces; the public API and its constants stay in
:mod:`cellcal.solver.calibrate`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from cellcal.solver import _core, _validate
from cellcal.solver import _observability as _obs
from cellcal.solver import diagnostics as _diag
from cellcal.solver import refine as _refine
from cellcal.solver import sanity as _sanity
from cellcal.solver import validation as _validation
from cellcal.solver.diagnostics import ResidualTests, SolveWarning
from cellcal.solver.errors import CalibrationError, DegenerateGeometry, NotEnoughSamples
from cellcal.solver.model_error import DEFAULT_ROBOT_ACCURACY_M
from cellcal.solver.options import SolverOptions
from cellcal.solver.pose_results import Residuals
from cellcal.solver.se3 import se3_inverse
from cellcal.solver.uncertainty import (
    inverse_covariance_map,
    sigma_figures,
)
from cellcal.solver.workspace import Workspace

#: Below this ``axis_spread`` the motions are refused as parallel (ADR 0002). A cone of
#: rotation axes with half-angle a has a spread of about 1.5 sin(a)^2: 1e-4 is a cone of
#: about 0.5 degrees, which tracker-grade noise (0.01-0.1 deg) already fills.
DEFAULT_MIN_AXIS_SPREAD = 1e-4
#: If no motion rotates more than this, nothing is determined (1 mrad = 0.057 deg).
DEFAULT_MIN_ROTATION_RAD = 1e-3
#: Two motions with non-parallel axes need three stations.
MIN_STATIONS = 3
#: Default tolerances of a prior (``expected_cell_T_base`` ...): a cell drawing locates a
#: robot to a few centimetres and degrees; wrong inputs miss it by far more (ADR 0014).
DEFAULT_EXPECTED_TOLERANCE_M = 0.05
DEFAULT_EXPECTED_TOLERANCE_RAD = math.radians(5.0)
#: Below this ``axis_spread`` (a cone of axes narrower than about 5 deg) the linear answer
#: is checked for determinacy at its estimated noise before it is refined.
CHECK_SPREAD = 1e-2
#: A result whose primary rotation is undetermined beyond this 1-sigma (rad, the largest
#: eigen-direction) is refused as degenerate: past ~0.1 rad the linearised covariance no
#: longer describes the error (noisy, nearly parallel axes; ADR 0002).
MAX_ROTATION_SIGMA_RAD = 0.1


# --- shared plumbing ----------------------------------------------------------------------------


def _prepare(stacks: list[tuple[Any, str]], workspace: Workspace | None, problem: str):
    arrays = [_validate.as_stack(a, name) for a, name in stacks]
    n = arrays[0].shape[0]
    for a, (_, name) in zip(arrays[1:], stacks[1:], strict=True):
        if a.shape[0] != n:
            raise ValueError(
                f"{stacks[0][1]} has {n} stations but {name} has {a.shape[0]}: they must pair up"
            )
    if n < MIN_STATIONS:
        raise NotEnoughSamples(n, MIN_STATIONS, problem)
    ws = Workspace(n, transient=True) if workspace is None else workspace
    ws.check(n)
    # A robot stack and a measured one: one conservative screen of both certifies the common
    # case (valid, plausible, no units warning); otherwise the exact checks run in order and
    # refuse with their own messages.
    clear = len(arrays) == 2 and _validate.screen_pair(
        arrays[0], arrays[1], ws, (_sanity.UNITS_FLANGE_M, _sanity.UNITS_MEASURED_M))
    if not clear:
        for a, (_, name) in zip(arrays, stacks, strict=True):
            _validate.validate_stack(a, name, ws)
            _sanity.check_magnitudes(a, name, n, ws)
    return arrays, n, ws, clear


def _check_observable(
    obs: _obs.Observability,
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
    if owned:
        # The solve's own transient workspace: copies, so that nothing keeps it alive.
        return Residuals(translation_m=rt.copy(), rotation_rad=rr.copy())
    if not owned:
        # Views into a caller's workspace: read-only so nobody edits the next solve's buffer.
        rt, rr = rt.view(), rr.view()
        rt.flags.writeable = False
        rr.flags.writeable = False
    return Residuals(translation_m=rt, rotation_rad=rr)


TRANSLATION_MODES = ("stations", "pairs")


def _solve_axxb(
    TA: np.ndarray, side_A: str, TB: np.ndarray, side_B: str, n: int, ws: Workspace, pairs: str,
    *, frame: str, problem: str, what_rot: str, what_trans: str,
    min_axis_spread: float, min_rotation_rad: float, pair_translation: bool,
    gate_on_b: bool = False,
) -> tuple[np.ndarray, np.ndarray | None, int, _obs.Observability]:
    """The shared solve: pairs, relative motions, observability gate, rotation of ``X``.

    Returns ``(R_X (3, 3), t_X from the pairwise 3x3 system or None, n_motions,
    observability)``. The station-wise translation (the default, ADR 0003) is solved by
    the caller with :func:`cellcal.solver._core.pivot_solve`, because which per-station
    terms enter it depends on the problem.

    The gate is judged on the robot's side, whose motions are exact (ADR 0002): the A side
    by default (hand-eye, eye-to-hand), the B side with ``gate_on_b`` (the base frame, whose
    A side is the tracker: its noise fills any cone of axes and would pass a single-axis
    motion). The axis reported is always in ``frame`` (the A side's): with ``gate_on_b``
    it is the A side's weakest axis on refusal (the robot's axis seen through ``X``) and
    ``R_X`` times the robot's otherwise.
    """
    RP, RQ = TA[:, :3, :3], TB[:, :3, :3]
    gate = None
    if gate_on_b:
        np.einsum("kij->ij", RQ, out=ws.R3)
        gate = _obs.observability(ws.R3, n, side_B, RQ, ws)
        obs = gate
        if gate.max_rotation_rad < min_rotation_rad or gate.axis_spread < min_axis_spread:
            # Refused: the axis to report is the A side's (the robot's axis seen in frame).
            np.einsum("kij->ij", RP, out=ws.R3)
            seen = _obs.observability(ws.R3, n, side_A, RP, ws)
            obs = _obs.Observability(gate.axis_spread, seen.axis, gate.max_rotation_rad, gate.trace)
    else:
        np.einsum("kij->ij", RP, out=ws.R3)  # strided np.sum would buffer 64 KiB
        obs = _obs.observability(ws.R3, n, side_A, RP, ws)
    _check_observable(
        obs, frame=frame, problem=problem, what_rot=what_rot, what_trans=what_trans,
        min_axis_spread=min_axis_spread, min_rotation_rad=min_rotation_rad,
    )
    if gate is not None:
        obs = _obs.Observability(gate.axis_spread, gate.axis.copy(), gate.max_rotation_rad, gate.trace)
    # Explicit subsets are solved from their own pairs; "all" needs no pair list (the O(N)
    # identity) unless the pairwise translation system asks for one (then the ring).
    m = n * (n - 1) // 2
    if pairs != "all" or pair_translation:
        m = _core.make_pairs(n, "ring" if pairs == "all" else pairs, ws)
        _core.relative_motions(TA, side_A, m, ws, ws.RA, ws.tA)
        _core.relative_motions(TB, side_B, m, ws, ws.RB, ws.tB)
    if pairs == "all":
        try:
            qX = _core.solve_rotation_all_pairs(RP, side_A, RQ, ws, stacks=(TA, TB))
        except _core._SignAmbiguity as exc:
            raise DegenerateGeometry(
                f"{problem}: two rotations fit the motions about equally (contrast {exc.contrast:.2g}, need "
                f"{_core.MIN_SIGN_CONTRAST:g}): the relative motions are (near) half turns about too few axes, and "
                f"the measurement noise hides how far from 180 deg they are; add stations with moderate rotations",
                axis=obs.axis, frame=frame, axis_spread=obs.axis_spread,
                unrecoverable=(f"{what_rot} (a half-turn ambiguity)",), max_rotation_rad=obs.max_rotation_rad,
            ) from None
    else:
        qX0 = _core.kronecker_estimate(RP, side_A, RQ, ws)
        _core.quats_from_rotations(ws.RA[:m], ws.qA[:m], ws)
        _core.quats_from_rotations(ws.RB[:m], ws.qB[:m], ws)
        qX = _core.solve_rotation(m, qX0, ws)
    Rx = _core.rot_from_quat_into(qX, np.empty((3, 3)))
    tx = np.array(_core.solve_translation(m, Rx, ws)) if pair_translation else None
    if gate is not None:
        obs.axis = Rx @ gate.axis  # the robot's weakest axis, in the A side's frame
        a = [float(c) for c in obs.axis]
        j = max(range(3), key=lambda i: abs(a[i]))  # the first of the largest, as np.argmax
        if a[j] < 0:
            obs.axis = -obs.axis
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


def _absolute_linear(
    G: np.ndarray, M: np.ndarray, n: int, ws: Workspace, pairs: str, pair_t: bool,
    min_axis_spread: float, min_rotation_rad: float, *,
    problem: str = "base-frame calibration", frame: str = "cell",
    what_rot: str = "base rotation", what_trans: str = "base translation",
    robot_is_g: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, _obs.Observability]:
    """Linear solve of ``M_i = X G_i Y`` (the base frame; eye-to-hand with the roles of the
    robot and the camera swapped, ``robot_is_g=False``). Returns ``(R_X, t_X, R_Y, t_Y,
    n_motions, observability)`` and leaves the closure of each station in ``ws.res_t`` /
    ``ws.res_r``. The observability gate looks at the robot's motions."""
    Rx, tx, m, obs = _solve_axxb(
        M, "left", G, "left", n, ws, pairs, frame=frame, problem=problem,
        what_rot=what_rot, what_trans=what_trans,
        min_axis_spread=min_axis_spread, min_rotation_rad=min_rotation_rad,
        pair_translation=pair_t, gate_on_b=robot_is_g,
    )
    RG, tG, tM = G[:, :3, :3], G[:, :3, 3], M[:, :3, 3]
    # Rotation of flange_T_target_i = R_G^T R_X^T R_M, chordal mean, rotation closure.
    _core.rotate_stack(Rx.T, M, ws)
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
    return Rx, tx, Ry, ty, m, obs


def _hand_eye_linear(
    G: np.ndarray, O: np.ndarray, n: int, ws: Workspace, pairs: str, pair_t: bool,
    min_axis_spread: float, min_rotation_rad: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, _obs.Observability]:
    """Linear eye-in-hand solve of ``G_i X O_i = Z``. Returns ``(R_X, t_X, R_Z, t_Z,
    n_motions, observability)`` with the closure in ``ws.res_t`` / ``ws.res_r``."""
    Rx, tx, m, obs = _solve_axxb(
        G, "right", O, "left", n, ws, pairs, frame="flange", problem="hand-eye calibration",
        what_rot="camera rotation", what_trans="camera translation",
        min_axis_spread=min_axis_spread, min_rotation_rad=min_rotation_rad,
        pair_translation=pair_t,
    )
    RG, tG, tO = G[:, :3, :3], G[:, :3, 3], O[:, :3, 3]
    # Rotation of base_T_target_i = R_G R_X R_O, chordal mean, rotation closure.
    _core.rotate_stack(Rx, O, ws)
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
    return Rx, tx, Rz, tz, m, obs


class _PoseOutcome:
    """What :func:`_pose_finish` hands back to the public functions (model form)."""

    __slots__ = ("A", "B", "cov", "stats", "fit", "holdout", "refined", "noise", "assessment", "converged",
                 "noise_cov", "extra_warnings", "probe_cov")

    def __init__(self, A, B, cov, stats, fit, holdout, refined, noise, assessment, converged):
        self.A, self.B, self.cov, self.stats = A, B, cov, stats
        self.fit, self.holdout, self.refined, self.noise = fit, holdout, refined, noise
        self.assessment, self.converged = assessment, converged
        self.noise_cov = cov  # before the model-error term
        self.extra_warnings: list[SolveWarning] = []
        self.probe_cov: np.ndarray | None = None  # a stopped fit's covariance under estimated noise


def _pose_finish(
    *, M: np.ndarray, G: np.ndarray, A0: np.ndarray, B0: np.ndarray, n: int, ws: Workspace,
    owned: bool, refine: bool, holdout: bool, noise: _refine.Noise, huber: float | None,
    reject_k: float | None = None, masked: bool = False,
    uncertainty: bool = True,
    max_iterations: int, fit_subset, stats: tuple, measurement_residuals: bool,
    determinacy=None, spread: float = 1.0, field=None,
) -> _PoseOutcome:
    """Refinement (or the covariance at the linear answer), residual tests, residuals and
    hold-out closure of the pose model ``M_i = A G_i B`` started from the linear ``(A0, B0)``.

    ``fit_subset(idx, m)`` re-runs the linear solve on a subset (k-fold closure of a linear
    answer). ``measurement_residuals`` makes a linear answer report the model's own
    measurement-space residuals instead of the linear solve's closure. The covariance in
    the outcome is the noise part (small-sample scaled); :func:`_add_model_error` adds the
    rigid term in the result's frames.
    """
    model = _refine.PoseModel(M, G, n, ws)
    refined = False
    if refine and determinacy is not None and spread < CHECK_SPREAD and (noise.estimate_t or noise.estimate_r):
        # Nearly parallel axes: is the linear start determined at the noise its residuals
        # imply? If not, refining would wander along the undetermined direction.
        pn = dataclasses.replace(noise, diag=None)
        _refine.fill_whitening(pn, n, ws)
        determinacy(_refine.covariance_at(model, (A0, B0), pn, huber=huber, masked=masked).covariance)
        _refine.fill_whitening(noise, n, ws)
    elif refine and determinacy is not None and spread < CHECK_SPREAD:
        determinacy(_refine.covariance_at(model, (A0, B0), noise, huber=huber, masked=masked).covariance)
    if refine:
        fit = _refine.refine(model, (A0, B0), noise, huber=huber, reject_k=reject_k,
                             max_iterations=max_iterations, masked=masked)
        refined = fit.ok
        converged = fit.converged
    elif uncertainty:
        fit = _refine.covariance_at(model, (A0, B0), noise, huber=huber, masked=masked)
        converged = True
    else:
        p = model.nparam
        fit = _refine.Fit((A0, B0), np.full((p, p), np.nan), math.nan, math.nan, 0, 0, True,
                          ws.down[:0], noise, ok=False, message="uncertainty not computed",
                          stop_reason="closed-form linear answer, not refined")
        converged = True
        if measurement_residuals:
            # Nothing evaluated the model yet: its residual buffers hold no answer's residuals.
            model.residuals((A0, B0))
    probe = None
    if refine and fit.ok and not converged and (noise.estimate_t or noise.estimate_r):
        # A stopped fit reports default noise (never an estimate from a state that is not
        # the minimum); whether the data determine it at all is judged with the noise the
        # residuals imply, so an undetermined answer is refused rather than returned.
        pn = dataclasses.replace(noise, diag=None, reset="")
        _refine.fill_whitening(pn, n, ws)
        probe = _refine.covariance_at(model, fit.state, pn, huber=huber, masked=masked).covariance
        _refine.fill_whitening(noise, n, ws)
        _refine._eval(model, fit.state, n, ws, huber, noise, masked)
    assessment = None
    if fit.ok:
        # Features: the target positions in the robot-side frame (ws.q4, left by the model).
        np.copyto(ws.v3d[:n], ws.q4[:n, :3])
        spec = field(fit.state) if callable(field) else field
        assessment = _diag.assess(model, fit, noise, n, ws, robot_p=ws.v3d[:n], a_cols=slice(0, 6),
                                  huber=huber, masked=masked or reject_k is not None,
                                  converged=converged, estimated_ok=not noise.reset, field=spec)
    if refined or measurement_residuals:
        model.norms(ws.res_t[:n], ws.res_r[:n])
        stats = _core.closure_stats(n, ws)
    ho = _holdout(model, fit, refined, holdout, fit_subset, n, ws, owned, stats[0],
                  A0=A0, B0=B0, noise=noise, huber=huber, masked=masked)
    A, B = fit.state if refined else (A0, B0)
    cov = assessment.covariance if assessment is not None else fit.covariance
    out = _PoseOutcome(A, B, cov, stats, fit, ho, refined, noise, assessment, converged)
    out.probe_cov = probe
    return out


def _add_model_error(cov: np.ndarray, assessment, blocks) -> np.ndarray:
    """``cov`` plus the rigid robot error of a detected model error (diagnostics module).

    ``blocks`` lists ``(start, kind, centroid)``: ``"rigid"`` adds the 6x6 rigid twist
    about ``centroid`` (the robot-side unknown), ``"base"`` the same size split between a
    twist about ``centroid`` and one about the unknown's origin (a robot-side unknown whose
    frame is the robot's base), ``"iso"`` the isotropic 6x6 (an unknown on the flange),
    ``"point"`` ``tau_t^2 I`` (a 3-vector).
    """
    if assessment is not None and assessment.absorbed is not None:
        # The fitted error field's absorbed part (model_error), or the robot accuracy's when
        # the residuals could not test for it.
        return cov + assessment.absorbed
    if assessment is None or not assessment.model_error:
        return cov
    out = cov.copy()
    tt, tr = assessment.tau_t, assessment.tau_r
    for start, kind, c in blocks:
        if kind == "rigid":
            out[start : start + 6, start : start + 6] += _diag.rigid_error_covariance(c, tt, tr)
        elif kind == "base":
            out[start : start + 6, start : start + 6] += _diag.absorbed_error_covariance(c, tt, tr)
        elif kind == "iso":
            out[start : start + 6, start : start + 6] += np.diag([tt * tt] * 3 + [tr * tr] * 3)
        else:
            out[start : start + 3, start : start + 3] += tt * tt * np.eye(3)
    return out


def _holdout(model, fit, refined, holdout, fit_subset, n, ws, owned, rms_t, *, A0=None, B0=None,
             noise=None, huber=None, masked=False):
    if not holdout or n < _validation.MIN_HOLDOUT_STATIONS:
        return None
    if refined or fit.ok:
        # Refined fits, and linear answers whose covariance was evaluated: the workspace
        # holds the whitened Jacobian and residual at the answer, so the closure is the
        # hat-matrix update of the validation module (one batch of 6x6 solves).
        _validation.loo_linearised(model, n, ws, fit.covariance)
        return _validation.closure_from_buffers("linearised leave-one-out", n, n, ws, owned, rms_t)
    if A0 is not None and noise is not None:
        # A linear answer without its covariance (uncertainty=False): the same update at
        # the linear answer, with the noise estimated there on a copy (the result reports
        # no uncertainty, so nothing of it leaks into the result's figures).
        nz = dataclasses.replace(noise, diag=None)
        _refine.fill_whitening(nz, n, ws)
        ho_fit = _refine.covariance_at(model, (A0, B0), nz, huber=huber, masked=masked)
        if ho_fit.ok:
            _validation.loo_linearised(model, n, ws, ho_fit.covariance)
            return _validation.closure_from_buffers("linearised leave-one-out", n, n, ws, owned, rms_t)
    # The fold solves reuse the residual buffers: keep the answer's residuals aside.
    np.copyto(ws.bk_t[:n], ws.res_t[:n])
    np.copyto(ws.bk_r[:n], ws.res_r[:n])
    k = _validation.kfold_refit(model, fit_subset, n, ws)
    np.copyto(ws.res_t[:n], ws.bk_t[:n])
    np.copyto(ws.res_r[:n], ws.bk_r[:n])
    return _validation.closure_from_buffers("k-fold refit", k, n, ws, owned, rms_t)


def _readonly(a: np.ndarray, owned: bool) -> np.ndarray:
    if owned:
        return a.copy()  # out of the transient workspace, which must not stay alive
    v = a.view()
    v.flags.writeable = False
    return v


def _common_warnings(out: _PoseOutcome, extra: list[SolveWarning]) -> tuple[SolveWarning, ...]:
    """Every warning of a result: the input checks', then the fit's and the tests'."""
    w = list(extra)
    fit, nz = out.fit, out.noise
    if not out.converged:
        w.append(SolveWarning(code="not_converged", message=(
            f"the refinement did not converge ({fit.stop_reason}): the answer is its last step and its "
            f"uncertainty uses the default noise figures; do not use it"), value=float(fit.iterations)))
    for name, fb, red in (("translation", nz.fallback_t, nz.redundancy_t), ("rotation", nz.fallback_r, nz.redundancy_r)):
        if fb and not nz.reset:
            w.append(SolveWarning(code="noise_default", message=(
                f"too few stations to estimate the {name} noise (redundancy {red:.1f}): the default figure is "
                f"assumed; declare the instrument's noise or add stations"), value=float(red)))
    down = np.asarray(fit.downweighted)
    if down.size:
        dropped = getattr(fit, "rejected", 0)
        what = "dropped or down-weighted" if dropped else "down-weighted"
        w.append(SolveWarning(code="outliers", message=(
            f"{down.size} station(s) {what} as outliers by the robust fit: "
            + ", ".join(str(int(i)) for i in down[:20]) + (", ..." if down.size > 20 else "")),
            value=float(down.size)))
    if out.assessment is not None:
        w.extend(out.assessment.warnings)
    return tuple(w)


def _uncertainty_fields(out: _PoseOutcome, covX: np.ndarray, owned: bool, warnings: tuple = (),
                        noise_covX: np.ndarray | None = None) -> dict:
    st, sr = sigma_figures(covX)
    nz, fit = out.noise, out.fit
    tests = out.assessment.tests if out.assessment is not None else _nan_tests(nz)
    if noise_covX is not None:
        tests = _diag.with_inflation(tests, noise_covX, covX)
    return dict(
        covariance=out.cov, sigma_translation_mm=st, sigma_rotation_deg=sr,
        noise_translation_m=nz.sigma_t, noise_rotation_rad=nz.sigma_r,
        noise_source=nz.describe(), chi2=fit.chi2, dof=fit.dof, refined=out.refined,
        converged=bool(out.converged), stop_reason=fit.stop_reason,
        iterations=fit.iterations if out.refined else 0,
        downweighted=_readonly(fit.downweighted, owned),
        warnings=warnings, residual_tests=tests,
        holdout=out.holdout,
    )


def _nan_tests(nz: _refine.Noise) -> ResidualTests:
    return ResidualTests(
        declared_noise=not (nz.estimate_t or nz.estimate_r), chi2_per_dof=math.nan, chi2_p=math.nan,
        structure_f=math.nan, structure_p=math.nan, structure_dof=(0, 0),
        redundancy_translation=nz.redundancy_t, redundancy_rotation=nz.redundancy_r,
        variance_factor_translation=1.0, variance_factor_rotation=1.0, small_sample_factor=1.0,
        model_error_translation_m=0.0, model_error_rotation_rad=0.0,
        inflation_translation=1.0, inflation_rotation=1.0,
    )


def _solver_text(linear: str, out: _PoseOutcome, huber: float | None, reject_k: float | None = None) -> str:
    if out.refined:
        h = f", Huber {huber:g} sigma" if huber is not None else ""
        h += f", reject beyond {reject_k:g} sigma" if reject_k is not None else ""
        state = "" if out.converged else f", NOT CONVERGED: {out.fit.stop_reason}"
        return (f"{linear}; maximum-likelihood Gauss-Newton refinement of the absolute model "
                f"({out.fit.iterations} iterations{h}{state})")
    if out.fit.message:
        return f"{linear} ({out.fit.message})"
    return linear


def _inverted_first_outcome(out, X, n, m, obs, frame, pairs, translation, huber, ws, owned,
                            reject_k=None, extra_warnings=()):
    """Hand-eye and eye-to-hand fit the model with the first unknown inverted: map the
    answer and its covariance back, and build the fields both results share."""
    Xo = X if not out.refined else se3_inverse(out.A)
    noise_cov = _invert_first(out.noise_cov, out.A)
    out.cov = _invert_first(out.cov, out.A)
    covX, covY = out.cov[:6, :6].copy(), out.cov[6:, 6:].copy()
    linear = f"quaternion-linear AX=XB rotation ({pairs} pairs), {translation} translation"
    common = dict(
        n_stations=n, n_motions=m, **_stats_fields(out.stats),
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame=frame,
        max_motion_rad=obs.max_rotation_rad, residuals=_residuals(ws, n, owned),
        solver=_solver_text(linear, out, huber, reject_k),
        linear_agreement=_validation.agreement(X, Xo, covX) if out.refined else None,
        **_uncertainty_fields(out, covX, owned, _common_warnings(out, list(extra_warnings)),
                              noise_cov[:6, :6]),
    )
    return Xo, covX, covY, common


def _input_checks(G: np.ndarray, M: np.ndarray | None, n: int, ws: Workspace, max_reach_m: float | None,
                  measured: str, units_clear: bool = False) -> tuple[bool, list[SolveWarning]]:
    """Reach (refuses), duplicates (weights them) and units (warns): ADR 0014.

    ``units_clear``: :func:`_prepare`'s screen found every translation within the units
    limits already (no warning possible)."""
    _sanity.check_reach(G, max_reach_m, n, ws, measured=measured)
    masked, dup = _sanity.mark_duplicates(G, n, ws)
    extra = [] if units_clear else _sanity.units_warnings(G, n, ws, M, measured)
    if dup is not None:
        extra.append(dup)
    return masked, extra


def _pose_blocks(out: _PoseOutcome, *, base: bool) -> list:
    """Model-error blocks of the pose model, in model form: the robot-side unknown ``A`` is
    off by a rigid motion about the stations' centroid (``base``: its frame is the robot's
    base, and half of that motion is about the base origin instead; diagnostics module),
    the flange-side ``B`` isotropically."""
    c = out.assessment.centroid if out.assessment is not None else np.zeros(3)
    return [(0, "base" if base else "rigid", c), (6, "iso", None)]


def _check_determined(cov6: np.ndarray, problem: str, frame: str, obs: _obs.Observability, T: np.ndarray) -> None:
    """Refuse (``DegenerateGeometry``) an answer whose rotation the data fix only beyond
    :data:`MAX_ROTATION_SIGMA_RAD`: there the covariance no longer describes the error.

    Only for nearly parallel axes (``axis_spread < CHECK_SPREAD``): with motions that span
    the rotations, a large covariance comes from large residuals (wrong units, a mix-up),
    and the honest report of it (a wide sigma, ``model_error``, ``units``) is the answer.
    """
    if obs.axis_spread >= CHECK_SPREAD:
        return
    C = np.asarray(cov6[3:, 3:], dtype=float)
    tr = float(C[0, 0] + C[1, 1] + C[2, 2])
    if not math.isfinite(tr) or tr <= MAX_ROTATION_SIGMA_RAD**2:
        return  # the largest eigenvalue is at most the trace: the common case needs no eigh
    lam, V = np.linalg.eigh(0.5 * (C + C.T))
    sig = math.sqrt(max(float(lam[-1]), 0.0))
    if sig <= MAX_ROTATION_SIGMA_RAD:
        return
    axis = T[:3, :3] @ V[:, -1]  # the child-frame direction, in the frame named
    j = int(np.argmax(np.abs(axis)))
    if axis[j] < 0:
        axis = -axis
    raise DegenerateGeometry(
        f"{problem}: the stations determine the rotation about [{axis[0]:.3f}, {axis[1]:.3f}, {axis[2]:.3f}] "
        f"({frame} frame) only to {math.degrees(sig):.1f} deg (1 sigma, limit "
        f"{math.degrees(MAX_ROTATION_SIGMA_RAD):.1f} deg): the motions are too close to one axis for this "
        f"noise (axis_spread {obs.axis_spread:.3g}); add stations that rotate about another axis",
        axis=axis, frame=frame, axis_spread=obs.axis_spread,
        unrecoverable=("rotation about axis", "translation along axis"), max_rotation_rad=obs.max_rotation_rad,
    )


def _stats_fields(stats: tuple) -> dict:
    rms_t, max_t, rms_r, max_r = stats
    return dict(rms_translation_m=rms_t, max_translation_m=max_t,
                rms_rotation_rad=rms_r, max_rotation_rad=max_r)


def _invert_first(cov: np.ndarray, A: np.ndarray) -> np.ndarray:
    """Joint covariance of ``[inv(A), B]`` from that of ``[A, B]`` (right perturbations)."""
    T = np.eye(12)
    T[:6, :6] = inverse_covariance_map(A)
    return T @ cov @ T.T


def _inverse_stack(G: np.ndarray, out: np.ndarray, ws: Workspace) -> np.ndarray:
    """Rigid inverses of a (n, 4, 4) stack into ``out`` without allocating."""
    n = G.shape[0]
    RT = G[:, :3, :3].transpose(0, 2, 1)
    np.copyto(out[:, :3, :3], RT)
    t = ws.tp[:n]
    np.matmul(RT, G[:, :3, 3:4], out=t[:, :, None])
    np.negative(t, out=t)
    np.copyto(out[:, :3, 3], t)
    np.copyto(out[:, 3, :], ws.lastrow)
    return out


# --- options and the robot behind the fit ----------------------------------------------------

_ALL_KEYS = frozenset(SolverOptions.__dataclass_fields__)
#: The options each kind of calibration can use (a keyword outside them is a TypeError).
POSE_KEYS = _ALL_KEYS - {"min_point_spread"}
POINT_KEYS = _ALL_KEYS - {"pairs", "translation", "noise_rotation_rad", "uncertainty"}
PIVOT_KEYS = frozenset({"pairs", "min_axis_spread", "min_rotation_rad", "holdout", "noise_translation_m",
                        "expected_tolerance_m", "max_reach_m", "max_target_offset_m"})


def _capture_array(a, name: str, n: int) -> np.ndarray | None:
    if a is None:
        return None
    v = np.asarray(a, dtype=np.float64).reshape(-1)
    if v.shape != (n,):
        raise ValueError(f"{name}: expected {n} values (one per station), got shape {np.shape(a)}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name}[{int(np.argmin(np.isfinite(v)))}]: not a finite number")
    return v


def _robot_accuracy(o: SolverOptions) -> float:
    if o.robot_accuracy_m is None:
        return DEFAULT_ROBOT_ACCURACY_M
    v = float(o.robot_accuracy_m)
    if not (math.isfinite(v) and v >= 0.0):
        raise ValueError(f"robot_accuracy_m must be a non-negative finite number, got {o.robot_accuracy_m!r}")
    return v


def _field_spec(G: np.ndarray, o: SolverOptions, n: int, time_s, speed, *, robot_map=None,
                a_cols: slice = slice(0, 6), cov: np.ndarray | None = None) -> _diag.FieldSpec:
    """The robot behind a fit (its flange poses, accuracy, capture times) for the model-error
    field (:mod:`cellcal.solver.model_error`)."""
    return _diag.FieldSpec(flange_T=G, robot_map=robot_map, robot_accuracy_m=_robot_accuracy(o), a_cols=a_cols,
                           time_s=_capture_array(time_s, "capture_time_s", n),
                           speed_m_s=_capture_array(speed, "capture_speed_m_s", n), noise_cov=cov)


def _pairing_check(out: _PoseOutcome | None, assessment, extra: list, linear, G: np.ndarray, meas: np.ndarray,
                   time_s) -> None:
    """With capture times: do the instrument's rows fit the robot's one station apart better
    than as paired (a measurement logged late or early)? The linear solve's closure on the
    stations but one, paired as given and shifted either way in capture order; a shift that
    closes :data:`~cellcal.solver.diagnostics.PAIRING_RATIO` better appends
    ``"pairing_suspect"`` to ``extra``. Allocates (three more linear solves): it runs only
    when the caller passes capture times."""
    if time_s is None or assessment is None:
        return
    n = G.shape[0]
    if n < 5:
        return
    o = np.argsort(np.asarray(time_s, dtype=float).reshape(-1), kind="stable")
    a, b = o[:-1], o[1:]
    try:
        base = linear(G[a], meas[a])
        fwd = linear(G[a], meas[b])
        bwd = linear(G[b], meas[a])
    except (CalibrationError, ValueError, np.linalg.LinAlgError, FloatingPointError):
        return
    if not base > 0.0:
        return
    ratio, shift = min((fwd / base, 1), (bwd / base, -1))
    assessment.tests = dataclasses.replace(assessment.tests, pairing_ratio=float(ratio))
    if ratio < _diag.PAIRING_RATIO:
        extra.append(_diag.pairing_warning(ratio, shift))
