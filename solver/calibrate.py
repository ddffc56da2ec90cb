"""The calibrations, on one shared AX=XB solve (ADR 0003).

* :func:`calibrate_base_frame`: ``cell_T_target_i = cell_T_base @ base_T_flange_i @
  flange_T_target``. Motions ``A = M_j M_i^-1`` (cell frame),
  ``B = G_j G_i^-1`` (base frame), ``A X = X B`` with ``X = cell_T_base``.
* :func:`calibrate_hand_eye` (eye-in-hand): ``base_T_flange_i @ flange_T_camera @
  camera_T_target_i = base_T_target``. Motions ``A = G_j^-1 G_i`` (flange frame),
  ``B = O_j O_i^-1`` (camera frame), ``A X = X B`` with ``X = flange_T_camera``.
* :func:`calibrate_eye_to_hand` (camera fixed in the cell, target on the flange):
  ``base_T_camera @ camera_T_target_i = base_T_flange_i @ flange_T_target``, i.e. the base
  frame's absolute form with the robot on the measured side: motions ``A = G_j G_i^-1``
  (base frame), ``B = O_j O_i^-1`` (camera frame), ``A X = X B`` with ``X = base_T_camera``.
* :func:`calibrate_tool_point` (pivot): ``R_i p_tip + t_i = p_pivot``, solved through the
  Schur complement of its fixed 6x6 normal equations.

The AX=XB problems differ only in which side each relative motion is taken on and in how
the constant edge is recovered afterwards; all run :func:`_solve_axxb`. The pivot shares
the workspace, the validation and the observability test. Every failure follows ADR 0002.

By default the linear answer then seeds the maximum-likelihood refinement of
:mod:`cellcal.solver.refine` (ADR 0004), and every result carries its covariance, 1-sigma
figures, held-out closure (:mod:`cellcal.solver.validation`) and, when refined, its
agreement with the linear answer. ``refine=False`` returns the linear answer unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np

from cellcal.solver import _core
from cellcal.solver import diagnostics as _diag
from cellcal.solver import refine as _refine
from cellcal.solver import sanity as _sanity
from cellcal.solver import validation as _validation
from cellcal.solver.diagnostics import ResidualTests, SolveWarning
from cellcal.solver.errors import CalibrationError, DegenerateGeometry, NotEnoughSamples
from cellcal.solver.model_error import DEFAULT_ROBOT_ACCURACY_M
from cellcal.solver.options import SolverOptions, SolverOptionsKeywords, resolve_options
from cellcal.solver.se3 import se3_adjoint, se3_inverse
from cellcal.solver.uncertainty import (
    PredictedError,
    covariance_point_error,
    inverse_covariance_map,
    point_error,
    sigma_figures,
)
from cellcal.solver.validation import Agreement, HoldoutClosure
from cellcal.solver.workspace import Workspace

__all__ = [
    "Residuals",
    "Estimate",
    "CalibrationResult",
    "BaseFrameResult",
    "HandEyeResult",
    "EyeToHandResult",
    "ToolPointResult",
    "calibrate_base_frame",
    "calibrate_hand_eye",
    "calibrate_eye_to_hand",
    "calibrate_tool_point",
    "DEFAULT_MIN_AXIS_SPREAD",
    "DEFAULT_MIN_ROTATION_RAD",
    "DEFAULT_EXPECTED_TOLERANCE_M",
    "DEFAULT_EXPECTED_TOLERANCE_RAD",
    "MAX_ROTATION_SIGMA_RAD",
    "CHECK_SPREAD",
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


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """One unknown a calibration estimated: a transform or a point, with its covariance.

    Every result lists its estimates with :meth:`CalibrationResult.transforms`, so code that
    reports, exports or publishes a result needs no knowledge of the result's type.

    Attributes
    ----------
    name : str
        The ADR 0001 name: ``parent_T_child`` for a transform (``"cell_T_base"``),
        ``frame_p_point`` for a point (``"flange_p_tip"``).
    kind : {"transform", "point"}
        Which of the two it is.
    value : numpy.ndarray, shape (4, 4) or (3,)
        The transform (metres) or the point's coordinates in ``parent_frame`` (metres).
    covariance : numpy.ndarray, shape (6, 6) or (3, 3)
        A transform's: right perturbation ``T_true = T @ se3_exp(xi)``, twist
        ``xi = (rho, phi)`` (m, rad) in the *child* frame (ADR 0004). A point's: additive,
        m^2, in ``parent_frame``. Not finite where the solve did not compute it
        (``refine=False, uncertainty=False``).
    parent_frame : str
        A transform's ``parent``; for a point, the frame its coordinates are in (``flange``
        of ``flange_p_tip``).
    child_frame : str
        A transform's ``child``; for a point, the point's own name (``tip`` of
        ``flange_p_tip``): exports place a frame of that name at the point, with
        ``parent_frame``'s orientation.
    """

    name: str
    kind: str
    value: np.ndarray
    covariance: np.ndarray
    parent_frame: str
    child_frame: str

    @property
    def frame(self) -> str:
        """The frame the value's coordinates are expressed in (``parent_frame``)."""
        return self.parent_frame

    @property
    def is_point(self) -> bool:
        return self.kind == "point"

    @classmethod
    def of(cls, name: str, value: np.ndarray, covariance: np.ndarray) -> Estimate:
        """The estimate called ``name`` (``a_T_b`` or ``a_p_x``), frames taken from the name.

        Raises
        ------
        ValueError
            A name of neither form, or a value or covariance of the wrong shape for it.
        """
        sep = "_T_" if "_T_" in name else "_p_"
        parent, found, child = name.partition(sep)
        if not (found and parent and child):
            raise ValueError(f"estimate name must look like parent_T_child or frame_p_point, got {name!r}")
        kind, shape, cov_shape = _ESTIMATE_KINDS[sep]
        if np.shape(value) != shape or np.shape(covariance) != cov_shape:
            raise ValueError(
                f"{name}: a {kind} needs a value of shape {shape} and a covariance of shape {cov_shape}, "
                f"got {np.shape(value)} and {np.shape(covariance)}"
            )
        return cls(name=name, kind=kind, value=value, covariance=covariance, parent_frame=parent, child_frame=child)


#: name separator -> (kind, value shape, covariance shape)
_ESTIMATE_KINDS = {"_T_": ("transform", (4, 4), (6, 6)), "_p_": ("point", (3,), (3, 3))}


def _estimates(*items: tuple[str, np.ndarray, np.ndarray]) -> dict[str, Estimate]:
    return {name: Estimate.of(name, value, cov) for name, value, cov in items}


@dataclass(frozen=True, kw_only=True)
class CalibrationResult(abc.ABC):
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
    covariance : numpy.ndarray, shape (k, k)
        Joint covariance of every estimated parameter, in blocks ordered as
        :meth:`transforms` lists the estimates (6 per transform, 3 per point).
        Transforms are perturbed on the right, ``T_true = T @ se3_exp(xi)`` with the twist
        ``xi = (rho, phi)`` (m, rad) in the transform's *child* frame; points additively
        (m). It is the inverse Fisher information of the measurement model at the answer
        (ADR 0004): the covariance of the refined estimate, a lower bound for a linear one
        (``refined`` False), with each estimated noise component's share scaled for the
        few degrees of freedom it was estimated from, and widened by the part of a robot
        error field fitted to the residuals that the answer absorbed (a detected model
        error), or of one of the robot's accuracy (an untested one; ``residual_tests``,
        :mod:`cellcal.solver.model_error`). Not finite when the solve
        skipped it (``uncertainty=False``).
    sigma_translation_mm, sigma_rotation_deg : float
        1-sigma of the primary unknown (the first transform or point of the result): RMS
        length of its translation error (mm) and rotation error (deg), i.e. the square
        roots of the traces of the covariance blocks.
    noise_translation_m, noise_rotation_rad : float
        Per-axis measurement 1-sigma the fit used (estimated or given, see
        ``noise_source``; RMS of the per-station figures when those were given; rotation
        NaN where the measurement has none).
    noise_source : str
        Where those figures came from.
    chi2, dof : float, int
        Sum of squared whitened residuals and its degrees of freedom (observations minus
        parameters; duplicated stations count once, dropped ones not at all). With given
        noise, ``chi2 / dof`` far from 1 says the noise figures do not describe these data;
        with estimated noise it is 1 by construction.
    refined : bool
        True if the answer is the maximum-likelihood refinement.
    converged : bool
        True if the answer is a minimum of the fit: the refinement converged, or the
        answer is closed form (linear, pivot). A result that did not converge keeps its
        noise figures at their defaults (never "estimated", see ``noise_source``).
    iterations : int
        Gauss-Newton iterations taken (0 for a linear answer).
    stop_reason : str
        Why the solve stopped, in words (``"converged"``, ``"iteration limit (20
        iterations) reached before convergence"``, ``"closed-form linear answer, not
        refined"``, ...).
    downweighted : numpy.ndarray of int
        Stations the Huber loss down-weighted or ``reject_k`` dropped, ascending (empty
        without either; a read-only view into the workspace when one was given).
    warnings : tuple of SolveWarning
        Things a person should know, each with a ``code``, a sentence (``message``) and
        its figure (``value``): ``"model_error"`` (the residuals are not noise; value:
        RMS of their structured part, mm), ``"model_error_untested"`` (they cannot reveal a
        robot error of the robot's accuracy; value: the smallest they could, mm; the
        covariance carries that accuracy), ``"pairing_suspect"``, ``"motion_during_capture"``
        (capture signatures, with capture times or speeds), ``"not_converged"``,
        ``"noise_default"``, ``"duplicate_stations"``, ``"units"``, ``"outliers"``.
    residual_tests : ResidualTests
        The figures behind those warnings and behind the covariance: chi-square against
        declared noise, the structure test, redundancies, the small-sample and
        model-error factors the covariance carries (ADR 0004).
    holdout : HoldoutClosure or None
        Closure of stations held out of the fit (None when disabled or N < 4).
    linear_agreement : Agreement or None
        Linear answer against the refined one (None when not refined).

    Notes
    -----
    Every field is a keyword; all but ``holdout`` and ``linear_agreement`` are required.
    Subclasses add their transforms and points under their ADR 0001 names, each with a
    ``<name>_covariance``, and list them in :meth:`transforms`.
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
    covariance: np.ndarray
    sigma_translation_mm: float
    sigma_rotation_deg: float
    noise_translation_m: float
    noise_rotation_rad: float
    noise_source: str
    chi2: float
    dof: int
    refined: bool
    converged: bool
    iterations: int
    stop_reason: str
    downweighted: np.ndarray
    warnings: tuple[SolveWarning, ...]
    residual_tests: ResidualTests
    holdout: HoldoutClosure | None = None
    linear_agreement: Agreement | None = None

    @abc.abstractmethod
    def transforms(self) -> dict[str, Estimate]:
        """Every transform and point this result estimated, by name, with its covariance.

        Returns
        -------
        dict of str to Estimate
            A new dict, in the order of the blocks of :attr:`covariance`; the first entry is
            the primary unknown the sigma figures describe. The values are the result's own
            arrays (not copies).
        """


@dataclass(frozen=True, kw_only=True)
class BaseFrameResult(CalibrationResult):
    """Result of :func:`calibrate_base_frame`.

    Attributes
    ----------
    cell_T_base : numpy.ndarray, shape (4, 4)
        Robot base in the cell (tracker) frame, metres.
    flange_T_target : numpy.ndarray, shape (4, 4)
        Tracker target on the flange, metres.
    cell_T_base_covariance, flange_T_target_covariance : numpy.ndarray, shape (6, 6)
        Their covariances (right perturbation, twist ``(rho, phi)``, m and rad);
        ``covariance`` (12, 12) is the joint one, ordered ``[cell_T_base, flange_T_target]``.
    """

    cell_T_base: np.ndarray
    flange_T_target: np.ndarray
    cell_T_base_covariance: np.ndarray
    flange_T_target_covariance: np.ndarray

    def transforms(self) -> dict[str, Estimate]:
        """``cell_T_base``, ``flange_T_target`` (see :meth:`CalibrationResult.transforms`)."""
        return _estimates(
            ("cell_T_base", self.cell_T_base, self.cell_T_base_covariance),
            ("flange_T_target", self.flange_T_target, self.flange_T_target_covariance),
        )

    def predicted_error_at(self, cell_p_task) -> PredictedError:
        """Error of a cell-frame task point expressed in the robot base with this result.

        Parameters
        ----------
        cell_p_task : array_like, shape (3,)
            The task point in the cell frame, m.

        Returns
        -------
        PredictedError
            ``base_p = inv(cell_T_base) @ cell_p`` is off by ``-(rho + phi x base_p)``:
            its covariance in the base frame, with the lever arm ``|base_p|`` (the rotation
            error times the distance from the base origin). Only the calibration's error is
            included, not the tracker's.
        """
        X = self.cell_T_base
        p = np.asarray(cell_p_task, dtype=float).reshape(3)
        pb = X[:3, :3].T @ (p - X[:3, 3])
        return point_error(np.eye(4), self.cell_T_base_covariance, pb, "base")


@dataclass(frozen=True, kw_only=True)
class HandEyeResult(CalibrationResult):
    """Result of :func:`calibrate_hand_eye` (eye-in-hand).

    Attributes
    ----------
    flange_T_camera : numpy.ndarray, shape (4, 4)
        Camera on the flange, metres.
    base_T_target : numpy.ndarray, shape (4, 4)
        The static calibration target in the robot base frame, metres.
    flange_T_camera_covariance, base_T_target_covariance : numpy.ndarray, shape (6, 6)
        Their covariances (right perturbation, ``(rho, phi)``); ``covariance`` (12, 12)
        is the joint one, ordered ``[flange_T_camera, base_T_target]``.
    """

    flange_T_camera: np.ndarray
    base_T_target: np.ndarray
    flange_T_camera_covariance: np.ndarray
    base_T_target_covariance: np.ndarray

    def transforms(self) -> dict[str, Estimate]:
        """``flange_T_camera``, ``base_T_target`` (see :meth:`CalibrationResult.transforms`)."""
        return _estimates(
            ("flange_T_camera", self.flange_T_camera, self.flange_T_camera_covariance),
            ("base_T_target", self.base_T_target, self.base_T_target_covariance),
        )

    def predicted_error_at(self, camera_p_task) -> PredictedError:
        """Error of a point seen by the camera, mapped to the flange with this result.

        Parameters
        ----------
        camera_p_task : array_like, shape (3,)
            The point in the camera frame, m (e.g. an object the camera locates).

        Returns
        -------
        PredictedError
            Covariance of ``flange_T_camera @ camera_p`` in the flange frame; the lever arm
            is ``|camera_p|``. Only the calibration's error is included.
        """
        return point_error(self.flange_T_camera, self.flange_T_camera_covariance, camera_p_task, "flange")


@dataclass(frozen=True, kw_only=True)
class EyeToHandResult(CalibrationResult):
    """Result of :func:`calibrate_eye_to_hand` (camera fixed in the cell, target on the flange).

    Attributes
    ----------
    base_T_camera : numpy.ndarray, shape (4, 4)
        The fixed camera in the robot base frame, metres.
    flange_T_target : numpy.ndarray, shape (4, 4)
        The calibration target on the flange, metres.
    base_T_camera_covariance, flange_T_target_covariance : numpy.ndarray, shape (6, 6)
        Their covariances (right perturbation, ``(rho, phi)``); ``covariance`` (12, 12) is
        the joint one, ordered ``[base_T_camera, flange_T_target]``.
    """

    base_T_camera: np.ndarray
    flange_T_target: np.ndarray
    base_T_camera_covariance: np.ndarray
    flange_T_target_covariance: np.ndarray

    def transforms(self) -> dict[str, Estimate]:
        """``base_T_camera``, ``flange_T_target`` (see :meth:`CalibrationResult.transforms`)."""
        return _estimates(
            ("base_T_camera", self.base_T_camera, self.base_T_camera_covariance),
            ("flange_T_target", self.flange_T_target, self.flange_T_target_covariance),
        )

    def predicted_error_at(self, camera_p_task) -> PredictedError:
        """Error of a point seen by the camera, mapped to the robot base with this result.

        Parameters
        ----------
        camera_p_task : array_like, shape (3,)
            The point in the camera frame, m.

        Returns
        -------
        PredictedError
            Covariance of ``base_T_camera @ camera_p`` in the base frame; the lever arm is
            ``|camera_p|`` (the camera's distance to the task).
        """
        return point_error(self.base_T_camera, self.base_T_camera_covariance, camera_p_task, "base")


@dataclass(frozen=True, kw_only=True)
class ToolPointResult(CalibrationResult):
    """Result of :func:`calibrate_tool_point` (pivot).

    Attributes
    ----------
    flange_p_tip : numpy.ndarray, shape (3,)
        Tool tip in the flange frame, metres.
    base_p_pivot : numpy.ndarray, shape (3,)
        The fixed pivot point in the base frame, metres.
    flange_p_tip_covariance, base_p_pivot_covariance : numpy.ndarray, shape (3, 3)
        Covariance of the tip (m^2, flange frame) and of the pivot (m^2, base frame);
        ``covariance`` (6, 6) is the joint one of ``[flange_p_tip, base_p_pivot]``.
    """

    flange_p_tip: np.ndarray
    base_p_pivot: np.ndarray
    flange_p_tip_covariance: np.ndarray
    base_p_pivot_covariance: np.ndarray

    def transforms(self) -> dict[str, Estimate]:
        """``flange_p_tip``, ``base_p_pivot`` (see :meth:`CalibrationResult.transforms`)."""
        return _estimates(
            ("flange_p_tip", self.flange_p_tip, self.flange_p_tip_covariance),
            ("base_p_pivot", self.base_p_pivot, self.base_p_pivot_covariance),
        )

    def predicted_error_at(self) -> PredictedError:
        """Error of the tool tip itself (the only point a pivot calibration estimates).

        Returns
        -------
        PredictedError
            Covariance of ``flange_p_tip`` in the flange frame (lever arm: its distance
            from the flange origin, for reference; a pivot has no rotation to multiply).
        """
        return covariance_point_error(
            self.flange_p_tip_covariance, "flange", float(np.linalg.norm(self.flange_p_tip))
        )


# --- shared plumbing ----------------------------------------------------------------------------


def _prepare(stacks: list[tuple[Any, str]], workspace: Workspace | None, problem: str):
    arrays = [_core.as_stack(a, name) for a, name in stacks]
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
    for a, (_, name) in zip(arrays, stacks, strict=True):
        _core.validate_stack(a, name, ws)
        _sanity.check_magnitudes(a, name, n, ws)
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
) -> tuple[np.ndarray, np.ndarray | None, int, _core.Observability]:
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
        gate = _core.observability(ws.R3, n, side_B, RQ, ws)
        obs = gate
        if gate.max_rotation_rad < min_rotation_rad or gate.axis_spread < min_axis_spread:
            # Refused: the axis to report is the A side's (the robot's axis seen in frame).
            np.einsum("kij->ij", RP, out=ws.R3)
            seen = _core.observability(ws.R3, n, side_A, RP, ws)
            obs = _core.Observability(gate.axis_spread, seen.axis, gate.max_rotation_rad, gate.trace)
    else:
        np.einsum("kij->ij", RP, out=ws.R3)  # strided np.sum would buffer 64 KiB
        obs = _core.observability(ws.R3, n, side_A, RP, ws)
    _check_observable(
        obs, frame=frame, problem=problem, what_rot=what_rot, what_trans=what_trans,
        min_axis_spread=min_axis_spread, min_rotation_rad=min_rotation_rad,
    )
    if gate is not None:
        obs = _core.Observability(gate.axis_spread, gate.axis.copy(), gate.max_rotation_rad, gate.trace)
    # Explicit subsets are solved from their own pairs; "all" needs no pair list (the O(N)
    # identity) unless the pairwise translation system asks for one (then the ring).
    m = n * (n - 1) // 2
    if pairs != "all" or pair_translation:
        m = _core.make_pairs(n, "ring" if pairs == "all" else pairs, ws)
        _core.relative_motions(TA, side_A, m, ws, ws.RA, ws.tA)
        _core.relative_motions(TB, side_B, m, ws, ws.RB, ws.tB)
    if pairs == "all":
        try:
            qX = _core.solve_rotation_all_pairs(RP, side_A, RQ, ws)
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
        j = int(np.argmax(np.abs(obs.axis)))
        if obs.axis[j] < 0:
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, _core.Observability]:
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
    return Rx, tx, Ry, ty, m, obs


def _hand_eye_linear(
    G: np.ndarray, O: np.ndarray, n: int, ws: Workspace, pairs: str, pair_t: bool,
    min_axis_spread: float, min_rotation_rad: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, _core.Observability]:
    """Linear eye-in-hand solve of ``G_i X O_i = Z``. Returns ``(R_X, t_X, R_Z, t_Z,
    n_motions, observability)`` with the closure in ``ws.res_t`` / ``ws.res_r``."""
    Rx, tx, m, obs = _solve_axxb(
        G, "right", O, "left", n, ws, pairs, frame="flange", problem="hand-eye calibration",
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
                  measured: str) -> tuple[bool, list[SolveWarning]]:
    """Reach (refuses), duplicates (weights them) and units (warns): ADR 0014."""
    _sanity.check_reach(G, max_reach_m, n, ws, measured=measured)
    masked, dup = _sanity.mark_duplicates(G, n, ws)
    extra = _sanity.units_warnings(G, n, ws, M, measured)
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


def _check_determined(cov6: np.ndarray, problem: str, frame: str, obs: _core.Observability, T: np.ndarray) -> None:
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
                a_cols: slice = slice(0, 6)) -> _diag.FieldSpec:
    """The robot behind a fit (its flange poses, accuracy, capture times) for the model-error
    field (:mod:`cellcal.solver.model_error`)."""
    return _diag.FieldSpec(flange_T=G, robot_map=robot_map, robot_accuracy_m=_robot_accuracy(o), a_cols=a_cols,
                           time_s=_capture_array(time_s, "capture_time_s", n),
                           speed_m_s=_capture_array(speed, "capture_speed_m_s", n))


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


# --- public API ------------------------------------------------------------------------------------


@_core.bounded_buffers
def calibrate_base_frame(
    base_T_flange: np.ndarray,
    cell_T_target: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    cell_T_target_std: np.ndarray | None = None,
    cell_T_target_cov: np.ndarray | None = None,
    expected_cell_T_base: np.ndarray | None = None,
    capture_time_s: np.ndarray | None = None,
    capture_speed_m_s: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> BaseFrameResult:
    """Where the robot base sits in the cell, from paired robot and tracker stations.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame from the controller's forward kinematics, m.
    cell_T_target : array_like, shape (N, 4, 4)
        The same stations measured by the tracker: target pose in the cell frame, m.
    options : SolverOptions, optional
        How to solve and what to trust (refinement, hold-out, noise figures, robust loss,
        refusal thresholds, reach, target offset, robot accuracy), documented once on
        :class:`~cellcal.solver.SolverOptions`; defaults when not given.
    workspace : Workspace, optional
        Preallocated buffers (capacity >= N). With one, a warmed-up solve allocates nothing
        that grows with N, and ``residuals`` are views into it.
    cell_T_target_std : array_like, shape (N, 6), optional
        Per-station 1-sigma from the instrument: ``(x, y, z)`` in m (cell axes), then
        ``(rx, ry, rz)`` in rad (about the target's axes). Excludes the scalar figures.
    cell_T_target_cov : array_like, shape (N, 6, 6), optional
        Per-station covariance from the instrument in the **cell** frame, ordered
        ``(dx, dy, dz)`` of the target origin (m), then ``dphi`` about the cell axes (rad),
        i.e. ``p' = p + dp`` and ``R' = Exp(dphi) R`` (e.g. from
        :meth:`~cellcal.solver.TrackerNoiseModel.pose_covariance`: a laser tracker's radial
        and transverse noise). The refinement whitens each station by its Cholesky factor.
        Excludes every other noise figure.
    expected_cell_T_base : array_like, shape (4, 4), optional
        The answer the cell drawing gives: an answer farther than the options' tolerances
        raises :class:`~cellcal.solver.PriorMismatch` (ADR 0014).
    capture_time_s : array_like, shape (N,), optional
        When each station was captured (s, any monotonic origin). Orders the stations for the
        pairing test: residuals that follow the step to the next or previous station raise
        ``"pairing_suspect"`` (rows shifted by one, or a robot moving during capture).
    capture_speed_m_s : array_like, shape (N,), optional
        The flange's speed when each station was captured (m/s): residuals that follow the
        motion raise ``"motion_during_capture"`` (a clock offset between robot and tracker).
    **overrides
        Any field of :class:`~cellcal.solver.SolverOptions` by name (``huber=3.0``,
        ``noise_translation_m=2e-5``, ...): applied over ``options``.

    Returns
    -------
    BaseFrameResult
        ``cell_T_base`` and ``flange_T_target`` with the closure figures; residuals are the
        closure of each ``cell_T_target[i]`` against ``cell_T_base @ base_T_flange[i] @
        flange_T_target``; covariances, held-out closure and linear agreement as described
        on :class:`CalibrationResult`.

    Raises
    ------
    ValueError
        Wrong shape, N mismatch, NaN/inf, a non-orthonormal rotation or a bad last row
        (the message names the array and station index); bad noise figures.
    NotEnoughSamples
        N < 3.
    DegenerateGeometry
        No rotation, or all rotation axes parallel (judged on the robot's exact motions):
        ``.axis`` is in the cell frame; the base's rotation about it and its translation
        along it are undetermined. Also for nearly parallel axes whose rotation the noise
        leaves undetermined beyond 0.1 rad, and for a half-turn ambiguity (ADR 0002).
    PriorMismatch, UnreachableStations
        The input checks of ``expected_cell_T_base`` and ``max_reach_m`` (ADR 0014).

    Notes
    -----
    Input sanity always runs: duplicated robot poses count once (``"duplicate_stations"``),
    translations far beyond a cell draw a ``"units"`` warning, beyond 100 km a
    ``ValueError``. The result says whether it ``converged``; its ``warnings`` and
    ``residual_tests`` say whether the residuals are the noise they claim to be.
    """
    o = resolve_options("calibrate_base_frame", options, overrides, POSE_KEYS)
    pairs, translation, refine, holdout, uncertainty = o.pairs, o.translation, o.refine, o.holdout, o.uncertainty
    min_axis_spread, min_rotation_rad, max_reach_m = o.min_axis_spread, o.min_rotation_rad, o.max_reach_m
    huber, reject_k, max_iterations = o.huber, o.reject_k, o.max_iterations
    problem = "base-frame calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, M), n, ws = _prepare(
        [(base_T_flange, "base_T_flange"), (cell_T_target, "cell_T_target")], workspace, problem
    )
    masked, extra = _input_checks(G, M, n, ws, max_reach_m, "cell_T_target")
    noise = _refine.prepare_noise(
        cell_T_target_std, "cell_T_target_std", o.noise_translation_m, o.noise_rotation_rad, n, ws, 6,
        cov=cell_T_target_cov, cov_name="cell_T_target_cov", R_meas=M[:, :3, :3],
    )
    field = _field_spec(G, o, n, capture_time_s, capture_speed_m_s)
    Rx, tx, Ry, ty, m, obs = _absolute_linear(G, M, n, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
    X, Y = _transform(Rx, tx), _transform(Ry, ty)
    stats = _core.closure_stats(n, ws)

    def fit_subset(idx, k):
        Gs, Ms = ws.Gx[:k], ws.Gy[:k]
        np.take(G, idx, axis=0, out=Gs, mode="clip")  # "raise" copies through a buffer
        np.take(M, idx, axis=0, out=Ms, mode="clip")
        try:
            r = _absolute_linear(Gs, Ms, k, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
        except (CalibrationError, np.linalg.LinAlgError, FloatingPointError):
            return None
        return _transform(r[0], r[1]), _transform(r[2], r[3])

    out = _pose_finish(
        M=M, G=G, A0=X, B0=Y, n=n, ws=ws, owned=workspace is None, refine=refine,
        holdout=holdout, uncertainty=uncertainty, noise=noise, huber=huber, reject_k=reject_k,
        masked=masked, max_iterations=max_iterations,
        fit_subset=fit_subset, stats=stats, measurement_residuals=False,
        determinacy=lambda C: _check_determined(C[:6, :6], problem, "cell", obs, X), spread=obs.axis_spread,
        field=field,
    )
    noise_covX = out.cov[:6, :6].copy()
    out.cov = _add_model_error(out.cov, out.assessment, _pose_blocks(out, base=True))
    covX, covY = out.cov[:6, :6].copy(), out.cov[6:, 6:].copy()
    _check_determined(noise_covX, problem, "cell", obs, out.A)
    if out.probe_cov is not None:
        _check_determined(out.probe_cov[:6, :6], problem, "cell", obs, out.A)
    _sanity.check_prior(out.A, expected_cell_T_base, o.expected_tolerance_m, o.expected_tolerance_rad, "cell_T_base")
    _pairing_check(out, out.assessment, extra, lambda g, m_: calibrate_base_frame(
        g, m_, refine=False, holdout=False, uncertainty=False, max_target_offset_m=None,
        min_axis_spread=0.0).rms_translation_m, G, M, capture_time_s)
    if not any(w.code == "units" for w in extra):  # millimetres: the units warning says what is wrong
        _sanity.check_offset(out.B[:3, 3], o.max_target_offset_m, "flange_T_target", "the tracker target")
    linear = f"quaternion-linear AX=XB rotation ({pairs} pairs), {translation} translation"
    return BaseFrameResult(
        n_stations=n, n_motions=m, **_stats_fields(out.stats),
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="cell",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver=_solver_text(linear, out, huber, reject_k),
        cell_T_base=out.A, flange_T_target=out.B,
        cell_T_base_covariance=covX, flange_T_target_covariance=covY,
        linear_agreement=_validation.agreement(X, out.A, covX) if out.refined else None,
        **_uncertainty_fields(out, covX, workspace is None, _common_warnings(out, extra), noise_covX),
    )


@_core.bounded_buffers
def calibrate_hand_eye(
    base_T_flange: np.ndarray,
    camera_T_target: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    camera_T_target_std: np.ndarray | None = None,
    camera_T_target_cov: np.ndarray | None = None,
    expected_flange_T_camera: np.ndarray | None = None,
    capture_time_s: np.ndarray | None = None,
    capture_speed_m_s: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> HandEyeResult:
    """Eye-in-hand calibration: the camera on the flange, from views of a static target.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    camera_T_target : array_like, shape (N, 4, 4)
        The static target as the camera sees it at each station, m.
    options, workspace, capture_time_s, capture_speed_m_s, **overrides
        As for :func:`calibrate_base_frame` (:class:`~cellcal.solver.SolverOptions`;
        ``max_target_offset_m`` does not apply: a camera's mount is checked by its prior).
    camera_T_target_std : array_like, shape (N, 6), optional
        Per-station 1-sigma from the instrument: ``(x, y, z)`` in m, then ``(rx, ry, rz)``
        in rad. Excludes the scalar figures.
    camera_T_target_cov : array_like, shape (N, 6, 6), optional
        Per-station covariance in the **camera** frame, ``(dp, dphi)`` as
        ``cell_T_target_cov`` of :func:`calibrate_base_frame`.
    expected_flange_T_camera : array_like, shape (4, 4), optional
        Input sanity as for :func:`calibrate_base_frame`, on ``flange_T_camera`` (ADR 0014).

    Returns
    -------
    HandEyeResult
        ``flange_T_camera`` and ``base_T_target``; residuals are the closure of each
        ``base_T_flange[i] @ flange_T_camera @ camera_T_target[i]`` against ``base_T_target``
        (the same lengths as ``camera_T_target[i]`` against its prediction).

    Raises
    ------
    ValueError, NotEnoughSamples, DegenerateGeometry
        As for :func:`calibrate_base_frame`; ``DegenerateGeometry.axis`` is in the flange
        frame (the camera's rotation about it and translation along it are undetermined).
    """
    o = resolve_options("calibrate_hand_eye", options, overrides, POSE_KEYS)
    pairs, translation, refine, holdout, uncertainty = o.pairs, o.translation, o.refine, o.holdout, o.uncertainty
    min_axis_spread, min_rotation_rad, max_reach_m = o.min_axis_spread, o.min_rotation_rad, o.max_reach_m
    huber, reject_k, max_iterations = o.huber, o.reject_k, o.max_iterations
    problem = "hand-eye calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, O), n, ws = _prepare(
        [(base_T_flange, "base_T_flange"), (camera_T_target, "camera_T_target")], workspace, problem
    )
    masked, extra = _input_checks(G, O, n, ws, max_reach_m, "camera_T_target")
    noise = _refine.prepare_noise(
        camera_T_target_std, "camera_T_target_std", o.noise_translation_m, o.noise_rotation_rad, n, ws, 6,
        cov=camera_T_target_cov, cov_name="camera_T_target_cov", R_meas=O[:, :3, :3],
    )
    spec = _field_spec(G, o, n, capture_time_s, capture_speed_m_s, a_cols=slice(6, 12))

    def field(state):
        # The robot's error enters on the target's side: inv(Exp(xi) G) = inv(G) Exp(-xi),
        # a right twist -Ad(inv(base_T_target)) xi of base_T_target.
        return dataclasses.replace(spec, robot_map=-se3_adjoint(se3_inverse(state[1])))

    Rx, tx, Rz, tz, m, obs = _hand_eye_linear(G, O, n, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
    X, Z = _transform(Rx, tx), _transform(Rz, tz)
    stats = _core.closure_stats(n, ws)
    # Model form: O_i = inv(X) inv(G_i) Z, the camera's own measurement space.
    Ginv = _inverse_stack(G, ws.Gz[:n], ws)

    def fit_subset(idx, k):
        Gs, Os = ws.Gx[:k], ws.Gy[:k]
        np.take(G, idx, axis=0, out=Gs, mode="clip")  # "raise" copies through a buffer
        np.take(O, idx, axis=0, out=Os, mode="clip")
        try:
            r = _hand_eye_linear(Gs, Os, k, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
        except (CalibrationError, np.linalg.LinAlgError, FloatingPointError):
            return None
        return se3_inverse(_transform(r[0], r[1])), _transform(r[2], r[3])

    out = _pose_finish(
        M=O, G=Ginv, A0=se3_inverse(X), B0=Z, n=n, ws=ws, owned=workspace is None,
        refine=refine, holdout=holdout, uncertainty=uncertainty, noise=noise, huber=huber,
        reject_k=reject_k, masked=masked,
        max_iterations=max_iterations, fit_subset=fit_subset, stats=stats,
        measurement_residuals=False,
        determinacy=lambda C: _check_determined(C[:6, :6], problem, "flange", obs, np.eye(4)),
        spread=obs.axis_spread, field=field,
    )
    out.cov = _add_model_error(out.cov, out.assessment, _pose_blocks(out, base=False))
    if out.probe_cov is not None:  # model form: A's child frame is the flange
        _check_determined(out.probe_cov[:6, :6], problem, "flange", obs, np.eye(4))
    _pairing_check(out, out.assessment, extra, lambda g, m_: calibrate_hand_eye(
        g, m_, refine=False, holdout=False, uncertainty=False, min_axis_spread=0.0).rms_translation_m,
        G, O, capture_time_s)
    Xo, covX, covZ, common = _inverted_first_outcome(
        out, X, n, m, obs, "flange", pairs, translation, huber, ws, workspace is None, reject_k, extra
    )
    _check_determined(out.noise_cov[:6, :6], problem, "flange", obs, np.eye(4))
    _sanity.check_prior(Xo, expected_flange_T_camera, o.expected_tolerance_m, o.expected_tolerance_rad, "flange_T_camera")
    return HandEyeResult(
        **common, flange_T_camera=Xo, base_T_target=out.B,
        flange_T_camera_covariance=covX, base_T_target_covariance=covZ,
    )


@_core.bounded_buffers
def calibrate_eye_to_hand(
    base_T_flange: np.ndarray,
    camera_T_target: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    camera_T_target_std: np.ndarray | None = None,
    camera_T_target_cov: np.ndarray | None = None,
    expected_base_T_camera: np.ndarray | None = None,
    capture_time_s: np.ndarray | None = None,
    capture_speed_m_s: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> EyeToHandResult:
    """Eye-to-hand (robot-world / hand-eye) calibration: a camera fixed in the cell sees a
    target carried on the flange.

    Model ``base_T_camera @ camera_T_target_i = base_T_flange_i @ flange_T_target``
    (``X O_i = G_i Y``): both constant edges are unknown. It is the base frame's absolute
    form with the robot on the measured side, so the same shared AX=XB solve runs on the
    motions ``G_j G_i^-1`` (base frame) and ``O_j O_i^-1`` (camera frame); the refinement
    then fits ``camera_T_target_i = inv(base_T_camera) @ base_T_flange_i @ flange_T_target``
    in the camera's measurement space.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    camera_T_target : array_like, shape (N, 4, 4)
        The flange-mounted target as the fixed camera sees it at each station, m.
    options, workspace, capture_time_s, capture_speed_m_s, **overrides
        As for :func:`calibrate_base_frame` (:class:`~cellcal.solver.SolverOptions`; the
        options' ``max_target_offset_m`` applies to the target's distance from the flange).
    camera_T_target_std : array_like, shape (N, 6), optional
        Per-station 1-sigma from the instrument: ``(x, y, z)`` in m, then ``(rx, ry, rz)``
        in rad. Excludes the scalar figures.
    camera_T_target_cov : array_like, shape (N, 6, 6), optional
        Per-station covariance in the **camera** frame, ``(dp, dphi)`` as
        ``cell_T_target_cov`` of :func:`calibrate_base_frame`.
    expected_base_T_camera : array_like, shape (4, 4), optional
        Input sanity as for :func:`calibrate_base_frame`, on ``base_T_camera`` (ADR 0014).

    Returns
    -------
    EyeToHandResult
        ``base_T_camera`` and ``flange_T_target``; residuals are the closure of each
        ``camera_T_target[i]`` against ``inv(base_T_camera) @ base_T_flange[i] @
        flange_T_target`` (camera frame), for the linear answer too.

    Raises
    ------
    ValueError, NotEnoughSamples
        As for :func:`calibrate_base_frame`.
    DegenerateGeometry
        No rotation, or all the flange's rotation axes parallel: ``.axis`` is in the robot
        base frame; the camera's rotation about it and its translation along it are
        undetermined.
    """
    o = resolve_options("calibrate_eye_to_hand", options, overrides, POSE_KEYS)
    pairs, translation, refine, holdout, uncertainty = o.pairs, o.translation, o.refine, o.holdout, o.uncertainty
    min_axis_spread, min_rotation_rad, max_reach_m = o.min_axis_spread, o.min_rotation_rad, o.max_reach_m
    huber, reject_k, max_iterations = o.huber, o.reject_k, o.max_iterations
    problem = "eye-to-hand calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, O), n, ws = _prepare(
        [(base_T_flange, "base_T_flange"), (camera_T_target, "camera_T_target")], workspace, problem
    )
    masked, extra = _input_checks(G, O, n, ws, max_reach_m, "camera_T_target")
    noise = _refine.prepare_noise(
        camera_T_target_std, "camera_T_target_std", o.noise_translation_m, o.noise_rotation_rad, n, ws, 6,
        cov=camera_T_target_cov, cov_name="camera_T_target_cov", R_meas=O[:, :3, :3],
    )
    field = _field_spec(G, o, n, capture_time_s, capture_speed_m_s)
    labels: dict[str, Any] = dict(problem=problem, frame="base", what_rot="camera rotation",
                                  what_trans="camera translation", robot_is_g=False)
    # G_i = X O_i inv(Y): the base frame's form with G measured and O as the "robot".
    Rx, tx, Ryi, tyi, m, obs = _absolute_linear(
        O, G, n, ws, pairs, pair_t, min_axis_spread, min_rotation_rad, **labels
    )
    X, Y = _transform(Rx, tx), se3_inverse(_transform(Ryi, tyi))
    stats = _core.closure_stats(n, ws)

    def fit_subset(idx, k):
        Gs, Os = ws.Gx[:k], ws.Gy[:k]
        np.take(G, idx, axis=0, out=Gs, mode="clip")  # "raise" copies through a buffer
        np.take(O, idx, axis=0, out=Os, mode="clip")
        try:
            r = _absolute_linear(Os, Gs, k, ws, pairs, pair_t, min_axis_spread, min_rotation_rad, **labels)
        except (CalibrationError, np.linalg.LinAlgError, FloatingPointError):
            return None
        return se3_inverse(_transform(r[0], r[1])), se3_inverse(_transform(r[2], r[3]))

    out = _pose_finish(
        M=O, G=G, A0=se3_inverse(X), B0=Y, n=n, ws=ws, owned=workspace is None,
        refine=refine, holdout=holdout, uncertainty=uncertainty, noise=noise, huber=huber,
        reject_k=reject_k, masked=masked,
        max_iterations=max_iterations, fit_subset=fit_subset, stats=stats,
        measurement_residuals=True,
        determinacy=lambda C: _check_determined(C[:6, :6], problem, "base", obs, np.eye(4)),
        spread=obs.axis_spread, field=field,
    )
    out.cov = _add_model_error(out.cov, out.assessment, _pose_blocks(out, base=True))
    if out.probe_cov is not None:  # model form: A's child frame is the robot base
        _check_determined(out.probe_cov[:6, :6], problem, "base", obs, np.eye(4))
    _pairing_check(out, out.assessment, extra, lambda g, m_: calibrate_eye_to_hand(
        g, m_, refine=False, holdout=False, uncertainty=False, max_target_offset_m=None,
        min_axis_spread=0.0).rms_translation_m, G, O, capture_time_s)
    Xo, covX, covY, common = _inverted_first_outcome(
        out, X, n, m, obs, "base", pairs, translation, huber, ws, workspace is None, reject_k, extra
    )
    _check_determined(out.noise_cov[:6, :6], problem, "base", obs, np.eye(4))
    _sanity.check_prior(Xo, expected_base_T_camera, o.expected_tolerance_m, o.expected_tolerance_rad, "base_T_camera")
    if not any(w.code == "units" for w in extra):
        _sanity.check_offset(out.B[:3, 3], o.max_target_offset_m, "flange_T_target", "the target")
    return EyeToHandResult(
        **common, base_T_camera=Xo, flange_T_target=out.B,
        base_T_camera_covariance=covX, flange_T_target_covariance=covY,
    )


@_core.bounded_buffers
def calibrate_tool_point(
    base_T_flange: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    expected_flange_p_tip: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> ToolPointResult:
    """Pivot calibration: the tool tip on the flange, held at one point while the flange turns.

    Solves ``[R_i  -I] [p_tip; p_pivot] = -t_i`` in least squares through its fixed 6x6
    normal equations (eliminating ``p_pivot`` leaves a 3x3 SPD system).

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    options, workspace, **overrides
        As for :func:`calibrate_base_frame` (:class:`~cellcal.solver.SolverOptions`). The
        pivot uses ``pairs`` (the relative rotations the observability test looks at),
        ``min_axis_spread``, ``min_rotation_rad``, ``holdout``, ``noise_translation_m``,
        ``expected_tolerance_m``, ``max_reach_m`` and ``max_target_offset_m``; the rest of a
        record is ignored, and as a keyword is a ``TypeError``.
    expected_flange_p_tip : array_like, shape (3,), optional
        The tip from the tool's drawing, m: an answer farther than the options'
        ``expected_tolerance_m`` raises :class:`~cellcal.solver.PriorMismatch` (ADR 0014).

    The pivot is linear least squares, so its leave-one-out (``holdout``) through the hat
    matrix is exact, not linearised. ``noise_translation_m`` is the per-axis 1-sigma of
    the tip's position scatter (m); estimated from the residuals
    (``sum |r|^2 / (3N - 6)``) when not given. The least-squares answer does not depend on
    it, only the covariance does: an estimated figure's is scaled by ``r / (r - 2)``,
    ``r = 3N - 6`` (few degrees of freedom, ADR 0004); a given one is tested against the
    scatter (chi-square), and the scatter is tested for a pattern in the flange position
    (``warnings``, ``residual_tests``). A tip farther from the flange than
    ``max_target_offset_m`` is refused (:class:`~cellcal.solver.ImplausibleGeometry`).

    Huber and ``reject_k`` are not offered: the pivot is one closed-form linear solve;
    screen outlier stations by their residuals and solve again.

    Returns
    -------
    ToolPointResult
        ``flange_p_tip`` and ``base_p_pivot``; residuals are the tip position scatter
        ``|R_i p_tip + t_i - p_pivot|`` (rotation residuals are zero); covariance
        ``sigma^2 (A^T A)^-1`` of ``[p_tip; p_pivot]`` with ``A_i = [R_i, -I]``.

    Raises
    ------
    ValueError, NotEnoughSamples
        As for :func:`calibrate_base_frame`.
    DegenerateGeometry
        All relative rotations about one axis (flange frame): the tip position along it
        cannot be recovered.
    """
    o = resolve_options("calibrate_tool_point", options, overrides, PIVOT_KEYS)
    pairs, holdout, min_axis_spread, min_rotation_rad = o.pairs, o.holdout, o.min_axis_spread, o.min_rotation_rad
    noise_translation_m, max_reach_m, expected_tolerance_m = o.noise_translation_m, o.max_reach_m, o.expected_tolerance_m
    problem = "tool-point calibration"
    _core.check_pair_scheme(pairs)
    (G,), n, ws = _prepare([(base_T_flange, "base_T_flange")], workspace, problem)
    masked, extra = _input_checks(G, None, n, ws, max_reach_m, "")
    if masked:
        # A weighted pivot is not offered (closed form): merging the copies is exact here,
        # the copies' residuals are equal, so count the group once in the noise estimate.
        pass
    np.einsum("kij->ij", G[:, :3, :3], out=ws.R3)
    obs = _core.observability(ws.R3, n, "right", G[:, :3, :3], ws)
    _check_observable(
        obs, frame="flange", problem=problem, what_rot="(nothing:) the flange",
        what_trans="tip position", min_axis_spread=min_axis_spread,
        min_rotation_rad=min_rotation_rad,
    )
    sigma_given = _refine._check_sigma(noise_translation_m, "noise_translation_m")
    p_tip, p_pivot = _core.pivot_solve(G[:, :3, :3], G[:, :3, 3], ws)
    ws.res_r[:n] = 0.0
    rms_t, max_t, _, _ = _core.closure_stats(n, ws)
    # pivot_solve leaves R_i p + t_i - c in ws.v3b: the residual vectors.
    n_eff = float(ws.mask[:n].sum()) if masked else float(n)
    dof = int(round(3 * n_eff)) - 6
    chi = float(np.vdot(ws.res_t[:n], ws.res_t[:n])) if not masked else float(
        np.vdot(ws.res_t[:n] * ws.res_t[:n], ws.mask[:n]))
    if sigma_given is not None:
        sigma = sigma_given
    else:
        sigma = max(math.sqrt(chi / dof), _refine.NOISE_FLOOR_M) if dof > 0 else _refine.DEFAULT_NOISE_TRANSLATION_M
    nz = _refine.Noise(sigma, math.nan, sigma_given is None, False, False, 3,
                       start_t=sigma_given if sigma_given is not None else _refine.DEFAULT_NOISE_TRANSLATION_M)
    model = _refine.PivotModel(G[:, :3, :3], ws.v3b[:n], sigma, n, ws)
    if masked:
        # Duplicated poses count once: scale their rows by sqrt(1/k).
        Jw, ew, _ = model.views()
        np.sqrt(ws.mask[:n], out=ws.hsw[:n])
        _refine._rowscale(ws.hsw[:n], Jw, ws.KJ[: n * 18].reshape(n, 3, 6))
        np.copyto(Jw, ws.KJ[: n * 18].reshape(n, 3, 6))
        _refine._rowscale(ws.hsw[:n], ew, ws.e3[:n])
        np.copyto(ew, ws.e3[:n])
    H = ws.H12[:6, :6]
    J2 = ws.Jw[: n * 18].reshape(3 * n, 6)
    np.matmul(J2.T, J2, out=H)
    try:
        hinv = np.linalg.inv(H)
    except np.linalg.LinAlgError:  # excluded by the observability gate; kept for safety
        hinv = np.full((6, 6), np.inf)
    fit = _refine.Fit((p_tip, p_pivot), hinv, chi / (sigma * sigma), chi / (sigma * sigma), dof, 0, True,
                      ws.down[:0], nz, stop_reason="closed-form least squares")
    if dof >= _refine.MIN_NOISE_REDUNDANCY or sigma_given is not None:
        nz.redundancy_t = float(dof)
    else:
        nz.fallback_t, nz.sigma_t = True, nz.start_t
    assessment = _diag.assess(model, fit, nz, n, ws, robot_p=G[:, :3, 3], a_cols=slice(3, 6), huber=None,
                              masked=masked, converged=True, estimated_ok=not nz.fallback_t,
                              blocks=((0, 3), (3, 3)))
    cov = assessment.covariance * (nz.sigma_t / sigma) ** 2 if nz.fallback_t else assessment.covariance
    noise_cov = cov
    if assessment.model_error:
        cov = cov.copy()
        cov[:3, :3] += assessment.tau_t ** 2 * np.eye(3)
        cov[3:, 3:] += assessment.tau_t ** 2 * np.eye(3)
    ho = None
    if holdout and n >= _validation.MIN_HOLDOUT_STATIONS and np.all(np.isfinite(hinv)):
        _validation.loo_linearised(model, n, ws, hinv)
        ho = _validation.closure_from_buffers("leave-one-out (exact, linear model)", n, n, ws,
                                              workspace is None, rms_t)
    tip_cov = cov[:3, :3].copy()
    tr = float(np.trace(tip_cov))
    if expected_flange_p_tip is not None:
        _check_point_prior(p_tip, expected_flange_p_tip, expected_tolerance_m, "flange_p_tip")
    _sanity.check_offset(p_tip, o.max_target_offset_m, "flange_p_tip", "the tool tip")
    out = _PoseOutcome(None, None, cov, None, fit, ho, False, nz, assessment, True)
    tests = _diag.with_inflation(assessment.tests, _pad6(noise_cov[:3, :3]), _pad6(cov[:3, :3]))
    return ToolPointResult(
        n_stations=n, n_motions=0,
        rms_translation_m=rms_t, max_translation_m=max_t,
        rms_rotation_rad=0.0, max_rotation_rad=0.0,
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="flange",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver="pivot least squares (6x6 normal equations, Schur complement)",
        flange_p_tip=p_tip, base_p_pivot=p_pivot,
        covariance=cov, flange_p_tip_covariance=tip_cov, base_p_pivot_covariance=cov[3:, 3:].copy(),
        sigma_translation_mm=1e3 * math.sqrt(tr) if math.isfinite(tr) else math.inf,
        sigma_rotation_deg=0.0, noise_translation_m=nz.sigma_t, noise_rotation_rad=math.nan,
        noise_source=nz.describe(), chi2=chi / (nz.sigma_t * nz.sigma_t), dof=dof, refined=False,
        converged=True, iterations=0, stop_reason="closed-form least squares",
        downweighted=_readonly(ws.down[:0], workspace is None), holdout=ho,
        warnings=_common_warnings(out, extra), residual_tests=tests,
    )


def _pad6(C3: np.ndarray) -> np.ndarray:
    out = np.zeros((6, 6))
    out[:3, :3] = C3
    return out


def _check_point_prior(p: np.ndarray, expected, tol_m: float, name: str) -> None:
    from cellcal.solver.errors import PriorMismatch

    e = np.asarray(expected, dtype=float).reshape(-1)
    if e.shape != (3,) or not np.all(np.isfinite(e)):
        raise ValueError(f"expected_{name}: expected 3 finite numbers, got {expected!r}")
    if not (math.isfinite(float(tol_m)) and float(tol_m) > 0.0):
        raise ValueError(f"expected_tolerance_m must be a positive finite number, got {tol_m!r}")
    d = float(np.linalg.norm(p - e))
    if d > tol_m:
        raise PriorMismatch(
            f"{name} is {1e3 * d:.1f} mm from the expected one (tolerance {1e3 * tol_m:.1f} mm): check the "
            "tool drawing, or whether the poses are in millimetres",
            translation_m=d, rotation_rad=0.0, tolerance_m=tol_m, tolerance_rad=math.inf, name=name,
        )
