"""The observability test of the AX=XB problems (ADR 0002): how spread the rotation axes of
all station pairs are and how large the rotations, in O(N) from one 3x3 sum. Split from
:mod:`cellcal.solver._core` (the shared solve) because every calibration calls it first."""

from __future__ import annotations

import math

import numpy as np

from cellcal.solver.workspace import Workspace

# --- observability ---------------------------------------------------------------------------


class Observability:
    """Figures of the motions' rotation axes (see ADR 0002).

    ``C = sum_k (R_k - I)^T (R_k - I) = sum_k 2 (1 - cos th_k) (I - a_k a_k^T)``;
    ``axis_spread = 3 lambda_min(C) / trace(C)`` in [0, 1]: 0 when every axis is
    parallel, 1 for an isotropic spread, 0.75 for two equally weighted perpendicular axes.
    ``axis`` is the eigenvector of ``lambda_min`` (the weakest direction).
    """

    __slots__ = ("axis_spread", "axis", "max_rotation_rad", "trace")

    def __init__(self, axis_spread: float, axis: np.ndarray, max_rotation_rad: float, trace: float):
        self.axis_spread = axis_spread
        self.axis = axis
        self.max_rotation_rad = max_rotation_rad
        self.trace = trace


def observability(Rsum: np.ndarray, n: int, side: str, R: np.ndarray, ws: Workspace) -> Observability:
    """Observability of ALL ordered station pairs, in O(N).

    For relative rotations ``R_ij = R_j R_i^T`` (``side="left"``) the sum over all ordered
    pairs is ``sum_ij R_ij = S S^T`` with ``S = sum_i R_i`` (``S^T S`` for ``side="right"``,
    ``R_ij = R_j^T R_i``), so ``C = sum_ij (R_ij - I)^T (R_ij - I) = 2 (n^2 I - S S^T)``
    costs one 3x3 product and does not depend on the order of the stations. ``Rsum`` is
    ``S`` (3, 3); ``R`` (n, 3, 3) are the station rotations of that side, used only for
    ``max_rotation_rad``: the largest rotation of any station relative to station 0.
    """
    C = ws.S3
    if side == "left":
        np.matmul(Rsum, Rsum.T, out=C)
    else:
        np.matmul(Rsum.T, Rsum, out=C)
    np.multiply(C, -2.0, out=C)
    for i in range(3):
        C[i, i] += 2.0 * n * n
    # On Python floats: the diagonal summed in np.trace's order, the axis's sign below.
    trace = float(C[0, 0]) + float(C[1, 1]) + float(C[2, 2])
    tr = ws.s1[:n]
    np.einsum("ab,kab->k", R[0], R, out=tr)  # tr(R_0^T R_k)
    # cos(theta) = (tr - 1) / 2; the largest rotation has the smallest trace.
    cmin = max(-1.0, min(1.0, 0.5 * (float(tr.min()) - 1.0)))
    max_rot = math.acos(cmin)
    if trace <= 1e-300:
        return Observability(0.0, np.array([0.0, 0.0, 1.0]), max_rot, trace)
    lam, v = sym3_min_eig(C)
    j = max(range(3), key=lambda i: abs(v[i]))  # the first of the largest, as np.argmax
    if v[j] < 0:
        v = (-v[0], -v[1], -v[2])
    spread = max(0.0, min(1.0, 3.0 * lam / trace))
    return Observability(spread, np.array(v), max_rot, trace)


def sym3_min_eig(A: np.ndarray) -> tuple[float, tuple[float, float, float]]:
    """Smallest eigenvalue and its unit eigenvector of a symmetric 3x3 matrix.

    Closed form (trigonometric solution of the characteristic cubic), then the eigenvector
    as the largest cross product of two rows of ``A - lambda I``. Accurate to about
    ``1e-8`` relative on the vector, ample for an observability figure; never used for the
    calibration itself.
    """
    a00, a01, a02 = float(A[0, 0]), float(A[0, 1]), float(A[0, 2])
    a11, a12, a22 = float(A[1, 1]), float(A[1, 2]), float(A[2, 2])
    p1 = a01 * a01 + a02 * a02 + a12 * a12
    q = (a00 + a11 + a22) / 3.0
    p2 = (a00 - q) ** 2 + (a11 - q) ** 2 + (a22 - q) ** 2 + 2.0 * p1
    p = math.sqrt(p2 / 6.0)
    if p < 1e-300:  # a multiple of the identity: every direction is an eigenvector
        return q, (0.0, 0.0, 1.0)
    b00, b11, b22 = (a00 - q) / p, (a11 - q) / p, (a22 - q) / p
    b01, b02, b12 = a01 / p, a02 / p, a12 / p
    r = 0.5 * (b00 * (b11 * b22 - b12 * b12) - b01 * (b01 * b22 - b12 * b02) + b02 * (b01 * b12 - b11 * b02))
    r = max(-1.0, min(1.0, r))
    phi = math.acos(r) / 3.0
    lam = q + 2.0 * p * math.cos(phi + 2.0 * math.pi / 3.0)  # the smallest root
    rows = ((a00 - lam, a01, a02), (a01, a11 - lam, a12), (a02, a12, a22 - lam))
    best, bn = (0.0, 0.0, 1.0), 0.0
    for (x0, y0, z0), (x1, y1, z1) in ((rows[0], rows[1]), (rows[0], rows[2]), (rows[1], rows[2])):
        c = (y0 * z1 - z0 * y1, z0 * x1 - x0 * z1, x0 * y1 - y0 * x1)
        cn = c[0] * c[0] + c[1] * c[1] + c[2] * c[2]
        if cn > bn:
            best, bn = c, cn
    if bn <= 0.0:
        return lam, (0.0, 0.0, 1.0)
    s = 1.0 / math.sqrt(bn)
    return lam, (best[0] * s, best[1] * s, best[2] * s)
