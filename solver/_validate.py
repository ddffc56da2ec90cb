"""The input stacks' checks at the API edge: shape, then every station of a (N, 4, 4) stack
(finite, last row, orthonormal rotation, determinant +1), with a one-pass screen of both
stacks of a pose calibration that lets the exact per-check passes be skipped when every
figure is clearly inside its limit (:func:`screen_pair`). ``ValueError`` names the first bad
station. Split from :mod:`cellcal.solver._core`, whose kernels assume checked input.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from cellcal.solver._core import ws_view
from cellcal.solver.workspace import Workspace

#: Levi-Civita symbol as a (9, 3) map: ``cross(a, b) = vec(a b^T) @ _EPS93``.
_EPS93 = np.zeros((9, 3))
for _i, _j, _k in ((0, 1, 2), (1, 2, 0), (2, 0, 1)):
    _EPS93[3 * _i + _j, _k] = 1.0
    _EPS93[3 * _j + _i, _k] = -1.0

def as_stack(T: np.ndarray, name: str) -> np.ndarray:
    """Return ``T`` as a float64 (N, 4, 4) array (no copy when it already is one)."""
    a = np.asarray(T, dtype=np.float64)
    if a.ndim != 3 or a.shape[1:] != (4, 4):
        raise ValueError(f"{name}: expected shape (N, 4, 4), got {a.shape}")
    return a


def validate_stack(a: np.ndarray, name: str, ws: Workspace, *, tol: float = 1e-6) -> None:
    """Check every station of a (N, 4, 4) stack; ``ValueError`` names the first bad index.

    Checks, in order: finite values, last row ``0 0 0 1``, rotation orthonormal
    (``max |R^T R - I| <= tol``) with determinant +1.
    """
    n = a.shape[0]
    # Fast path: a NaN or inf anywhere makes the sum non-finite. Only then look per station.
    if not math.isfinite(float(np.add.reduce(a, axis=None))):
        fin = ws.b16[:n]
        np.isfinite(a, out=fin)
        ok = ws.ball[:n]
        np.logical_and.reduce(fin.reshape(n, 16), axis=1, out=ok)
        if not ok.all():
            i = int(np.argmin(ok))
            raise ValueError(f"{name}[{i}]: contains NaN or inf")
    d = ws.v3a[:n]
    err = ws.s1[:n]
    tmp4 = ws.onehot[:n]
    # Binary ufuncs on strided views buffer up to 2 x 64 KiB: copy to contiguous first.
    np.copyto(tmp4, a[:, 3, :])
    np.subtract(tmp4, ws.lastrow, out=tmp4)
    np.abs(tmp4, out=tmp4)
    np.max(tmp4, axis=1, out=err)
    if float(err.max()) > 1e-9:
        i = int(np.argmax(err))
        raise ValueError(f"{name}[{i}]: last row must be [0, 0, 0, 1], got {a[i, 3].tolist()}")
    R = a[:, :3, :3]
    RtR = ws.M33[:n]
    np.matmul(R.transpose(0, 2, 1), R, out=RtR)
    np.subtract(RtR, ws.eye3, out=RtR)
    np.abs(RtR, out=RtR)
    np.max(RtR.reshape(n, 9), axis=1, out=err)
    worst = float(err.max())
    if worst > tol:
        i = int(np.argmax(err))
        raise ValueError(
            f"{name}[{i}]: rotation is not orthonormal (max |R^T R - I| = {float(err[i]):.3g}, "
            f"tolerance {tol:g})"
        )
    # det(R) = (c0 x c1) . c2; orthonormal already, so only its sign matters. The cross
    # product is the outer product c0 c1^T contracted with the Levi-Civita symbol.
    outer = ws.M33[:n]
    np.matmul(R[:, :, 0:1], R[:, :, 1].reshape(n, 1, 3), out=outer)
    np.matmul(outer.reshape(n, 9), _EPS93, out=d)
    det = ws.s2[:n]
    np.einsum("ij,ij->i", d, R[:, :, 2], out=det)
    if float(det.min()) <= 0.0:
        i = int(np.argmin(det))
        raise ValueError(f"{name}[{i}]: rotation has determinant {float(det[i]):.3g}, expected +1")


def _build_screen() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gathers and map of :func:`screen_pair`: which entries of a flattened 4x4 (``T[i, j]``
    at ``4 i + j``) multiply, and how the products sum to the checked figures."""
    gram = [(a, b) for a in range(3) for b in range(a, 3)]
    i1 = [4 * i + a for a, b in gram for i in range(3)]
    i2 = [4 * i + b for a, b in gram for i in range(3)]
    perms = ((0, 1, 2, 1.0), (1, 2, 0, 1.0), (2, 0, 1, 1.0), (0, 2, 1, -1.0), (2, 1, 0, -1.0), (1, 0, 2, -1.0))
    i1 += [4 * i for i, _, _, _ in perms]
    i2 += [4 * j + 1 for _, j, _, _ in perms]
    i3 = [4 * k + 2 for _, _, k, _ in perms]
    i1 += [3, 7, 11]  # translation, squared
    i2 += [3, 7, 11]
    i1 += [12, 13, 14, 15]  # last row, as it is
    lin = np.zeros((31, 12))
    for c in range(6):
        lin[3 * c : 3 * c + 3, c] = 1.0  # Gram entries (R^T R)_ab, a <= b
    for c, (_, _, _, sgn) in enumerate(perms):
        lin[18 + c, 6] = sgn  # determinant
    lin[24:27, 11] = 1.0  # |t|^2
    for c in range(4):
        lin[27 + c, 7 + c] = 1.0
    off = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    return np.array(i1, np.intp), np.array(i2, np.intp), np.array(i3, np.intp), lin, off


_SCR_I1, _SCR_I2, _SCR_I3, _SCR_LIN, _SCR_OFF = _build_screen()
#: Margin of :func:`screen_pair` below each threshold, so that its figures, summed in
#: another order than the exact checks', never pass what those would refuse.
SCREEN_MARGIN = 0.99


def screen_pair(G: np.ndarray, M: np.ndarray, ws: Workspace, limits: tuple[float, float],
                tol: float = 1e-6) -> bool:
    """True when two (N, 4, 4) stacks certainly pass every input check of the pose solves.

    One conservative pass over both stacks: finite values, last rows ``0 0 0 1`` (1e-9),
    rotations orthonormal to ``tol`` with determinant +1 (as :func:`validate_stack`) and
    every translation at most ``limits[0]`` (``G``) / ``limits[1]`` (``M``) m long. Each
    station's 12 figures (the 6 Gram entries of ``R^T R``, ``det R``, the last row, ``|t|^2``)
    come from three gathers, two products and one constant (31, 12) map, each figure scaled
    so that one maximum against ``SCREEN_MARGIN * tol`` decides all of them: about a dozen
    numpy calls for both stacks instead of one batched 3x3 product per check and stack.
    False means "not certain" (a NaN anywhere, a figure near or past a limit, a strided
    stack): the caller then runs the exact checks, which raise with their own messages.
    """
    n = G.shape[0]
    if not (G.flags.c_contiguous and M.flags.c_contiguous):
        return False
    P1 = ws_view(ws, "KJ", 0, (n, 31))
    P2 = ws_view(ws, "KJ", 31 * n, (n, 27))
    P3 = ws_view(ws, "KJ", 58 * n, (n, 6))
    Q = ws_view(ws, "L36", 0, (2 * n, 12))
    # A NaN or inf in the input (which the exact checks then refuse, naming the station) or a
    # huge value must not reach the caller as numpy's RuntimeWarning: it only makes the
    # screen "not certain".
    with np.errstate(invalid="ignore", over="ignore"):
        for k, (T, limit) in enumerate(((G, limits[0]), (M, limits[1]))):
            T16 = T.reshape(n, 16)
            np.take(T16, _SCR_I1, axis=1, out=P1, mode="clip")
            np.take(T16, _SCR_I2, axis=1, out=P2, mode="clip")
            np.take(T16, _SCR_I3, axis=1, out=P3, mode="clip")
            np.multiply(P1[:, :27], P2, out=P1[:, :27])
            np.multiply(P1[:, 18:24], P3, out=P1[:, 18:24])
            np.matmul(P1, _screen_map(tol, limit), out=Q[k * n : (k + 1) * n])
        np.subtract(Q, _screen_off(tol), out=Q)
        np.abs(Q, out=Q)
        worst = float(Q.max())
    return worst <= SCREEN_MARGIN * tol  # NaN compares False


@functools.lru_cache(maxsize=16)
def _screen_map(tol: float, limit: float) -> np.ndarray:
    lin = _SCR_LIN.copy()
    lin[:, 7:11] *= tol / 1e-9  # the last row's limit 1e-9 becomes tol
    lin[:, 11] *= tol / (limit * limit)  # |t|^2 <= limit^2 becomes <= tol
    lin.flags.writeable = False
    return lin


@functools.lru_cache(maxsize=4)
def _screen_off(tol: float) -> np.ndarray:
    off = _SCR_OFF.copy()
    off[10] *= tol / 1e-9
    off.flags.writeable = False
    return off
