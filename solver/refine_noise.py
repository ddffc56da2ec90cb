"""The noise model of the refinement (:mod:`cellcal.solver.refine`, ADR 0004): declared or
estimated per-axis sigmas, full per-station covariances and their whitening."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver.workspace import Workspace

__all__ = ["Noise", "prepare_noise", "fill_whitening", "DEFAULT_NOISE_TRANSLATION_M", "DEFAULT_NOISE_ROTATION_RAD",
           "NOISE_FLOOR_M", "NOISE_FLOOR_RAD"]

#: Starting point of the noise estimate (and the figure used when too few stations leave
#: no redundancy to estimate it): 0.1 mm per axis, the order of a laser tracker's 6-DoF
#: probe plus a robot's repeatability.
DEFAULT_NOISE_TRANSLATION_M = 1.0e-4
#: 0.05 deg per axis, the same order for orientation.
DEFAULT_NOISE_ROTATION_RAD = math.radians(0.05)
#: An estimated noise figure is never taken below these (1 nm, 1 nrad): noise-free data
#: would otherwise whiten by 1/0.
NOISE_FLOOR_M = 1.0e-9
NOISE_FLOOR_RAD = 1.0e-9


# --- noise ------------------------------------------------------------------------------------


@dataclass
class Noise:
    """Measurement noise of one solve (mutable: the estimate updates it).

    ``sigma_t``/``sigma_r`` are per-axis 1-sigma figures (m, rad); with per-station
    figures (``per_station``) they are the RMS of those, for reporting. ``estimate_t`` /
    ``estimate_r`` say which ones are estimated from the residuals; ``start_t`` /
    ``start_r`` are the figures an estimate starts from (the defaults), kept so that an
    estimate that cannot be trusted (too little redundancy, a refinement that did not
    converge) is replaced by them, and said so (``fallback_*``, ``reset``).
    """

    sigma_t: float
    sigma_r: float
    estimate_t: bool
    estimate_r: bool
    per_station: bool
    rows: int  # residual components per station: 6 (pose) or 3 (point)
    source: str = ""
    diag: np.ndarray | None = None  # diag(1/sigma) (rows, rows) when the figures are scalar
    full: bool = False  # per-station full covariances: whitening matrices in ws.Wfull
    start_t: float = math.nan
    start_r: float = math.nan
    redundancy_t: float = math.nan  # redundancy numbers of the last variance-component round
    redundancy_r: float = math.nan
    fallback_t: bool = False  # wanted an estimate, redundancy too low: the start figure kept
    fallback_r: bool = False
    reset: str = ""  # why the estimate was discarded for the start figures ("" if it was not)
    pooled: bool = False  # one factor estimated for both figures (too few stations for two)

    @property
    def estimated(self) -> bool:
        """True when some figure the fit used was estimated from the residuals."""
        return (self.estimate_t and not self.fallback_t) or (self.estimate_r and not self.fallback_r)

    def describe(self) -> str:
        if self.per_station:
            what = "covariances" if self.full else "standard deviations"
            return f"per-station {what} given with the measurements"
        parts = []
        for name, est, fb, start, unit in (
            ("translation", self.estimate_t, self.fallback_t, self.start_t, "mm"),
            ("rotation", self.estimate_r, self.fallback_r, self.start_r, "deg"),
        ):
            if self.rows == 3 and name == "rotation":
                continue
            if not est:
                parts.append(f"{name} given")
                continue
            value = f"{start * 1e3:.3g} mm" if unit == "mm" else f"{math.degrees(start):.3g} deg"
            if self.reset:
                parts.append(f"{name} default {value} (not estimated: {self.reset})")
            elif self.pooled:
                parts.append(f"{name} estimated from the residuals with the other, in the ratio of the defaults "
                             "(too few stations to estimate them apart)")
            elif fb:
                parts.append(f"{name} default {value} (too few stations to estimate it)")
            else:
                parts.append(f"{name} estimated from the residuals")
        return ", ".join(parts)

    def restart(self, reason: str) -> None:
        """Discard the estimated figures for the start figures (``reason`` says why)."""
        if self.estimate_t:
            self.sigma_t = self.start_t
        if self.estimate_r:
            self.sigma_r = self.start_r
        if self.estimate_t or self.estimate_r:
            self.reset = reason


def _check_sigma(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def prepare_noise(
    std: np.ndarray | None,
    std_name: str,
    noise_t: float | None,
    noise_r: float | None,
    n: int,
    ws: Workspace,
    rows: int,
    *,
    cov: np.ndarray | None = None,
    cov_name: str = "",
    R_meas: np.ndarray | None = None,
) -> Noise:
    """Validate the noise arguments and fill the whitening (``ws.wsig`` or ``ws.Wfull``).

    Parameters
    ----------
    std : array_like or None
        Per-station 1-sigma, shape (N, rows) (per axis: translation m, then rotation rad
        for the pose model) or (N,) for an isotropic point figure; ``None`` if not given.
    std_name : str
        Argument name for error messages.
    noise_t, noise_r : float or None
        Scalar per-axis 1-sigma (m, rad); ``None`` means estimate it.
    n, ws, rows
        Stations, workspace, residual components per station (6 pose, 3 point).
    cov : array_like or None
        Per-station full covariance, shape (N, rows, rows), in the measurement's *parent*
        frame: ``(dx, dy, dz)`` of the measured origin (m), then for a pose ``dphi`` about
        the parent's axes (rad), i.e. ``p' = p + dp`` and ``R' = Exp(dphi) R``.
    cov_name : str
        Its argument name for error messages.
    R_meas : numpy.ndarray, shape (N, 3, 3)
        The measured rotations (pose model with ``cov`` only): the refinement's rotation
        residual lives in the measurement's child frame, ``e_r = R^T dphi``.

    Notes
    -----
    With ``cov`` the residual ``e_i = (e_t, e_r)`` has covariance ``T_i C_i T_i^T`` with
    ``T_i = diag(I, R_i^T)``, so ``W_i = L_i^-1 diag(I, R_i)`` (``C_i = L_i L_i^T``, the
    Cholesky factor) whitens it: ``W_i T_i C_i T_i^T W_i^T = I``. ``W_i`` and its inverse
    ``diag(I, R_i^T) L_i`` (which maps whitened residuals back to metres and radians) are
    stored in the workspace once; the refinement then whitens with one batched 6x6 product.

    Raises
    ------
    ValueError
        Bad shape, a non-positive, non-finite or non-symmetric figure (naming the station),
        a covariance that is not positive definite, or more than one noise description.
    """
    noise_t = _check_sigma(noise_t, "noise_translation_m")
    noise_r = _check_sigma(noise_r, "noise_rotation_rad")
    w = ws.wsig[: n * rows].reshape(n, rows)
    if cov is not None:
        if std is not None or noise_t is not None or noise_r is not None:
            raise ValueError(f"give either {cov_name} or other noise figures, not both")
        return _prepare_full(cov, cov_name, n, ws, rows, R_meas)
    if std is not None:
        if noise_t is not None or noise_r is not None:
            raise ValueError(f"give either {std_name} or scalar noise figures, not both")
        s = np.asarray(std, dtype=np.float64)
        if rows == 3 and s.shape == (n,):
            s = s[:, None]
        if s.ndim != 2 or s.shape[0] != n or s.shape[1] not in ((rows,) if rows == 6 else (rows, 1)):
            raise ValueError(f"{std_name}: expected shape ({n}, {rows}), got {np.shape(std)}")
        # Validation may allocate: it runs once, on the caller's array, outside any hot loop.
        ok = np.all(np.isfinite(s) & (s > 0.0), axis=1)
        if not ok.all():
            i = int(np.argmin(ok))
            raise ValueError(f"{std_name}[{i}]: standard deviations must be positive and finite")
        np.copyto(w, s)  # broadcasts an isotropic (n, 1) figure
        np.reciprocal(w, out=w)
        st = math.sqrt(float(np.mean(np.square(s[:, :3])))) if rows == 6 else math.sqrt(float(np.mean(np.square(s))))
        sr = math.sqrt(float(np.mean(np.square(s[:, 3:])))) if rows == 6 else math.nan
        return Noise(st, sr, False, False, True, rows, start_t=st, start_r=sr)
    st = noise_t if noise_t is not None else DEFAULT_NOISE_TRANSLATION_M
    sr = (noise_r if noise_r is not None else DEFAULT_NOISE_ROTATION_RAD) if rows == 6 else math.nan
    nz = Noise(st, sr, noise_t is None, noise_r is None and rows == 6, False, rows, start_t=st, start_r=sr)
    fill_whitening(nz, n, ws)
    return nz


def _prepare_full(cov, cov_name: str, n: int, ws: Workspace, rows: int, R_meas) -> Noise:
    C = np.asarray(cov, dtype=np.float64)
    if C.shape != (n, rows, rows):
        raise ValueError(f"{cov_name}: expected shape ({n}, {rows}, {rows}), got {np.shape(cov)}")
    # Validation and factorisation allocate: once per solve, on the caller's array.
    fin = np.all(np.isfinite(C.reshape(n, -1)), axis=1)
    if not fin.all():
        raise ValueError(f"{cov_name}[{int(np.argmin(fin))}]: contains NaN or inf")
    scale = np.max(np.abs(C.reshape(n, -1)), axis=1)
    asym = np.max(np.abs(C - C.transpose(0, 2, 1)).reshape(n, -1), axis=1)
    bad = asym > 1e-9 * np.maximum(scale, 1e-300)
    if bad.any():
        raise ValueError(f"{cov_name}[{int(np.argmax(bad))}]: covariance is not symmetric")
    L = np.empty_like(C)
    for i in range(n):
        try:
            L[i] = np.linalg.cholesky(0.5 * (C[i] + C[i].T))
        except np.linalg.LinAlgError:
            raise ValueError(f"{cov_name}[{i}]: covariance is not positive definite") from None
    Linv = np.linalg.inv(L)
    W = ws.Wfull[: n * rows * rows].reshape(n, rows, rows)
    Wi = ws.Winv[: n * rows * rows].reshape(n, rows, rows)
    if rows == 6:
        T = np.zeros((n, 6, 6))
        T[:, :3, :3] = np.eye(3)
        T[:, 3:, 3:] = R_meas
        np.matmul(Linv, T, out=W)  # L^-1 diag(I, R)
        np.matmul(T.transpose(0, 2, 1), L, out=Wi)  # diag(I, R^T) L
    else:
        np.copyto(W, Linv)
        np.copyto(Wi, L)
    var = np.diagonal(C, axis1=1, axis2=2)
    st = math.sqrt(float(np.mean(var[:, :3])))
    sr = math.sqrt(float(np.mean(var[:, 3:]))) if rows == 6 else math.nan
    # ws.wsig keeps a per-row figure for code that only scales (the diagonal's inverse).
    np.reciprocal(np.sqrt(var), out=ws.wsig[: n * rows].reshape(n, rows))
    return Noise(st, sr, False, False, True, rows, full=True, start_t=st, start_r=sr)


def fill_whitening(nz: Noise, n: int, ws: Workspace) -> None:
    """Write ``1/sigma`` of scalar noise figures into ``ws.wsig`` (per-station: no-op)."""
    if nz.per_station:
        return
    w = ws.wsig[: n * nz.rows].reshape(n, nz.rows)
    w[:, :3] = 1.0 / nz.sigma_t
    if nz.rows == 6:
        w[:, 3:] = 1.0 / nz.sigma_r
    # The same weights as a constant diagonal: whitening is then one broadcast matmul.
    if nz.diag is None:
        nz.diag = np.zeros((nz.rows, nz.rows))
    for i in range(nz.rows):
        nz.diag[i, i] = 1.0 / (nz.sigma_t if i < 3 else nz.sigma_r)
