"""Preallocated buffers for the calibration solves.

A :class:`Workspace` holds every array a solve of up to ``capacity`` stations needs, so a
warmed-up solve that is given one allocates nothing that grows with N (the allocation test
in ``tests/test_solver_alloc.py`` checks this with ``tracemalloc``). One workspace serves one
solve at a time: it is not thread-safe, and the per-station ``residuals`` a result returns
are read-only views into it, valid until the workspace's next solve. A solve given no
workspace makes a transient one and returns copies, so nothing of it outlives the call.
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["Workspace"]

#: A transient workspace (the one a solve without ``workspace=`` makes for itself) at least
#: this large is an anonymous memory mapping, so that nothing of it stays in the process
#: after the call: freed heap blocks of this size are kept by the C allocator.
TRANSIENT_MMAP_BYTES = 256 * 1024
_ALIGN = 64  # bytes: every buffer starts on a cache line


class _Carver:
    """Hands out the workspace's buffers from one block; without a block it only sizes."""

    _NOTHING = np.empty(0)

    def __init__(self, block: np.ndarray | None) -> None:
        self.block = block
        self.nbytes = 0

    def empty(self, shape: int | tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
        shp = (shape,) if isinstance(shape, int) else tuple(shape)
        dt = np.dtype(dtype)
        count = 1
        for d in shp:
            count *= d
        start = -(-self.nbytes // _ALIGN) * _ALIGN
        self.nbytes = start + max(count * dt.itemsize, 1)
        if self.block is None:
            return self._NOTHING
        return self.block[start : start + count * dt.itemsize].view(dt).reshape(shp)

    def zeros(self, shape: int | tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
        a = self.empty(shape, dtype)
        a.fill(0)
        return a

    def ones(self, shape: int | tuple[int, ...], dtype: type = np.float64) -> np.ndarray:
        a = self.empty(shape, dtype)
        a.fill(1)
        return a

    def arange(self, n: int) -> np.ndarray:
        a = self.empty(n, np.intp)
        if self.block is not None:
            a[:] = np.arange(n, dtype=np.intp)
        return a

    def eye(self, k: int) -> np.ndarray:
        a = self.zeros((k, k))
        if self.block is not None:
            np.fill_diagonal(a, 1.0)
        return a

    def array(self, values: list[float]) -> np.ndarray:
        a = self.empty(len(values))
        if self.block is not None:
            a[:] = values
        return a


class Workspace:
    """Buffers for solves of up to ``capacity`` stations.

    Parameters
    ----------
    capacity : int
        Largest number of stations a solve with this workspace may have (>= 1).
    transient : bool
        For the workspace a solve makes for itself when it is given none: at
        :data:`TRANSIENT_MMAP_BYTES` or more its block is an anonymous memory mapping, which
        the system takes back as soon as the solve's last reference to it is gone (such a
        solve's results copy what they return, so none is kept).

    Notes
    -----
    Memory is about ``capacity * 4.5`` KiB (1.2 KiB for the linear solve, the rest for the
    refinement, covariance and hold-out closure of ADR 0004), one block from which every
    buffer is a view. Motion pairs never outnumber stations (ADR 0003), so every per-pair
    buffer has ``capacity`` rows too.
    """

    def __init__(self, capacity: int, *, transient: bool = False) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"Workspace capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        # Two passes over one layout: the first sizes it, the second carves every buffer
        # out of one block (one allocation, freed as one).
        sizer = _Carver(None)
        self._layout(capacity, sizer)
        if transient and sizer.nbytes >= TRANSIENT_MMAP_BYTES:
            # An anonymous mapping: unmapped (returned to the system) when the last view dies,
            # where a heap block of this size would stay in the process after it is freed.
            block = np.frombuffer(mmap.mmap(-1, sizer.nbytes), dtype=np.uint8)
        else:
            block = np.empty(sizer.nbytes, np.uint8)
        self._layout(capacity, _Carver(block))

    def _layout(self, n: int, a: _Carver) -> None:
        f8 = np.float64
        # Per-station / per-pair buffers.
        self.T44a = a.empty((n, 4, 4), f8)  # gathered transforms, pose i
        self.T44b = a.empty((n, 4, 4), f8)  # gathered transforms, pose j
        self.RA = a.empty((n, 3, 3), f8)  # relative rotations, side A
        self.RB = a.empty((n, 3, 3), f8)
        self.tA = a.empty((n, 3), f8)
        self.tB = a.empty((n, 3), f8)
        self.qA = a.empty((n, 4), f8)
        self.qB = a.empty((n, 4), f8)
        self.K44 = a.empty((n, 4, 4), f8)  # Shepperd matrices 4 q q^T
        self.onehot = a.empty((n, 4), f8)
        self.M33 = a.empty((n, 3, 3), f8)  # scratch rotations
        self.M33b = a.empty((n, 3, 3), f8)
        self.v3a = a.empty((n, 3), f8)
        self.v3b = a.empty((n, 3), f8)
        self.v3c = a.empty((n, 3), f8)
        self.v3d = a.empty((n, 3), f8)
        self.s1 = a.empty(n, f8)
        self.s2 = a.empty(n, f8)
        self.s3 = a.empty(n, f8)
        self.w = a.empty(n, f8)
        self.idx = a.empty(n, np.intp)
        self.grp = a.empty(n, np.intp)  # quaternion sign groups
        self.pi = a.empty(n, np.intp)  # pair index i
        self.pj = a.empty(n, np.intp)  # pair index j
        self.b16 = a.empty((n, 4, 4), np.bool_)
        self.ball = a.empty(n, np.bool_)
        # Result buffers (exposed read-only as residual views).
        self.res_t = a.empty(n, f8)
        self.res_r = a.empty(n, f8)
        # Fixed-size scratch.
        self.N4 = a.empty((4, 4), f8)
        self.P4 = a.empty((4, 4), f8)
        self.Q4 = a.empty((4, 4), f8)
        self.C16 = a.empty(16, f8)
        self.c44 = a.empty((4, 4), f8)
        self.R3 = a.empty((3, 3), f8)
        self.S3 = a.empty((3, 3), f8)
        self.t3 = a.empty(3, f8)
        self.u3 = a.empty(3, f8)
        self.C99 = a.empty((9, 9), f8)
        self.K99 = a.empty((9, 9), f8)
        self.S99 = a.empty((9, 9), f8)
        self.P99 = a.empty((9, 9), f8)
        self.Q99 = a.empty((9, 9), f8)
        self.U444 = a.empty((4, 4, 4), f8)
        self.V444 = a.empty((4, 4, 4), f8)
        self.v4a = a.empty((n, 4), f8)
        self.v4b = a.empty((n, 4), f8)
        self.ar4 = a.arange(4)
        # --- refinement, covariance and hold-out closure (ADR 0004) ---
        # Flat per-station blocks, viewed (n, 6, 12) by the pose model and (n, 3, 9) /
        # (n, 3, 6) by the point and pivot models: one allocation serves all three.
        self.Jraw = a.zeros(n * 72, f8)  # Jacobian of the raw residual
        self.Jw = a.zeros(n * 72, f8)  # whitened (and Huber-weighted) Jacobian
        self.KJ = a.empty(n * 72, f8)  # Jw @ H^-1
        self.L36 = a.empty(n * 36, f8)  # leverage blocks, then I - leverage
        self.T36 = a.empty(n * 36, f8)  # elimination scratch
        self.et = a.empty((n, 3), f8)  # translation residual, m (measurement parent frame)
        self.er = a.empty((n, 3), f8)  # rotation residual, rad (measurement child frame)
        self.ew = a.empty(n * 6, f8)  # whitened residual
        self.ewh = a.empty(n * 6, f8)  # whitened, Huber-weighted residual
        self.wsig = a.empty(n * 6, f8)  # 1 / sigma per residual component
        self.wrow = a.empty(n * 6, f8)  # whitening times sqrt(Huber weight)
        self.f6 = a.empty(n * 6, f8)  # elimination multipliers
        self.b6 = a.empty(n * 6, f8)  # leave-one-out right-hand sides / solutions
        self.tb6 = a.empty(n * 6, f8)
        self.b6b = a.empty(n * 6, f8)
        self.down = a.empty(n + 1, np.intp)  # indices of down-weighted stations
        self.ipos = a.empty(n, np.intp)
        self.itmp = a.empty(n, np.intp)
        self.meas3 = a.empty((n, 3), f8)  # measured positions, contiguous
        self.q4 = a.empty((n, 4), f8)  # target origin in the station's parent frame
        self.tp = a.empty((n, 3), f8)  # predicted positions
        self.rC = a.empty((n, 3, 3), f8)
        self.rP = a.empty((n, 3, 3), f8)
        self.rE = a.empty((n, 3, 3), f8)
        self.rEE = a.empty((n, 3, 3), f8)
        self.rJi = a.empty((n, 3, 3), f8)  # minus the inverse left Jacobian of SO(3)
        self.rv = a.empty((n, 3), f8)
        self.r9 = a.empty((n, 9), f8)
        self.rs = a.empty((6, n), f8)  # per-station scalars
        self.hw = a.empty(n, f8)  # Huber weights
        self.r2 = a.empty(n, f8)  # whitened squared residual length per station
        self.mask = a.ones(n, f8)  # station weights: 0 dropped, 1/k for k duplicates
        self.vm = a.empty(n, f8)  # weights of the stations a variance estimate uses
        self.vind = a.empty(n, f8)  # their indicator
        self.ball2 = a.empty(n, np.bool_)
        self.e6 = a.empty((n, 6), f8)  # raw residual (e_t, e_r), contiguous
        self.e3 = a.empty((n, 3), f8)  # one component of it, contiguous
        self.Wfull = a.zeros(n * 36, f8)  # per-station whitening L^-1 diag(I, R) (full covariance)
        self.Winv = a.zeros(n * 36, f8)  # and its inverse
        self.feat = a.empty((n, 3), f8)  # structure-test features (centred positions)
        self.f9 = a.empty((n, 9), f8)  # their outer products
        self.key = a.empty(n, f8)  # duplicate-station keys
        self.hsw = a.empty(n, f8)  # their square roots
        self.Gx = a.empty((n, 4, 4), f8)  # derived stacks: inverses, k-fold subsets
        self.Gy = a.empty((n, 4, 4), f8)
        self.Gz = a.empty((n, 4, 4), f8)
        self.kidx = a.empty(n, np.intp)
        self.iota = a.arange(n)
        self.ho_t = a.empty(n, f8)  # held-out closure per station
        self.ho_r = a.empty(n, f8)
        self.bk_t = a.empty(n, f8)  # residuals kept aside while folds are refitted
        self.bk_r = a.empty(n, f8)
        self.srt = a.empty(n, f8)  # percentile scratch
        self.H12 = a.empty((12, 12), f8)
        # Structure test (diagnostics): the feature space has at most 18 dimensions.
        self.z936 = a.empty(9 * 36, f8)
        self.z18a = a.empty((18, 18), f8)
        self.z18b = a.empty((18, 18), f8)
        self.z372 = a.empty(3 * 72, f8)
        self.z18p = a.empty((18, 12), f8)
        self.z18v = a.empty(18, f8)
        self.z18w = a.empty(18, f8)
        self.g12b = a.empty(12, f8)
        self.g12c = a.empty(12, f8)
        self.g12 = a.empty(12, f8)
        self.Hd12 = a.empty((12, 12), f8)
        # Model-error field (model_error): per station its rotated columns (18 + 12) and
        # the diagonal of its rough block, for the variance-component fit.
        self.fU = a.empty(n * 6 * 30, f8)
        self.fT = a.empty(n * 6 * 30, f8)
        self.fL = a.empty(n * 6, f8)
        self.fY = a.empty(n * 6, f8)
        self.fW = a.empty(n * 6, f8)
        self.fV = a.empty(n * 6, f8)
        self.fX = a.empty(n * 6, f8)
        self.fZ = a.empty(n * 6, f8)
        self.lev6 = a.empty(6, f8)  # leverage and squared residual per residual row
        self.sq6 = a.empty(6, f8)
        self.eye3 = a.eye(3)
        self.lastrow = a.array([0.0, 0.0, 0.0, 1.0])

    def check(self, n: int) -> None:
        """Raise ``ValueError`` if ``n`` stations do not fit."""
        if n > self.capacity:
            raise ValueError(
                f"{n} stations do not fit a Workspace of capacity {self.capacity}; "
                f"create Workspace({n}) or larger"
            )
