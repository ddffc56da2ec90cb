"""Maximum-likelihood refinement of the absolute station model (ADR 0004).

The linear AX=XB solve uses relative motions and throws information away; the stations
themselves satisfy an absolute model whose least-squares fit, weighted by the measurement
covariance, is the maximum-likelihood estimate and attains the Cramer-Rao bound.

Pose model (6-DoF measurement), used by the base frame, hand-eye and eye-to-hand::

    M_i = A @ G_i @ B          (M_i measured, G_i known, A and B unknown)

* base frame:    ``cell_T_target_i = cell_T_base @ base_T_flange_i @ flange_T_target``
* eye-in-hand:   ``camera_T_target_i = inv(flange_T_camera) @ inv(base_T_flange_i) @ base_T_target``
* eye-to-hand:   ``camera_T_target_i = inv(base_T_camera) @ base_T_flange_i @ flange_T_target``

Residual of station i (6,): translation ``e_t = t_M - t_P`` in the measurement's parent
frame (metres) and rotation ``e_r = Log(R_P^T R_M)`` in its child frame (radians), with
``P = A G_i B``. That is the noise model of a tracker (and of
:func:`cellcal.solver.synthetic.perturb`): position error per axis of the instrument,
orientation error of the target it sees. Each component is whitened by its 1-sigma.

Point model (3-DoF measurement, one reflector on the flange)::

    p_i = A @ (R_G_i y + t_G_i)    (p_i measured, A = cell_T_base, y = flange_p_target)

Unknowns are perturbed on the right, ``A <- A @ se3_exp(d_A)``, ``B <- B @ se3_exp(d_B)``
(``y <- y + d_y``), twists ordered ``(rho, phi)``; the parameter vector is
``[rho_A, phi_A, rho_B, phi_B]`` (12,) or ``[rho_A, phi_A, y]`` (9,). Jacobians are
analytic (tests check them against finite differences). The normal equations are fixed
size (12x12 or 9x9) whatever N is; every per-station quantity lives in the
:class:`~cellcal.solver.workspace.Workspace`, so a warmed-up refinement allocates nothing
that grows with N.

Noise: per-station, per-axis 1-sigma from the instrument when given; else scalar per-axis
figures when given; else each missing figure is *estimated* from the residuals by
variance-component estimation (Foerstner's redundancy-number estimator), starting from
:data:`DEFAULT_NOISE_TRANSLATION_M` / :data:`DEFAULT_NOISE_ROTATION_RAD`. The ratio of the
two figures sets the relative weight of positions and orientations, which is what makes the
fit efficient; their scale sets the reported covariance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver.workspace import Workspace

__all__ = [
    "DEFAULT_NOISE_TRANSLATION_M",
    "DEFAULT_NOISE_ROTATION_RAD",
    "DEFAULT_MAX_ITERATIONS",
    "NOISE_FLOOR_M",
    "NOISE_FLOOR_RAD",
    "Noise",
    "Fit",
    "PoseModel",
    "PointModel",
    "PivotModel",
    "prepare_noise",
    "refine",
    "fisher_information_pose",
    "fisher_information_point",
    "pose_residual_jacobian",
    "point_residual_jacobian",
]

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
#: Gauss-Newton iterations at most; from the linear start 2-4 are typical.
DEFAULT_MAX_ITERATIONS = 20
#: Converged when the predicted cost decrease of the next step is below this fraction of
#: the cost (a step of ~1e-5 sigma), or below the absolute floor.
_REL_TOL = 1.0e-10
_ABS_TOL = 1.0e-24
#: Variance-component rounds stop once every estimated sigma moves by less than this.
_VCE_TOL = 0.02
_VCE_MAX_ROUNDS = 6

# hat(v).ravel() == v @ _HAT39 (row-major 3x3), and half of it.
_HAT39 = np.zeros((3, 9))
_HAT39[2, 1], _HAT39[1, 2], _HAT39[2, 3] = -1.0, 1.0, 1.0
_HAT39[0, 5], _HAT39[1, 6], _HAT39[0, 7] = -1.0, -1.0, 1.0
_HALF_HAT39 = 0.5 * _HAT39
_NEG_I3 = -np.eye(3)


# --- small SE(3) kernel on Python floats ------------------------------------------------------------


def se3_exp_right(T: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """``T @ se3_exp(xi)`` for one twist ``(rho, phi)``, on Python floats.

    The same group exponential as :func:`cellcal.solver.se3.se3_exp` (series below
    1e-4 rad), without its intermediate arrays: the retraction runs once per iteration and
    the generic helper costs more than the rest of a small step.
    """
    rx, ry, rz, wx, wy, wz = (float(v) for v in xi)
    th2 = wx * wx + wy * wy + wz * wz
    if th2 < 1e-8:
        a, b, c = 1.0 - th2 / 6.0, 0.5 - th2 / 24.0, 1.0 / 6.0 - th2 / 120.0
    else:
        th = math.sqrt(th2)
        sn, cs = math.sin(th), math.cos(th)
        a, b, c = sn / th, (1.0 - cs) / th2, (th - sn) / (th2 * th)
    # K^2 = w w^T - th^2 I; R = I + a K + b K^2, V = I + b K + c K^2, t = V rho.
    xx, yy, zz = wx * wx - th2, wy * wy - th2, wz * wz - th2
    xy, xz, yz = wx * wy, wx * wz, wy * wz
    E = np.empty((4, 4))
    E[0, 0], E[0, 1], E[0, 2] = 1.0 + b * xx, -a * wz + b * xy, a * wy + b * xz
    E[1, 0], E[1, 1], E[1, 2] = a * wz + b * xy, 1.0 + b * yy, -a * wx + b * yz
    E[2, 0], E[2, 1], E[2, 2] = -a * wy + b * xz, a * wx + b * yz, 1.0 + b * zz
    E[0, 3] = (1.0 + c * xx) * rx + (-b * wz + c * xy) * ry + (b * wy + c * xz) * rz
    E[1, 3] = (b * wz + c * xy) * rx + (1.0 + c * yy) * ry + (-b * wx + c * yz) * rz
    E[2, 3] = (-b * wy + c * xz) * rx + (b * wx + c * yz) * ry + (1.0 + c * zz) * rz
    E[3, 0], E[3, 1], E[3, 2], E[3, 3] = 0.0, 0.0, 0.0, 1.0
    return T @ E


# --- noise ------------------------------------------------------------------------------------


@dataclass
class Noise:
    """Measurement noise of one solve (mutable: the estimate updates it).

    ``sigma_t``/``sigma_r`` are per-axis 1-sigma figures (m, rad); with per-station
    figures (``per_station``) they are the RMS of those, for reporting. ``estimate_t`` /
    ``estimate_r`` say which ones are estimated from the residuals.
    """

    sigma_t: float
    sigma_r: float
    estimate_t: bool
    estimate_r: bool
    per_station: bool
    rows: int  # residual components per station: 6 (pose) or 3 (point)
    source: str = ""
    diag: np.ndarray | None = None  # diag(1/sigma) (rows, rows) when the figures are scalar

    def describe(self) -> str:
        if self.per_station:
            return "per-station standard deviations given with the measurements"
        parts = []
        for name, est in (("translation", self.estimate_t), ("rotation", self.estimate_r)):
            if self.rows == 3 and name == "rotation":
                continue
            parts.append(f"{name} {'estimated from the residuals' if est else 'given'}")
        return ", ".join(parts)


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
) -> Noise:
    """Validate the noise arguments and fill ``ws.wsig`` (1/sigma per residual component).

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

    Raises
    ------
    ValueError
        Bad shape, a non-positive or non-finite figure (naming the station), or both a
        per-station array and scalar figures.
    """
    noise_t = _check_sigma(noise_t, "noise_translation_m")
    noise_r = _check_sigma(noise_r, "noise_rotation_rad")
    w = ws.wsig[: n * rows].reshape(n, rows)
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
        return Noise(st, sr, False, False, True, rows)
    nz = Noise(
        noise_t if noise_t is not None else DEFAULT_NOISE_TRANSLATION_M,
        (noise_r if noise_r is not None else DEFAULT_NOISE_ROTATION_RAD) if rows == 6 else math.nan,
        noise_t is None,
        noise_r is None and rows == 6,
        False,
        rows,
    )
    fill_whitening(nz, n, ws)
    return nz


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


# --- models -----------------------------------------------------------------------------------


class PoseModel:
    """``M_i = A G_i B`` with 6-DoF measurements (module docstring). State ``(A, B)``."""

    nparam = 12
    rows = 6

    def __init__(self, M: np.ndarray, G: np.ndarray, n: int, ws: Workspace) -> None:
        self.M, self.G, self.n, self.ws = M, G, n, ws
        np.copyto(ws.meas3[:n], M[:, :3, 3])  # contiguous: ufuncs on strided views buffer
        J = ws.Jraw[: n * 72].reshape(n, 6, 12)
        # Structural zeros (the flat buffer is shared with the other models' views).
        J[:, 0:3, 9:12] = 0.0
        J[:, 3:6, 0:3] = 0.0
        J[:, 3:6, 6:9] = 0.0

    def views(self):
        n, ws = self.n, self.ws
        return (
            ws.Jw[: n * 72].reshape(n, 6, 12),
            ws.ew[: n * 6].reshape(n, 6),
            ws.ewh[: n * 6].reshape(n, 6),
        )

    @staticmethod
    def retract(state, d: np.ndarray):
        A, B = state
        return se3_exp_right(A, d[:6]), se3_exp_right(B, d[6:])

    def residuals(self, state) -> None:
        """Raw residuals into ``ws.et`` (m) and ``ws.er`` (rad), plus the intermediates
        the Jacobian needs."""
        A, B = state
        n, ws = self.n, self.ws
        G, M = self.G, self.M
        RA, RB = A[:3, :3], B[:3, :3]
        q4 = ws.q4[:n]
        np.matmul(G, B[:, 3], out=q4)  # [R_G t_B + t_G, 1]: target origin in G's parent
        tp = ws.tp[:n]
        np.matmul(q4, A[:3, :].T, out=tp)  # R_A q + t_A
        et = ws.et[:n]
        np.subtract(ws.meas3[:n], tp, out=et)
        C = ws.rC[:n]
        np.matmul(G[:, :3, :3], RB, out=C)  # R_G R_B
        P = ws.rP[:n]
        np.matmul(RA, C, out=P)
        E = ws.rE[:n]
        np.matmul(P.transpose(0, 2, 1), M[:, :3, :3], out=E)
        _batch_log(E, ws.er[:n], n, ws)

    def evaluate(self, state, jacobian: bool = True) -> None:
        self.residuals(state)
        if not jacobian:
            return
        A, _ = state
        n, ws = self.n, self.ws
        RA = A[:3, :3]
        J = ws.Jraw[: n * 72].reshape(n, 6, 12)
        nJi = _neg_inv_left_jacobian(ws.er[:n], n, ws)
        negRA = ws.R3
        np.negative(RA, out=negRA)
        C = ws.rC[:n]
        np.copyto(J[:, 0:3, 0:3], negRA)  # d e_t / d rho_A = -R_A
        hq = ws.r9[:n]
        np.matmul(ws.q4[:n, :3], _HAT39, out=hq)
        np.matmul(RA, hq.reshape(n, 3, 3), out=J[:, 0:3, 3:6])  # d e_t / d phi_A = R_A [q]x
        np.matmul(negRA, C, out=J[:, 0:3, 6:9])  # d e_t / d rho_B = -R_P
        np.matmul(nJi, C.transpose(0, 2, 1), out=J[:, 3:6, 3:6])  # d e_r / d phi_A = -Jl^-1 C^T
        np.copyto(J[:, 3:6, 9:12], nJi)  # d e_r / d phi_B = -Jl^-1

    def whiten(self, nz: Noise) -> None:
        """Whitened residual ``ws.ew`` from ``ws.et``/``ws.er`` and the noise figures."""
        n, ws = self.n, self.ws
        ew = ws.ew[: n * 6].reshape(n, 6)
        if nz.diag is not None:
            np.matmul(ws.et[:n], nz.diag[:3, :3], out=ew[:, :3])
            np.matmul(ws.er[:n], nz.diag[3:, 3:], out=ew[:, 3:])
            return
        w = ws.wsig[: n * 6].reshape(n, 6)
        np.einsum("ij,ij->ij", ws.et[:n], w[:, :3], out=ew[:, :3])
        np.einsum("ij,ij->ij", ws.er[:n], w[:, 3:], out=ew[:, 3:])

    def norms(self, out_t: np.ndarray, out_r: np.ndarray) -> None:
        """Per-station translation (m) and rotation (rad) residual lengths."""
        n, ws = self.n, self.ws
        _rownorm(ws.et[:n], out_t)
        _rownorm(ws.er[:n], out_r)


class PointModel:
    """``p_i = A (R_G_i y + t_G_i)`` with 3-DoF measurements. State ``(A, y)``."""

    nparam = 9
    rows = 3

    def __init__(self, p: np.ndarray, G: np.ndarray, n: int, ws: Workspace) -> None:
        self.p, self.G, self.n, self.ws = p, G, n, ws
        np.copyto(ws.meas3[:n], p)
        self.y4 = np.ones(4)

    def views(self):
        n, ws = self.n, self.ws
        return (
            ws.Jw[: n * 27].reshape(n, 3, 9),
            ws.ew[: n * 3].reshape(n, 3),
            ws.ewh[: n * 3].reshape(n, 3),
        )

    @staticmethod
    def retract(state, d: np.ndarray):
        A, y = state
        return se3_exp_right(A, d[:6]), y + d[6:]

    def residuals(self, state) -> None:
        A, y = state
        n, ws = self.n, self.ws
        self.y4[:3] = y
        q4 = ws.q4[:n]
        np.matmul(self.G, self.y4, out=q4)  # [R_G y + t_G, 1]: the target in the base frame
        tp = ws.tp[:n]
        np.matmul(q4, A[:3, :].T, out=tp)
        np.subtract(ws.meas3[:n], tp, out=ws.et[:n])

    def evaluate(self, state, jacobian: bool = True) -> None:
        self.residuals(state)
        if not jacobian:
            return
        A, _ = state
        n, ws = self.n, self.ws
        RA = A[:3, :3]
        J = ws.Jraw[: n * 27].reshape(n, 3, 9)
        negRA = ws.R3
        np.negative(RA, out=negRA)
        np.copyto(J[:, :, 0:3], negRA)  # d e / d rho_A = -R_A
        hq = ws.r9[:n]
        np.matmul(ws.q4[:n, :3], _HAT39, out=hq)
        np.matmul(RA, hq.reshape(n, 3, 3), out=J[:, :, 3:6])  # d e / d phi_A = R_A [q]x
        np.matmul(negRA, self.G[:, :3, :3], out=J[:, :, 6:9])  # d e / d y = -R_A R_G

    def whiten(self, nz: Noise) -> None:
        n, ws = self.n, self.ws
        np.multiply(ws.et[:n], ws.wsig[: n * 3].reshape(n, 3), out=ws.ew[: n * 3].reshape(n, 3))

    def norms(self, out_t: np.ndarray, out_r: np.ndarray) -> None:
        n, ws = self.n, self.ws
        _rownorm(ws.et[:n], out_t)
        out_r.fill(0.0)


class PivotModel:
    """The pivot ``R_i p_tip + t_i = p_pivot``: linear least squares, so no iteration; this
    holds its whitened Jacobian ``[R_i, -I] / sigma`` (n, 3, 6) and residual for the
    covariance and the (exact) leave-one-out closure."""

    nparam = 6
    rows = 3

    def __init__(self, R: np.ndarray, d: np.ndarray, sigma: float, n: int, ws: Workspace) -> None:
        self.n, self.ws = n, ws
        s = 1.0 / sigma
        J = ws.Jw[: n * 18].reshape(n, 3, 6)
        np.matmul(R, np.eye(3) * s, out=J[:, :, 0:3])  # a scaled strided ufunc would buffer
        np.copyto(J[:, :, 3:6], _NEG_I3 * s)
        np.multiply(d, s, out=ws.ew[: n * 3].reshape(n, 3))
        ws.wsig[: n * 3] = s

    def views(self):
        n, ws = self.n, self.ws
        return ws.Jw[: n * 18].reshape(n, 3, 6), ws.ew[: n * 3].reshape(n, 3), ws.ew[: n * 3].reshape(n, 3)


# --- batch SO(3) kernels -------------------------------------------------------------------------


def _rowdot(a: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = a[i] . a[i]`` for (n, k) ``a``: a batched 1xk @ kx1 matmul, several times
    cheaper than ``einsum`` at small n."""
    np.matmul(a[:, None, :], a[:, :, None], out=out[:, None, None])


def _rownorm(a: np.ndarray, out: np.ndarray) -> None:
    _rowdot(a, out)
    np.sqrt(out, out=out)


def _rowscale(s: np.ndarray, a: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = s[i] * a[i]`` for (n,) ``s`` and (n, ...) ``a`` (a matmul: a broadcasting
    ufunc would buffer)."""
    n = a.shape[0]
    np.matmul(s[:, None, None], a.reshape(n, 1, -1), out=out.reshape(n, 1, -1))


def _batch_log(E: np.ndarray, out: np.ndarray, n: int, ws: Workspace) -> None:
    """Rotation vectors of a batch of rotations ``E`` (n, 3, 3) into ``out`` (n, 3).

    ``vee(E - E^T) = 2 sin(th) a`` and ``tr(E) - 1 = 2 cos(th)``: the angle by atan2 is
    accurate at 0; the direction degrades only near 180 degrees, where a residual is a
    gross outlier anyway. Scratch ``ws.rs[0:3]`` and ``ws.rv``; ``ws.rs[2]`` keeps the angle.
    """
    v = ws.rv[:n]
    np.subtract(E[:, 2, 1], E[:, 1, 2], out=v[:, 0])
    np.subtract(E[:, 0, 2], E[:, 2, 0], out=v[:, 1])
    np.subtract(E[:, 1, 0], E[:, 0, 1], out=v[:, 2])
    s = ws.rs[0, :n]
    _rownorm(v, s)  # 2 sin(th)
    c = ws.rs[1, :n]
    np.add(E[:, 0, 0], E[:, 1, 1], out=c)
    np.add(c, E[:, 2, 2], out=c)
    np.subtract(c, 1.0, out=c)  # 2 cos(th)
    th = ws.rs[2, :n]
    np.arctan2(s, c, out=th)
    np.maximum(s, 1e-300, out=s)
    np.divide(th, s, out=s)  # th / (2 sin th); 0 at th = 0 where v = 0 too
    _rowscale(s, v, out)


def _neg_inv_left_jacobian(er: np.ndarray, n: int, ws: Workspace) -> np.ndarray:
    """``-Jl^-1(e)`` for a batch of rotation vectors, into ``ws.rJi`` (n, 3, 3).

    ``Jl^-1(e) = I - [e]x / 2 + c(th) [e]x^2``, ``[e]x^2 = e e^T - th^2 I``,
    ``c = 1/th^2 - cot(th/2) / (2 th) = 1/12 + th^2/720 + th^4/30240 + th^6/1209600 + ...``;
    the series (exact to 1e-13 below 0.5 rad, where residuals live) runs always, and the
    closed form replaces it only for stations beyond 0.5 rad (outliers). Needs the angle in
    ``ws.rs[2]`` from :func:`_batch_log`.
    """
    th2 = ws.rs[3, :n]
    np.multiply(ws.rs[2, :n], ws.rs[2, :n], out=th2)
    c = ws.rs[4, :n]
    np.multiply(th2, 1.0 / 1209600.0, out=c)
    np.add(c, 1.0 / 30240.0, out=c)
    np.multiply(c, th2, out=c)
    np.add(c, 1.0 / 720.0, out=c)
    np.multiply(c, th2, out=c)
    np.add(c, 1.0 / 12.0, out=c)
    th = ws.rs[2, :n]
    if float(th.max()) > 0.5:
        big = ws.ball[:n]
        np.greater(th, 0.5, out=big)
        ex = ws.rs[5, :n]
        with np.errstate(divide="ignore", invalid="ignore"):
            np.multiply(th, 0.5, out=ex)
            np.tan(ex, out=ex)
            np.multiply(ex, th, out=ex)
            np.multiply(ex, 2.0, out=ex)  # 2 th tan(th/2)
            np.divide(1.0, ex, out=ex)
            # c = 1/th^2 - 1 / (2 th tan(th/2))
            d2 = ws.rs[1, :n]
            np.divide(1.0, th2, out=d2)
            np.subtract(d2, ex, out=ex)
        np.copyto(c, ex, where=big)
    EE = ws.rEE[:n]
    np.matmul(er[:, :, None], er[:, None, :], out=EE)  # e e^T
    nJi = ws.rJi[:n]
    np.negative(c, out=ws.rs[5, :n])
    _rowscale(ws.rs[5, :n], EE, nJi)  # -c e e^T
    d = ws.rs[1, :n]
    np.multiply(c, th2, out=d)
    np.subtract(d, 1.0, out=d)  # diagonal: c th^2 - 1
    for i in range(3):
        np.add(nJi[:, i, i], d, out=nJi[:, i, i])
    h = ws.r9[:n]
    np.matmul(er, _HALF_HAT39, out=h)
    np.add(nJi.reshape(n, 9), h, out=nJi.reshape(n, 9))  # + [e]x / 2
    return nJi


# --- the solve ----------------------------------------------------------------------------------


@dataclass
class Fit:
    """What :func:`refine` returns (internal; the public results copy what they need)."""

    state: tuple
    covariance: np.ndarray  # (p, p), right perturbation, (rho, phi) order
    cost: float  # whitened, Huber-weighted
    chi2: float  # whitened, unweighted
    dof: int
    iterations: int
    converged: bool
    downweighted: np.ndarray
    noise: Noise
    ok: bool = True
    message: str = ""


def _weigh(model, n: int, ws: Workspace, huber: float | None, nz: Noise) -> float:
    """Whiten, apply Huber weights; fill ``ws.Jw``/``ws.ewh``; return the robust cost."""
    rows, p = model.rows, model.nparam
    model.whiten(nz)
    Jw, ew, ewh = model.views()
    Jraw = ws.Jraw[: n * rows * p].reshape(n, rows, p)
    w = ws.wsig[: n * rows].reshape(n, rows)
    r2 = ws.hw[:n]
    _rowdot(ew, r2)
    if huber is None:
        if nz.diag is not None:
            np.matmul(nz.diag, Jraw, out=Jw)  # diag(1/sigma) J_i for every station
        else:
            np.einsum("nrk,nr->nrk", Jraw, w, out=Jw)
        np.copyto(ewh, ew)
        return float(r2.sum())
    # Station-level Huber on the whitened residual length r: weight min(1, k / r); the
    # robust cost sum (2 w - w^2) r^2 is r^2 inside the threshold, 2 k r - k^2 outside.
    k = float(huber)
    sw = ws.hsw[:n]
    np.sqrt(r2, out=sw)
    np.maximum(sw, k, out=sw)
    np.divide(k, sw, out=sw)  # w
    t = ws.rs[0, :n]
    np.subtract(2.0, sw, out=t)
    np.multiply(t, sw, out=t)
    cost = float(np.vdot(t, r2))
    np.copyto(r2, sw)  # keep w in ws.hw
    np.sqrt(sw, out=sw)
    wr = ws.wrow[: n * rows].reshape(n, rows)
    _rowscale(sw, w, wr)
    np.matmul(wr[:, :, None, None], Jraw[:, :, None, :], out=Jw[:, :, None, :])
    _rowscale(sw, ew, ewh)
    return cost


def _normal(model, n: int, ws: Workspace) -> tuple[np.ndarray, np.ndarray]:
    p = model.nparam
    Jw, _, ewh = model.views()
    J2 = Jw.reshape(n * model.rows, p)
    H = ws.H12[:p, :p]
    g = ws.g12[:p]
    np.matmul(J2.T, J2, out=H)
    np.matmul(J2.T, ewh.reshape(n * model.rows), out=g)
    return H, g


def _eval(model, state, n, ws, huber, nz) -> float:
    model.evaluate(state)
    return _weigh(model, n, ws, huber, nz)


def _vce(model, n: int, ws: Workspace, nz: Noise, Hinv: np.ndarray) -> bool:
    """One variance-component update of the estimated noise figures; True if one moved.

    For component c (translation or rotation rows) the redundancy is ``r_c = 3N -
    tr(H^-1 J_c^T J_c)`` (its share of the leverage) and ``s_c^2 = sum e_c^2 / r_c`` (whitened,
    weighted) estimates ``(sigma_true / sigma_assumed)^2``.
    """
    rows, p = model.rows, model.nparam
    Jw, _, ewh = model.views()
    K = ws.KJ[: n * rows * p].reshape(n, rows, p)
    np.matmul(Jw, Hinv, out=K)
    moved = False
    comps = (("t", 0, 3), ("r", 3, 6)) if rows == 6 else (("t", 0, 3),)
    for name, a, b in comps:
        if not (nz.estimate_t if name == "t" else nz.estimate_r):
            continue
        lev = float(np.einsum("nrk,nrk->", K[:, a:b], Jw[:, a:b]))
        red = 3.0 * n - lev
        if red < 0.5:  # too little redundancy to estimate: keep the assumed figure
            continue
        s2 = float(np.einsum("ij,ij->", ewh[:, a:b], ewh[:, a:b])) / red
        old = nz.sigma_t if name == "t" else nz.sigma_r
        new = max(old * math.sqrt(s2), NOISE_FLOOR_M if name == "t" else NOISE_FLOOR_RAD)
        if abs(new / old - 1.0) > _VCE_TOL:
            moved = True
        if name == "t":
            nz.sigma_t = new
        else:
            nz.sigma_r = new
    return moved


def _downweighted(n: int, ws: Workspace) -> np.ndarray:
    """Indices of the stations with Huber weight < 1, as a view of ``ws.down`` (ascending).

    Scattered with ``np.put`` to their rank among the flagged stations (the others to a
    spare slot), because ``flatnonzero`` would allocate with their number.
    """
    mi = ws.itmp[:n]
    np.less(ws.hw[:n], 1.0, out=ws.ball[:n])
    np.copyto(mi, ws.ball[:n])  # as intp: mixed-type ufuncs buffer
    pos = ws.ipos[:n]
    np.cumsum(mi, out=pos)
    count = int(pos[n - 1])
    np.subtract(pos, 1, out=pos)
    np.multiply(pos, mi, out=pos)
    np.subtract(1, mi, out=mi)
    np.multiply(mi, n, out=mi)  # unflagged stations go to the spare slot n
    np.add(pos, mi, out=pos)
    np.put(ws.down, pos, ws.iota[:n])
    return ws.down[:count]


def _solve_step(H: np.ndarray, g: np.ndarray, lam: float, ws: Workspace) -> np.ndarray:
    p = H.shape[0]
    Hd = ws.Hd12[:p, :p]
    np.copyto(Hd, H)
    if lam:
        for i in range(p):
            Hd[i, i] *= 1.0 + lam
    d = np.linalg.solve(Hd, g)
    np.negative(d, out=d)
    return d


def refine(
    model,
    state,
    nz: Noise,
    *,
    huber: float | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
) -> Fit:
    """Levenberg-Marquardt (Gauss-Newton with damping only on a rejected step) from
    ``state``, with variance-component estimation of the noise figures marked for it.

    On return the workspace holds the Jacobian and residuals at the returned state (for the
    covariance and the hold-out closure). If the information matrix is singular the fit is
    returned with ``ok=False`` at the starting state.
    """
    n, ws = model.n, model.ws
    if huber is not None and not (math.isfinite(float(huber)) and float(huber) > 0.0):
        raise ValueError(f"huber must be a positive threshold in sigmas, got {huber!r}")
    estimating = nz.estimate_t or nz.estimate_r
    start = state
    cost = _eval(model, state, n, ws, huber, nz)
    H, g = _normal(model, n, ws)
    lam = 0.0
    it = 0
    rejects = 0
    vce_rounds = 0
    stale = False  # the buffers hold a rejected trial state
    converged = False
    try:
        while it < max_iterations:
            d = _solve_step(H, g, lam, ws)
            dec = -float(np.vdot(g, d))
            if not math.isfinite(dec):
                raise np.linalg.LinAlgError("non-finite step")
            if dec <= _REL_TOL * cost + _ABS_TOL:
                if estimating and vce_rounds < _VCE_MAX_ROUNDS:
                    vce_rounds += 1
                    if _vce(model, n, ws, nz, np.linalg.inv(H)):
                        fill_whitening(nz, n, ws)
                        cost = _weigh(model, n, ws, huber, nz)  # same state, new weights
                        H, g = _normal(model, n, ws)
                        lam = 0.0
                        continue
                converged = True
                break
            it += 1
            trial = model.retract(state, d)
            c1 = _eval(model, trial, n, ws, huber, nz)
            if c1 <= cost:
                state, cost = trial, c1
                H, g = _normal(model, n, ws)
                lam = 0.0 if lam < 1e-9 else lam * 0.1
                rejects = 0
                stale = False
            else:
                stale = True
                rejects += 1
                if rejects >= 4:  # at the rounding floor: nothing left to gain
                    converged = True
                    break
                lam = max(lam * 10.0, 1e-6)
        if stale:
            cost = _eval(model, state, n, ws, huber, nz)
            H, g = _normal(model, n, ws)
        cov = np.linalg.inv(H)
        if not np.all(np.isfinite(cov)):
            raise np.linalg.LinAlgError("singular information matrix")
    except np.linalg.LinAlgError as exc:
        cost = _eval(model, start, n, ws, huber, nz)
        H, g = _normal(model, n, ws)
        p = model.nparam
        return Fit(start, np.full((p, p), np.inf), cost, cost, n * model.rows - p, it, False,
                   ws.down[:0], nz, ok=False, message=f"refinement skipped: {exc}")
    _, ew, _ = model.views()
    chi2 = float(np.vdot(ew, ew))
    down = _downweighted(n, ws) if huber is not None else ws.down[:0]
    return Fit(state, cov, cost, chi2, n * model.rows - model.nparam, it, converged, down, nz)


def covariance_at(model, state, nz: Noise, *, huber: float | None = None) -> Fit:
    """Covariance of the ML estimate evaluated at ``state`` (no iteration).

    Used for a linear answer (``refine=False``): the inverse Fisher information there is the
    covariance the ML fit would have, i.e. a lower bound for the linear estimate's. Noise
    figures marked for estimation are estimated from the residuals at ``state``.
    """
    n, ws = model.n, model.ws
    cost = _eval(model, state, n, ws, huber, nz)
    H, _ = _normal(model, n, ws)
    p = model.nparam
    try:
        for _ in range(_VCE_MAX_ROUNDS if (nz.estimate_t or nz.estimate_r) else 0):
            if not _vce(model, n, ws, nz, np.linalg.inv(H)):
                break
            fill_whitening(nz, n, ws)
            cost = _weigh(model, n, ws, huber, nz)
            H, _ = _normal(model, n, ws)
        cov = np.linalg.inv(H)
        ok = bool(np.all(np.isfinite(cov)))
    except np.linalg.LinAlgError:
        cov, ok = np.full((p, p), np.inf), False
    _, ew, _ = model.views()
    return Fit(state, cov, cost, float(np.vdot(ew, ew)), n * model.rows - p, 0, True, ws.down[:0], nz, ok=ok,
               message="" if ok else "information matrix singular")


# --- conveniences (allocate; for planning and tests) ---------------------------------------------


def pose_residual_jacobian(M, G, A, B) -> tuple[np.ndarray, np.ndarray]:
    """Raw residuals (N, 6) and their Jacobian (N, 6, 12) of the pose model at ``(A, B)``.

    Rows ``(e_t (m), e_r (rad))``, columns ``[rho_A, phi_A, rho_B, phi_B]`` for the right
    perturbations ``A exp(d_A)``, ``B exp(d_B)``.
    """
    M = np.asarray(M, float)
    G = np.asarray(G, float)
    n = M.shape[0]
    ws = Workspace(n)
    m = PoseModel(M, G, n, ws)
    m.evaluate((np.asarray(A, float), np.asarray(B, float)))
    e = np.concatenate([ws.et[:n], ws.er[:n]], axis=1)
    return e, ws.Jraw[: n * 72].reshape(n, 6, 12).copy()


def point_residual_jacobian(p, G, A, y) -> tuple[np.ndarray, np.ndarray]:
    """Raw residuals (N, 3) and Jacobian (N, 3, 9) of the point model at ``(A, y)``."""
    p = np.asarray(p, float)
    G = np.asarray(G, float)
    n = p.shape[0]
    ws = Workspace(n)
    m = PointModel(p, G, n, ws)
    m.evaluate((np.asarray(A, float), np.asarray(y, float)))
    return ws.et[:n].copy(), ws.Jraw[: n * 27].reshape(n, 3, 9).copy()


def fisher_information_pose(G, A, B, sigma_t_m: float, sigma_r_rad: float) -> np.ndarray:
    """Per-station Fisher information (N, 12, 12) of the pose model at zero residual.

    ``J_i^T W J_i`` with ``W = diag(1/sigma_t^2 (x3), 1/sigma_r^2 (x3))``; sum over
    stations for the information matrix, invert for the Cramer-Rao bound.
    """
    G = np.asarray(G, float)
    A = np.asarray(A, float)
    B = np.asarray(B, float)
    M = A @ G @ B
    _, J = pose_residual_jacobian(M, G, A, B)
    w = np.array([1.0 / sigma_t_m] * 3 + [1.0 / sigma_r_rad] * 3)
    Jw = J * w[None, :, None]
    return np.einsum("nri,nrj->nij", Jw, Jw)


def fisher_information_point(G, A, y, sigma_m: float) -> np.ndarray:
    """Per-station Fisher information (N, 9, 9) of the point model."""
    G = np.asarray(G, float)
    A = np.asarray(A, float)
    y = np.asarray(y, float)
    p = (A @ G @ np.append(y, 1.0))[:, :3]
    _, J = point_residual_jacobian(p, G, A, y)
    Jw = J / sigma_m
    return np.einsum("nri,nrj->nij", Jw, Jw)
