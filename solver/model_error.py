"""How much of a robot's kinematic error a rigid calibration absorbed: estimated, not assumed.

A calibration of a rigid transform (``cell_T_base``, ``base_T_camera``, ...) from a robot
whose forward kinematics is slightly wrong fits that error as well as it can. Part of it
stays in the residuals (it varies with the pose, so no rigid transform can take it); part
of it is *absorbed* into the answer and leaves no trace. The absorbed part is the
calibration's error, and no residual shows it: only a model of how a robot's error varies
over its poses relates it to what the residuals do show. This module is that model, fitted
to the residuals (ADR 0004, amendment "A calibrated widening").

**The error field.** The robot's error at station ``i`` is a twist ``xi_i`` of its flange
pose in the base frame (``base_T_flange_true = Exp(xi_i) base_T_flange``), the sum of

* a **structured** part: small rigid errors of the arm's links, each constant in its own
  link frame. The solver sees only flange poses, so it uses surrogate link frames that every
  serial industrial arm has in some form: joint 1 about the base's z axis, then the arm
  plane: ``F_1`` turned by the flange's azimuth about z, at a shoulder point on the base
  axis (:data:`SHOULDER_HEIGHT_M`); ``F_2`` the arm plane tilted towards the flange, at the
  shoulder; ``F_3`` the same, half-way to the flange (an elbow). Each carries an isotropic
  twist, translation 1-sigma :data:`LINK_LENGTH_M` per radian of rotation. Such errors
  rotate with the arm: with stations spread over azimuth and reach much of them shows,
  with stations in a small box nearly all of them is absorbed, and the fit tells the
  difference from the stations' own geometry;
* a **rough** part: an independent pose error per station about the flange point (what
  the wrist, backlash and the link errors the surrogate frames miss add), 1-sigma
  :data:`ROUGH_LENGTH_M` per radian. It is absorbed like noise, ``1/N``.

Each part's size is a variance component, estimated from the whitened residuals by REML
(Fisher scoring on the restricted likelihood, the fit's own parameters as fixed effects);
with estimated measurement noise the noise is a third component. A component may not claim
more residual energy than the whole excess over the noise (REML's likelihood is flat along
errors the residuals barely see, and would otherwise let the absorbed part run away). The
covariance added to the answer is the absorbed part of the fitted field,
``H^-1 J^T Sigma_field J H^-1``, with :data:`ISO_SHARE` of it replaced by an isotropic rigid
field (twists about the stations' centroid and the base origin and a pose-linear field) of
the same residual energy, so that no direction of the answer is claimed to be free of model
error because the surrogate frames happened not to reach it.

**Detection.** A score test matched to the field (its statistic ``e^T C e``, ``C`` the
field's covariance at equal shares, Satterthwaite's scaled chi-square with declared noise,
an F with the noise estimated) joins the chi-square and structure tests of
:mod:`cellcal.solver.diagnostics`. Its power against a field of a given size gives the
smallest model error the residuals could have revealed (90 % power at the test's level):
when that exceeds the robot's accuracy (declared, or :data:`DEFAULT_ROBOT_ACCURACY_M`), the
residuals cannot test for a real arm's error, the result says so
(``"model_error_untested"``) and its covariance carries the absorbed part of a field of the
robot's accuracy.

The constants were chosen on UR5e worlds with DH errors (planned, boxed, facing and free
wrist stations) and the simulator's realistic arms, and measured on held-out arms of other
geometry and seeds (``tests/test_honest_uncertainty.py``, ADR 0004 for the figures).

Every per-station quantity goes through workspace buffers in chunks of :data:`CHUNK`
stations, so a warmed-up solve allocates nothing that grows with N.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import numpy as np

from cellcal.solver import _stats
from cellcal.solver.workspace import Workspace

__all__ = [
    "SHOULDER_HEIGHT_M",
    "LINK_LENGTH_M",
    "ROUGH_LENGTH_M",
    "ISO_SHARE",
    "DEFAULT_ROBOT_ACCURACY_M",
    "DETECTION_POWER",
    "MIN_TESTED_DOF",
    "BLIND_ANISOTROPY",
    "MISSED_FIELD_FACTOR",
    "noise_anisotropy",
    "FieldTerms",
    "FieldFit",
    "field_terms",
    "fit_field",
    "field_covariance",
    "robot_term",
]

#: Height of the surrogate shoulder above the base origin, m (UR5e 0.16 m, a 6R arm with a
#: spherical wrist about 0.5 m; the estimate is insensitive within that range).
SHOULDER_HEIGHT_M = 0.25
#: 1-sigma translation per radian of rotation in a link's error twist: length errors of
#: 0.1-0.5 mm against angle errors of 0.01-0.05 deg.
LINK_LENGTH_M = 0.4
#: The same for the rough (per-station) part, about the flange point.
ROUGH_LENGTH_M = 0.4
#: Share of the widening spread isotropically (module docstring).
ISO_SHARE = 0.1
#: A robot's accuracy when none is declared: RMS distance (3-D) between where the controller
#: says the flange is and where it is, over the workspace. A factory-calibrated cobot or a
#: mid-size industrial arm is at 0.5-1.5 mm; 1 mm is the middle.
DEFAULT_ROBOT_ACCURACY_M = 1.0e-3
#: Standard errors of its REML estimate added to each variance component (module docstring).
UNCERTAINTY_SIGMAS = 1.0
#: The residuals test for a real arm's model error when they would find one of this fraction
#: of the robot's accuracy (at :data:`DETECTION_POWER`): an arm's error varies from arm to
#: arm, and one half the stated accuracy, undetected, still biases the answer by several of
#: its noise-only sigmas (a realistic arm at 10 stations: 0.98 mm detectable, NEES 72).
TESTED_FRACTION = 0.5
#: Fewest residual degrees of freedom at which a test that did not fire counts as a test when
#: the instrument's noise is strongly anisotropic (:data:`BLIND_ANISOTROPY`). The detectable
#: size is the power of the matched test against the surrogate field; when the noise is far
#: smaller across one direction than along another, an arm's error shows in few residual
#: directions and the power rests on the field's assumed shape, not on the data. Measured (ADR
#: 0004, amendment 2026-12-07): points under a total station's beam noise (1 mm along the line
#: of sight, 15 um across) at 5 and 6 stations (6 and 9 degrees of freedom) let 0.2-0.7 mm
#: base-frame errors through with a detectable size of 0.11 mm and NEES 300-2,300, no warning;
#: from 8 stations (15) none.
MIN_TESTED_DOF = 12.0
#: Ratio of a station's largest to smallest translation noise sigma above which the noise
#: counts as strongly anisotropic: a total station is at 67 (1 mm / 15 um); a laser tracker's
#: beam model at 2.5 m at 2.4-2.7 (what the test misses there is not the anisotropy's doing:
#: :data:`MISSED_FIELD_FACTOR`).
BLIND_ANISOTROPY = 4.0
#: Below :data:`MIN_TESTED_DOF`, a test that did not fire (and counted) leaves in the covariance
#: the absorbed part of a field this many times its detectable size: its power is computed for
#: the field's assumed shape, and an arm's error of another shape can hide behind few degrees
#: of freedom. Measured (ADR 0004, amendment 2026-12-07 b): points under 1.3-2.7x anisotropic
#: noise at 5-6 stations on accurate arms, 1-5 of 80 beyond the 99.9 % bound without a warning
#: (NEES to 1,300) before; at 1.0x the detectable size 2 of 80 still beyond (NEES 29-33); at
#: 1.5x none.
MISSED_FIELD_FACTOR = 1.5
#: Power at which the smallest detectable model error is quoted.
DETECTION_POWER = 0.9
#: Stations per chunk of the per-station passes (bounded scratch); the REML passes sum chunk
#: by chunk in this order (the pinned figures' rounding).
CHUNK = 64
#: Chunks per block of :func:`field_terms`' per-station algebra: each station's products are
#: its own, so they are formed for a block at once (a few hundred numpy calls of fixed cost
#: per block instead of per chunk), and its sums are one product per block too (their order
#: moved the figures by ~1e-16 relative, far inside tests/test_solver_pinned.py's 1e-12).
_BLOCK_CHUNKS = 4
#: Fisher-scoring iterations of the variance components.
_REML_ITERATIONS = 30
#: Arm columns (3 link frames x 6) and isotropic columns (2 rigid twists + 3 pose-linear, x 6).
_M_ARM = 18
_M_ISO = 30


@dataclass
class FieldTerms:
    """Internal: the field's second-moment sums over the stations (one chunked pass).

    Columns are normalised so that a unit variance component is a field whose mean squared
    flange position error (3-D) over the stations is 1 m^2: a component's value is then
    the squared RMS position error it implies.
    """

    p: int
    nu: float  # residual degrees of freedom of the fit
    yy: float  # squared whitened residual
    Q: np.ndarray  # (p, 18) X^T Z (arm)
    Szz: np.ndarray  # (18, 18) Z^T Z
    zy: np.ndarray  # (18,) Z^T y
    Xw: np.ndarray  # (p, p) sum X_i^T W_i X_i (rough part)
    Xw2: np.ndarray  # (p, p) sum X_i^T W_i^2 X_i
    XwZ: np.ndarray  # (p, 18) sum X_i^T W_i Z_i
    Zw: np.ndarray  # (18, 18) sum Z_i^T W_i Z_i
    trW: float
    trW2: float
    ywy: float  # sum y_i^T W_i y_i
    Qi: np.ndarray  # (p, 30) X^T Z_iso
    trZi: float  # |Z_iso|^2
    rot2: tuple[float, float]  # mean squared rotation (rad^2) per unit of the arm and rough parts
    Hinv: np.ndarray

    # --- traces of R C and R C R C (R = I - X H^-1 X^T) for C_s = Z Z^T and C_w = W ---

    def trace_rs(self) -> float:
        return float(np.trace(self.Szz) - np.vdot(self.Q, self.Hinv @ self.Q))

    def trace_rw(self) -> float:
        return float(self.trW - np.vdot(self.Hinv, self.Xw))

    def trace_rsrs(self) -> float:
        M = self.Szz - self.Q.T @ self.Hinv @ self.Q
        return float(np.vdot(M, M))

    def trace_rwrw(self) -> float:
        A = self.Hinv @ self.Xw
        return float(self.trW2 - 2.0 * np.vdot(self.Hinv, self.Xw2) + np.vdot(A, A.T))

    def trace_rsrw(self) -> float:
        HQ = self.Hinv @ self.Q
        return float(np.trace(self.Zw) - 2.0 * np.vdot(HQ, self.XwZ) + np.vdot(HQ, self.Xw @ HQ))

    def trace_riso(self) -> float:
        return float(self.trZi - np.vdot(self.Qi, self.Hinv @ self.Qi))


def _rz_columns(az_c: np.ndarray, az_s: np.ndarray, out: np.ndarray) -> None:
    """Rotations about z by the angles with cosines ``az_c`` and sines ``az_s`` into ``out``."""
    out.fill(0.0)
    out[:, 0, 0] = az_c
    out[:, 1, 0] = az_s
    out[:, 0, 1] = -az_s
    out[:, 1, 1] = az_c
    out[:, 2, 2] = 1.0


def _hat_into(v: np.ndarray, out: np.ndarray) -> None:
    out.fill(0.0)
    out[:, 0, 1] = -v[:, 2]
    out[:, 0, 2] = v[:, 1]
    out[:, 1, 0] = v[:, 2]
    out[:, 1, 2] = -v[:, 0]
    out[:, 2, 0] = -v[:, 1]
    out[:, 2, 1] = v[:, 0]


class _Scratch:
    """Fixed-size per-chunk scratch (allocated once per workspace and residual shape, not per
    station); every array a matrix product writes is contiguous, so the sums over a chunk are
    single BLAS products of its (c * rows, k) views."""

    def __init__(self, rows: int, p: int) -> None:
        c = CHUNK * _BLOCK_CHUNKS
        # One anonymous mapping (zero-filled) for all of it, as a transient workspace has: about
        # 1 MB, freed back to the system with the workspace. From the heap, the blocks freed
        # between results a caller keeps stayed resident (bench/solver_resident_bench.py).
        per_station = 4 * 9 + 3 + 6 + 6 * _M_ARM + 36 + rows * (
            2 * _M_ARM + 6 + rows + p + 6 + 1 + 6 + 12) + 6 * p + 4
        block = np.frombuffer(mmap.mmap(-1, 8 * c * per_station), dtype=np.float64)
        at = 0

        def take(*shape: int) -> np.ndarray:
            nonlocal at
            size = math.prod(shape)
            at += size
            return block[at - size:at].reshape(shape)

        self.R1, self.R2, self.Ry, self.H = take(c, 3, 3), take(c, 3, 3), take(c, 3, 3), take(c, 3, 3)
        self.o, self.s = take(c, 3), take(c, 6)
        self.A, self.Aw = take(c, 6, _M_ARM), take(c, 6, 6)
        self.Z, self.Bw = take(c, rows, _M_ARM), take(c, rows, 6)
        self.W, self.WX, self.WZ = take(c, rows, rows), take(c, rows, p), take(c, rows, _M_ARM)
        self.JR, self.yv = take(c, rows, 6), take(c, rows)
        # (J_R A_w)^T contiguous (a product with a transposed view runs at half speed); the
        # isotropic part's X_i^T J_R, J_R C, J_R B and its station weights [1, f_i].
        self.BwT, self.P = take(c, 6, rows), take(c, p, 6)
        self.JC, self.JB, self.F4 = take(c, rows, 6), take(c, rows, 6), take(4, c)
        assert at == block.size
        # Accumulators of the sums over the stations and their per-chunk parts.
        shapes = dict(Q=(p, _M_ARM), Szz=(_M_ARM, _M_ARM), zy=(_M_ARM,), xy=(p,), Xw=(p, p), Xw2=(p, p),
                      XwZ=(p, _M_ARM), Zw=(_M_ARM, _M_ARM), Ki=(4, 6 * p))
        self.acc = {k: np.zeros(v) for k, v in shapes.items()}
        self.part = {k: np.zeros(v) for k, v in shapes.items()}


def _scratch(ws: Workspace, rows: int = 6, p: int = 12) -> _Scratch:
    cache = getattr(ws, "_field_scratch", None)
    if cache is None:
        cache = {}
        ws._field_scratch = cache  # type: ignore[attr-defined]
    s = cache.get((rows, p))
    if s is None:
        s = cache[(rows, p)] = _Scratch(rows, p)
    return s


def _arm_columns(p: np.ndarray, S: _Scratch, c: int) -> np.ndarray:
    """Unscaled arm columns (c, 6, 18) of stations at flange positions ``p`` (c, 3)."""
    A = S.A[:c, :, :_M_ARM]
    A.fill(0.0)
    r = S.s[:c, 0]
    np.hypot(p[:, 0], p[:, 1], out=r)
    np.maximum(r, 1e-9, out=r)
    cz, sz = S.s[:c, 1], S.s[:c, 2]
    np.divide(p[:, 0], r, out=cz)
    np.divide(p[:, 1], r, out=sz)
    R1 = S.R1[:c]
    _rz_columns(cz, sz, R1)
    # Elevation of the shoulder -> flange line in the azimuth plane.
    dz = S.s[:c, 3]
    np.subtract(p[:, 2], SHOULDER_HEIGHT_M, out=dz)
    ln = S.s[:c, 4]
    np.hypot(r, dz, out=ln)
    np.maximum(ln, 1e-9, out=ln)
    el = S.s[:c, 1:3]  # cos, sin of the elevation (the azimuth's are in R1 already)
    np.divide(r, ln, out=el[:, 0])
    np.divide(dz, ln, out=el[:, 1])
    Ry = S.Ry[:c]
    Ry.fill(0.0)
    Ry[:, 0, 0] = el[:, 0]
    Ry[:, 2, 2] = el[:, 0]
    Ry[:, 0, 2] = -el[:, 1]
    Ry[:, 2, 0] = el[:, 1]
    Ry[:, 1, 1] = 1.0
    R2 = S.R2[:c]
    np.matmul(R1, Ry, out=R2)
    # Blocks [l R, hat(o) R; 0, R]: F_1 and F_2 at the shoulder o = (0, 0, h), where hat(o) R
    # is two scaled rows of R; the elbow F_3 (R_2 again) half-way to the flange.
    for k, R in ((0, R1), (1, R2)):
        cols = A[:, :, 6 * k : 6 * k + 6]
        np.multiply(R, LINK_LENGTH_M, out=cols[:, 0:3, 0:3])  # V^1/2: translation 1-sigma per radian
        np.copyto(cols[:, 3:6, 3:6], R)
        np.multiply(R[:, 1, :], -SHOULDER_HEIGHT_M, out=cols[:, 0, 3:6])  # rho_0 = o x phi
        np.multiply(R[:, 0, :], SHOULDER_HEIGHT_M, out=cols[:, 1, 3:6])
    cols = A[:, :, 12:18]
    np.multiply(R2, LINK_LENGTH_M, out=cols[:, 0:3, 0:3])  # from R2: a copy within A would buffer
    np.copyto(cols[:, 3:6, 3:6], R2)
    o = S.o[:c]
    np.copyto(o, p)
    o[:, 2] += SHOULDER_HEIGHT_M
    np.multiply(o, 0.5, out=o)
    Hm = S.H[:c]
    _hat_into(o, Hm)
    np.matmul(Hm, R2, out=cols[:, 0:3, 3:6])
    return A


def _rough_columns(p: np.ndarray, S: _Scratch, c: int) -> np.ndarray:
    """Unscaled rough-part square roots (c, 6, 6): a twist about the flange point."""
    A = S.Aw[:c]
    A.fill(0.0)
    for i in range(3):
        A[:, i, i] = ROUGH_LENGTH_M
        A[:, 3 + i, 3 + i] = 1.0
    _hat_into(p, S.H[:c])
    np.copyto(A[:, 0:3, 3:6], S.H[:c])  # rho_0 = rho + p x phi
    return A


def _iso_blocks(cen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The isotropic field's constant 6x6 blocks: a twist at the origin and about ``cen``."""
    base = np.zeros((6, 6))
    for i in range(3):
        base[i, i] = LINK_LENGTH_M
        base[3 + i, 3 + i] = 1.0
    adc = base.copy()
    adc[0:3, 3:6] = np.array([[0.0, -cen[2], cen[1]], [cen[2], 0.0, -cen[0]], [-cen[1], cen[0], 0.0]])
    return base, adc


def _column_energy(p: np.ndarray) -> tuple[float, float, float]:
    """``(sum |p_i|^2, arm, rough)``: the flange position error summed over stations at ``p``
    (c, 3) of the unscaled arm columns (:func:`_arm_columns`) and rough columns
    (:func:`_rough_columns`), in closed form. A block ``[l R, hat(o) R; 0, R]`` (a twist about
    ``o``, ``R`` a rotation) moves the flange point ``p`` by ``|[I, -hat(p)] M|_F^2 = 3 l^2 +
    2 |p - o|^2`` and turns it by ``|R|_F^2 = 3`` (so a station's rotation energy is 9 for
    the arm, 3 for the rough part). The arm's frames sit at the shoulder ``s`` (twice) and
    half-way to ``p``; the rough block at ``p``."""
    c = p.shape[0]
    sp2 = float(np.einsum("ij,ij->", p, p))
    sps = sp2 - 2.0 * SHOULDER_HEIGHT_M * float(p[:, 2].sum()) + c * SHOULDER_HEIGHT_M ** 2  # sum |p - s|^2
    return sp2, 9.0 * LINK_LENGTH_M ** 2 * c + 4.5 * sps, 3.0 * ROUGH_LENGTH_M ** 2 * c


def _robot_jacobian(Jw: np.ndarray, a_cols: slice, robot_map: np.ndarray | None, S: _Scratch,
                    lo: int, hi: int) -> np.ndarray:
    """Whitened Jacobian of the residual with respect to a left twist of ``base_T_flange``."""
    out = S.JR[: hi - lo]
    if robot_map is None:
        np.copyto(out, Jw[lo:hi, :, a_cols])
    else:
        np.matmul(Jw[lo:hi, :, a_cols], robot_map, out=out)
    return out


def field_terms(model, n: int, ws: Workspace, Hinv: np.ndarray, *, flange_p: np.ndarray, a_cols: slice,
                robot_map: np.ndarray | None = None, dof: float | None = None) -> FieldTerms:
    """One chunked pass over the stations: the sums the field test, REML and the widening need.

    Parameters
    ----------
    model
        The fitted model; its workspace buffers hold the whitened Jacobian and residual.
    flange_p : numpy.ndarray, shape (N, 3)
        Flange positions in the robot base frame (the field's features).
    a_cols : slice
        Jacobian columns of the unknown a base-frame twist of the flange moves.
    robot_map : numpy.ndarray, shape (6, 6), optional
        Maps a base-frame twist of the flange to those columns' twist (hand-eye, where the
        robot's error enters the target's side); identity when None.
    """
    Jw, _, ewh = model.views()
    rows, p = model.rows, model.nparam
    S = _scratch(ws, rows, p)
    acc, part = S.acc, S.part
    for v in acc.values():
        v.fill(0.0)

    def add(key: str, a: np.ndarray, b: np.ndarray) -> None:
        # sum_i a_i^T b_i over the chunk: one product of the contiguous (c * rows, k) views
        c = a.shape[0]
        a2 = a.reshape(c * a.shape[1], -1)
        b2 = b.reshape(c * b.shape[1], -1) if b.ndim == 3 else b.reshape(c * b.shape[1])
        np.matmul(a2.T, b2, out=part[key])
        np.add(acc[key], part[key], out=acc[key])

    trW = trW2 = ywy = trZi = 0.0
    ms_arm = ms_w = ms_iso = 0.0
    cen = np.zeros(3)
    np.copyto(ws.v3a[:n], flange_p)  # contiguous: a reduction over a strided view copies it
    np.einsum("ij->j", ws.v3a[:n], out=cen)
    cen /= n
    d = ws.s1[:n]
    np.subtract(ws.v3a[:n], cen, out=ws.v3a[:n])
    np.einsum("ij,ij->i", ws.v3a[:n], ws.v3a[:n], out=d)
    L = math.sqrt(float(d.sum()) / n)
    L = L if L > 1e-9 else 1.0
    base, adc = _iso_blocks(cen)
    h2 = 0.5  # each rigid twist of the isotropic field carries half the weight
    block = CHUNK * _BLOCK_CHUNKS
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        c = hi - lo
        pc = flange_p[lo:hi]
        JR = _robot_jacobian(Jw, a_cols, robot_map, S, lo, hi)
        sp2, e_arm, e_w = _column_energy(pc)
        ms_arm += e_arm
        ms_w += e_w
        # Arm part.
        A = _arm_columns(pc, S, c)
        Z = S.Z[:c]
        np.matmul(JR, A, out=Z)
        # Rough part: W_i = (J_R A_w)(J_R A_w)^T.
        Aw = _rough_columns(pc, S, c)
        Bw = S.Bw[:c]
        np.matmul(JR, Aw, out=Bw)
        W = S.W[:c]
        BwT = S.BwT[:c]
        np.copyto(BwT, Bw.transpose(0, 2, 1))
        np.matmul(Bw, BwT, out=W)
        WX = S.WX[:c]
        np.matmul(W, Jw[lo:hi], out=WX)
        WZ = S.WZ[:c]
        np.matmul(W, Z, out=WZ)
        yv = S.yv[:c]
        np.matmul(W, ewh[lo:hi, :, None], out=yv[:, :, None])
        # Sums over the block: one product each of the contiguous (c * rows, k) views.
        X = Jw[lo:hi]
        y = ewh[lo:hi]
        add("Q", X, Z)
        add("Szz", Z, Z)
        add("zy", Z, y)
        add("xy", X, y)
        add("Xw", X, WX)
        add("Xw2", WX, WX)
        add("XwZ", WX, Z)
        add("Zw", Z, WZ)
        trW += float(np.einsum("nii->", W))
        trW2 += float(np.einsum("nij,nij->", W, W))
        ywy += float(np.einsum("ni,ni->", y, yv))
        # Isotropic part (its absorbed share and energy only). Its columns are constant 6x6
        # blocks (_iso_blocks) scaled per station, A_i = [h C, h B, f_i0 C, f_i1 C, f_i2 C]
        # (f_i the centred position / L), so X^T J_R A sums to [sum_i P_i, sum_i f_i P_i]
        # (P_i = X_i^T J_R) times the blocks, and |J_R A_i|^2 = (h^2 + |f_i|^2) |J_R C|^2 +
        # h^2 |J_R B|^2: no (c, 6, 30) column array, no product with it.
        F4 = S.F4[:, :c]
        F4[0] = 1.0
        f = F4[1:4].T
        np.subtract(pc, cen, out=f)
        np.multiply(f, 1.0 / L, out=f)
        ff = S.s[:c, 4]
        np.einsum("ij,ij->i", f, f, out=ff)
        wv = S.s[:c, 3]
        np.add(ff, h2, out=wv)
        P = S.P[:c]
        np.matmul(X.transpose(0, 2, 1), JR, out=P)
        np.matmul(F4, P.reshape(c, 6 * p), out=part["Ki"])
        np.add(acc["Ki"], part["Ki"], out=acc["Ki"])
        JR2 = JR.reshape(c * rows, 6)
        JC, JB = S.JC[:c], S.JB[:c]
        np.matmul(JR2, adc, out=JC.reshape(c * rows, 6))
        np.matmul(JR2, base, out=JB.reshape(c * rows, 6))
        nv = S.s[:c, 5]
        np.einsum("nij,nij->n", JC, JC, out=nv)
        trZi += float(wv @ nv) + h2 * float(np.einsum("nij,nij->", JB, JB))
        # Flange position error of the blocks: |[I, -hat(p)] C|^2 = 3 l^2 + 2 |p - cen|^2 and
        # |[I, -hat(p)] B|^2 = 3 l^2 + 2 |p|^2 (l the link length), |p - cen|^2 = L^2 |f|^2.
        sf, sff = float(ff.sum()), float(ff @ ff)
        l2 = 3.0 * LINK_LENGTH_M ** 2
        ms_iso += (l2 * (h2 * c + sf) + 2.0 * L * L * (h2 * sf + sff)
                   + h2 * (l2 * c + 2.0 * sp2))
    # Normalise: a unit component is a field of 1 m^2 mean squared flange error.
    ka, kw, ki = n / ms_arm, n / ms_w, n / ms_iso
    sa = math.sqrt(ka)
    Q, Szz, zy, Xw, Xw2, XwZ, Zw = (acc[k] for k in ("Q", "Szz", "zy", "Xw", "Xw2", "XwZ", "Zw"))
    Q *= sa
    Szz *= ka
    zy *= sa
    Xw *= kw
    Xw2 *= kw * kw
    XwZ *= kw * sa
    Zw *= kw * ka
    Ki = acc["Ki"].reshape(4, p, 6)
    hk = math.sqrt(h2)
    Qi = np.concatenate([hk * (Ki[0] @ adc), hk * (Ki[0] @ base)] + [Ki[1 + a] @ adc for a in range(3)], axis=1)
    Qi *= math.sqrt(ki)
    # The residual's part outside the fit's span: at a linear (not least-squares) answer the
    # residual is not orthogonal to the Jacobian, and what the fit could still take must not
    # read as a field.
    xy = acc["xy"]
    hxy = Hinv @ xy
    zy -= Q.T @ hxy
    yy = float(np.vdot(ewh, ewh)) - float(xy @ hxy)
    nu = float(dof) if dof is not None else float(rows * n - p)
    return FieldTerms(p=p, nu=nu, yy=yy, Q=Q, Szz=Szz, zy=zy, Xw=Xw, Xw2=Xw2, XwZ=XwZ, Zw=Zw,
                      trW=trW * kw, trW2=trW2 * kw * kw, ywy=ywy * kw, Qi=Qi, trZi=trZi * ki,
                      rot2=(9.0 * ka, 3.0 * kw), Hinv=Hinv)


# --- the matched test and its power ---------------------------------------------------------


def _pearson(lam: np.ndarray, th: float = 0.0) -> tuple[float, float, float]:
    """``(c1, c2, h)`` of ``sum_j lam_j (1 + th lam_j) chi2_1``: its mean, variance / 2 and
    Pearson's degrees of freedom ``h = c2^3 / c3^2`` (the central chi-square matching its
    first three cumulants: close in the upper tail, where a test's level lives)."""
    w = lam * (1.0 + th * lam)
    c1, c2, c3 = float(w.sum()), float((w * w).sum()), float((w * w * w).sum())
    return c1, c2, c2 ** 3 / c3 ** 2 if c3 > 0.0 else 1.0


def _structured_eigenvalues(t: FieldTerms) -> np.ndarray:
    """Non-zero eigenvalues of ``R Z Z^T R``: those of ``Z^T R Z`` (18 x 18); computed once
    per :class:`FieldTerms` (the field test and the detectable size both need them)."""
    lam = getattr(t, "_lam", None)
    if lam is None:
        M = t.Szz - t.Q.T @ t.Hinv @ t.Q
        lam = np.linalg.eigvalsh(0.5 * (M + M.T))
        lam = lam[lam > 1e-12 * max(float(lam[-1]), 1e-300)]
        t._lam = lam  # type: ignore[attr-defined]
    return lam


def field_test(t: FieldTerms, declared: bool) -> tuple[float, float, tuple[float, float]]:
    """The score test of "no structured field": ``(statistic, p, (h, d2))``.

    ``T = |Z^T e|^2`` (``Z`` the structured columns) is, under noise alone, ``sum_j lam_j
    chi2_1`` with ``lam`` the eigenvalues of ``Z^T R Z``: exactly known, compared by
    Pearson's three-moment chi-square. With the noise estimated the whitening already
    divides by the estimate, and the standardised statistic is compared with ``F(h, nu)``.
    The rough part is not in the test: it is white across stations, which the chi-square
    test sees with declared noise and nothing can tell from noise without.
    """
    lam = _structured_eigenvalues(t)
    if lam.size == 0:
        return math.nan, math.nan, (0.0, 0.0)
    c1, c2, h = _pearson(lam)
    T = float(np.vdot(t.zy, t.zy))
    if not declared:
        T /= max(t.yy / t.nu, 1e-300)
    x = h + (T - c1) * math.sqrt(h / c2)
    if declared:
        return x, _stats.chi2_sf(max(x, 0.0), h), (h, 0.0)
    d2 = max(t.nu - h, 1.0)
    return x / h, _stats.f_sf(max(x / h, 0.0), h, d2), (h, d2)


#: A power within this of :data:`DETECTION_POWER` at a bisection step of
#: :func:`detectable_size` sends it down the array path (the moments' rounding differs from
#: it by ~1e-15, so only such a step could decide otherwise there).
_POWER_GUARD = 1e-11


def detectable_size(t: FieldTerms, declared: bool, alpha: float) -> float:
    """Smallest field (RMS flange position error, m) the matched test finds with
    :data:`DETECTION_POWER` at level ``alpha``: under a structured field of variance
    ``th`` the statistic is ``sum_j lam_j (1 + th lam_j) chi2_1``; its power by the same
    three-moment approximation, solved for ``th`` by bisection. The rough part is counted
    as the structured part's own share of the accuracy (half).

    The cumulants are polynomials in ``th`` of the moments ``sum lam^k`` (k <= 6), taken
    once: each bisection step is a handful of float operations and one chi-square tail.
    Their rounding differs from the array sums' by ~1e-15 relative, which can change a
    step's decision only at a power within that of the target: a step within
    :data:`_POWER_GUARD` of it reruns the search on the array sums (the pinned path). Its
    decisions are replayed from the root (``_stats.replayed_size_bisection``): ~15 tails.
    """
    lam = _structured_eigenvalues(t)
    if lam.size == 0:
        return math.inf
    l2 = lam * lam
    l3 = l2 * lam
    S1, S2, S3 = float(lam.sum()), float(l2.sum()), float(l3.sum())
    S4, S5, S6 = float((l3 * lam).sum()), float((l3 * l2).sum()), float((l3 * l3).sum())

    def moments(th: float) -> tuple[float, float, float]:
        if th == 0.0:
            return _pearson(lam)  # the test's own figures, exactly
        c1 = S1 + th * S2
        c2 = S2 + th * (2.0 * S3 + th * S4)
        c3 = S3 + th * (3.0 * S4 + th * (3.0 * S5 + th * S6))
        return c1, c2, c2 ** 3 / c3 ** 2 if c3 > 0.0 else 1.0

    out = _detectable_search(t, declared, alpha, lam, moments)
    if out is None:
        out = _detectable_search(t, declared, alpha, lam, lambda th: _pearson(lam, th), guard=False)
        assert out is not None
    return out


def _detectable_search(t: FieldTerms, declared: bool, alpha: float, lam: np.ndarray, moments,
                       guard: bool = True) -> float | None:
    """The bisection of :func:`detectable_size` with the cumulants from ``moments(th)``
    (None, with ``guard``: a step's power fell within :data:`_POWER_GUARD` of the target)."""
    c1, c2, h = moments(0.0)
    d2 = max(t.nu - h, 1.0)
    if declared or d2 >= 50.0:
        # F(h, d2) -> chi2_h / h: within 2 % of the quantile from 50 degrees of freedom on,
        # and the incomplete beta's continued fraction is slow there.
        xc = _stats.chi2_ppf(1.0 - alpha, h)
    else:
        xc = h * _stats.f_ppf(1.0 - alpha, h, d2)
    Tc = c1 + (xc - h) * math.sqrt(c2 / h)  # critical value of T
    target = DETECTION_POWER

    def power(th: float) -> float:
        a1, a2, ha = moments(th)
        return _stats.chi2_sf(max(ha + (Tc - a1) * math.sqrt(ha / a2), 0.0), ha)

    p0 = power(0.0)
    close = guard and abs(p0 - target) < _POWER_GUARD
    if not p0 < target:
        return None if close else 0.0
    bracket = _stats.replayed_size_bisection(power, target, _POWER_GUARD) if guard and not close else None
    if bracket is None:
        seen = [close]

        def below(th: float) -> bool:  # power(th) < DETECTION_POWER
            pw = power(th)
            if guard and abs(pw - target) < _POWER_GUARD:
                seen[0] = True
            return pw < target

        bracket = _stats.size_bisection(below)
        if seen[0]:
            return None
    if bracket is None:
        return math.inf
    hi = bracket[1]
    # th is the structured part's variance; the robot's error is twice it (half rough).
    best = math.sqrt(2.0 * hi)
    if declared and t.nu > 0.0:
        best = min(best, _chi2_detectable(t, alpha))
    return best


def _chi2_detectable(t: FieldTerms, alpha: float) -> float:
    """The same for the chi-square test against declared noise (it sees the whole field, the
    rough part too): the residual energy of a field of variance ``th`` split evenly between
    the parts is ``nu + th m`` on average, ``m = (tr(R Z Z^T) + tr(R W)) / 2``; its power by
    the normal approximation of that (non-central) chi-square."""
    m = 0.5 * (t.trace_rs() + t.trace_rw())
    if not m > 0.0:
        return math.inf
    nu = t.nu
    crit = _stats.chi2_ppf(1.0 - alpha, nu)
    z = 1.2815515655446004  # DETECTION_POWER = 0.9
    # nu + lam - z sqrt(2 nu + 4 lam) = crit, lam = th m
    lo, hi = 0.0, max(crit, 1.0)
    while hi - z * math.sqrt(2.0 * nu + 4.0 * hi) + nu < crit:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if nu + mid - z * math.sqrt(2.0 * nu + 4.0 * mid) < crit:
            lo = mid
        else:
            hi = mid
    return math.sqrt(hi / m)


# --- REML and the widening ------------------------------------------------------------------


@dataclass
class FieldFit:
    """Internal: the fitted field (variance components in m^2 of RMS flange error)."""

    structured: float
    rough: float
    noise_factor: float  # REML's factor on the noise variance (1 with declared noise)
    excess: float  # residual energy above the noise the field was allowed to explain
    iterations: int


def fit_field(model, n: int, ws: Workspace, t: FieldTerms, *, flange_p: np.ndarray, a_cols: slice,
              robot_map: np.ndarray | None, declared: bool) -> FieldFit:
    """REML estimate of the structured and rough components (and, with estimated noise, of
    the noise's factor) from the fit's whitened residual; module docstring.

    The likelihood is evaluated in each station's eigenbasis of its rough block, where the
    covariance is diagonal plus the rank-18 structured part, so the restricted projector is
    ``P = W - W U SKS U^T W`` (``U`` the structured columns and the fit's Jacobian, ``W``
    diagonal, ``SKS`` a q x q matrix, ``q = 18 + parameters``): every iteration costs a few
    ``U^T diag(v) U`` sums over the stations, through workspace buffers.
    """
    Jw, _, ewh = model.views()
    rows, p = model.rows, model.nparam
    S = _scratch(ws, rows, p)
    m = _M_ARM
    q = m + p
    N = n * rows
    Ut = ws.fU[: N * q].reshape(n, rows, q)
    lam = ws.fL[:N].reshape(n, rows)
    yt = ws.fY[:N].reshape(n, rows)
    ms_arm = ms_w = 0.0
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        c = hi - lo
        pc = flange_p[lo:hi]
        JR = _robot_jacobian(Jw, a_cols, robot_map, S, lo, hi)
        A = _arm_columns(pc, S, c)
        _, e_arm, e_w = _column_energy(pc)
        ms_arm += e_arm
        ms_w += e_w
        Z = S.Z[:c]
        np.matmul(JR, A, out=Z)
        Aw = _rough_columns(pc, S, c)
        Bw = S.Bw[:c]
        np.matmul(JR, Aw, out=Bw)
        W = S.W[:c]
        np.matmul(Bw, Bw.transpose(0, 2, 1), out=W)
        ev, V = np.linalg.eigh(W)  # one chunk: bounded
        lam[lo:hi] = ev
        VT = V.transpose(0, 2, 1)
        np.matmul(VT, Z, out=Ut[lo:hi, :, :m])
        np.matmul(VT, Jw[lo:hi], out=Ut[lo:hi, :, m:])
        np.matmul(VT, ewh[lo:hi, :, None], out=yt[lo:hi, :, None])
    np.multiply(Ut[:, :, :m], math.sqrt(n / ms_arm), out=Ut[:, :, :m])
    np.multiply(lam, n / ms_w, out=lam)
    U2 = Ut.reshape(N, q)
    y2 = yt.reshape(N)
    l2 = lam.reshape(N)
    wv, va, vb = ws.fW[:N], ws.fV[:N], ws.fX[:N]
    TU = ws.fT[: N * q].reshape(N, q)

    def gram(v: np.ndarray) -> np.ndarray:
        np.multiply(U2, v[:, None], out=TU)
        return U2.T @ TU

    nu = t.nu
    trs, trw = max(t.trace_rs(), 1e-300), max(t.trace_rw(), 1e-300)
    E0 = t.yy - (nu if declared else 0.5 * nu)
    E0 = max(E0, 1e-12 * max(t.yy, 1e-300))
    th = [0.5 * E0 / trs, 0.5 * E0 / trw, 1.0]  # structured, rough, noise factor
    comps = ("s", "w") if declared else ("s", "w", "n")
    k = len(comps)
    iterations = 0
    Finv = np.full((k, k), np.nan)
    for _ in range(_REML_ITERATIONS):
        iterations += 1
        ts, tw, s2 = th
        np.multiply(l2, tw, out=va)
        np.add(va, s2, out=va)
        np.reciprocal(va, out=wv)  # w = 1 / (s2 + tw lam)
        Gw = gram(wv)
        sc = np.ones(q)
        sc[:m] = math.sqrt(max(ts, 0.0))
        Ms = sc[:, None] * Gw * sc[None, :]
        Ms[:m, :m] += np.eye(m)
        try:
            K = np.linalg.inv(Ms)
        except np.linalg.LinAlgError:
            break
        SKS = sc[:, None] * K * sc[None, :]
        T = np.eye(q) - SKS @ Gw  # P U = W U T
        np.multiply(wv, y2, out=va)
        b = U2.T @ va
        Ur = b - Gw @ (SKS @ b)  # U^T P y
        np.matmul(U2, SKS @ b, out=va)
        np.subtract(y2, va, out=va)
        np.multiply(va, wv, out=va)  # P y
        # Diagonal components: the rough part (gamma = lam) and the noise (gamma = 1).
        np.multiply(wv, wv, out=vb)  # w^2
        G2: dict[str, np.ndarray] = {}
        np.multiply(vb, l2, out=ws.fZ[:N])
        G2["w"] = gram(ws.fZ[:N])
        if not declared:
            G2["n"] = gram(vb)
        score = np.zeros(k)
        F = np.zeros((k, k))
        for a_, cname in enumerate(comps):
            if cname == "s":
                quad = float(np.vdot(Ur[:m], Ur[:m]))
                trpc = float(np.trace(Gw[:m, :m] - (Gw @ SKS @ Gw)[:m, :m]))
            elif cname == "w":
                np.multiply(va, va, out=vb)
                quad = float(np.vdot(vb, l2))
                np.multiply(wv, wv, out=vb)
                trpc = float(np.vdot(wv, l2)) - float(np.vdot(SKS, G2["w"]))
            else:
                quad = float(np.vdot(va, va))
                trpc = float(wv.sum()) - float(np.vdot(SKS, G2["n"]))
            score[a_] = 0.5 * (quad - trpc)
        GwT = Gw @ T
        for a_, ca in enumerate(comps):
            for b_, cb in enumerate(comps):
                if b_ < a_:
                    F[a_, b_] = F[b_, a_]
                    continue
                if ca == "s" and cb == "s":
                    Mzz = GwT[:m, :m]
                    val = float(np.vdot(Mzz, Mzz.T))
                elif ca == "s" or cb == "s":
                    other = cb if ca == "s" else ca
                    val = float(np.trace((T.T @ G2[other] @ T)[:m, :m]))
                else:
                    # tr(P Da P Db) = sum w^2 ga gb - 2 tr(SKS G[w^3 ga gb]) + tr(SKS G[w^2 ga] SKS G[w^2 gb])
                    np.multiply(wv, wv, out=vb)
                    for g_ in (ca, cb):
                        if g_ == "w":
                            np.multiply(vb, l2, out=vb)
                    lead = float(vb.sum())
                    np.multiply(vb, wv, out=vb)
                    G3 = gram(vb)
                    val = lead - 2.0 * float(np.vdot(SKS, G3)) + float(np.vdot(SKS @ G2[ca], (SKS @ G2[cb]).T))
                F[a_, b_] = 0.5 * val
        try:
            step = np.linalg.solve(F, score)
            Finv = np.linalg.inv(F)
        except np.linalg.LinAlgError:
            break
        moved = 0.0
        for a_ in range(k):
            cur = th[a_]
            new = max(cur + float(step[a_]), 1e-9 * max(cur, 1e-300))
            moved = max(moved, abs(new - cur) / max(cur, 1e-300))
            th[a_] = new
        if moved < 1e-3:
            break
    s2 = th[2] if not declared else 1.0
    # With the noise estimated, a rough robot error and the noise are the same to the
    # likelihood (REML may give either the energy): the field may then claim all of it.
    excess = max(t.yy - nu, 0.0) if declared else t.yy
    # The plug-in field is as uncertain as its estimate: each component is taken one REML
    # standard error above it (the inverse Fisher information), which the few degrees of
    # freedom of a small or noise-estimated run make large and a long declared run small.
    se = [math.sqrt(max(float(Finv[a_, a_]), 0.0)) if math.isfinite(float(Finv[a_, a_])) else 0.0 for a_ in range(2)]
    ts = th[0] + UNCERTAINTY_SIGMAS * se[0]
    tw = th[1] + UNCERTAINTY_SIGMAS * se[1]
    # Cap: no component may explain more residual energy than the whole excess.
    return FieldFit(structured=min(ts, excess / trs), rough=min(tw, excess / trw), noise_factor=s2,
                    excess=excess, iterations=iterations)


def field_covariance(t: FieldTerms, structured: float, rough: float, excess: float) -> np.ndarray:
    """The absorbed part (p x p) of a field of the given components, with :data:`ISO_SHARE`
    of it replaced by the isotropic field of the same residual energy."""
    Hinv = t.Hinv
    HQ = Hinv @ t.Q
    C = structured * (HQ @ HQ.T) + rough * (Hinv @ t.Xw @ Hinv)
    tri = t.trace_riso()
    if ISO_SHARE > 0.0 and tri > 0.0 and excess > 0.0:
        HQi = Hinv @ t.Qi
        C = (1.0 - ISO_SHARE) * C + ISO_SHARE * (excess / tri) * (HQi @ HQi.T)
    return 0.5 * (C + C.T)


def robot_term(t: FieldTerms, accuracy_m: float) -> np.ndarray:
    """The absorbed part of a field of the robot's accuracy (RMS flange error), split
    evenly between the structured and rough parts, :data:`ISO_SHARE` isotropic."""
    a2 = accuracy_m * accuracy_m
    Hinv = t.Hinv
    HQ = Hinv @ t.Q
    C = 0.5 * a2 * (HQ @ HQ.T) + 0.5 * a2 * (Hinv @ t.Xw @ Hinv)
    # The isotropic part at the same residual energy as the field.
    vis = 0.5 * a2 * (t.trace_rs() + t.trace_rw())
    tri = t.trace_riso()
    if ISO_SHARE > 0.0 and tri > 0.0 and vis > 0.0:
        HQi = Hinv @ t.Qi
        C = (1.0 - ISO_SHARE) * C + ISO_SHARE * (vis / tri) * (HQi @ HQi.T)
    return 0.5 * (C + C.T)


def noise_anisotropy(cov: np.ndarray | None, n: int) -> float:
    """Largest ratio over the stations of the translation noise's largest to smallest sigma
    (1 without per-station covariances). ``cov`` (N, r, r), translation block first."""
    if cov is None:
        return 1.0
    ev = np.linalg.eigvalsh(np.asarray(cov, dtype=np.float64)[:n, :3, :3])  # few stations only: see caller
    return float(np.sqrt(np.max(ev[:, -1] / np.maximum(ev[:, 0], 1e-300))))


def field_rms(t: FieldTerms, structured: float, rough: float) -> tuple[float, float]:
    """Per-axis RMS flange position (m) and rotation (rad) error of a field."""
    pos = math.sqrt(max(structured + rough, 0.0) / 3.0)
    rot = math.sqrt(max(structured * t.rot2[0] + rough * t.rot2[1], 0.0) / 3.0)
    return pos, rot


# --- motion and pairing signatures ----------------------------------------------------------


def _rot_log(R: np.ndarray, out: np.ndarray) -> None:
    """Rotation vectors (c, 3) of rotations (c, 3, 3) (steps between stations, well below pi)."""
    out[:, 0] = R[:, 2, 1] - R[:, 1, 2]
    out[:, 1] = R[:, 0, 2] - R[:, 2, 0]
    out[:, 2] = R[:, 1, 0] - R[:, 0, 1]
    s = 0.5 * np.sqrt(np.einsum("ij,ij->i", out, out))
    c = 0.5 * (np.einsum("ijj->i", R) - 1.0)
    th = np.arctan2(s, c)
    f = np.where(s > 1e-12, th / np.maximum(2.0 * s, 1e-300), 0.5)
    out *= f[:, None]


def _steps(T: np.ndarray, nb: np.ndarray, out: np.ndarray) -> None:
    """First-order base-frame twists ``xi`` with ``T[nb] ~ Exp(xi) T`` (zero where ``nb < 0``)."""
    c = T.shape[0]
    idx = np.where(nb >= 0, nb, np.arange(c))
    Tn = T[idx]
    Rr = Tn[:, :3, :3] @ T[:, :3, :3].transpose(0, 2, 1)
    _rot_log(Rr, out[:, 3:])
    out[:, :3] = Tn[:, :3, 3] - np.einsum("nij,nj->ni", Rr, T[:, :3, 3])
    out[nb < 0] = 0.0


def signature_tests(model, n: int, ws: Workspace, t: FieldTerms, *, flange_T: np.ndarray, a_cols: slice,
                    robot_map: np.ndarray | None, time_s: np.ndarray | None,
                    speed_m_s: np.ndarray | None) -> dict[str, float]:
    """Do the residuals follow the flange's motion at capture (a robot moving while it was
    measured, or robot and instrument clocks apart)?

    An F-test of nested linear models against the residual left after the fit *and* the
    structured field (a smooth kinematic error must not look like motion): the column
    ``J_R,i s_i u_i`` with ``s_i`` the speed at capture and ``u_i`` the direction of travel
    through the station (from its neighbours in capture order, ``time_s``, else in index
    order). Returns ``{"motion_f", "motion_p", "motion_dt_s"}`` (NaN when it did not run:
    no speeds, or all zero); ``motion_dt_s`` is the fitted lag.

    Allocates O(N) (the station order and steps): it runs only when the caller passes
    capture speeds.
    """
    out = dict(motion_f=math.nan, motion_p=math.nan, motion_dt_s=math.nan)
    if speed_m_s is None or not np.any(np.asarray(speed_m_s, dtype=float) > 0.0):
        return out
    Jw, _, ewh = model.views()
    rows, p = model.rows, model.nparam
    order = np.argsort(np.asarray(time_s, dtype=float), kind="stable") if time_s is not None else np.arange(n)
    rank = np.empty(n, dtype=np.intp)
    rank[order] = np.arange(n)
    nxt = np.full(n, -1, dtype=np.intp)
    prv = np.full(n, -1, dtype=np.intp)
    nxt[order[:-1]] = order[1:]
    prv[order[1:]] = order[:-1]
    cols = []
    xf = np.empty((n, 6))
    xb = np.empty((n, 6))
    _steps(flange_T, nxt, xf)
    _steps(flange_T, prv, xb)
    if speed_m_s is not None:
        s = np.asarray(speed_m_s, dtype=float).reshape(-1)
        if s.shape != (n,) or not np.all(np.isfinite(s)):
            raise ValueError(f"capture_speed_m_s: expected {n} finite speeds, got shape {np.shape(speed_m_s)}")
        d = xf - xb
        ln = np.linalg.norm(d[:, :3], axis=1)
        u = np.where(ln[:, None] > 0, d / np.maximum(ln, 1e-300)[:, None], 0.0)
        cols.append(u * s[:, None])
    k = len(cols)
    JR = Jw[:, :, a_cols] if robot_map is None else Jw[:, :, a_cols] @ robot_map
    C = np.stack([np.einsum("nrj,nj->nr", JR, c) for c in cols], axis=2)  # (n, rows, k)
    # Nuisance: the fit's columns and the structured field's.
    Z = np.empty((n, rows, _M_ARM))
    S = _scratch(ws, rows, p)
    ms = 0.0
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        A = _arm_columns(flange_T[lo:hi, :3, 3], S, hi - lo)
        ms += _column_energy(flange_T[lo:hi, :3, 3])[1]
        np.matmul(JR[lo:hi], A, out=Z[lo:hi])
    Bn = np.concatenate([Jw, Z], axis=2).reshape(n * rows, -1)
    Cf = C.reshape(n * rows, k)
    y = ewh.reshape(n * rows)
    Gb = Bn.T @ Bn
    lb, Ub = np.linalg.eigh(Gb)
    keep = lb > 1e-10 * lb[-1]
    Wb = Ub[:, keep] / np.sqrt(lb[keep])
    BC, By = Wb.T @ (Bn.T @ Cf), Wb.T @ (Bn.T @ y)
    Gc = Cf.T @ Cf - BC.T @ BC
    cy = Cf.T @ y - BC.T @ By
    rest = float(y @ y) - float(By @ By)
    nu = t.nu - int(keep.sum()) + p

    def ftest(sel: list[int]) -> tuple[float, float, np.ndarray]:
        G = Gc[np.ix_(sel, sel)]
        g = cy[sel]
        try:
            beta = np.linalg.solve(G, g)
        except np.linalg.LinAlgError:
            return math.nan, math.nan, np.zeros(len(sel))
        qc = float(g @ beta)
        d2 = nu - len(sel)
        if d2 < 3 or not rest - qc > 0.0:
            return math.nan, math.nan, beta
        F = (qc / len(sel)) / ((rest - qc) / d2)
        return F, _stats.f_sf(F, len(sel), d2), beta

    F, pv, beta = ftest([0])
    out.update(motion_f=F, motion_p=pv, motion_dt_s=-float(beta[0]) if beta.size else math.nan)
    return out
