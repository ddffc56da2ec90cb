"""The residual models the refinement fits (:mod:`cellcal.solver.refine`, ADR 0004): the pose,
point and pivot closures with their analytic Jacobians, on the small SE(3) and batched SO(3)
kernels they share."""

from __future__ import annotations

import math

import numpy as np

from cellcal.solver.refine_noise import Noise
from cellcal.solver.workspace import Workspace

__all__ = ["PoseModel", "PointModel", "PivotModel", "se3_exp_right"]

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
    # One array from nested lists: sixteen item assignments cost more than the arithmetic.
    E = np.array([
        [1.0 + b * xx, -a * wz + b * xy, a * wy + b * xz,
         (1.0 + c * xx) * rx + (-b * wz + c * xy) * ry + (b * wy + c * xz) * rz],
        [a * wz + b * xy, 1.0 + b * yy, -a * wx + b * yz,
         (b * wz + c * xy) * rx + (1.0 + c * yy) * ry + (-b * wx + c * yz) * rz],
        [-a * wy + b * xz, a * wx + b * yz, 1.0 + b * zz,
         (-b * wy + c * xz) * rx + (b * wx + c * yz) * ry + (1.0 + c * zz) * rz],
        [0.0, 0.0, 0.0, 1.0],
    ])
    return T @ E


# --- models -----------------------------------------------------------------------------------


class PoseModel:
    """``M_i = A G_i B`` with 6-DoF measurements (module docstring). State ``(A, B)``."""

    nparam = 12
    rows = 6

    def __init__(self, M: np.ndarray, G: np.ndarray, n: int, ws: Workspace) -> None:
        self.M, self.G, self.n, self.ws = M, G, n, ws
        np.copyto(ws.meas3[:n], M[:, :3, 3])  # contiguous: ufuncs on strided views buffer
        # The views, made once: a refinement asks for them dozens of times.
        self._views = (ws.Jw[: n * 72].reshape(n, 6, 12), ws.ew[: n * 6].reshape(n, 6),
                       ws.ewh[: n * 6].reshape(n, 6))
        self._split = (ws.KJ[: n * 72].reshape(2, n, 3, 12), ws.e6.reshape(-1)[: n * 6].reshape(2, n, 3))
        # G_i @ b for every station as one (4N, 4) @ (4,) product: a batched matvec costs a
        # call per station (the caller's stack, when contiguous: a reshape must not copy).
        flat = G.flags.c_contiguous and G.dtype == np.float64
        self._G2 = G.reshape(4 * n, 4) if flat else None
        self._G16 = G.reshape(n, 16)[:, :11] if flat else None
        # A 3x3 product per station is a call per station; a fixed one on either side is one
        # flat product with a Kronecker-expanded factor (the extra terms are exact zeros):
        # R_G R_B = G16[:, :11] @ _KB, R_A C = C9 @ _KA.
        self._KB = np.zeros((11, 9))  # _KB[4a + b, 3a + c] = R_B[b, c]
        self._KA = np.zeros((9, 9))  # _KA[3b + c, 3a + c] = R_A[a, b]
        J = ws.Jraw[: n * 72].reshape(n, 6, 12)
        # Structural zeros (the flat buffer is shared with the other models' views).
        J[:, 0:3, 9:12] = 0.0
        J[:, 3:6, 0:3] = 0.0
        J[:, 3:6, 6:9] = 0.0

    def split_views(self) -> tuple[np.ndarray, np.ndarray]:
        """The split layout of the fused refinement (:class:`cellcal.solver.refine._Fused`):
        the raw Jacobian per noise component, (2, n, 3, 12) in ``ws.KJ``, and the raw residual
        per component, (2, n, 3) in ``ws.e6``. Each component's rows are contiguous, so one
        batched product gives both components' information matrices."""
        return self._split

    def prepare_split(self) -> None:
        """Write the split Jacobian's structural zeros (``ws.KJ`` is scratch between solves)."""
        J2, _ = self.split_views()
        J2[0, :, :, 9:12] = 0.0
        J2[1, :, :, 0:3] = 0.0
        J2[1, :, :, 6:9] = 0.0

    def unsplit(self, wt: float, wr: float) -> None:
        """From the split layout to the one the rest of the solver reads: ``ws.et``/``ws.er``
        and the whitened ``ws.Jw``/``ws.ew`` under the scalar whitening ``wt``/``wr``
        (``1 / sigma``; the same products, element by element, as :meth:`whiten` and the
        refinement's weighting)."""
        n, ws = self.n, self.ws
        J2, e2 = self.split_views()
        np.copyto(ws.et[:n], e2[0])
        np.copyto(ws.er[:n], e2[1])
        Jw, ew, _ = self.views()
        np.multiply(J2[0], wt, out=Jw[:, 0:3])
        np.multiply(J2[1], wr, out=Jw[:, 3:6])
        np.multiply(e2[0], wt, out=ew[:, 0:3])
        np.multiply(e2[1], wr, out=ew[:, 3:6])

    def views(self):
        return self._views

    @staticmethod
    def retract(state, d: np.ndarray):
        A, B = state
        return se3_exp_right(A, d[:6]), se3_exp_right(B, d[6:])

    def residuals(self, state, split: bool = False) -> None:
        """Raw residuals into ``ws.et`` (m) and ``ws.er`` (rad) (``split``: into the split
        layout of :meth:`split_views`), plus the intermediates the Jacobian needs."""
        A, B = state
        n, ws = self.n, self.ws
        if split:
            _, e2 = self.split_views()
            et, er = e2[0], e2[1]
        else:
            et, er = ws.et[:n], ws.er[:n]
        G, M = self.G, self.M
        RA, RB = A[:3, :3], B[:3, :3]
        q4 = ws.q4[:n]
        if self._G2 is not None:
            np.matmul(self._G2, B[:, 3], out=q4.reshape(4 * n))
        else:
            np.matmul(G, B[:, 3], out=q4)  # [R_G t_B + t_G, 1]: target origin in G's parent
        tp = ws.tp[:n]
        np.matmul(q4, A[:3, :].T, out=tp)  # R_A q + t_A
        np.subtract(ws.meas3[:n], tp, out=et)
        C = ws.rC[:n]
        if self._G16 is not None:
            KB = self._KB
            for a in range(3):
                KB[4 * a : 4 * a + 3, 3 * a : 3 * a + 3] = RB
            np.matmul(self._G16, KB, out=C.reshape(n, 9))  # R_G R_B
        else:
            np.matmul(G[:, :3, :3], RB, out=C)
        P = ws.rP[:n]
        KA = self._KA.reshape(3, 3, 3, 3)
        for c in range(3):
            KA[:, c, :, c] = RA.T
        np.matmul(C.reshape(n, 9), self._KA, out=P.reshape(n, 9))  # R_A C
        E = ws.rE[:n]
        np.matmul(P.transpose(0, 2, 1), M[:, :3, :3], out=E)
        _batch_log(E, er, n, ws)

    def evaluate(self, state, jacobian: bool = True, split: bool = False) -> None:
        """Residuals and (``jacobian``) their Jacobian into ``ws.Jraw`` (n, 6, 12), or with
        ``split`` both into the split layout of :meth:`split_views`."""
        self.residuals(state, split)
        if not jacobian:
            return
        A, _ = state
        n, ws = self.n, self.ws
        RA = A[:3, :3]
        if split:
            J2, e2 = self.split_views()
            Jt, Jr, er = J2[0], J2[1], e2[1]
        else:
            J = ws.Jraw[: n * 72].reshape(n, 6, 12)
            Jt, Jr, er = J[:, 0:3], J[:, 3:6], ws.er[:n]
        nJi = _neg_inv_left_jacobian(er, n, ws)
        negRA = ws.R3
        np.negative(RA, out=negRA)
        C = ws.rC[:n]
        np.copyto(Jt[:, :, 0:3], negRA)  # d e_t / d rho_A = -R_A
        hq = ws.r9[:n]
        if split:
            # d e_t / d phi_A = R_A [q]x = [R_A q]x R_A: one flat product on the right instead
            # of a 3x3 product per station on the left.
            u = ws.rv[:n]  # free after the residuals' log
            np.matmul(ws.q4[:n, :3], RA.T, out=u)
            np.matmul(u, _HAT39, out=hq)
            np.matmul(hq.reshape(3 * n, 3), RA, out=Jt.reshape(3 * n, 12)[:, 3:6])
        else:
            np.matmul(ws.q4[:n, :3], _HAT39, out=hq)
            np.matmul(RA, hq.reshape(n, 3, 3), out=Jt[:, :, 3:6])  # d e_t / d phi_A = R_A [q]x
        np.negative(ws.rP[:n], out=Jt[:, :, 6:9])  # d e_t / d rho_B = -R_P
        np.matmul(nJi, C.transpose(0, 2, 1), out=Jr[:, :, 3:6])  # d e_r / d phi_A = -Jl^-1 C^T
        np.copyto(Jr[:, :, 9:12], nJi)  # d e_r / d phi_B = -Jl^-1

    def whiten(self, nz: Noise) -> None:
        """Whitened residual ``ws.ew`` from ``ws.et``/``ws.er`` and the noise figures."""
        n, ws = self.n, self.ws
        ew = ws.ew[: n * 6].reshape(n, 6)
        if nz.full:
            e6 = ws.e6[:n]
            np.copyto(e6[:, :3], ws.et[:n])
            np.copyto(e6[:, 3:], ws.er[:n])
            np.matmul(ws.Wfull[: n * 36].reshape(n, 6, 6), e6[:, :, None], out=ew[:, :, None])
            return
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
        self._views = (ws.Jw[: n * 27].reshape(n, 3, 9), ws.ew[: n * 3].reshape(n, 3), ws.ewh[: n * 3].reshape(n, 3))
        self._split = (ws.Jraw[: n * 27].reshape(1, n, 3, 9), ws.et[:n].reshape(1, n, 3))
        # Flat products for the fixed 3x3 factors, as in PoseModel.
        flat = G.flags.c_contiguous and G.dtype == np.float64
        self._G2 = G.reshape(4 * n, 4) if flat else None
        self._G16 = G.reshape(n, 16)[:, :11] if flat else None
        self._KA = np.zeros((11, 9))  # _KA[4b + c, 3a + c] = -R_A[a, b]

    def split_views(self) -> tuple[np.ndarray, np.ndarray]:
        """One noise component: ``ws.Jraw`` (1, n, 3, 9) and ``ws.et`` (1, n, 3) as they are."""
        return self._split

    def prepare_split(self) -> None:
        """Nothing to prepare: the split layout is the ordinary one."""

    def unsplit(self, w: float, wr: float = math.nan) -> None:
        """The whitened ``ws.Jw``/``ws.ew`` under the scalar whitening ``w`` (``1 / sigma``)."""
        n, ws = self.n, self.ws
        Jw, ew, _ = self.views()
        np.multiply(ws.Jraw[: n * 27].reshape(n, 3, 9), w, out=Jw)
        np.multiply(ws.et[:n], w, out=ew)

    def views(self):
        return self._views

    @staticmethod
    def retract(state, d: np.ndarray):
        A, y = state
        return se3_exp_right(A, d[:6]), y + d[6:]

    def residuals(self, state) -> None:
        A, y = state
        n, ws = self.n, self.ws
        self.y4[:3] = y
        q4 = ws.q4[:n]
        if self._G2 is not None:
            np.matmul(self._G2, self.y4, out=q4.reshape(4 * n))
        else:
            np.matmul(self.G, self.y4, out=q4)  # [R_G y + t_G, 1]: the target in the base frame
        tp = ws.tp[:n]
        np.matmul(q4, A[:3, :].T, out=tp)
        np.subtract(ws.meas3[:n], tp, out=ws.et[:n])

    def evaluate(self, state, jacobian: bool = True, split: bool = False) -> None:
        """Residual into ``ws.et`` and (``jacobian``) its Jacobian into ``ws.Jraw``
        (``split`` changes nothing: one component)."""
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
        # d e / d phi_A = R_A [q]x = [R_A q]x R_A (flat products, as in PoseModel.evaluate)
        u = ws.rv[:n]
        np.matmul(ws.q4[:n, :3], RA.T, out=u)
        np.matmul(u, _HAT39, out=hq)
        np.matmul(hq.reshape(3 * n, 3), RA, out=J.reshape(3 * n, 9)[:, 3:6])
        if self._G16 is not None:  # d e / d y = -R_A R_G
            K = self._KA
            for c in range(3):
                K[c:11:4, c:9:3] = negRA.T
            tmp = ws.rP[:n]
            np.matmul(self._G16, K, out=tmp.reshape(n, 9))
            np.copyto(J[:, :, 6:9], tmp)
        else:
            np.matmul(negRA, self.G[:, :3, :3], out=J[:, :, 6:9])

    def whiten(self, nz: Noise) -> None:
        n, ws = self.n, self.ws
        ew = ws.ew[: n * 3].reshape(n, 3)
        if nz.full:
            np.matmul(ws.Wfull[: n * 9].reshape(n, 3, 3), ws.et[:n, :, None], out=ew[:, :, None])
            return
        np.multiply(ws.et[:n], ws.wsig[: n * 3].reshape(n, 3), out=ew)

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
    diag = nJi.reshape(n, 9)[:, ::4]  # the three diagonal entries, one strided add
    np.add(diag, d[:, None], out=diag)
    h = ws.r9[:n]
    np.matmul(er, _HALF_HAT39, out=h)
    np.add(nJi.reshape(n, 9), h, out=nJi.reshape(n, 9))  # + [e]x / 2
    return nJi
