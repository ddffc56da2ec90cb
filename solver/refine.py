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

Noise: per-station full covariances from the instrument when given (whitened by their
Cholesky factors, :func:`prepare_noise`); else per-station, per-axis 1-sigma; else scalar
per-axis figures when given; else each missing figure is *estimated* from the residuals by
variance-component estimation (Foerstner's redundancy-number estimator, whose fixed point is
REML's), starting from :data:`DEFAULT_NOISE_TRANSLATION_M` / :data:`DEFAULT_NOISE_ROTATION_RAD`.
The ratio of the two figures sets the relative weight of positions and orientations, which
is what makes the fit efficient; their scale sets the reported covariance, which
:mod:`cellcal.solver.diagnostics` then corrects for small samples and model error. A robust
fit (``huber``, ``reject_k``) measures residuals in a robust scale. Every fit says why it
stopped (``Fit.stop_reason``); one that did not converge keeps the start figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver import _stats
from cellcal.solver.refine_models import PivotModel, PointModel, PoseModel, _rowdot, _rowscale
from cellcal.solver.refine_noise import (
    DEFAULT_NOISE_ROTATION_RAD,
    DEFAULT_NOISE_TRANSLATION_M,
    NOISE_FLOOR_M,
    NOISE_FLOOR_RAD,
    Noise,
    fill_whitening,
    prepare_noise,
)
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
    "fill_whitening",
    "refine",
    "fisher_information_pose",
    "fisher_information_point",
    "pose_residual_jacobian",
    "point_residual_jacobian",
]

#: Gauss-Newton iterations at most; from the linear start 2-4 are typical.
DEFAULT_MAX_ITERATIONS = 20
#: Converged when the predicted cost decrease of the next step is below this fraction of
#: the cost (a step of ~1e-5 sigma), or below the absolute floor.
_REL_TOL = 1.0e-10
_ABS_TOL = 1.0e-24
#: Variance-component rounds stop once every estimated sigma moves by less than this.
_VCE_TOL = 0.02
_VCE_MAX_ROUNDS = 6



# --- the solve ----------------------------------------------------------------------------------

#: Why a refinement stopped (``Fit.stop_reason`` starts with one of these).
STOP_CONVERGED = "converged"
STOP_ROUNDING = "converged at the rounding floor"
STOP_ITERATIONS = "iteration limit"
STOP_STALLED = "stalled"
STOP_SKIPPED = "refinement skipped"
#: A variance component is estimated only from this much redundancy on: the scaled
#: inverse chi-square that describes the estimate has a finite mean above 2 degrees of
#: freedom, and the small-sample inflation ``r / (r - 2)`` stays below 3 from here.
MIN_NOISE_REDUNDANCY = 3.0
#: Rejected steps in a row, with growing damping, before the refinement gives up.
_MAX_REJECTS = 10
#: A step rejected with a predicted gain below this fraction of the cost is at the
#: rounding floor (the minimum, to working precision), not stuck away from it.
_FLOOR_REL = 1.0e-7
#: Rounds of hard rejection (``reject_k``) at most.
_MAX_REJECT_ROUNDS = 5
#: A robust fit's budget is this many times ``max_iterations`` per round: re-weighting
#: converges linearly, not quadratically (20-30 steps from a start with gross outliers).
ROBUST_ITERATION_FACTOR = 3
#: Medians of chi-square with 3 and 6 degrees of freedom (robust scale of a station's
#: translation or rotation residual, and of a 6-D length).
_MEDIAN_CHI2_3 = 2.365973884375338
#: A robust fit estimates its noise from the stations whose whitened squared length is
#: below the 99.9 % point of chi-square (rows degrees of freedom), and corrects for the
#: truncation: ``E[R^2 | R^2 < c^2] = rows P(chi2_{rows+2} < c^2) / P(chi2_rows < c^2)``.
#: Cutting by the Huber weight instead (stations inside k) would bias the scale low, and
#: for small k the low scale cuts more stations: a runaway.
_VAR_CUT = {r: _stats.chi2_ppf(0.999, r) for r in (3, 6)}
_VAR_TRUNC = {r: (1.0 - _stats.chi2_sf(_VAR_CUT[r], r + 2)) / 0.999 for r in (3, 6)}


@dataclass
class Fit:
    """What :func:`refine` returns (internal; the public results copy what they need).

    ``covariance`` is the inverse of the (weighted, whitened) information matrix at the
    returned state under the returned noise figures: the leverage the hold-out closure
    needs, and the noise part of the reported covariance before the small-sample and
    model-error terms (:mod:`cellcal.solver.diagnostics`).
    """

    state: tuple
    covariance: np.ndarray  # (p, p), right perturbation, (rho, phi) order
    cost: float  # whitened, Huber-weighted
    chi2: float  # whitened, unweighted by Huber (stations weighted by their mask)
    dof: int
    iterations: int
    converged: bool
    downweighted: np.ndarray
    noise: Noise
    ok: bool = True
    message: str = ""
    stop_reason: str = STOP_CONVERGED
    rejected: int = 0  # stations dropped by reject_k
    robust: bool = False  # huber or reject_k: noise from the stations inside the 99.9 % cut


def _station_weights(n: int, ws: Workspace, huber: float | None, masked: bool, r2: np.ndarray) -> float:
    """Per-station weights into ``ws.hsw`` (square roots of the total weight) from the
    whitened squared lengths ``r2``; Huber weights stay in ``ws.hw``. Returns the cost."""
    sw = ws.hsw[:n]
    t = ws.rs[0, :n]
    if huber is not None:
        # Station-level Huber on the whitened residual length r: weight min(1, k / r); the
        # robust cost sum (2 w - w^2) r^2 is r^2 inside the threshold, 2 k r - k^2 outside.
        k = float(huber)
        np.sqrt(r2, out=sw)
        np.maximum(sw, k, out=sw)
        np.divide(k, sw, out=sw)  # w
        np.subtract(2.0, sw, out=t)
        np.multiply(t, sw, out=t)
        np.multiply(t, r2, out=t)  # robust cost per station
        np.copyto(ws.hw[:n], sw)
    else:
        np.copyto(t, r2)
        ws.hw[:n] = 1.0
        sw.fill(1.0)
    if masked:
        m = ws.mask[:n]
        np.multiply(t, m, out=t)
        np.multiply(sw, m, out=sw)
    cost = float(t.sum())
    np.sqrt(sw, out=sw)
    return cost


def _weigh(model, n: int, ws: Workspace, huber: float | None, nz: Noise, masked: bool = False) -> float:
    """Whiten, apply station weights (Huber, mask); fill ``ws.Jw``/``ws.ewh``; return the
    robust cost."""
    rows, p = model.rows, model.nparam
    model.whitening_full = nz.full
    model.whiten(nz)
    Jw, ew, ewh = model.views()
    Jraw = ws.Jraw[: n * rows * p].reshape(n, rows, p)
    r2 = ws.r2[:n]
    _rowdot(ew, r2)
    if huber is None and not masked:
        ws.hw[:n] = 1.0
        if nz.full:
            np.matmul(ws.Wfull[: n * rows * rows].reshape(n, rows, rows), Jraw, out=Jw)
        elif nz.diag is not None:
            np.matmul(nz.diag, Jraw, out=Jw)  # diag(1/sigma) J_i for every station
        else:
            np.einsum("nrk,nr->nrk", Jraw, ws.wsig[: n * rows].reshape(n, rows), out=Jw)
        np.copyto(ewh, ew)
        return float(r2.sum())
    cost = _station_weights(n, ws, huber, masked, r2)
    sw = ws.hsw[:n]
    if nz.full:
        tmp = ws.KJ[: n * rows * p].reshape(n, rows, p)  # free until the next covariance
        np.matmul(ws.Wfull[: n * rows * rows].reshape(n, rows, rows), Jraw, out=tmp)
        _rowscale(sw, tmp, Jw)
    else:
        w = ws.wsig[: n * rows].reshape(n, rows)
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


class _Generic:
    """The normal equations of any model and noise, station by station through ``ws.Jw``
    (:func:`_weigh`, :func:`_normal`). ``H``/``g`` are those of the accepted state."""

    def __init__(self, model, n: int, ws: Workspace, huber: float | None, nz: Noise, masked: bool) -> None:
        self.model, self.n, self.ws, self.huber, self.nz, self.masked = model, n, ws, huber, nz, masked
        self.H = self.g = ws.g12  # set by load()
        self._hinv: np.ndarray | None = None

    def trial(self, state) -> float:
        """Evaluate at ``state``; its cost (``H``/``g`` stay those of the accepted state)."""
        return _eval(self.model, state, self.n, self.ws, self.huber, self.nz, self.masked)

    def accept(self) -> None:
        self.H, self.g = _normal(self.model, self.n, self.ws)
        self._hinv = None

    def load(self, state) -> float:
        cost = self.trial(state)
        self.accept()
        return cost

    def reweigh(self) -> float:
        """The same state under new noise figures (``fill_whitening`` done)."""
        cost = _weigh(self.model, self.n, self.ws, self.huber, self.nz, self.masked)
        self.accept()
        return cost

    def step(self, lam: float) -> np.ndarray:
        return _solve_step(self.H, self.g, lam, self.ws)

    def inverse(self) -> np.ndarray:
        """``H^-1``, kept until ``H`` changes (the covariance is the last round's inverse)."""
        if self._hinv is None:
            self._hinv = np.linalg.inv(self.H)
        return self._hinv

    def components(self, Hinv: np.ndarray, vm: np.ndarray | None) -> tuple:
        return component_redundancy(self.model, self.n, self.ws, Hinv, vm)

    def finish(self) -> None:
        """Leave ``ws.Jw``/``ws.ew``/``ws.ewh`` at the accepted state (they are, here)."""


class _Fused(_Generic):
    """The normal equations of scalar noise figures, with no station weights, from the raw
    Jacobian split by noise component (``model.split_views``).

    One batched product per evaluation gives, for each component c (translation rows,
    rotation rows), the raw information ``J_c^T J_c``, gradient ``J_c^T e_c`` and sum of
    squares ``e_c^T e_c``; the whitened ones are these times ``1 / sigma_c^2``, so one small
    product with ``(1 / sigma_t^2, 1 / sigma_r^2)`` gives ``H``, ``g`` and the cost. A
    variance-component round then re-weighs with no per-station work, and its redundancy
    numbers are ``3 N - tr(H^-1 J_c^T J_c) / sigma_c^2``: traces of p x p products. The
    undamped step solves ``H [-d, H^-1] = [g, I]`` at once, so the inverse a round or the
    covariance needs is there without a second factorisation. ``ws.Jw`` and the residual
    buffers are written only by :meth:`finish`, at the returned state.
    """

    def __init__(self, model, n: int, ws: Workspace, huber: float | None, nz: Noise, masked: bool) -> None:
        super().__init__(model, n, ws, huber, nz, masked)
        p = model.nparam
        c = model.rows // 3
        self.c, self.p, self.pp = c, p, p * p
        # Fixed size (p x p per component): per-component products S, whitened sums T, for
        # the accepted state and a trial (swapped on acceptance).
        self._S = [np.empty((c, p * p + p + 1)) for _ in range(2)]
        self._T = [np.empty(p * p + p + 1) for _ in range(2)]
        self._w2 = np.empty(c)
        self._B = np.zeros((p, p + 1))
        self._B[:, 1:] = np.eye(p)
        self._cur = 0
        model.prepare_split()
        self._weights()

    def _weights(self) -> None:
        # The whitening in use, ``nz.diag`` (``fill_whitening``), not the figures: a round
        # whose figures moved too little to re-weigh leaves it at the previous ones, as it
        # leaves H and g.
        diag, w2 = self.nz.diag, self._w2
        assert diag is not None
        self._wt = wt = float(diag[0, 0])
        w2[0] = wt * wt
        self._wr = wr = float(diag[3, 3]) if self.c == 2 else math.nan
        if self.c == 2:
            w2[1] = wr * wr

    def _products(self, k: int) -> None:
        n, c, p, pp = self.n, self.c, self.p, self.pp
        self._weights()  # the figures may have been reset since the last products
        J2, e2 = self.model.split_views()
        Jc = J2.reshape(c, 3 * n, p)
        ec = e2.reshape(c, 3 * n, 1)
        S = self._S[k]
        JcT = Jc.transpose(0, 2, 1)
        np.matmul(JcT, Jc, out=S[:, :pp].reshape(c, p, p))
        np.matmul(JcT, ec, out=S[:, pp : pp + p].reshape(c, p, 1))
        np.matmul(ec.transpose(0, 2, 1), ec, out=S[:, pp + p :].reshape(c, 1, 1))
        np.matmul(self._w2, S, out=self._T[k])

    def _set(self) -> None:
        T = self._T[self._cur]
        self.H = T[: self.pp].reshape(self.p, self.p)
        self.g = T[self.pp : self.pp + self.p]
        self._hinv = None

    def trial(self, state) -> float:
        self.model.evaluate(state, split=True)
        k = 1 - self._cur
        self._products(k)
        return float(self._T[k][-1])

    def accept(self) -> None:
        self._cur = 1 - self._cur
        self._set()

    def reweigh(self) -> float:
        self._weights()
        T = self._T[self._cur]
        np.matmul(self._w2, self._S[self._cur], out=T)
        self._set()
        return float(T[-1])

    def step(self, lam: float) -> np.ndarray:
        if lam:
            return _solve_step(self.H, self.g, lam, self.ws)
        B = self._B
        np.copyto(B[:, 0], self.g)
        X = np.linalg.solve(self.H, B)
        self._hinv = np.ascontiguousarray(X[:, 1:])
        d = X[:, 0]
        np.negative(d, out=d)
        return d

    def components(self, Hinv: np.ndarray, vm: np.ndarray | None) -> tuple:
        c, pp = self.c, self.pp
        S = self._S[self._cur]
        w2 = self._w2
        lev = np.matmul(S[:, :pp], Hinv.reshape(pp))  # tr(H^-1 J_c^T J_c) per component
        out = []
        for k in range(2):
            if k >= c:
                out.append((math.nan, math.nan))
                continue
            out.append((3.0 * self.n - float(lev[k]) * float(w2[k]), float(S[k, -1]) * float(w2[k])))
        return tuple(out)

    def finish(self) -> None:
        n, ws, model = self.n, self.ws, self.model
        model.whitening_full = False
        model.unsplit(self._wt, self._wr)
        _, ew, ewh = model.views()
        np.copyto(ewh, ew)
        _rowdot(ew, ws.r2[:n])
        ws.hw[:n] = 1.0


def _system(model, n: int, ws: Workspace, huber: float | None, nz: Noise, masked: bool) -> _Generic:
    """The fused normal equations where they apply (scalar figures, no Huber, no mask, a
    model with a split layout), else the station-by-station ones."""
    if (huber is None and not masked and not nz.full and not nz.per_station and nz.diag is not None
            and hasattr(model, "split_views")):
        return _Fused(model, n, ws, huber, nz, masked)
    return _Generic(model, n, ws, huber, nz, masked)


def _eval(model, state, n, ws, huber, nz, masked=False) -> float:
    model.evaluate(state)
    return _weigh(model, n, ws, huber, nz, masked)


def _variance_stations(n: int, ws: Workspace, robust: bool, masked: bool, rows: int = 6) -> np.ndarray | None:
    """Weights of the stations a variance estimate sums over, into ``ws.vm`` (None: all
    with weight 1). A robust fit leaves out the stations beyond the 99.9 % point of their
    whitened length (:data:`_VAR_CUT`); ``ws.r2`` must hold the squared lengths."""
    if not robust and not masked:
        return None
    vm = ws.vm[:n]
    if masked:
        np.copyto(vm, ws.mask[:n])
    else:
        vm.fill(1.0)
    if robust:
        inside = ws.ball[:n]
        np.less(ws.r2[:n], _VAR_CUT[rows], out=inside)
        np.multiply(vm, inside, out=vm)
    return vm


def component_redundancy(model, n: int, ws: Workspace, Hinv: np.ndarray, vm: np.ndarray | None) -> tuple:
    """Redundancy numbers and weighted sums of squares of the residual components.

    For component c (translation or rotation rows) the redundancy is ``r_c = 3 N_c -
    tr(H^-1 J_c^T J_c)`` over the stations ``vm`` counts (its share of the observations
    minus its share of the leverage), and ``sum e_c^2 / r_c`` (whitened) estimates
    ``(sigma_true / sigma_assumed)^2`` (Foerstner). Returns ``((r_t, q_t), (r_r, q_r))``;
    the rotation pair is ``(nan, nan)`` for a 3-row model. Leaves ``Jw @ H^-1`` in
    ``ws.KJ``.
    """
    rows, p = model.rows, model.nparam
    Jw, ew, _ = model.views()
    K = ws.KJ[: n * rows * p].reshape(n, rows, p)
    np.matmul(Jw, Hinv, out=K)
    out = []
    count = float(n) if vm is None else float(vm.sum())
    ind = None
    if vm is not None:
        ind = ws.vind[:n]
        np.greater(vm, 0.0, out=ws.ball[:n])
        np.copyto(ind, ws.ball[:n])
    if ind is None:
        # Per residual row, summed over stations and parameters: one pass for both components.
        lr, qr = ws.lev6[:rows], ws.sq6[:rows]
        np.einsum("nrk,nrk->r", K, Jw, out=lr)
        np.einsum("nr,nr->r", ew, ew, out=qr)
    for a, b in ((0, 3), (3, 6)):
        if b > rows:
            out.append((math.nan, math.nan))
            continue
        if ind is None:
            lev = float(lr[a] + lr[a + 1] + lr[a + 2])
            q = float(qr[a] + qr[a + 1] + qr[a + 2])
        else:
            # Per station, then the weights' dot product: a three-operand einsum buffers.
            # The squares are of the unweighted whitened residual, weighted by vm (a
            # duplicate's 1/k; a Huber weight is not a variance weight).
            li = ws.rs[4, :n]
            np.einsum("nrk,nrk->n", K[:, a:b], Jw[:, a:b], out=li)
            lev = float(np.vdot(li, ind))
            np.copyto(ws.e3[:n], ew[:, a:b])
            _rowdot(ws.e3[:n], li)
            assert vm is not None
            q = float(np.dot(li, vm))
        out.append((3.0 * count - lev, q))
    return tuple(out)


def _vce(model, n: int, ws: Workspace, nz: Noise, Hinv: np.ndarray, vm: np.ndarray | None = None,
         robust: bool = False, components: tuple | None = None) -> bool:
    """One variance-component update of the estimated noise figures; True if one moved.

    A component whose redundancy is below :data:`MIN_NOISE_REDUNDANCY` keeps its start
    figure and is flagged ``fallback_*`` (too few stations to estimate it). ``robust``:
    ``vm`` is the truncated station set of :func:`_variance_stations`, corrected for.
    ``components``: :func:`component_redundancy`'s answer when the caller has it (the fused
    normal equations of :class:`_Fused` compute it from their p x p blocks).
    """
    if components is None:
        components = component_redundancy(model, n, ws, Hinv, vm)
    (rt, qt), (rr, qr) = components
    if robust:
        qt /= _VAR_TRUNC[model.rows]
        qr /= _VAR_TRUNC[model.rows]
    nz.redundancy_t, nz.redundancy_r = rt, rr
    moved = False
    if (nz.estimate_t and nz.estimate_r and not (rt >= MIN_NOISE_REDUNDANCY and rr >= MIN_NOISE_REDUNDANCY)
            and rt + rr >= MIN_NOISE_REDUNDANCY):
        # Too few stations to estimate the two figures apart (three stations: about 3 each),
        # enough for one factor on both: their ratio stays the start figures', and the
        # covariance is scaled by that one estimate's small-sample law, r / (r - 2) with
        # r = r_t + r_r (diagnostics), instead of falling back to a default it cannot test.
        f = math.sqrt((qt + qr) / (rt + rr)) if qt + qr > 0.0 else 0.0
        new_t = max(nz.sigma_t * f, NOISE_FLOOR_M)
        new_r = max(nz.sigma_r * f, NOISE_FLOOR_RAD)
        moved = abs(new_t / nz.sigma_t - 1.0) > _VCE_TOL
        nz.sigma_t, nz.sigma_r = new_t, new_r
        nz.fallback_t = nz.fallback_r = False
        nz.pooled = True
        return moved
    nz.pooled = False
    for name, red, q in (("t", rt, qt), ("r", rr, qr)):
        if not (nz.estimate_t if name == "t" else nz.estimate_r):
            continue
        if not red >= MIN_NOISE_REDUNDANCY:
            new = nz.start_t if name == "t" else nz.start_r
            if name == "t":
                moved |= nz.sigma_t != new
                nz.sigma_t, nz.fallback_t = new, True
            else:
                moved |= nz.sigma_r != new
                nz.sigma_r, nz.fallback_r = new, True
            continue
        s2 = q / red
        old = nz.sigma_t if name == "t" else nz.sigma_r
        new = max(old * math.sqrt(s2), NOISE_FLOOR_M if name == "t" else NOISE_FLOOR_RAD)
        if abs(new / old - 1.0) > _VCE_TOL:
            moved = True
        if name == "t":
            nz.sigma_t, nz.fallback_t = new, False
        else:
            nz.sigma_r, nz.fallback_r = new, False
    return moved


def _masked_median(vals: np.ndarray, n: int, ws: Workspace, masked: bool) -> float:
    """Median of ``vals`` (n,) over the stations with mask > 0 (all when not masked)."""
    s = ws.srt[:n]
    np.copyto(s, vals)
    count = n
    if masked:
        excl = ws.ball[:n]
        np.less_equal(ws.mask[:n], 0.0, out=excl)
        count = n - int(np.count_nonzero(excl))
        np.copyto(s, np.inf, where=excl)
    if count <= 0:
        return math.nan
    s.sort()
    lo, hi = (count - 1) // 2, count // 2
    return 0.5 * (float(s[lo]) + float(s[hi]))


def _robust_factors(model, n: int, ws: Workspace, masked: bool) -> tuple[float, float]:
    """Robust variance factors of the whitened translation and rotation residuals.

    ``median(|e_c,i|^2) / median(chi2_3)``, scaled up by ``3 N / (3 N - p_c)`` for the
    share ``p_c`` of the parameters the component absorbs (half of them for a pose): an
    estimate of ``(sigma_true / sigma_assumed)^2`` that one gross outlier in two does not
    move (the median), unlike the residual sum of squares.
    """
    rows, p = model.rows, model.nparam
    _, ew, _ = model.views()
    if masked:
        np.greater(ws.mask[:n], 0.0, out=ws.ball2[:n])
        cnt = float(np.count_nonzero(ws.ball2[:n]))
    else:
        cnt = float(n)
    pc = p * 3.0 / rows
    corr = 3.0 * cnt / max(3.0 * cnt - pc, 1.0)
    out = []
    for a, b in ((0, 3), (3, 6)):
        if b > rows:
            out.append(math.nan)
            continue
        q = ws.rs[1, :n]
        np.copyto(ws.e3[:n], ew[:, a:b])
        _rowdot(ws.e3[:n], q)
        med = _masked_median(q, n, ws, masked)
        out.append(max(med / _MEDIAN_CHI2_3 * corr, 1e-300) if math.isfinite(med) else 1.0)
    return out[0], out[1]


def _robust_start(model, state, n, ws, nz: Noise, masked: bool) -> None:
    """Scale the estimated figures by the robust factors at ``state`` (before a robust fit),
    so outliers cannot inflate the scale the Huber weights and rejections are measured in."""
    model.evaluate(state, jacobian=False)
    model.whitening_full = nz.full
    model.whiten(nz)
    ft, fr = _robust_factors(model, n, ws, masked)
    if nz.estimate_t:
        nz.sigma_t = max(nz.sigma_t * math.sqrt(ft), NOISE_FLOOR_M)
    if nz.estimate_r and math.isfinite(fr):
        nz.sigma_r = max(nz.sigma_r * math.sqrt(fr), NOISE_FLOOR_RAD)
    fill_whitening(nz, n, ws)


def _reject(model, n: int, ws: Workspace, k: float) -> int:
    """Drop (mask 0) the stations whose robust whitened length exceeds ``k``; return how many."""
    rows = model.rows
    _, ew, _ = model.views()
    ft, fr = _robust_factors(model, n, ws, True)
    r2 = ws.r2[:n]
    q = ws.rs[1, :n]
    np.copyto(ws.e3[:n], ew[:, 0:3])
    _rowdot(ws.e3[:n], r2)
    np.multiply(r2, 1.0 / ft, out=r2)
    if rows == 6:
        np.copyto(ws.e3[:n], ew[:, 3:6])
        _rowdot(ws.e3[:n], q)
        np.multiply(q, 1.0 / fr, out=q)
        np.add(r2, q, out=r2)
    out = ws.ball[:n]
    np.greater(r2, k * k, out=out)
    keep = ws.ball2[:n]
    np.greater(ws.mask[:n], 0.0, out=keep)
    np.logical_and(out, keep, out=out)
    count = int(np.count_nonzero(out))
    if count:
        np.copyto(ws.mask[:n], 0.0, where=out)
    return count


def _downweighted(n: int, ws: Workspace, masked: bool) -> np.ndarray:
    """Indices of the stations with Huber weight < 1 or dropped (mask 0), as a view of
    ``ws.down`` (ascending).

    Scattered with ``np.put`` to their rank among the flagged stations (the others to a
    spare slot), because ``flatnonzero`` would allocate with their number.
    """
    mi = ws.itmp[:n]
    flag = ws.ball[:n]
    np.less(ws.hw[:n], 1.0, out=flag)
    if masked:
        dropped = ws.ball2[:n]
        np.less_equal(ws.mask[:n], 0.0, out=dropped)
        np.logical_or(flag, dropped, out=flag)
    np.copyto(mi, flag)  # as intp: mixed-type ufuncs buffer
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


def _dof(model, n: int, ws: Workspace, masked: bool) -> int:
    count = float(n) if not masked else float(ws.mask[:n].sum())
    return int(round(model.rows * count)) - model.nparam


def refine(
    model,
    state,
    nz: Noise,
    *,
    huber: float | None = None,
    reject_k: float | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    masked: bool = False,
) -> Fit:
    """Levenberg-Marquardt (Gauss-Newton with damping only on a rejected step) from
    ``state``, with variance-component estimation of the noise figures marked for it.

    Parameters
    ----------
    model, state, nz
        The model, its starting state and the noise (updated in place when estimated).
    huber : float, optional
        Huber threshold on each station's whitened residual length (sigmas).
    reject_k : float, optional
        After convergence, stations whose whitened length exceeds ``reject_k`` robust
        sigmas are dropped (``ws.mask`` set to 0) and the fit repeated, until none is.
    max_iterations : int
        Gauss-Newton steps at most per round (a ``reject_k`` round starts a new budget; a
        robust fit has :data:`ROBUST_ITERATION_FACTOR` times as many).
    masked : bool
        Weigh each station by ``ws.mask`` (filled by the caller; 1/k for k duplicates).

    Notes
    -----
    With ``huber`` or ``reject_k`` and estimated noise, the scale is robust: the fit starts
    from the median-based figures of :func:`_robust_factors`, and each variance-component
    round sums only over the stations kept at full weight. A fit that stops without
    converging (iteration limit, stalled) returns its last accepted state with the noise
    figures reset to their start values (``Noise.reset``): an estimate from a state that
    is not the minimum describes nothing. On return the workspace holds the Jacobian and
    residuals at the returned state (for the covariance and the hold-out closure). If the
    information matrix is singular the fit is returned with ``ok=False`` at the starting
    state.
    """
    n, ws = model.n, model.ws
    if huber is not None and not (math.isfinite(float(huber)) and float(huber) > 0.0):
        raise ValueError(f"huber must be a positive threshold in sigmas, got {huber!r}")
    if reject_k is not None:
        if not (math.isfinite(float(reject_k)) and float(reject_k) > 0.0):
            raise ValueError(f"reject_k must be a positive threshold in sigmas, got {reject_k!r}")
        if not masked:
            ws.mask[:n] = 1.0
            masked = True
    estimating = nz.estimate_t or nz.estimate_r
    robust = huber is not None or reject_k is not None
    start = state
    try:
        if robust and estimating:
            _robust_start(model, state, n, ws, nz, masked)
        sys_ = _system(model, n, ws, huber, nz, masked)
        cost = sys_.load(state)
    except np.linalg.LinAlgError as exc:  # pragma: no cover - a start the model cannot evaluate
        return _skipped(model, start, n, ws, huber, nz, masked, 0, exc)
    big = _max_abs_measured(n, ws)  # the measurements stay fixed through the fit
    lam = 0.0
    it = 0
    budget = max_iterations * (ROBUST_ITERATION_FACTOR if robust else 1)
    limit = budget
    rejects = 0
    vce_rounds = 0
    reject_rounds = 0
    rejected = 0
    stale = False  # the buffers hold a rejected trial state
    dec0 = math.inf  # predicted decrease of the undamped step at the current state
    stop = STOP_ITERATIONS
    try:
        while True:
            d = sys_.step(lam)
            dec = -float(np.vdot(sys_.g, d))
            if not math.isfinite(dec):
                raise np.linalg.LinAlgError("non-finite step")
            if lam == 0.0:
                dec0 = dec
            if dec <= _REL_TOL * cost + _ABS_TOL + _rounding_cost(model, n, ws, nz, big):
                if estimating and vce_rounds < _VCE_MAX_ROUNDS:
                    vce_rounds += 1
                    vm = _variance_stations(n, ws, robust, masked, model.rows)
                    Hinv = sys_.inverse()
                    if _vce(model, n, ws, nz, Hinv, vm, robust, sys_.components(Hinv, vm)):
                        fill_whitening(nz, n, ws)
                        cost = sys_.reweigh()  # same state, new weights
                        lam = 0.0
                        continue
                if reject_k is not None and reject_rounds < _MAX_REJECT_ROUNDS:
                    dropped = _reject(model, n, ws, float(reject_k))
                    if dropped:
                        reject_rounds += 1
                        rejected += dropped
                        limit = it + budget
                        if estimating:
                            _robust_start(model, state, n, ws, nz, masked)
                        cost = sys_.load(state)
                        lam, vce_rounds = 0.0, 0
                        continue
                stop = STOP_CONVERGED
                break
            if it >= limit:
                stop = STOP_ITERATIONS
                break
            it += 1
            trial = model.retract(state, d)
            c1 = sys_.trial(trial)
            if c1 <= cost:
                state, cost = trial, c1
                sys_.accept()
                lam = 0.0 if lam < 1e-9 else lam * 0.1
                rejects = 0
                stale = False
            else:
                stale = True
                rejects += 1
                if dec0 <= _FLOOR_REL * cost + _ABS_TOL + _rounding_cost(model, n, ws, nz, big):
                    stop = STOP_ROUNDING  # nothing left to gain at working precision
                    break
                if rejects >= _MAX_REJECTS:
                    stop = STOP_STALLED
                    break
                lam = max(lam * 10.0, 1e-6)
        converged = stop in (STOP_CONVERGED, STOP_ROUNDING)
        if not converged:
            nz.restart("the refinement did not converge")
            fill_whitening(nz, n, ws)
            stale = True
        if stale:
            cost = sys_.load(state)
        cov = sys_.inverse()
        if not np.all(np.isfinite(cov)):
            raise np.linalg.LinAlgError("singular information matrix")
        if estimating and not converged:
            # Redundancy figures of the returned state (no estimate from them).
            rr = sys_.components(cov, _variance_stations(n, ws, robust, masked, model.rows))
            nz.redundancy_t, nz.redundancy_r = rr[0][0], rr[1][0]
        sys_.finish()
    except np.linalg.LinAlgError as exc:
        return _skipped(model, start, n, ws, huber, nz, masked, it, exc)
    _, ew, _ = model.views()
    chi2 = _masked_chi2(ew, n, ws, masked)
    down = _downweighted(n, ws, masked) if robust else ws.down[:0]
    if stop == STOP_ITERATIONS:
        reason = f"{STOP_ITERATIONS} ({budget} iterations) reached before convergence"
    elif stop == STOP_STALLED:
        reason = f"{STOP_STALLED}: {_MAX_REJECTS} steps in a row did not lower the cost"
    else:
        reason = stop
    return Fit(state, cov, cost, chi2, _dof(model, n, ws, masked), it, converged, down, nz,
               stop_reason=reason, rejected=rejected, robust=robust)


def _max_abs_measured(n: int, ws: Workspace) -> float:
    m3 = ws.meas3[:n]
    return max(float(m3.max()), -float(m3.min())) + 1e-300  # max |x| without a temporary


def _rounding_cost(model, n: int, ws: Workspace, nz: Noise, big: float | None = None) -> float:
    """The whitened cost that rounding alone makes: residuals of the size of the data's
    last digits (``1e-15`` relative to the largest measured coordinate, ``1e-15`` rad),
    whitened by the figures in use. A predicted decrease below it is no decrease: without
    it, noise-free data (whitened by the 1 nm floor) take rounding-level steps until the
    iteration limit."""
    if big is None:
        big = _max_abs_measured(n, ws)
    st = nz.sigma_t if math.isfinite(nz.sigma_t) and nz.sigma_t > 0 else 1.0
    c = 3.0 * n * (1e-15 * big / st) ** 2
    if model.rows == 6:
        sr = nz.sigma_r if math.isfinite(nz.sigma_r) and nz.sigma_r > 0 else 1.0
        c += 3.0 * n * (1e-15 / sr) ** 2
    return c


def _masked_chi2(ew: np.ndarray, n: int, ws: Workspace, masked: bool) -> float:
    if not masked:
        return float(np.vdot(ew, ew))
    r2 = ws.r2[:n]
    _rowdot(ew, r2)
    return float(np.vdot(r2, ws.mask[:n]))


def _skipped(model, start, n, ws, huber, nz, masked, it, exc) -> Fit:
    """The fit at the starting state when the refinement cannot proceed."""
    nz.restart("the refinement was skipped")
    fill_whitening(nz, n, ws)
    cost = _eval(model, start, n, ws, huber, nz, masked)
    _normal(model, n, ws)
    p = model.nparam
    return Fit(start, np.full((p, p), np.inf), cost, cost, _dof(model, n, ws, masked), it, False,
               ws.down[:0], nz, ok=False, message=f"refinement skipped: {exc}",
               stop_reason=f"{STOP_SKIPPED}: {exc}")


def covariance_at(model, state, nz: Noise, *, huber: float | None = None, masked: bool = False) -> Fit:
    """Covariance of the ML estimate evaluated at ``state`` (no iteration).

    Used for a linear answer (``refine=False``): the inverse Fisher information there is the
    covariance the ML fit would have, i.e. a lower bound for the linear estimate's. Noise
    figures marked for estimation are estimated from the residuals at ``state``.
    """
    n, ws = model.n, model.ws
    sys_ = _system(model, n, ws, huber, nz, masked)
    cost = sys_.load(state)
    p = model.nparam
    try:
        robust = huber is not None
        for _ in range(_VCE_MAX_ROUNDS if (nz.estimate_t or nz.estimate_r) else 0):
            vm = _variance_stations(n, ws, robust, masked, model.rows)
            Hinv = sys_.inverse()
            if not _vce(model, n, ws, nz, Hinv, vm, robust, sys_.components(Hinv, vm)):
                break
            fill_whitening(nz, n, ws)
            cost = sys_.reweigh()
        cov = sys_.inverse()
        ok = bool(np.all(np.isfinite(cov)))
        if ok:
            rr = sys_.components(cov, _variance_stations(n, ws, robust, masked, model.rows))
            nz.redundancy_t, nz.redundancy_r = rr[0][0], rr[1][0]
    except np.linalg.LinAlgError:
        cov, ok = np.full((p, p), np.inf), False
    sys_.finish()
    _, ew, _ = model.views()
    return Fit(state, cov, cost, _masked_chi2(ew, n, ws, masked), _dof(model, n, ws, masked), 0, True,
               ws.down[:0], nz, ok=ok, message="" if ok else "information matrix singular",
               stop_reason="closed-form linear answer, not refined", robust=huber is not None)



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
