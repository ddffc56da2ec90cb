"""Batch kernels shared by every calibration: relative motions, quaternions,
the quaternion-linear AX=XB rotation solve, the 3x3 translation solve, observability and
the recovery of the constant edge with its per-station closure.

Everything here writes into :class:`~cellcal.solver.workspace.Workspace` buffers with
``out=`` arguments, so a solve allocates nothing that grows with N. Fixed-size linear
algebra (3x3, 4x4) runs on Python floats or fixed workspace buffers. Callers validate
once at the API edge (:mod:`cellcal.solver._validate`); the kernels do not re-check.
"""

from __future__ import annotations

import functools
import math
import weakref

import numpy as np

from cellcal.solver.workspace import Workspace

# --- constants ---------------------------------------------------------------------------

#: Most squarings the eigenvector kernel performs. Each squaring doubles the power, so 64
#: covers any eigen-gap down to 2**-60 relative to the shift: the work is bounded even
#: when the gap is tiny, and the result is still the dominant eigenvector to rounding.
MAX_SQUARINGS = 64


def _quat_left(q: tuple[float, float, float, float]) -> np.ndarray:
    w, x, y, z = q
    return np.array([[w, -x, -y, -z], [x, w, -z, y], [y, z, w, -x], [z, -y, x, w]])


def _quat_right(q: tuple[float, float, float, float]) -> np.ndarray:
    w, x, y, z = q
    return np.array([[w, -x, -y, -z], [x, w, z, -y], [y, -z, w, x], [z, y, -x, w]])


def _build_ltr() -> np.ndarray:
    """Constant tensor with ``vec(L(a)^T R(b)) = vec(a b^T) @ _LTR`` (both bilinear)."""
    out = np.zeros((16, 16))
    eye = np.eye(4)
    for i in range(4):
        for j in range(4):
            out[4 * i + j] = (_quat_left(tuple(eye[i])).T @ _quat_right(tuple(eye[j]))).ravel()
    return out


_LTR = _build_ltr()

#: ``L(e_a)^T`` and ``R(e_a)`` / ``R(e_a)^T`` for the unit quaternions ``e_a`` (4, 4, 4):
#: ``L`` and ``R`` are linear, so ``L(q) = sum_a q_a L(e_a)``.
_LT = np.stack([_quat_left(tuple(e)).T for e in np.eye(4)])
_RB = np.stack([_quat_right(tuple(e)) for e in np.eye(4)])
_RT = np.ascontiguousarray(_RB.transpose(0, 2, 1))
#: ``vec(g p^T) @ _QPROD == g ⊗ p`` (Hamilton product as a (16, 4) map).
_QPROD = np.stack([_quat_left(tuple(e)) for e in np.eye(4)]).transpose(0, 2, 1).reshape(16, 4)
_CONJ = np.array([1.0, -1.0, -1.0, -1.0])


# --- bounded ufunc scratch --------------------------------------------------------------

#: numpy buffers a binary ufunc whose operand is broadcast or strided, in blocks of
#: ``bufsize`` elements per operand (8192 by default: 64 KiB each). Inside a solve we set
#: it to this, so that scratch is at most ~4 KiB whatever N is (ADR 0003, allocation).
UFUNC_BUFSIZE = 256


def bounded_buffers(fn):
    """Run ``fn`` with numpy's ufunc buffer size at :data:`UFUNC_BUFSIZE` (restored after).

    NumPy keeps the setting in a context variable, so this is thread- and task-local.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        old = np.setbufsize(UFUNC_BUFSIZE)
        try:
            return fn(*args, **kwargs)
        finally:
            np.setbufsize(old)

    return wrapper


# --- shaped views of workspace buffers -------------------------------------------------------

_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ws_view(ws: Workspace, name: str, start: int, shape: tuple[int, ...], dtype: type | None = None) -> np.ndarray:
    """``getattr(ws, name)`` flattened, from element ``start``, as an array of ``shape``
    (reinterpreted as ``dtype`` of the same item size when given).

    Kept per workspace (weakly: nothing here keeps a workspace alive), so that a warmed-up
    solve gets its scratch shapes without a numpy call (a reshape costs about as much as a
    small ufunc, and the linear solve is call-bound at small N).
    """
    key = (name, start, shape, dtype)
    cache = _VIEWS.get(ws)
    if cache is None:
        cache = _VIEWS[ws] = {}
    v = cache.get(key)
    if v is None:
        size = 1
        for d in shape:
            size *= d
        src = cache[name] if name in cache else getattr(ws, name)  # the cache's own arrays too
        flat = src.reshape(-1)[start : start + size]
        v = cache[key] = (flat if dtype is None else flat.view(dtype)).reshape(shape)
    return v


#: ``I_3`` broadcast as ``[None, b, None, b']`` (the identity factor of ``kron(A, I)``; also
#: :func:`rotation_edge`'s ``kron(Rm, I)``).
_EYE33 = np.eye(3)[None, :, None, :]


def rotate_stack(A: np.ndarray, T: np.ndarray, ws: Workspace) -> np.ndarray:
    """``A @ T[k, :3, :3]`` for a (3, 3) ``A`` and every pose of a stack ``T``, into
    ``ws.RB[:n]`` (returned).

    For a C-contiguous ``T`` one (n, 16) x (16, 9) product with ``A`` spread over a constant
    pattern (the same three terms per entry, in the same order, as the batch of 3x3
    products, which costs about 0.2 us per station); otherwise that batch.
    """
    n = T.shape[0]
    out = ws.RB[:n]
    if not T.flags.c_contiguous:
        np.matmul(A, T[:, :3, :3], out=out)
        return out
    cache = _VIEWS.get(ws)
    if cache is None:
        cache = _VIEWS[ws] = {}
    W = cache.get("rotate_stack")
    if W is None:  # rows 4 i + b', columns 3 a + b; zero outside the rotation's rows
        W = cache["rotate_stack"] = np.zeros((4, 4, 3, 3))
    np.multiply(A.T[:, None, :, None], _EYE33, out=W[:3, :3])  # W[i, b, a, b] = A[a, i]
    np.matmul(T.reshape(n, 16), ws_view(ws, "rotate_stack", 0, (16, 9)), out=ws_view(ws, "RB", 0, (n, 9)))
    return out


# --- motion pairs ------------------------------------------------------------------------

PAIR_SCHEMES = ("all", "ring", "consecutive", "star")


def ring_stride(n: int) -> int:
    """Stride ``h`` nearest ``n/2`` with ``gcd(h, n) == 1``: the pairs ``(i, i+h mod n)``
    form one cycle through every station, each station in exactly two far-apart pairs."""
    if n <= 3:
        return 1
    best = 1
    for h in range(n // 2, 0, -1):
        if math.gcd(h, n) == 1:
            best = h
            break
    return best


def make_pairs(n: int, scheme: str, ws: Workspace) -> int:
    """Fill ``ws.pi``/``ws.pj`` with motion pairs; return the number of pairs ``m <= n``.

    ``ring`` (default, ADR 0003): the cycle ``(i, i + h mod n)`` with ``h`` from
    :func:`ring_stride`. ``consecutive``: ``(i, i + 1)``. ``star``: ``(0, i)``.
    """
    pi, pj = ws.pi, ws.pj
    if scheme == "ring":
        h = ring_stride(n)
        pi[:n] = ws_arange(ws, n)
        np.add(pi[:n], h, out=pj[:n])
        np.remainder(pj[:n], n, out=pj[:n])
        return n
    if scheme == "consecutive":
        pi[: n - 1] = ws_arange(ws, n - 1)
        np.add(pi[: n - 1], 1, out=pj[: n - 1])
        return n - 1
    if scheme == "star":
        pi[: n - 1] = 0
        pj[: n - 1] = ws_arange(ws, n - 1)
        np.add(pj[: n - 1], 1, out=pj[: n - 1])
        return n - 1
    raise ValueError(f"unknown pair scheme {scheme!r}; expected one of {PAIR_SCHEMES}")


def check_pair_scheme(scheme: str) -> None:
    """``ValueError`` for a pair scheme name we do not know."""
    if scheme not in PAIR_SCHEMES:
        raise ValueError(f"unknown pair scheme {scheme!r}; expected one of {PAIR_SCHEMES}")


def ws_arange(ws: Workspace, n: int) -> np.ndarray:
    """``arange(n)`` into the workspace's index buffer (no allocation)."""
    idx = ws.idx[:n]
    idx[0:1] = 0
    if n > 1:
        idx[1:] = 1
        np.cumsum(idx, out=idx)
    return idx


def relative_motions(
    T: np.ndarray, side: str, m: int, ws: Workspace, R_out: np.ndarray, t_out: np.ndarray
) -> None:
    """Relative motions of the pairs ``(ws.pi, ws.pj)`` of a (N, 4, 4) stack.

    ``side="left"``: ``T_j @ inv(T_i)`` (a motion seen in the parent frame);
    ``side="right"``: ``inv(T_j) @ T_i`` (seen in the child frame).
    """
    Ti, Tj = ws.T44a[:m], ws.T44b[:m]
    np.take(T, ws.pi[:m], axis=0, out=Ti, mode="clip")
    np.take(T, ws.pj[:m], axis=0, out=Tj, mode="clip")
    Ri, ti = Ti[:, :3, :3], Ti[:, :3, 3]
    Rj, tj = Tj[:, :3, :3], Tj[:, :3, 3]
    R, t = R_out[:m], t_out[:m]
    # ti/tj are strided views: copied to contiguous buffers before any binary ufunc,
    # which would otherwise buffer up to 2 x 64 KiB (an allocation that grows with N).
    if side == "left":
        np.matmul(Rj, Ri.transpose(0, 2, 1), out=R)
        np.matmul(R, ti[:, :, None], out=ws.v3c[:m, :, None])
        np.copyto(t, tj)
        np.subtract(t, ws.v3c[:m], out=t)
    else:
        np.matmul(Rj.transpose(0, 2, 1), Ri, out=R)
        np.copyto(ws.v3c[:m], ti)
        np.copyto(t, tj)
        np.subtract(ws.v3c[:m], t, out=ws.v3c[:m])
        np.matmul(Rj.transpose(0, 2, 1), ws.v3c[:m, :, None], out=t[:, :, None])


# --- quaternions -------------------------------------------------------------------------


def _build_davenport_map() -> tuple[np.ndarray, np.ndarray]:
    """Constant (9, 16) map and (16,) diagonal with ``vec(K) = vec(R) @ map + s * diag``."""
    lin = np.zeros((9, 16))

    def put(a: int, b: int, terms: tuple[tuple[int, int, float], ...]) -> None:
        for i, j, c in terms:
            lin[3 * i + j, 4 * a + b] += c
            if a != b:
                lin[3 * i + j, 4 * b + a] += c

    put(0, 0, ((0, 0, 1), (1, 1, 1), (2, 2, 1)))
    put(1, 1, ((0, 0, 1), (1, 1, -1), (2, 2, -1)))
    put(2, 2, ((0, 0, -1), (1, 1, 1), (2, 2, -1)))
    put(3, 3, ((0, 0, -1), (1, 1, -1), (2, 2, 1)))
    put(0, 1, ((2, 1, 1), (1, 2, -1)))
    put(0, 2, ((0, 2, 1), (2, 0, -1)))
    put(0, 3, ((1, 0, 1), (0, 1, -1)))
    put(1, 2, ((0, 1, 1), (1, 0, 1)))
    put(1, 3, ((0, 2, 1), (2, 0, 1)))
    put(2, 3, ((1, 2, 1), (2, 1, 1)))
    return lin, np.eye(4).reshape(16)


_DAV_LIN, _DAV_DIAG = _build_davenport_map()


def _fill_davenport(R: np.ndarray, K: np.ndarray, shift: float) -> None:
    """Batch ``K`` (m, 4, 4) with ``q^T K q = tr(R(q)^T R) + shift`` for every ``R`` (m, 3, 3).

    For a rotation matrix with ``shift = 1`` this is Shepperd's ``4 q q^T``; for a sum of
    rotations it is Davenport's matrix, whose dominant eigenvector is the chordal mean.
    ``K`` is linear in ``R``: one (m, 9) x (9, 16) product. ``R`` and ``K`` are contiguous.
    """
    m = R.shape[0]
    K16 = K.reshape(m, 16)
    np.matmul(R.reshape(m, 9), _DAV_LIN, out=K16)
    if shift:
        K16 += shift * _DAV_DIAG


def quats_from_rotations(R: np.ndarray, q_out: np.ndarray, ws: Workspace) -> None:
    """Unit quaternions ``(w, x, y, z)``, ``w >= 0``, of a batch of rotations (Shepperd).

    Each column of ``4 q q^T`` is ``q`` scaled by ``4 q_k``; the column with the largest
    diagonal is the best-conditioned one for every rotation, 180 degrees included.
    """
    m = R.shape[0]
    K = ws.K44[:m]
    _fill_davenport(R, K, 1.0)
    idx = ws.idx[:m]
    diag = ws.onehot[:m]
    np.copyto(diag, np.diagonal(K, 0, 1, 2))  # argmax on the strided view would copy it
    np.argmax(diag, axis=1, out=idx)
    np.equal(ws.ar4, idx[:, None], out=ws.b16[:m, 0, :])
    np.copyto(diag, ws.b16[:m, 0, :])
    np.matmul(K, diag[:, :, None], out=q_out[:, :, None])
    nrm = ws.s1[:m]
    np.einsum("ij,ij->i", q_out, q_out, out=nrm)
    np.sqrt(nrm, out=nrm)
    np.copysign(nrm, q_out[:, 0], out=nrm)  # divide by -|q| where w < 0: w >= 0 after
    np.divide(q_out, nrm[:, None], out=q_out)


#: ``vec(K) = vec(T) @ _DAV16`` for a 4x4 ``T`` whose upper-left 3x3 is ``R``: the
#: Davenport map of :func:`_fill_davenport` read straight from a flattened pose.
_DAV16 = np.zeros((16, 16))
_DAV16[[4 * i + j for i in range(3) for j in range(3)]] = _DAV_LIN
_DIAG4 = np.array([0, 5, 10, 15], np.intp)


def _row_base(ws: Workspace, m: int) -> np.ndarray:
    """``16 k + j`` (m, 4), intp: the flat index of entry j of row 0 of the k-th 4x4. Made
    once per workspace and size (the cache of :func:`ws_view`), never in a warmed-up solve."""
    cache = _VIEWS.get(ws)
    if cache is None:
        cache = _VIEWS[ws] = {}
    key = ("row_base", m)
    v = cache.get(key)
    if v is None:
        v = cache[key] = (16 * np.arange(m, dtype=np.intp))[:, None] + np.arange(4, dtype=np.intp)
    return v


def quats_of_stacks(TA: np.ndarray, TB: np.ndarray, ws: Workspace) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quats_from_rotations` of the rotations of two C-contiguous (n, 4, 4) stacks at
    once, into workspace scratch; returns the two (n, 4) views.

    The Shepperd matrices come straight from the flattened poses (no copy of the strided
    rotations), both stacks share every later step, and the chosen column is gathered by
    index instead of a batch of 4x4 matrix-vector products with a one-hot vector (which cost
    about 0.2 us per station). Each step computes what :func:`quats_from_rotations` does,
    with the same roundings (its product adds exact zeros to the entries gathered here).
    """
    n = TA.shape[0]
    K = ws_view(ws, "KJ", 0, (2 * n, 16))
    np.matmul(TA.reshape(n, 16), _DAV16, out=K[:n])
    np.matmul(TB.reshape(n, 16), _DAV16, out=K[n:])
    K += _DAV_DIAG
    diag = ws_view(ws, "KJ", 32 * n, (2 * n, 4))
    np.take(K, _DIAG4, axis=1, out=diag, mode="clip")
    idx = ws_view(ws, "KJ", 40 * n, (2 * n,), np.intp)
    np.argmax(diag, axis=1, out=idx)
    # Row idx of K (K is exactly symmetric: the same terms in the same order on both sides of
    # the diagonal), i.e. the column Shepperd picks, gathered at 16 k + 4 idx_k + j.
    np.multiply(idx, 4, out=idx)
    at = ws_view(ws, "KJ", 52 * n, (2 * n, 4), np.intp)
    np.add(idx[:, None], _row_base(ws, 2 * n), out=at)
    q = ws_view(ws, "KJ", 42 * n, (2 * n, 4))
    np.take(ws_view(ws, "KJ", 0, (32 * n,)), at, out=q, mode="clip")
    nrm = ws_view(ws, "KJ", 50 * n, (2 * n,))
    np.einsum("ij,ij->i", q, q, out=nrm)
    np.sqrt(nrm, out=nrm)
    np.copysign(nrm, q[:, 0], out=nrm)  # divide by -|q| where w < 0: w >= 0 after
    np.divide(q, nrm[:, None], out=q)
    return q[:n], q[n:]


# --- fixed-size eigen kernel ---------------------------------------------------------------


def _trace(P: np.ndarray) -> float:
    # Summing the diagonal by index is several times cheaper than ndarray.trace() at k <= 4.
    t = 0.0
    for i in range(P.shape[0]):
        t += P[i, i]
    return float(t)


def dominant_eigvec(P: np.ndarray, Q: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Dominant eigenvector of a symmetric positive semi-definite ``P`` (k x k), in place.

    Power iteration by repeated squaring: after s squarings ``P`` holds ``P^(2^s)``, which
    tends to ``c v v^T`` at rate ``(mu2/mu1)^(2^s)``, so even a tiny eigen-gap needs only
    ``log2`` as many steps as plain power iteration. Squarings run in pairs between
    normalisations to unit trace (a unit-trace PSD matrix squared twice keeps its trace
    above ``k^-3``: no underflow). Once ``1 - ||P||_F < 1e-9`` (the unwanted components
    are below 1e-9 relative) one more squaring takes them below 1e-18, under rounding.
    The work is bounded by :data:`MAX_SQUARINGS`. ``P`` and ``Q`` are overwritten; the
    returned unit vector is a view into ``Q``.
    """
    tr = _trace(P)
    if not tr > 0.0:
        raise FloatingPointError("eigen kernel: matrix is zero or not positive semi-definite")
    np.multiply(P, 1.0 / tr, out=P)
    for _ in range(MAX_SQUARINGS // 2):
        np.matmul(P, P, out=Q)
        np.matmul(Q, Q, out=P)
        np.multiply(P, 1.0 / _trace(P), out=P)
        if 1.0 - math.sqrt(float(np.vdot(P, P))) < tol:
            np.matmul(P, P, out=Q)
            np.multiply(Q, 1.0 / _trace(Q), out=P)
            break
    d = [float(P[i, i]) for i in range(P.shape[0])]
    k = d.index(max(d))  # the first of the largest, as np.argmax
    v = Q[:, 0]
    np.multiply(P[:, k], 1.0 / math.sqrt(float(P[k, k])), out=v)
    # One power step with the converged matrix removes the column-choice rounding.
    np.matmul(P, v, out=Q[:, 1])
    np.multiply(Q[:, 1], 1.0 / math.sqrt(float(np.vdot(Q[:, 1], Q[:, 1]))), out=v)
    return v


def null_vector(S: np.ndarray, P: np.ndarray, Q: np.ndarray, tol: float = 1e-9) -> tuple[np.ndarray, float]:
    """Eigenvector of the smallest eigenvalue of a PSD ``S`` by the shifted power method.

    The shift ``sigma = ||S||_F >= lambda_max`` turns ``S``'s smallest eigenvalue into the
    dominant one of ``sigma I - S`` (still PSD). Returns ``(v, lambda_min)``; ``v`` is a
    view into ``Q``.
    """
    sigma = math.sqrt(float(np.vdot(S, S)))
    if sigma == 0.0:
        raise FloatingPointError("null_vector: zero matrix")
    np.negative(S, out=P)
    k = S.shape[0]
    for i in range(k):
        P[i, i] += sigma
    v = dominant_eigvec(P, Q, tol)
    np.matmul(S, v, out=Q[:, 2])
    return v, float(np.vdot(v, Q[:, 2]))


def chordal_mean_quat(Rsum: np.ndarray, ws: Workspace) -> tuple[float, float, float, float]:
    """Quaternion of the rotation nearest (Frobenius) a sum of rotation matrices.

    Davenport: the eigenvector of the largest eigenvalue of a symmetric 4x4 (one LAPACK
    call on fixed-size scratch; exact to rounding, unlike a truncated power iteration).
    """
    K = ws.c44
    # _fill_davenport of one matrix (shift 0), the same (1, 9) x (9, 16) product.
    r9 = ws_view(ws, "R3", 0, (1, 9)) if Rsum is ws.R3 else Rsum.reshape(1, 9)
    np.matmul(r9, _DAV_LIN, out=ws_view(ws, "c44", 0, (1, 16)))
    v = np.linalg.eigh(K)[1][:, 3]
    w, x, y, z = (float(c) for c in v)
    if w < 0.0:
        w, x, y, z = -w, -x, -y, -z
    return w, x, y, z


def rot_from_quat_into(q: tuple[float, float, float, float], out: np.ndarray) -> np.ndarray:
    """Write the rotation matrix of a unit quaternion into ``out`` (3, 3)."""
    w, x, y, z = q
    n = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / n, x / n, y / n, z / n
    out[0, 0] = 1 - 2 * (y * y + z * z)
    out[0, 1] = 2 * (x * y - w * z)
    out[0, 2] = 2 * (x * z + w * y)
    out[1, 0] = 2 * (x * y + w * z)
    out[1, 1] = 1 - 2 * (x * x + z * z)
    out[1, 2] = 2 * (y * z - w * x)
    out[2, 0] = 2 * (x * z - w * y)
    out[2, 1] = 2 * (y * z + w * x)
    out[2, 2] = 1 - 2 * (x * x + y * y)
    return out


# --- small dense solves on Python floats ----------------------------------------------------


def solve_spd3(A: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """Solve a symmetric positive-definite 3x3 system by Cholesky on Python floats."""
    a00, a01, a02 = float(A[0, 0]), float(A[0, 1]), float(A[0, 2])
    a11, a12, a22 = float(A[1, 1]), float(A[1, 2]), float(A[2, 2])
    if not a00 > 0.0:
        raise np.linalg.LinAlgError("matrix is not positive definite")
    l00 = math.sqrt(a00)
    l10 = a01 / l00
    l20 = a02 / l00
    d1 = a11 - l10 * l10
    if not d1 > 0.0:
        raise np.linalg.LinAlgError("matrix is not positive definite")
    l11 = math.sqrt(d1)
    l21 = (a12 - l20 * l10) / l11
    d2 = a22 - l20 * l20 - l21 * l21
    if not d2 > 0.0:
        raise np.linalg.LinAlgError("matrix is not positive definite")
    l22 = math.sqrt(d2)
    y0 = float(b[0]) / l00
    y1 = (float(b[1]) - l10 * y0) / l11
    y2 = (float(b[2]) - l20 * y0 - l21 * y1) / l22
    x2 = y2 / l22
    x1 = (y1 - l21 * x2) / l11
    x0 = (y0 - l10 * x1 - l20 * x2) / l00
    return x0, x1, x2


# --- the shared AX = XB solve -------------------------------------------------------------------


def rotation_normal_matrix(qA: np.ndarray, qB: np.ndarray, w: np.ndarray, ws: Workspace) -> np.ndarray:
    """``S = sum_k w_k K_k^T K_k`` with ``K_k = L(qA_k) - R(qB_k)`` (4x4, into ``ws.N4``).

    For unit quaternions ``K^T K = 2 I - (L(a)^T R(b) + its transpose)`` and ``L(a)^T R(b)``
    is bilinear in ``a, b``, so the whole sum needs only ``C = sum w a b^T`` (one 4xm by
    mx4 product) and a constant 16x16 map.
    """
    m = qA.shape[0]
    C = ws.c44
    Aw = ws.onehot[:m]
    np.multiply(qA, w[:, None], out=Aw)
    np.matmul(Aw.T, qB, out=C)
    return normal_from_outer(C, float(w.sum()), ws)


def normal_from_outer(C: np.ndarray, wsum: float, ws: Workspace) -> np.ndarray:
    """``S = 2 wsum I - (M + M^T)`` with ``vec(M) = vec(C) @ _LTR`` (into ``ws.N4``)."""
    c16 = ws_view(ws, "c44", 0, (16,)) if C is ws.c44 else C.reshape(16)
    np.matmul(c16, _LTR, out=ws.C16)
    M = ws_view(ws, "C16", 0, (4, 4))  # the product's own buffer: no copy to a 4x4 needed
    S = ws.N4
    np.add(M, M.T, out=S)
    np.negative(S, out=S)
    for i in range(4):
        S[i, i] += 2.0 * wsum
    return S


def all_pairs_outer(Pq: np.ndarray, side_A: str, Qq: np.ndarray, ws: Workspace) -> np.ndarray:
    """``C = sum over ALL ordered pairs (i, j) of a_ij b_ij^T`` in O(N) (into ``ws.c44``).

    ``Pq``, ``Qq`` (n, 4) are the station quaternions of the A side and the B side, with
    signs aligned (:func:`align_signs`); ``b_ij = q_j ⊗ q_i*`` (B left-relative) and
    ``a_ij = p_j ⊗ p_i*`` (``side_A="left"``) or ``p_j* ⊗ p_i`` (``"right"``). Both
    factors are linear in their two stations, so with ``E = sum_i p_i q_i^T``:

    * left:  ``C = sum_ab E_ab R(e_a)^T E R(e_b)``
    * right: ``C = sum_ab L(e_a)^T E[:, b] E[a, :] R(e_b)``

    and the N^2 pairs cost one 4xN by Nx4 product (ADR 0003).
    """
    E = ws.P4
    np.matmul(Pq.T, Qq, out=E)
    U = ws.U444
    V = ws.V444
    C = ws.c44
    if side_A == "left":
        np.matmul(_RT, E, out=U)  # U_a = R_a^T E
        np.einsum("ab,aij->bij", E, U, out=V)  # V_b = sum_a E_ab U_a
        np.einsum("bij,bjk->ik", V, _RB, out=C)
    else:
        np.einsum("ac,bcd->abd", E, _RB, out=U)  # U[a, b, :] = E[a, :] R_b
        np.matmul(E, U, out=V)  # V_a = E @ U[a]  (= sum_b E[:, b] U[a, b, :])
        np.einsum("aij,ajk->ik", _LT, V, out=C)  # sum_a L_a^T V_a
    return C


def align_signs(Pq: np.ndarray, side_A: str, Qq: np.ndarray, qX: tuple, ws: Workspace) -> None:
    """Flip rows of ``Qq`` so every station implies the same sign of the constant edge.

    Base frame (A left): ``p_i = qX ⊗ q_i ⊗ qY`` so ``y_i = q_i* ⊗ qX* ⊗ p_i = ±qY``.
    Hand-eye (A right): ``p_i ⊗ qX ⊗ q_i = ±qZ``. Each station's estimate is compared with
    station 0's; the estimates are near-equal unit quaternions, so the dot product is near
    ±1 and the sign is never ambiguous (unlike a per-pair sign near 180 degrees).
    """
    n = Pq.shape[0]
    w, x, y, z = qX
    y4 = ws.v4b[:n]
    outer = ws.K44[:n]
    if side_A == "left":
        Lxc = _quat_left((w, -x, -y, -z))
        t = ws.v4a[:n]
        np.matmul(Pq, Lxc.T, out=t)  # qX* ⊗ p_i
        qc = ws.onehot[:n]
        np.multiply(Qq, _CONJ, out=qc)
        np.matmul(qc[:, :, None], t[:, None, :], out=outer)
    else:
        Rx = _quat_right((w, x, y, z))
        t = ws.v4a[:n]
        np.matmul(Pq, Rx.T, out=t)  # p_i ⊗ qX
        np.matmul(t[:, :, None], Qq[:, None, :], out=outer)
    np.matmul(outer.reshape(n, 16), _QPROD, out=y4)
    dot = ws.s2[:n]
    np.matmul(y4, y4[0], out=dot)
    np.copysign(1.0, dot, out=dot)
    np.multiply(Qq, dot[:, None], out=Qq)


def _rotate_vec_part_sign(qA: np.ndarray, qB: np.ndarray, qX: tuple, ws: Workspace) -> int:
    """Flip ``qB`` rows so each agrees in sign with ``qX^-1 ⊗ qA ⊗ qX``; return flips.

    ``A X = X B`` means ``qA ⊗ qX = ±qX ⊗ qB``. Away from 180 degrees ``w >= 0`` on both
    sides fixes the sign; near 180 degrees ``w ~ 0`` and noise can flip either, so the
    sign is taken from the first-pass ``X``: ``qA · (qX ⊗ qB ⊗ qX*) >= 0``.
    """
    m = qA.shape[0]
    Rx = rot_from_quat_into(qX, ws.R3)
    vb = ws.v3a[:m]
    np.matmul(qB[:, 1:], Rx.T, out=vb)  # R_X vec(b)
    dot = ws.s2[:m]
    np.einsum("ij,ij->i", qA[:, 1:], vb, out=dot)
    t = ws.s3[:m]
    np.multiply(qA[:, 0], qB[:, 0], out=t)
    np.add(dot, t, out=dot)
    np.less(dot, 0.0, out=ws.ball[:m])
    flips = int(np.count_nonzero(ws.ball[:m]))
    if flips:
        np.copysign(1.0, dot, out=t)
        np.multiply(qB, t[:, None], out=qB)
    return flips


def _shepperd(R: np.ndarray) -> tuple[float, float, float, float]:
    """Unit quaternion (w >= 0) of a matrix near a positive multiple of a rotation."""
    m00, m01, m02 = float(R[0, 0]), float(R[0, 1]), float(R[0, 2])
    m10, m11, m12 = float(R[1, 0]), float(R[1, 1]), float(R[1, 2])
    m20, m21, m22 = float(R[2, 0]), float(R[2, 1]), float(R[2, 2])
    # The scale c of c R: every row of a rotation has unit norm, so c^2 = sum(m^2) / 3.
    s = math.sqrt((m00 * m00 + m01 * m01 + m02 * m02 + m10 * m10 + m11 * m11 + m12 * m12
                   + m20 * m20 + m21 * m21 + m22 * m22) / 3.0) or 1.0
    tr = m00 + m11 + m22
    cand = (s + tr, s + m00 - m11 - m22, s - m00 + m11 - m22, s - m00 - m11 + m22)
    k = max(range(4), key=cand.__getitem__)
    if k == 0:
        q = (cand[0], m21 - m12, m02 - m20, m10 - m01)
    elif k == 1:
        q = (m21 - m12, cand[1], m01 + m10, m02 + m20)
    elif k == 2:
        q = (m02 - m20, m01 + m10, cand[2], m12 + m21)
    else:
        q = (m10 - m01, m02 + m20, m12 + m21, cand[3])
    return _canon(np.array(q))


def _det3(A: np.ndarray) -> float:
    a, b, c = float(A[0, 0]), float(A[0, 1]), float(A[0, 2])
    d, e, f = float(A[1, 0]), float(A[1, 1]), float(A[1, 2])
    g, h, i = float(A[2, 0]), float(A[2, 1]), float(A[2, 2])
    return a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)


def kronecker_estimate(RP: np.ndarray, side_A: str, RQ: np.ndarray, ws: Workspace) -> tuple:
    """Sign-free first estimate of ``R_X`` from ALL ordered station pairs, in O(N).

    ``R_A R_X = R_X R_B`` is linear in the entries of ``R_X`` (row-major ``x``):
    ``(R_A ⊗ I - I ⊗ R_B^T) x = 0``, and over every ordered pair the normal matrix is
    ``2 n^2 I - (W + W^T)`` with ``W = sum_ij R_A,ij ⊗ R_B,ij = K K^T`` and
    ``K = sum_i P_i' ⊗ Q_i`` (``P' = P`` for left-relative A, ``P^T`` for right-relative).
    Rotation matrices carry no sign, so this estimate is safe for motions at 180 degrees,
    where quaternion signs are ambiguous; it is used only to align quaternion signs, the
    answer itself comes from the quaternion-linear solve. Returns a quaternion.
    """
    n = RP.shape[0]
    Pc, Qc = ws.M33[:n], ws.M33b[:n]
    np.copyto(Pc, RP)
    np.copyto(Qc, RQ)
    C = ws.C99
    np.matmul(Pc.reshape(n, 9).T, Qc.reshape(n, 9), out=C)  # [(a, b), (r, s)] sums
    C4 = C.reshape(3, 3, 3, 3)
    K = ws.K99
    np.copyto(K.reshape(3, 3, 3, 3), C4.transpose(0, 2, 1, 3) if side_A == "left" else C4.transpose(1, 2, 0, 3))
    S = ws.S99
    np.matmul(K, K.T, out=S)
    np.add(S, S.T, out=ws.P99)
    np.negative(ws.P99, out=S)
    for i in range(9):
        S[i, i] += 2.0 * n * n
    # Only signs depend on this estimate: one LAPACK call (fixed 9x9 scratch) is several
    # times cheaper here than squarings; the answer's own null vector (the quaternion solve)
    # keeps the bounded power method.
    v = np.linalg.eigh(S)[1][:, 0]
    R0 = ws.R3
    np.copyto(R0, v.reshape(3, 3))
    if _det3(R0) < 0.0:  # the null vector's sign is arbitrary; a rotation has det > 0
        np.negative(R0, out=R0)
    return _shepperd(R0)


def solve_rotation(m: int, qX0: tuple, ws: Workspace) -> tuple[float, float, float, float]:
    """Quaternion of ``X`` from the pair quaternions in ``ws.qA[:m]``, ``ws.qB[:m]``.

    ``qX0`` (from :func:`kronecker_estimate`) fixes each pair's relative sign, so motions
    at and near 180 degrees enter with the right sign.
    """
    qA, qB = ws.qA[:m], ws.qB[:m]
    _rotate_vec_part_sign(qA, qB, qX0, ws)
    w = ws.w[:m]
    w.fill(1.0)
    S = rotation_normal_matrix(qA, qB, w, ws)
    v, _ = null_vector(S, ws.P4, ws.Q4)
    return _canon(v)


#: A relative rotation whose quaternion scalar part is below this on either side is within
#: about 23 degrees of 180 from the reference station: its sign is not trusted from the dot
#: product (noise of tenths of a degree is far below this margin).
SIGN_MARGIN = 0.2
#: Reference stations tried before the sign-free Kronecker estimate takes over.
MAX_SIGN_REFERENCES = 8


def align_signs_by_reference(Pq: np.ndarray, Qq: np.ndarray, ws: Workspace) -> bool:
    """Align station quaternion signs from scalar parts alone; False if some stay ambiguous.

    For stations i and r the scalar part of the relative quaternion is ``p_r . p_i`` on the
    A side and ``q_r . q_i`` on the B side (either composition order), and both describe
    the same angle: with consistent signs they are equal, so ``sign(p_r.p_i) sign(q_r.q_i)``
    is the relative sign of station i. Only near 180 degrees from the reference (scalar
    part ~ 0) is it ambiguous; those stations are tried against further references.
    """
    n = Pq.shape[0]
    dp, dq, prod = ws.s1[:n], ws.s2[:n], ws.s3[:n]
    # The common case in a few calls: station 0 decides every sign (no station near 180 deg
    # from it). The same figures and comparisons as the loop's first pass, which runs from
    # the start whenever one station is not decided here.
    np.matmul(Pq, Pq[0], out=dp)
    np.matmul(Qq, Qq[0], out=dq)
    np.multiply(dp, dq, out=prod)
    np.abs(dp, out=dp)
    np.abs(dq, out=dq)
    if float(dp.min()) >= SIGN_MARGIN and float(dq.min()) >= SIGN_MARGIN:
        np.copysign(1.0, prod, out=prod)
        np.multiply(Qq, prod[:, None], out=Qq)
        return True
    sgn = ws.w[:n]
    sgn.fill(0.0)  # 0: not aligned yet
    ok = ws.ball[:n]
    ref = 0
    sgn[0] = 1.0
    for _ in range(MAX_SIGN_REFERENCES):
        np.matmul(Pq, Pq[ref], out=dp)
        np.matmul(Qq, Qq[ref], out=dq)
        np.multiply(dp, dq, out=prod)
        np.abs(dp, out=dp)
        np.abs(dq, out=dq)
        np.minimum(dp, dq, out=dp)
        np.greater_equal(dp, SIGN_MARGIN, out=ok)
        np.copysign(1.0, prod, out=prod)
        np.multiply(prod, sgn[ref], out=prod)
        # Take the sign from this reference where it is trusted and not yet set.
        np.equal(sgn, 0.0, out=ws.b16[:n, 0, 0])
        np.logical_and(ok, ws.b16[:n, 0, 0], out=ok)
        np.copyto(sgn, prod, where=ok)
        if bool(np.all(sgn)):
            np.multiply(Qq, sgn[:, None], out=Qq)
            return True
        # Next reference: the next aligned station after this one (workspace buffers only).
        if ref + 1 >= n:
            return False
        rest = ws.ball[ref + 1 : n]
        np.not_equal(sgn[ref + 1 :], 0.0, out=rest)
        if not bool(rest.any()):
            return False
        ref = ref + 1 + int(np.argmax(rest))
    return False


#: Most sign groups whose relative signs are tried exhaustively (2^(groups - 1) solves).
MAX_SIGN_GROUPS = 4
#: The best group signs must close this many times better than the next best; otherwise
#: two rotations fit (e.g. every motion at 180 degrees about just two axes: a half turn
#: about their common normal maps both axes to their negatives, which a half turn cannot
#: tell from the axes themselves). Determined sets measure 10^3-10^5, ambiguous ones 1-4.
MIN_SIGN_CONTRAST = 100.0


class _SignAmbiguity(Exception):
    """Internal: two sign assignments (two rotations) fit the motions about equally."""

    def __init__(self, contrast: float) -> None:
        self.contrast = contrast
        super().__init__(f"two rotations fit the motions (contrast {contrast:.3g})")


def align_sign_groups(Pq: np.ndarray, Qq: np.ndarray, ws: Workspace) -> int:
    """Align station quaternion signs within groups; return the number of groups.

    As :func:`align_signs_by_reference`, but a station no aligned reference can decide
    (near 180 degrees from all of them) starts a new group instead of giving up: within a
    group every relative sign is trusted, between groups it is not (e.g. stations at the
    identity and stations turned 180 degrees from it, whose scalar parts are ~0 against
    each other). Group labels go to ``ws.grp``; each group's first station keeps its sign.
    """
    n = Pq.shape[0]
    sgn = ws.w[:n]
    sgn.fill(0.0)
    grp = ws.grp[:n]
    grp.fill(-1)
    dp, dq, prod = ws.s1[:n], ws.s2[:n], ws.s3[:n]
    ok = ws.ball[:n]
    unset = ws.b16[:n, 0, 0]
    groups = 0
    while True:
        np.equal(sgn, 0.0, out=unset)
        if not unset.any():
            break
        ref = int(np.argmax(unset))  # first station not aligned yet: a new group
        sgn[ref] = 1.0
        grp[ref] = groups
        queue = [ref]
        while queue:
            r = queue.pop()
            np.matmul(Pq, Pq[r], out=dp)
            np.matmul(Qq, Qq[r], out=dq)
            np.multiply(dp, dq, out=prod)
            np.abs(dp, out=dp)
            np.abs(dq, out=dq)
            np.minimum(dp, dq, out=dp)
            np.greater_equal(dp, SIGN_MARGIN, out=ok)
            np.equal(sgn, 0.0, out=unset)
            np.logical_and(ok, unset, out=ok)
            if not ok.any():
                continue
            np.copysign(1.0, prod, out=prod)
            np.multiply(prod, sgn[r], out=prod)
            np.copyto(sgn, prod, where=ok)
            np.copyto(grp, groups, where=ok)
            if len(queue) < MAX_SIGN_REFERENCES:
                queue.extend(int(i) for i in np.flatnonzero(ok)[:MAX_SIGN_REFERENCES])
        groups += 1
    np.multiply(Qq, sgn[:, None], out=Qq)
    return groups


def solve_rotation_all_pairs(
    RP: np.ndarray, side_A: str, RQ: np.ndarray, ws: Workspace, qX0: tuple | None = None,
    stacks: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[float, float, float, float]:
    """Rotation of ``X`` from every ordered station pair at O(N) cost.

    ``RP``/``RQ`` (n, 3, 3) are the station rotations of the A and B sides. Station
    quaternion signs are aligned from their scalar parts (:func:`align_signs_by_reference`);
    where that stays ambiguous (stations near 180 degrees from every reference tried), a
    sign-free first estimate of ``X`` (:func:`kronecker_estimate`, or ``qX0``) decides.
    ``stacks``: the (n, 4, 4) poses ``RP`` and ``RQ`` are the rotations of, when at hand
    (contiguous ones take the fused :func:`quats_of_stacks`).
    """
    n = RP.shape[0]
    Rc = ws.M33[:n]  # contiguous copies: the batch kernels reshape without copying
    if stacks is not None and stacks[0].flags.c_contiguous and stacks[1].flags.c_contiguous:
        Pq, Qq = quats_of_stacks(stacks[0], stacks[1], ws)
    else:
        Pq, Qq = ws.qA[:n], ws.qB[:n]
        np.copyto(Rc, RP)
        quats_from_rotations(Rc, Pq, ws)
        np.copyto(Rc, RQ)
        quats_from_rotations(Rc, Qq, ws)
    if not align_signs_by_reference(Pq, Qq, ws):
        # Reset to Shepperd's signs and align within groups; the few relative signs between
        # groups are tried exhaustively, keeping the one whose solution closes best (the
        # smallest eigenvalue): the sign-free Kronecker estimate alone is unreliable with
        # few stations and noise at 180 degrees.
        np.copyto(Rc, RQ)
        quats_from_rotations(Rc, Qq, ws)
        groups = align_sign_groups(Pq, Qq, ws) if qX0 is None else MAX_SIGN_GROUPS + 1
        if groups > MAX_SIGN_GROUPS:
            if qX0 is None:
                qX0 = kronecker_estimate(RP, side_A, RQ, ws)
            align_signs(Pq, side_A, Qq, qX0, ws)
        elif groups > 1:
            return _best_group_signs(Pq, side_A, Qq, groups, n, ws)
    C = all_pairs_outer(Pq, side_A, Qq, ws)
    S = normal_from_outer(C, float(n * n), ws)
    v, _ = null_vector(S, ws.P4, ws.Q4)
    return _canon(v)


def _best_group_signs(Pq: np.ndarray, side_A: str, Qq: np.ndarray, groups: int, n: int, ws: Workspace) -> tuple:
    """Try every relative sign of groups 1.. against group 0; keep the best-closing one.

    Raises :class:`_SignAmbiguity` when the runner-up closes within
    :data:`MIN_SIGN_CONTRAST` of the best: the data do not choose between two rotations.
    """
    grp = ws.grp[:n]
    best = None
    best_lam = math.inf
    best_mask = 0
    lams: list[float] = []
    for mask in range(1 << (groups - 1)):
        flip = ws.w[:n]
        flip.fill(1.0)
        for g in range(1, groups):
            if mask >> (g - 1) & 1:
                np.copyto(flip, -1.0, where=grp == g)
        np.multiply(Qq, flip[:, None], out=ws.v4b[:n])
        C = all_pairs_outer(Pq, side_A, ws.v4b[:n], ws)
        S = normal_from_outer(C, float(n * n), ws)
        v, lam = null_vector(S, ws.P4, ws.Q4)
        lams.append(lam)
        if lam < best_lam:
            best_lam, best, best_mask = lam, _canon(v), mask
    for g in range(1, groups):  # leave Qq with the chosen signs
        if best_mask >> (g - 1) & 1:
            np.multiply(Qq, np.where(grp == g, -1.0, 1.0)[:, None], out=Qq)
    assert best is not None
    lams.sort()
    contrast = lams[1] / max(lams[0], 1e-300)
    if contrast < MIN_SIGN_CONTRAST:
        raise _SignAmbiguity(contrast)
    return best


def _canon(v: np.ndarray) -> tuple[float, float, float, float]:
    w, x, y, z = (float(c) for c in v)
    n = math.sqrt(w * w + x * x + y * y + z * z)
    s = 1.0 / n if w >= 0.0 else -1.0 / n
    return w * s, x * s, y * s, z * s


def solve_translation(m: int, Rx: np.ndarray, ws: Workspace) -> tuple[float, float, float]:
    """``t_X`` from ``sum D^T D t = sum D^T (R_X t_B - t_A)``, ``D = R_A - I`` (3x3)."""
    RA, tA, tB = ws.RA[:m], ws.tA[:m], ws.tB[:m]
    lhs = ws.S3
    Rs = ws.R3
    np.sum(RA, axis=0, out=Rs)
    np.add(Rs, Rs.T, out=lhs)
    np.negative(lhs, out=lhs)
    for i in range(3):
        lhs[i, i] += 2.0 * m
    v = ws.v3a[:m]
    np.matmul(tB, Rx.T, out=v)  # R_X t_B
    np.subtract(v, tA, out=v)
    rhs = ws.t3
    np.einsum("kji,kj->i", RA, v, out=rhs)  # sum R_A^T v
    np.subtract(rhs, v.sum(axis=0, out=ws.u3), out=rhs)
    return solve_spd3(lhs, rhs)


# --- constant edge, the pivot kernel and closure ------------------------------------------------


def pivot_solve(R: np.ndarray, t: np.ndarray, ws: Workspace) -> tuple[np.ndarray, np.ndarray]:
    """Least squares ``R_i p + t_i = c`` for fixed ``p`` and ``c`` (each (3,)).

    The normal equations of ``[R_i  -I] [p; c] = -t_i`` are a fixed 6x6 system; eliminating
    ``c = mean(R_i p + t_i)`` leaves the 3x3 SPD system
    ``(n I - S^T S / n) p = S^T T / n - sum R_i^T t_i`` with ``S = sum R_i``, ``T = sum t_i``.
    This one kernel is the tool-point calibration and the translation step of the base-frame
    and hand-eye calibrations (ADR 0003). The per-station residual ``|R_i p + t_i - c|`` goes
    to ``ws.res_t``. Raises ``numpy.linalg.LinAlgError`` if the system is singular.
    """
    n = R.shape[0]
    if not t.flags.c_contiguous:  # binary ufuncs on strided views buffer 2 x 64 KiB
        np.copyto(ws.v3d[:n], t)
        t = ws.v3d[:n]
    Rs = ws.R3
    np.einsum("kij->ij", R, out=Rs)  # a strided np.sum would buffer 64 KiB
    ts = ws.u3
    np.sum(t, axis=0, out=ts)
    lhs = ws.S3
    np.matmul(Rs.T, Rs, out=lhs)
    np.multiply(lhs, -1.0 / n, out=lhs)
    for i in range(3):
        lhs[i, i] += n
    rhs = ws.t3
    np.einsum("kji,kj->i", R, t, out=rhs)  # sum R_i^T t_i
    np.subtract((Rs.T @ ts) / n, rhs, out=rhs)  # x - r is (-r) + x exactly
    p = np.array(solve_spd3(lhs, rhs))
    c = (ts + Rs @ p) / n
    d = ws.v3b[:n]
    np.matmul(R, p, out=d)
    np.add(d, t, out=d)
    np.subtract(d, c, out=d)
    rt = ws.res_t[:n]
    np.einsum("ij,ij->i", d, d, out=rt)
    np.sqrt(rt, out=rt)
    return p, c


#: ``vec(E) @ _VEE_TR = (vee(E - E^T) / 2, tr(E) / 2)`` for a 3x3 ``E`` (row-major vec):
#: the log map's two inputs from one product (halving is exact, so these are the halves of
#: the differences and of the trace the angle needs, to the bit).
_VEE_TR = np.zeros((9, 4))
for _c, (_p, _m) in enumerate(((7, 5), (2, 6), (3, 1))):
    _VEE_TR[_p, _c], _VEE_TR[_m, _c] = 0.5, -0.5
_VEE_TR[[0, 4, 8], 3] = 0.5


def rotation_edge(RZ: np.ndarray, ws: Workspace) -> np.ndarray:
    """Chordal mean of per-station rotations ``RZ`` (n, 3, 3) of a constant edge, and the
    angle of each against it into ``ws.res_r``. Returns the mean (3, 3) as a new array.

    ``RZ`` is contiguous. ``E_i = Rm^T RZ_i`` for every station is one (n, 9) x (9, 9)
    product with ``kron(Rm, I)`` (no batch of 3x3 products), its vee and trace one more.
    """
    n = RZ.shape[0]
    Rsum = ws.R3
    np.sum(RZ, axis=0, out=Rsum)
    Rm = rot_from_quat_into(chordal_mean_quat(Rsum, ws), np.empty((3, 3)))
    # Angle of E_i = Rm^T RZ_i by atan2(|vee(E - E^T)|/2, (tr E - 1)/2): accurate at 0,
    # where arccos would lose half the digits.
    W = ws_view(ws, "C99", 0, (3, 3, 3, 3))
    np.multiply(Rm[:, None, :, None], _EYE33, out=W)  # W[i, b, a, b'] = Rm[i, a] d(b, b')
    E = ws_view(ws, "M33", 0, (n, 9))
    np.matmul(RZ.reshape(n, 9), ws_view(ws, "C99", 0, (9, 9)), out=E)
    F = ws.v4a[:n]
    np.matmul(E, _VEE_TR, out=F)
    sn = ws.s1[:n]
    np.einsum("ij,ij->i", F[:, :3], F[:, :3], out=sn)
    np.sqrt(sn, out=sn)
    c = ws.s2[:n]
    np.subtract(F[:, 3], 0.5, out=c)
    np.arctan2(sn, c, out=ws.res_r[:n])
    return Rm


def closure_stats(n: int, ws: Workspace) -> tuple[float, float, float, float]:
    """``(rms_t, max_t, rms_r, max_r)`` of the residuals in ``ws.res_t`` / ``ws.res_r``."""
    rt, rr = ws.res_t[:n], ws.res_r[:n]
    return (
        math.sqrt(float(np.vdot(rt, rt)) / n),
        float(rt.max()),
        math.sqrt(float(np.vdot(rr, rr)) / n),
        float(rr.max()),
    )
