"""A laser tracker's noise in beam coordinates, as per-station cell-frame covariances.

A laser tracker measures range along its beam (interferometer or absolute distance meter)
and two angles (encoders). Its position error is therefore far from isotropic: small along
the beam (radial), larger across it (transverse, the angle error times the range), both
growing with the range. A fit that knows only a per-cell-axis standard deviation weights a
station as if the error were spread over the cell's axes; with an oblique line of sight it
leaves precision on the table. :class:`TrackerNoiseModel` builds the full covariances the
solvers take (``cell_p_target_cov``, ``cell_T_target_cov``), in the solver's convention: cell
frame, ``(dx, dy, dz)`` of the target origin in metres, then ``dphi`` about the cell axes in
radians (``p' = p + dp``, ``R' = Exp(dphi) R``).

**From an ISO 10360-10 MPE statement to a standard deviation.** Manufacturers state maximum
permissible errors, e.g. radial ``+-(10 um + 0.3 um/m)`` and transverse ``+-(15 um + 6 um/m)``
of the range ``d``. An MPE bounds the errors of a conforming instrument under its rated
conditions; this module reads it, as is common practice in uncertainty budgets, as an
*expanded uncertainty with coverage factor k = 2* (about 95 % for a normal error), so the
1-sigma figure is ``sigma(d) = (A + B d) / 2`` for each direction (the two transverse
directions alike). A rectangular reading of the bound would give ``/ sqrt(3)`` instead
(15 % larger); pass ``coverage_factor`` to choose. At 3 m the example gives radial
``(10 + 0.9) / 2 = 5.5 um`` and transverse ``(15 + 18) / 2 = 16.5 um``: a factor 3.

The simulator generates its noise from this same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from cellcal.solver.se3 import so3_exp

__all__ = ["TrackerNoiseModel", "ISO_RADIAL_MPE", "ISO_TRANSVERSE_MPE"]

#: The example MPE figures of a current laser tracker (constant m, per metre of range).
ISO_RADIAL_MPE = (10e-6, 0.3e-6)
ISO_TRANSVERSE_MPE = (15e-6, 6e-6)


def _positive(value: float, name: str, *, zero_ok: bool = True) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0.0 or (v == 0.0 and not zero_ok):
        raise ValueError(f"{name} must be a {'non-negative' if zero_ok else 'positive'} finite number, got {value!r}")
    return v


@dataclass(frozen=True, kw_only=True)
class TrackerNoiseModel:
    """1-sigma noise of a laser tracker in beam coordinates.

    Attributes
    ----------
    cell_p_instrument : numpy.ndarray, shape (3,)
        The tracker's centre (where the beam leaves the head) in the cell frame, m.
    radial_std_m, radial_std_per_m : float
        1-sigma along the beam: constant (m) plus per metre of range (m/m).
    transverse_std_m, transverse_std_per_m : float
        1-sigma across the beam, each of the two transverse directions: constant (m) plus
        per metre of range (m/m).
    rotation_std_rad : float or None
        1-sigma of a 6-DoF probe's orientation about each axis (rad); None for a
        reflector (3-DoF).

    Raises
    ------
    ValueError
        A non-finite position, a negative figure, or no positive figure across the beam or
        along it (the covariance would be singular).
    """

    cell_p_instrument: np.ndarray
    radial_std_m: float
    radial_std_per_m: float = 0.0
    transverse_std_m: float
    transverse_std_per_m: float = 0.0
    rotation_std_rad: float | None = None

    def __post_init__(self) -> None:
        c = np.array(self.cell_p_instrument, dtype=np.float64).reshape(-1)
        if c.shape != (3,) or not np.all(np.isfinite(c)):
            raise ValueError(f"cell_p_instrument: expected 3 finite numbers, got {self.cell_p_instrument!r}")
        c.setflags(write=False)
        object.__setattr__(self, "cell_p_instrument", c)
        for key in ("radial_std_m", "radial_std_per_m", "transverse_std_m", "transverse_std_per_m"):
            object.__setattr__(self, key, _positive(getattr(self, key), key))
        if self.radial_std_m == 0.0 and self.radial_std_per_m == 0.0:
            raise ValueError("radial_std_m or radial_std_per_m must be positive")
        if self.transverse_std_m == 0.0 and self.transverse_std_per_m == 0.0:
            raise ValueError("transverse_std_m or transverse_std_per_m must be positive")
        if self.rotation_std_rad is not None:
            object.__setattr__(self, "rotation_std_rad", _positive(self.rotation_std_rad, "rotation_std_rad",
                                                                   zero_ok=False))

    @classmethod
    def from_mpe(
        cls,
        cell_p_instrument: ArrayLike,
        *,
        radial_mpe: tuple[float, float] = ISO_RADIAL_MPE,
        transverse_mpe: tuple[float, float] = ISO_TRANSVERSE_MPE,
        rotation_mpe_rad: float | None = None,
        coverage_factor: float = 2.0,
    ) -> TrackerNoiseModel:
        """The model from MPE statements ``+-(A + B d)`` (module docstring).

        Parameters
        ----------
        cell_p_instrument : array_like, shape (3,)
            Tracker position in the cell, m.
        radial_mpe, transverse_mpe : (float, float)
            ``(A, B)``: constant (m) and per metre of range (m/m).
        rotation_mpe_rad : float, optional
            A 6-DoF probe's orientation MPE per axis (rad).
        coverage_factor : float
            ``k`` the MPE is read as an expanded uncertainty of (default 2).
        """
        k = _positive(coverage_factor, "coverage_factor", zero_ok=False)
        return cls(
            cell_p_instrument=np.asarray(cell_p_instrument, dtype=float),
            radial_std_m=radial_mpe[0] / k, radial_std_per_m=radial_mpe[1] / k,
            transverse_std_m=transverse_mpe[0] / k, transverse_std_per_m=transverse_mpe[1] / k,
            rotation_std_rad=None if rotation_mpe_rad is None else rotation_mpe_rad / k,
        )

    def _points(self, cell_p: ArrayLike) -> np.ndarray:
        p = np.asarray(cell_p, dtype=np.float64)
        if p.ndim == 1:
            p = p[None, :]
        if p.ndim != 2 or p.shape[1] != 3 or not np.all(np.isfinite(p)):
            raise ValueError(f"cell_p: expected finite points of shape (N, 3), got {np.shape(cell_p)}")
        return p

    def stds(self, cell_p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(radial, transverse)`` 1-sigma (m), each (N,), at target positions (N, 3)."""
        d = np.linalg.norm(self._points(cell_p) - self.cell_p_instrument, axis=1)
        return self.radial_std_m + self.radial_std_per_m * d, self.transverse_std_m + self.transverse_std_per_m * d

    def point_covariance(self, cell_p: ArrayLike) -> np.ndarray:
        """Covariances (N, 3, 3) of points measured at ``cell_p`` (N, 3), cell frame, m^2:
        ``sigma_r^2 u u^T + sigma_t^2 (I - u u^T)`` with ``u`` the unit beam direction.

        Raises
        ------
        ValueError
            A point at the instrument itself (no beam direction).
        """
        p = self._points(cell_p)
        v = p - self.cell_p_instrument
        d = np.linalg.norm(v, axis=1)
        if np.any(d <= 0.0):
            raise ValueError(f"cell_p[{int(np.argmin(d))}]: at the instrument's centre, no beam direction")
        u = v / d[:, None]
        sr, st = self.stds(p)
        uu = u[:, :, None] * u[:, None, :]
        return (sr**2)[:, None, None] * uu + (st**2)[:, None, None] * (np.eye(3) - uu)

    def pose_covariance(self, cell_T_target: ArrayLike) -> np.ndarray:
        """Covariances (N, 6, 6) of 6-DoF poses ``cell_T_target`` (N, 4, 4): the point part
        at each target origin, then ``rotation_std_rad^2 I`` for ``dphi`` about the cell
        axes (isotropic, so the same in any frame), no correlation between the two.

        Raises
        ------
        ValueError
            No ``rotation_std_rad`` (a 3-DoF model), or a bad pose stack.
        """
        if self.rotation_std_rad is None:
            raise ValueError("pose_covariance needs rotation_std_rad (a 6-DoF probe)")
        T = np.asarray(cell_T_target, dtype=np.float64)
        if T.ndim != 3 or T.shape[1:] != (4, 4):
            raise ValueError(f"cell_T_target: expected shape (N, 4, 4), got {T.shape}")
        out = np.zeros((T.shape[0], 6, 6))
        out[:, :3, :3] = self.point_covariance(T[:, :3, 3])
        out[:, 3:, 3:] = self.rotation_std_rad**2 * np.eye(3)
        return out

    def sample_poses(self, rng: np.random.Generator, cell_T_target: ArrayLike
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Measured 6-DoF poses of true poses ``cell_T_target`` (N, 4, 4), for simulations.

        Returns
        -------
        measured : numpy.ndarray, shape (N, 4, 4)
            ``p' = p + dp``, ``R' = Exp(dphi) R`` (the convention of :meth:`pose_covariance`).
        covariance : numpy.ndarray, shape (N, 6, 6)
            :meth:`pose_covariance` of the true poses.
        noise : numpy.ndarray, shape (N, 6)
            The draws ``(dp, dphi)``, m and rad.
        """
        T = np.asarray(cell_T_target, dtype=np.float64)
        C = self.pose_covariance(T)
        e = np.einsum("nij,nj->ni", np.linalg.cholesky(C), rng.normal(size=(len(T), 6)))
        measured = T.copy()
        measured[:, :3, 3] += e[:, :3]
        for k in range(len(T)):
            measured[k, :3, :3] = so3_exp(e[k, 3:]) @ T[k, :3, :3]
        return measured, C, e

    def sample(self, rng: np.random.Generator, cell_p: ArrayLike) -> np.ndarray:
        """Noise draws (N, 3) for points measured at ``cell_p`` (for simulations)."""
        C = self.point_covariance(cell_p)
        L = np.linalg.cholesky(C)
        return np.einsum("nij,nj->ni", L, rng.normal(size=(C.shape[0], 3)))
