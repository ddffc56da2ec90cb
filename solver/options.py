"""The options every calibration shares, as one documented record (ADR 0004).

A solve is configured by *what to compute and how much to trust* (the refinement, the
hold-out, the noise model, the robust loss, the refusal thresholds, the robot's reach and
accuracy, the target's mount) and given *data* (the stations, their per-station noise and
capture times, a prior transform under its name, a workspace to compute in). The first kind
is :class:`SolverOptions`, documented here once; every public ``calibrate_*`` function takes
it as ``options=`` and the same names as keywords, which override the record::

    opts = SolverOptions(noise_translation_m=2e-5, noise_rotation_rad=math.radians(0.01), max_reach_m=0.9)
    calibrate_base_frame(G, M, options=opts)
    calibrate_base_frame(G, M, options=opts, huber=3.0)   # the same record, robustly
    calibrate_base_frame(G, M, huber=3.0)                 # keywords alone, as before

A field a problem has no use for (``min_point_spread`` for a pose model, ``huber`` for the
closed-form pivot, ``noise_rotation_rad`` for points) is ignored when it comes from the
record, so one record serves every calibration of a cell; given as a keyword to a function
that cannot use it, it is a ``TypeError``, as any unexpected keyword is. The workspace is not
an option: it is where a solve computes (one per thread), and an options record is a value
meant to be shared.

The image solves (``calibrate_hand_eye_camera``, ``calibrate_eye_to_hand_camera``,
``calibrate_intrinsics``) take the record too, beside their own keywords and defaults: it
fills the keywords not given, its defaults leave theirs, and a field they cannot honour (a
pose noise where the measurements are corners, ``refine=False``, ``reject_k``; ``huber`` for
the intrinsics) is a ``ValueError`` when set, not ignored (each function's ``options``
parameter lists its fields; ADR 0004, amendment of 2026-12-06).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

__all__ = [
    "SolverOptions",
    "SolverOptionsKeywords",
    "DEFAULT_MAX_TARGET_OFFSET_M",
    "resolve_options",
]

#: Refusal threshold on the fitted target's distance from the flange (m). A tracker target
#: on a tool (an SMR nest, a 6-DoF probe) sits a few centimetres to half a metre from the
#: flange; inverted inputs put it where the cell's origin is seen from the base (metres).
DEFAULT_MAX_TARGET_OFFSET_M = 1.0


@dataclass(frozen=True, kw_only=True)
class SolverOptions:
    """How a calibration is computed and what it trusts; shared by every ``calibrate_*``.

    Attributes
    ----------
    refine : bool
        Refine the linear AX=XB answer to the maximum-likelihood fit of the absolute station
        model (default True; ADR 0004). ``False`` returns the linear answer exactly as the
        linear solve gives it, with the inverse Fisher information at that answer as its
        covariance (a lower bound for the linear estimate's error). Points: ``False`` is the
        converged Kabsch/pivot alternation. The pivot is closed form either way.
    holdout : bool
        Compute the held-out station closure (default True; needs N >= 4): linearised
        leave-one-out at the answer, k-fold refits only where the information matrix is
        singular.
    uncertainty : bool
        With ``refine=False``, also evaluate the covariance at the linear answer (default
        True). ``False`` is the fastest linear solve: covariance and sigmas are not finite.
    noise_translation_m, noise_rotation_rad : float, optional
        The instrument's per-axis 1-sigma: position (m, along the measurement's parent
        axes) and orientation (rad, about its child axes; poses only). Each one not given is
        estimated from the residuals (variance components). Declared figures are tested
        against the residuals (chi-square), which is what detects a robot's model error from
        a handful of stations: declare them when you know them. Per-station figures
        (``<measurement>_std`` / ``_cov`` keywords of each function) exclude these.
    huber : float, optional
        Huber threshold in sigmas on each station's whitened residual length (3 resists gross
        outliers well; 4.1 is the 99 % point of a 6-D length, 3.4 of a 3-D one); the noise
        scale is then robust. None (default): plain least squares. Not offered by the pivot.
    reject_k : float, optional
        Drop, after convergence, the stations whose robust whitened length exceeds this, and
        refit until none is (listed in ``downweighted``, not counted in ``dof``).
    max_iterations : int
        Gauss-Newton iterations at most per fit (default 20; a robust fit gets three times as
        many).
    pairs : {"all", "ring", "consecutive", "star"}
        Motion pairs of the AX=XB rotation solve (ADR 0003); for the pivot, the motions the
        observability test looks at.
    translation : {"stations", "pairs"}
        Translation of the linear solve: from the stations (default, the pivot form) or from
        the pairwise system (ADR 0003).
    min_axis_spread, min_rotation_rad : float
        Refuse motions whose ``axis_spread`` is below the first, or data in which no motion
        rotates more than the second (ADR 0002).
    min_point_spread : float
        Points only: refuse target positions whose ``point_spread`` is below this.
    expected_tolerance_m, expected_tolerance_rad : float
        Tolerances of a prior given under the answer's name (``expected_cell_T_base=`` ...):
        an answer farther raises :class:`~cellcal.solver.PriorMismatch` (ADR 0014).
    max_reach_m : float, optional
        The arm's reach: flange poses farther from the base raise
        :class:`~cellcal.solver.UnreachableStations` (swapped arguments, millimetres).
    max_target_offset_m : float or None
        Largest plausible distance of the flange-mounted thing the calibration fits from the
        flange (the tracker target, a camera, a reflector, a tool tip); default
        :data:`DEFAULT_MAX_TARGET_OFFSET_M` (1 m: a target on a tool is centimetres to half a
        metre away). A fit beyond it raises :class:`~cellcal.solver.ImplausibleGeometry`:
        inverted or swapped inputs fit exactly and put it metres away (ADR 0014). None
        disables the check.
    robot_accuracy_m : float, optional
        The robot's absolute accuracy: RMS distance (3-D) between where its controller says
        the flange is and where it is, over the workspace, m. When the residuals cannot test
        for a model error of this size (few stations, noise estimated), the result says so
        (``"model_error_untested"``) and its covariance covers a robot error of this size.
        None: :data:`~cellcal.solver.model_error.DEFAULT_ROBOT_ACCURACY_M` (1 mm); 0
        declares the robot exact (a simulation).
    """

    refine: bool = True
    holdout: bool = True
    uncertainty: bool = True
    noise_translation_m: float | None = None
    noise_rotation_rad: float | None = None
    huber: float | None = None
    reject_k: float | None = None
    max_iterations: int = 20
    pairs: str = "all"
    translation: str = "stations"
    min_axis_spread: float = 1e-4
    min_rotation_rad: float = 1e-3
    min_point_spread: float = 1e-4
    expected_tolerance_m: float = 0.05
    expected_tolerance_rad: float = math.radians(5.0)
    max_reach_m: float | None = None
    max_target_offset_m: float | None = DEFAULT_MAX_TARGET_OFFSET_M
    robot_accuracy_m: float | None = None

    def replace(self, **changes: Any) -> SolverOptions:
        """A copy with ``changes`` (``TypeError`` for a name that is not an option)."""
        return dataclasses.replace(self, **changes)


class SolverOptionsKeywords(TypedDict, total=False):
    """The fields of :class:`SolverOptions` as keyword arguments (for type checkers)."""

    refine: bool
    holdout: bool
    uncertainty: bool
    noise_translation_m: float | None
    noise_rotation_rad: float | None
    huber: float | None
    reject_k: float | None
    max_iterations: int
    pairs: str
    translation: str
    min_axis_spread: float
    min_rotation_rad: float
    min_point_spread: float
    expected_tolerance_m: float
    expected_tolerance_rad: float
    max_reach_m: float | None
    max_target_offset_m: float | None
    robot_accuracy_m: float | None


_FIELDS = frozenset(f.name for f in dataclasses.fields(SolverOptions))
_DEFAULT = SolverOptions()


def resolve_options(fn: str, options: SolverOptions | None, overrides: Mapping[str, Any],
                    accepted: frozenset[str]) -> SolverOptions:
    """The record a call runs with: ``options`` (or the defaults) with ``overrides`` applied.

    Raises
    ------
    TypeError
        ``options`` is not a :class:`SolverOptions`, or a keyword that is no option or that
        ``fn`` cannot use (the message names it, as Python does for an unexpected keyword).
    """
    if options is not None and not isinstance(options, SolverOptions):
        raise TypeError(f"{fn}() options must be a SolverOptions, got {type(options).__name__}")
    for key in overrides:
        if key not in _FIELDS or key not in accepted:
            raise TypeError(f"{fn}() got an unexpected keyword argument {key!r}")
    base = options if options is not None else _DEFAULT
    return dataclasses.replace(base, **dict(overrides)) if overrides else base
