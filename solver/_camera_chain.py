"""The camera chain on the image: model, Jacobians and the arrow-structured solver (ADR 0027).

Internal to :mod:`cellcal.solver.hand_eye_camera` and :mod:`cellcal.solver.camera_temporal`.

Model
-----
View ``v`` sees the target's corner ``p`` (target frame, m) at ``project(k, P_v, p)`` with

* eye-in-hand: ``P_v = X^-1 D_v^-1 G_v^-1 Z``, ``X = flange_T_camera``, ``Z = base_T_target``;
* eye-to-hand: ``P_v = X^-1 G_v D_v Z``, ``X = base_T_camera``, ``Z = flange_T_target``;

``G_v`` the robot's ``base_T_flange`` and ``D_v = [exp(phi_v), rho_v]`` the view's correction
of it, ``c_v = (rho_v, phi_v)`` (m, rad; flange frame), ``c_v = d_v + tau xi_v``: ``d_v`` held by
a zero-mean Gaussian prior (the robot's repeatability, and its accuracy where declared),
``tau`` an optional latency (s) times the flange's body twist ``xi_v`` (m/s, rad/s) at the view.

Parameters
----------
Globals ``g`` (:data:`N_GLOBAL` or one more with the latency): ``X`` (6, right twist),
``Z`` (6, right twist), the nine intrinsics (additive, :data:`camera_model.PARAMETER_NAMES`),
then ``tau``. Per view ``d_v`` (6, additive). A mask holds any global fixed.

Jacobians (chain rule onto the camera model's right-perturbation pose Jacobian ``J_P``):
``X exp(e)``: ``P exp(-Ad(P^-1) e)``; ``Z exp(e)``: ``P exp(e)``; ``D exp(e)``:
``P exp(-Ad(Z^-1 G D) e)`` (eye-in-hand) or ``P exp(Ad(Z^-1) e)`` (eye-to-hand); and
``D(c + dc) = D exp(blockdiag(R_D^T, J_r(phi)) dc)`` exactly, ``J_r`` SO(3)'s right Jacobian.

Solver
------
Gauss-Newton, Levenberg-Marquardt damping after a rejected step (as the intrinsics, ADR
0022), on residuals whitened by the corner noise (image) and by the priors. Views are
independent given the globals, so the normal equations are an arrow: one Schur complement
on the globals (``p x p``) and a batch of 6x6 inverses per iteration, everything per corner
batched. An optional Huber loss re-weights corners (IRLS) on their whitened length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from cellcal.solver.camera_model import N_PARAMETERS, project

__all__ = ["EYE_IN_HAND", "EYE_TO_HAND", "SETUPS", "N_GLOBAL", "ChainState", "ChainProblem", "refine_chain",
           "so3_exp_batch", "se3_exp_batch", "inverse_batch", "adjoint_batch", "log_batch"]

EYE_IN_HAND = "eye_in_hand"
EYE_TO_HAND = "eye_to_hand"
SETUPS = (EYE_IN_HAND, EYE_TO_HAND)
#: X (6), Z (6), intrinsics (9).
N_GLOBAL = 12 + N_PARAMETERS
SL_X, SL_Z, SL_K = slice(0, 6), slice(6, 12), slice(12, 12 + N_PARAMETERS)
I_TAU = N_GLOBAL

STOP_CONVERGED = "converged"
STOP_ROUNDING = "converged at the rounding floor"
STOP_ITERATIONS = "iteration limit"
STOP_STALLED = "stalled"


# -- batched SO(3) / SE(3) ----------------------------------------------------------------------


def _hat_batch(v: np.ndarray) -> np.ndarray:
    K = np.zeros(v.shape[:-1] + (3, 3))
    K[..., 0, 1], K[..., 0, 2], K[..., 1, 2] = -v[..., 2], v[..., 1], -v[..., 0]
    K[..., 1, 0], K[..., 2, 0], K[..., 2, 1] = v[..., 2], -v[..., 1], v[..., 0]
    return K


def _coefficients(phi: np.ndarray):
    th2 = np.einsum("...i,...i->...", phi, phi)
    small = th2 < 1e-8
    th = np.sqrt(np.where(small, 1.0, th2))
    t2 = np.where(small, 1.0, th2)
    a = np.where(small, 1.0 - th2 / 6.0, np.sin(th) / th)  # sin / th
    b = np.where(small, 0.5 - th2 / 24.0, (1.0 - np.cos(th)) / t2)  # (1 - cos) / th^2
    c = np.where(small, 1.0 / 6.0 - th2 / 120.0, (th - np.sin(th)) / (t2 * th))  # (th - sin) / th^3
    return a[..., None, None], b[..., None, None], c[..., None, None]


def so3_exp_batch(phi: np.ndarray) -> np.ndarray:
    """Rotations (..., 3, 3) of rotation vectors (..., 3)."""
    a, b, _ = _coefficients(phi)
    K = _hat_batch(phi)
    return np.eye(3) + a * K + b * (K @ K)


def so3_right_jacobian_batch(phi: np.ndarray) -> np.ndarray:
    """``J_r(phi)`` (..., 3, 3): ``exp(phi + d) = exp(phi) exp(J_r(phi) d)`` to first order."""
    _, b, c = _coefficients(phi)
    K = _hat_batch(phi)
    return np.eye(3) - b * K + c * (K @ K)


def se3_exp_batch(xi: np.ndarray) -> np.ndarray:
    """Group exponentials (..., 4, 4) of twists (..., 6) ordered ``(rho, phi)``."""
    a, b, c = _coefficients(xi[..., 3:])
    K = _hat_batch(xi[..., 3:])
    KK = K @ K
    T = np.zeros(xi.shape[:-1] + (4, 4))
    T[..., :3, :3] = np.eye(3) + a * K + b * KK
    T[..., :3, 3] = ((np.eye(3) + b * K + c * KK) @ xi[..., :3, None])[..., 0]
    T[..., 3, 3] = 1.0
    return T


def log_batch(T: np.ndarray) -> np.ndarray:
    """``(rho, phi)`` (..., 6) with ``se3_exp(log(T)) == T`` for rotations below pi."""
    R = T[..., :3, :3]
    cos = np.clip((np.trace(R, axis1=-2, axis2=-1) - 1.0) * 0.5, -1.0, 1.0)
    w = np.stack([R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]], -1) * 0.5
    s = np.linalg.norm(w, axis=-1)
    th = np.arctan2(s, cos)
    scale = np.where(s < 1e-10, 1.0 + th * th / 6.0, th / np.where(s < 1e-10, 1.0, s))
    phi = w * scale[..., None]
    _, b, c = _coefficients(phi)
    K = _hat_batch(phi)
    V = np.eye(3) + b * K + c * (K @ K)
    rho = np.linalg.solve(V, T[..., :3, 3:4])[..., 0]
    return np.concatenate([rho, phi], axis=-1)


def inverse_batch(T: np.ndarray) -> np.ndarray:
    """Rigid inverses (..., 4, 4)."""
    out = np.zeros_like(T)
    Rt = np.swapaxes(T[..., :3, :3], -1, -2)
    out[..., :3, :3] = Rt
    out[..., :3, 3] = -(Rt @ T[..., :3, 3:4])[..., 0]
    out[..., 3, 3] = 1.0
    return out


def adjoint_batch(T: np.ndarray) -> np.ndarray:
    """Adjoints (..., 6, 6) for twists ``(rho, phi)``: ``[[R, [t]x R], [0, R]]``."""
    R = T[..., :3, :3]
    Ad = np.zeros(T.shape[:-2] + (6, 6))
    Ad[..., :3, :3] = R
    Ad[..., 3:, 3:] = R
    Ad[..., :3, 3:] = _hat_batch(T[..., :3, 3]) @ R
    return Ad


def correction_transforms(c: np.ndarray) -> np.ndarray:
    """``D = [exp(phi), rho]`` (N, 4, 4) of corrections ``c = (rho, phi)`` (N, 6)."""
    D = np.zeros(c.shape[:-1] + (4, 4))
    D[..., :3, :3] = so3_exp_batch(c[..., 3:])
    D[..., :3, 3] = c[..., :3]
    D[..., 3, 3] = 1.0
    return D


# -- state and problem -----------------------------------------------------------------------------


@dataclass
class ChainState:
    """Where the chain is: the two transforms, the intrinsics, the latency, the corrections."""

    X: np.ndarray
    Z: np.ndarray
    k: np.ndarray
    d: np.ndarray  # (N, 6)
    tau: float = 0.0

    def copy(self) -> ChainState:
        return ChainState(self.X.copy(), self.Z.copy(), self.k.copy(), self.d.copy(), float(self.tau))


@dataclass
class ChainProblem:
    """The corners of the views (sorted by view), the robot poses and the priors.

    ``prior_sd`` (N, 6) is the 1-sigma of each view's correction ``d_v`` (m, rad);
    ``k_prior`` ``(k0 (9,), information (9, 9))`` a Gaussian prior on the intrinsics (None:
    none); ``free`` (p,) which globals move; ``twist`` (N, 6) the flange's body twist at each
    view when the latency is a parameter (None: no latency).
    """

    setup: str
    obj: np.ndarray  # (n, 3)
    img: np.ndarray  # (n, 2)
    view: np.ndarray  # (n,) intp, sorted
    G: np.ndarray  # (N, 4, 4)
    sigma_px: float
    prior_sd: np.ndarray  # (N, 6)
    free: np.ndarray  # (p,) bool
    k_prior: tuple[np.ndarray, np.ndarray] | None = None
    twist: np.ndarray | None = None
    huber: float | None = None
    starts: np.ndarray = field(init=False)
    n_views: int = field(init=False)

    def __post_init__(self) -> None:
        if self.setup not in SETUPS:
            raise ValueError(f"setup must be one of {SETUPS}, got {self.setup!r}")
        self.n_views = int(self.G.shape[0])
        self.starts = np.searchsorted(self.view, np.arange(self.n_views))
        p = N_GLOBAL + (0 if self.twist is None else 1)
        if self.free.shape != (p,):
            raise ValueError(f"free mask must have {p} entries, got {self.free.shape}")

    @property
    def n_global(self) -> int:
        return N_GLOBAL + (0 if self.twist is None else 1)

    # -- model --------------------------------------------------------------------------
    def corrections(self, s: ChainState) -> np.ndarray:
        c = s.d if self.twist is None else s.d + s.tau * self.twist
        return c

    def poses(self, s: ChainState) -> tuple[np.ndarray, np.ndarray]:
        """``camera_T_target`` of every view (N, 4, 4) and the corrections ``D`` (N, 4, 4)."""
        D = correction_transforms(self.corrections(s))
        Xi = inverse_batch(s.X)
        if self.setup == EYE_IN_HAND:
            P = Xi @ inverse_batch(self.G @ D) @ s.Z
        else:
            P = Xi @ self.G @ D @ s.Z
        return P, D

    def weights(self, r: np.ndarray) -> np.ndarray:
        """IRLS weights (n,) of the Huber loss on each corner's whitened length (1 without it)."""
        if self.huber is None:
            return np.ones(r.shape[0])
        s = np.hypot(r[:, 0], r[:, 1]) / self.sigma_px
        return np.where(s <= self.huber, 1.0, self.huber / np.maximum(s, 1e-300))

    def residual_px(self, s: ChainState) -> np.ndarray:
        P, _ = self.poses(s)
        return self.img - project(s.k, P[self.view], self.obj).uv

    def cost(self, s: ChainState) -> float:
        """Half the robust whitened cost (image, corrections' prior, intrinsics' prior)."""
        r = self.residual_px(s)
        if not np.all(np.isfinite(r)):
            return math.inf
        q = np.hypot(r[:, 0], r[:, 1]) / self.sigma_px
        if self.huber is None:
            c = float(np.sum(q * q))
        else:
            h = self.huber
            c = float(np.sum(np.where(q <= h, q * q, 2.0 * h * q - h * h)))
        c += float(np.sum((s.d / self.prior_sd) ** 2))
        if self.k_prior is not None:
            e = s.k - self.k_prior[0]
            c += float(e @ self.k_prior[1] @ e)
        return 0.5 * c

    def jacobians(self, s: ChainState):
        """Whitened-by-nothing Jacobians: residual (n, 2) px, ``J_g`` (n, 2, p), ``J_d`` (n, 2, 6)."""
        P, D = self.poses(s)
        v = self.view
        pr = project(s.k, P[v], self.obj, jacobians=True)
        assert pr.J_uv_pose is not None and pr.J_uv_intrinsics is not None
        Jp = pr.J_uv_pose
        Pinv = inverse_batch(P)
        A_X = -adjoint_batch(Pinv)  # (N, 6, 6)
        c = self.corrections(s)
        E = np.zeros((self.n_views, 6, 6))
        E[:, :3, :3] = np.swapaxes(D[:, :3, :3], -1, -2)
        E[:, 3:, 3:] = so3_right_jacobian_batch(c[:, 3:])
        if self.setup == EYE_IN_HAND:
            A_D = -adjoint_batch(inverse_batch(s.Z) @ self.G @ D) @ E
        else:
            A_D = adjoint_batch(inverse_batch(s.Z))[None] @ E
        n = v.shape[0]
        Jg = np.zeros((n, 2, self.n_global))
        Jg[:, :, SL_X] = Jp @ A_X[v]
        Jg[:, :, SL_Z] = Jp
        Jg[:, :, SL_K] = pr.J_uv_intrinsics
        Jd = Jp @ A_D[v]
        if self.twist is not None:
            Jg[:, :, I_TAU] = (Jd @ self.twist[v][:, :, None])[:, :, 0]
        Jg *= self.free
        return self.img - pr.uv, Jg, Jd

    def normal(self, s: ChainState):
        """Whitened normal equations: ``r`` (n, 2) px, ``w`` (n,), ``U`` (p, p), ``V`` (N, 6, 6),
        ``W`` (N, p, 6), ``gg`` (p,), ``gv`` (N, 6); ``V`` and ``gg``/``gv`` include the priors."""
        r, Jg, Jd = self.jacobians(s)
        w = self.weights(r)
        sq = (np.sqrt(w) / self.sigma_px)[:, None, None]
        Jg = Jg * sq
        Jd = Jd * sq
        rw = r * sq[:, :, 0]
        st = self.starts
        p = self.n_global
        Jgf = Jg.reshape(-1, p)
        U = Jgf.T @ Jgf
        JdT = np.swapaxes(Jd, 1, 2)
        V = np.add.reduceat(JdT @ Jd, st, axis=0)
        W = np.add.reduceat(np.swapaxes(Jg, 1, 2) @ Jd, st, axis=0)
        gg = Jgf.T @ rw.reshape(-1)
        gv = np.add.reduceat((JdT @ rw[:, :, None])[:, :, 0], st, axis=0)
        info = 1.0 / self.prior_sd**2
        V = V + info[:, :, None] * np.eye(6)
        gv = gv - info * s.d
        if self.k_prior is not None:
            k0, Ik = self.k_prior
            fk = self.free[SL_K].astype(float)
            U[SL_K, SL_K] += Ik * np.outer(fk, fk)
            gg[SL_K] += (Ik @ (k0 - s.k)) * fk
        return r, w, U, V, W, gg, gv

    def solve(self, U, V, W, gg, gv, lam: float):
        """Damped step ``(dg, dd)`` through the Schur complement; also ``S`` and ``V^-1``."""
        fixed = ~self.free
        Ud = U + lam * np.diag(np.diag(U))
        Ud[fixed, :] = 0.0
        Ud[:, fixed] = 0.0
        Ud[fixed, fixed] = 1.0
        Vd = V + lam * (np.eye(6) * np.einsum("nii->ni", V)[:, :, None])
        Vinv = np.linalg.inv(Vd)
        WVi = W @ Vinv
        S = Ud - np.einsum("nij,nkj->ik", WVi, W)
        rhs = gg - np.einsum("nij,nj->i", WVi, gv)
        rhs[fixed] = 0.0
        dg = np.linalg.solve(S, rhs)
        dd = np.einsum("nij,nj->ni", Vinv, gv - np.einsum("nji,j->ni", W, dg))
        return dg, dd, S, Vinv

    def retract(self, s: ChainState, dg: np.ndarray, dd: np.ndarray) -> ChainState:
        from cellcal.solver.se3 import se3_exp

        out = ChainState(s.X @ se3_exp(dg[SL_X]), s.Z @ se3_exp(dg[SL_Z]), s.k + dg[SL_K], s.d + dd, s.tau)
        if self.twist is not None:
            out.tau = float(s.tau + dg[I_TAU])
        return out

    def covariance(self, s: ChainState):
        """Inverse information at ``s``: the globals' (p, p) with fixed rows and columns 0,
        each view's correction (N, 6, 6), and the pieces the tests reuse."""
        r, w, U, V, W, gg, gv = self.normal(s)
        _dg, _dd, S, Vinv = self.solve(U, V, W, gg, gv, 0.0)
        Sinv = np.linalg.inv(S)
        fixed = ~self.free
        Sinv[fixed, :] = 0.0
        Sinv[:, fixed] = 0.0
        WVi = W @ Vinv  # (N, p, 6)
        Cd = Vinv + np.swapaxes(WVi, 1, 2) @ Sinv @ WVi
        return Sinv, Cd, (r, w, U, V, W, S, Vinv)


def refine_chain(prob: ChainProblem, state: ChainState, max_iter: int) -> tuple[ChainState, int, bool, str]:
    """Levenberg-Marquardt from ``state``; returns the state, iterations, converged, stop reason."""
    cost = prob.cost(state)
    lam = 0.0
    stop = STOP_ITERATIONS
    converged = False
    rejected = 0
    it = 0
    if not math.isfinite(cost):
        return state, 0, False, STOP_STALLED
    while it < max_iter:
        it += 1
        _r, _w, U, V, W, gg, gv = prob.normal(state)
        try:
            dg, dd, _S, _Vi = prob.solve(U, V, W, gg, gv, lam)
        except np.linalg.LinAlgError:
            stop = STOP_STALLED
            break
        pred = float(dg @ gg + np.sum(dd * gv)) - 0.5 * (
            float(dg @ U @ dg) + 2.0 * float(np.einsum("i,nij,nj->", dg, W, dd))
            + float(np.einsum("ni,nij,nj->", dd, V, dd)))
        new = prob.retract(state, dg, dd)
        new_cost = prob.cost(new) if np.all(np.isfinite(new.k)) and new.k[0] > 0 and new.k[1] > 0 else math.inf
        if new_cost <= cost:
            done = cost - new_cost <= 1e-12 * cost or pred <= 1e-14 * max(cost, 1e-300)
            state, cost = new, new_cost
            lam = 0.0 if lam < 1e-6 else lam / 4.0
            rejected = 0
            if done:
                converged, stop = True, STOP_CONVERGED
                break
        else:
            if pred <= 1e-14 * max(cost, 1e-300) or cost <= 1e-24:
                converged, stop = True, STOP_ROUNDING
                break
            rejected += 1
            if rejected >= 12:
                stop = STOP_STALLED
                break
            lam = 1e-4 if lam == 0.0 else lam * 8.0
    return state, it, converged, stop
