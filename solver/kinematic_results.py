"""What a kinematic identification returns (:func:`cellcal.solver.identify.identify_kinematics`):
the identified model with its covariance and the validation figures before and after, on
stations never fitted (ADR 0016)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from cellcal.solver.calibrate import Estimate, Residuals
from cellcal.solver.diagnostics import SolveWarning
from cellcal.solver.kinematic_parameters import kinematic_jacobian
from cellcal.solver.kinematics import KinematicModel
from cellcal.solver.validation import HoldoutClosure

__all__ = ["KinematicResult", "ValidationFigures", "KinematicValidation"]

# --------------------------------------------------------------------------- results
@dataclass(frozen=True, kw_only=True)
class ValidationFigures:
    """Closure of one model on held-out stations (measured minus predicted).

    Attributes
    ----------
    n_stations : int
    rms_translation_m, p50_translation_m, p90_translation_m, max_translation_m : float
        Position closure, m.
    rms_rotation_rad, p50_rotation_rad, p90_rotation_rad, max_rotation_rad : float
        Orientation closure, rad (NaN for point measurements).
    pairwise_rms_m, pairwise_max_m : float
        Error of the distances between all pairs of stations, measured against modelled
        (independent of the base frame), RMS and worst, m.
    """

    n_stations: int
    rms_translation_m: float
    p50_translation_m: float
    p90_translation_m: float
    max_translation_m: float
    rms_rotation_rad: float
    p50_rotation_rad: float
    p90_rotation_rad: float
    max_rotation_rad: float
    pairwise_rms_m: float
    pairwise_max_m: float


@dataclass(frozen=True, kw_only=True)
class KinematicValidation:
    """Held-out figures before (nominal arm, its own best base and target) and after."""

    before: ValidationFigures
    after: ValidationFigures


@dataclass(frozen=True, kw_only=True)
class KinematicResult:
    """What :func:`identify_kinematics` found (module docstring for the method).

    Attributes
    ----------
    model : KinematicModel
        The identified arm (DH arrays ``a, d, alpha, theta, beta``): ``model.forward(q)``
        is ``(4, 4) base_T_flange`` for ``q`` (6,) and ``(N, 4, 4)`` for (N, 6).
    nominal : KinematicModel
        The model identification started from.
    parameters : dict of str to float
        Identified parameters by name (module docstring), absolute values, SI.
    deltas : dict of str to float
        ``parameters`` minus the nominal values.
    sigmas : dict of str to float
        1-sigma of each identified parameter, SI: the measurement noise and the prior of
        the ``considered`` parameters (consider covariance, ADR 0016).
    noise_sigmas : dict of str to float
        The same from the measurements alone (what the sigmas were before the consider
        term): the difference is what the fixed parameters' uncertainty adds.
    estimated : tuple of str
        Parameters that were estimated (the keys of ``parameters``), in order.
    unidentifiable : tuple of str
        Parameters the stations cannot determine, fixed at their nominal values.
    unidentifiable_reasons : dict of str to str
        Why, per name: folded into the base frame, into the target, redundant with named
        parameters, not excited by these stations, or weak (condition number).
    condition_number : float
        Of the whitened, column-normalised Jacobian of everything estimated, at the answer.
    observability_o1, observability_o3 : float
        Borm-Menq O1 (geometric mean of the singular values over sqrt(N)) and O3 (smallest
        singular value) of the parameter columns, column-normalised, base and target
        projected out.
    cell_T_base : numpy.ndarray, shape (4, 4)
    flange_T_target : numpy.ndarray, shape (4, 4) or None
        Pose measurements only.
    flange_p_target : numpy.ndarray, shape (3,) or None
        Point measurements only, m, flange frame.
    covariance : numpy.ndarray, shape (k, k)
        Of ``covariance_names``: the parameters (SI), then the base twist (right, base
        frame) and the target twist (right, target frame) or point (flange frame);
        including the considered parameters' prior (:mod:`cellcal.solver.kinematic_consider`).
    covariance_names : tuple of str
    considered : tuple of str
        Parameters fixed at nominal whose error the estimate cannot absorb exactly (not
        excited, weakly determined, or left out by ``parameters=``), in preference order;
        their prior is in ``covariance``. Fixed parameters not listed are structural
        (a reparametrisation: folded into the frames or redundant with an estimated one).
    prior_sigmas : dict of str to float
        The 1-sigma prior used for each considered parameter, SI.
    full_covariance : numpy.ndarray, shape (k + c, k + c)
        Joint covariance of the errors of ``full_covariance_names``: ``covariance_names``
        then ``considered`` (their reported value, the nominal, is off by minus their
        error); what :meth:`prediction_covariance` uses.
    full_covariance_names : tuple of str
    weakly_excited : tuple of str
        The considered parameters the stations left undetermined (not excited, or fixed by
        the condition gate): the ``weak_excitation`` warning's parameters.
    weakly_excited_joints : tuple of int
        Joints (1-based) whose motion over their range would determine them: the warning's
        joints (empty when no single joint would).
    correlations : tuple of (str, str, float)
        Pairs among ``covariance_names`` correlated beyond ``correlation_threshold``.
    residuals : Residuals
        Per fit station, m and rad.
    rms_translation_m : float
    holdout : HoldoutClosure
        Linearised leave-one-out closure of the fit stations.
    validation : KinematicValidation or None
        With ``validation_q``: held-out figures before and after.
    converged : bool
    iterations : int
    stop_reason : str
    noise_source : str
        ``"declared"`` (covariances or noise given), ``"estimated"`` (scaled by the residual
        variance) or ``"default"`` (the fit did not converge: the weights' noise is kept).
    dof : int
        Observations minus unknowns.
    chi2_per_dof : float
        Whitened residual sum of squares over ``dof``.
    warnings : tuple of SolveWarning
    downweighted : numpy.ndarray of int
        Stations the Huber loss down-weighted or ``reject_k`` dropped.
    n_stations : int
    measurement : str
        ``"pose"`` or ``"point"``.
    """

    model: KinematicModel
    nominal: KinematicModel
    parameters: dict[str, float]
    deltas: dict[str, float]
    sigmas: dict[str, float]
    noise_sigmas: dict[str, float]
    estimated: tuple[str, ...]
    unidentifiable: tuple[str, ...]
    unidentifiable_reasons: dict[str, str]
    condition_number: float
    observability_o1: float
    observability_o3: float
    cell_T_base: np.ndarray
    flange_T_target: np.ndarray | None
    flange_p_target: np.ndarray | None
    covariance: np.ndarray
    covariance_names: tuple[str, ...]
    considered: tuple[str, ...]
    prior_sigmas: dict[str, float]
    full_covariance: np.ndarray
    full_covariance_names: tuple[str, ...]
    weakly_excited: tuple[str, ...]
    weakly_excited_joints: tuple[int, ...]
    correlations: tuple[tuple[str, str, float], ...]
    residuals: Residuals
    rms_translation_m: float
    holdout: HoldoutClosure
    validation: KinematicValidation | None
    converged: bool
    iterations: int
    stop_reason: str
    noise_source: str
    dof: int
    chi2_per_dof: float
    warnings: tuple[SolveWarning, ...]
    downweighted: np.ndarray
    n_stations: int
    measurement: str

    def transforms(self) -> dict[str, Estimate]:
        """``cell_T_base`` and ``flange_T_target`` (or ``flange_p_target``) with their
        covariance blocks, as the other results list them (``CalibrationResult.transforms``)."""
        P = len(self.estimated)
        out = {"cell_T_base": Estimate.of("cell_T_base", self.cell_T_base, self.covariance[P:P + 6, P:P + 6])}
        if self.flange_T_target is not None:
            out["flange_T_target"] = Estimate.of("flange_T_target", self.flange_T_target,
                                                 self.covariance[P + 6:, P + 6:])
        elif self.flange_p_target is not None:
            out["flange_p_target"] = Estimate.of("flange_p_target", self.flange_p_target,
                                                 self.covariance[P + 6:, P + 6:])
        return out

    def predict(self, q: ArrayLike) -> np.ndarray:
        """Modelled ``cell_T_target`` (N, 4, 4) or ``cell_p_target`` (N, 3) at joints ``q``."""
        tool = self.flange_T_target if self.flange_T_target is not None else self.flange_p_target
        assert tool is not None
        return kinematic_jacobian(self.model, q, [], self.cell_T_base, tool)[0]

    def prediction_covariance(self, q: ArrayLike) -> np.ndarray:
        """Covariance of :meth:`predict`'s error at joints ``q``: from the estimated
        parameters, the frames and the considered parameters' prior (``full_covariance``),
        measurement noise not included.

        Parameters
        ----------
        q : array_like, shape (N, 6) or (6,)
            Joint angles, rad.

        Returns
        -------
        numpy.ndarray, shape (N, 6, 6) or (N, 3, 3)
            Cell frame, ``(dp m, dphi rad)`` for poses (the residual convention of
            :func:`identify_kinematics`), ``dp`` for points.
        """
        tool = self.flange_T_target if self.flange_T_target is not None else self.flange_p_target
        assert tool is not None
        names = list(self.estimated) + list(self.considered)
        _, J = kinematic_jacobian(self.model, q, names, self.cell_T_base, tool)
        E, C = len(self.estimated), len(self.considered)
        # kinematic_jacobian orders (estimated, considered, frames); full_covariance (estimated,
        # frames, considered).
        order = list(range(E)) + list(range(E + C, J.shape[2])) + list(range(E, E + C))
        Jf = J[:, :, order]
        return np.asarray(np.einsum("nij,jk,nlk->nil", Jf, self.full_covariance, Jf))
