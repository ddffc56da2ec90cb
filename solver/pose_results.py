"""What the pose calibrations return (:mod:`cellcal.solver.calibrate`): the per-station
closure (:class:`Residuals`), one fitted quantity with its covariance (:class:`Estimate`) and
the result types of the base frame, hand-eye, eye-to-hand and tool point calibrations, all on
:class:`CalibrationResult`. Kept apart from the solves so that a reader of a result (the
daemon, the exports) depends on the types, not on the pipeline."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np

from cellcal.solver.diagnostics import ResidualTests, SolveWarning
from cellcal.solver.uncertainty import (
    PredictedError,
    covariance_point_error,
    point_error,
)
from cellcal.solver.validation import Agreement, HoldoutClosure

__all__ = ["Residuals", "Estimate", "CalibrationResult", "BaseFrameResult", "HandEyeResult",
           "EyeToHandResult", "ToolPointResult"]


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
        robot error of the robot's accuracy, or are too few under strongly anisotropic noise
        for a passed test to count; value: the smallest they could, mm; the covariance
        carries that accuracy), ``"pairing_suspect"``, ``"motion_during_capture"``
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
