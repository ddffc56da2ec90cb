"""The one exception tree every cellcal package shares.

The root lives in the solver (the lowest floor) so drivers, sim and daemon can all derive
from it without importing upwards.

``CellcalError``
    ``CalibrationError``: a calibration could not be determined from the data given.
        ``NotEnoughSamples``: fewer stations than the problem needs.
        ``DegenerateGeometry``: enough stations, but the motions cannot determine every
        degree of freedom (parallel rotation axes, or no rotation at all).

Bad arguments (wrong shapes, NaN, non-orthonormal rotations) raise the builtin
``ValueError`` instead: they are the caller's bug, not a property of the cell.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CellcalError", "CalibrationError", "NotEnoughSamples", "DegenerateGeometry"]


class CellcalError(Exception):
    """Root of every error cellcal raises on purpose."""


class CalibrationError(CellcalError):
    """The data cannot determine the calibration asked for."""


class NotEnoughSamples(CalibrationError):
    """Fewer stations than the calibration needs.

    Attributes
    ----------
    n_given : int
        Stations supplied.
    n_required : int
        Minimum stations the problem needs.
    """

    def __init__(self, n_given: int, n_required: int, problem: str) -> None:
        self.n_given = int(n_given)
        self.n_required = int(n_required)
        self.problem = problem
        super().__init__(
            f"{problem}: {self.n_given} station(s) given, at least {self.n_required} needed "
            f"(two motions with non-parallel rotation axes)"
        )


class DegenerateGeometry(CalibrationError):
    """The station motions leave some degrees of freedom undetermined.

    Attributes
    ----------
    axis : numpy.ndarray, shape (3,)
        Unit vector of the weakest (or common) rotation axis, expressed in ``frame``.
    frame : str
        Frame ``axis`` is expressed in (``"cell"`` for the base frame, ``"flange"`` for
        hand-eye and tool point).
    axis_spread : float
        The observability figure (0 for parallel axes, 1 for an isotropic spread).
    unrecoverable : tuple of str
        What cannot be recovered, in words (e.g. ``"rotation about axis"``).
    max_rotation_rad : float
        Largest relative rotation among the motions used.
    """

    def __init__(
        self,
        message: str,
        *,
        axis: np.ndarray,
        frame: str,
        axis_spread: float,
        unrecoverable: tuple[str, ...],
        max_rotation_rad: float,
    ) -> None:
        self.axis = np.array(axis, dtype=float)
        self.frame = frame
        self.axis_spread = float(axis_spread)
        self.unrecoverable = tuple(unrecoverable)
        self.max_rotation_rad = float(max_rotation_rad)
        super().__init__(message)
