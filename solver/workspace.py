"""Preallocated buffers for the calibration solves.

A :class:`Workspace` holds every array a solve of up to ``capacity`` stations needs, so a
warmed-up solve that is given one allocates nothing that grows with N (the allocation test
in ``tests/test_solver_alloc.py`` checks this with ``tracemalloc``). One workspace serves one
solve at a time: it is not thread-safe, and the per-station ``residuals`` a result returns
are read-only views into it, valid until the workspace's next solve.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Workspace"]


class Workspace:
    """Buffers for solves of up to ``capacity`` stations.

    Parameters
    ----------
    capacity : int
        Largest number of stations a solve with this workspace may have (>= 1).

    Notes
    -----
    Memory is about ``capacity * 4.5`` KiB (1.2 KiB for the linear solve, the rest for the
    refinement, covariance and hold-out closure of ADR 0004). Motion pairs never outnumber
    stations (ADR 0003), so every per-pair buffer has ``capacity`` rows too.
    """

    def __init__(self, capacity: int) -> None:
        capacity = int(capacity)
        if capacity < 1:
            raise ValueError(f"Workspace capacity must be >= 1, got {capacity}")
        n = capacity
        self.capacity = n
        f8 = np.float64
        # Per-station / per-pair buffers.
        self.T44a = np.empty((n, 4, 4), f8)  # gathered transforms, pose i
        self.T44b = np.empty((n, 4, 4), f8)  # gathered transforms, pose j
        self.RA = np.empty((n, 3, 3), f8)  # relative rotations, side A
        self.RB = np.empty((n, 3, 3), f8)
        self.tA = np.empty((n, 3), f8)
        self.tB = np.empty((n, 3), f8)
        self.qA = np.empty((n, 4), f8)
        self.qB = np.empty((n, 4), f8)
        self.K44 = np.empty((n, 4, 4), f8)  # Shepperd matrices 4 q q^T
        self.onehot = np.empty((n, 4), f8)
        self.M33 = np.empty((n, 3, 3), f8)  # scratch rotations
        self.M33b = np.empty((n, 3, 3), f8)
        self.v3a = np.empty((n, 3), f8)
        self.v3b = np.empty((n, 3), f8)
        self.v3c = np.empty((n, 3), f8)
        self.v3d = np.empty((n, 3), f8)
        self.s1 = np.empty(n, f8)
        self.s2 = np.empty(n, f8)
        self.s3 = np.empty(n, f8)
        self.w = np.empty(n, f8)
        self.idx = np.empty(n, np.intp)
        self.grp = np.empty(n, np.intp)  # quaternion sign groups
        self.pi = np.empty(n, np.intp)  # pair index i
        self.pj = np.empty(n, np.intp)  # pair index j
        self.b16 = np.empty((n, 4, 4), np.bool_)
        self.ball = np.empty(n, np.bool_)
        # Result buffers (exposed read-only as residual views).
        self.res_t = np.empty(n, f8)
        self.res_r = np.empty(n, f8)
        # Fixed-size scratch.
        self.N4 = np.empty((4, 4), f8)
        self.P4 = np.empty((4, 4), f8)
        self.Q4 = np.empty((4, 4), f8)
        self.C16 = np.empty(16, f8)
        self.c44 = np.empty((4, 4), f8)
        self.R3 = np.empty((3, 3), f8)
        self.S3 = np.empty((3, 3), f8)
        self.t3 = np.empty(3, f8)
        self.u3 = np.empty(3, f8)
        self.C99 = np.empty((9, 9), f8)
        self.K99 = np.empty((9, 9), f8)
        self.S99 = np.empty((9, 9), f8)
        self.P99 = np.empty((9, 9), f8)
        self.Q99 = np.empty((9, 9), f8)
        self.U444 = np.empty((4, 4, 4), f8)
        self.V444 = np.empty((4, 4, 4), f8)
        self.v4a = np.empty((n, 4), f8)
        self.v4b = np.empty((n, 4), f8)
        self.ar4 = np.arange(4, dtype=np.intp)
        # --- refinement, covariance and hold-out closure (ADR 0004) ---
        # Flat per-station blocks, viewed (n, 6, 12) by the pose model and (n, 3, 9) /
        # (n, 3, 6) by the point and pivot models: one allocation serves all three.
        self.Jraw = np.zeros(n * 72, f8)  # Jacobian of the raw residual
        self.Jw = np.zeros(n * 72, f8)  # whitened (and Huber-weighted) Jacobian
        self.KJ = np.empty(n * 72, f8)  # Jw @ H^-1
        self.L36 = np.empty(n * 36, f8)  # leverage blocks, then I - leverage
        self.T36 = np.empty(n * 36, f8)  # elimination scratch
        self.et = np.empty((n, 3), f8)  # translation residual, m (measurement parent frame)
        self.er = np.empty((n, 3), f8)  # rotation residual, rad (measurement child frame)
        self.ew = np.empty(n * 6, f8)  # whitened residual
        self.ewh = np.empty(n * 6, f8)  # whitened, Huber-weighted residual
        self.wsig = np.empty(n * 6, f8)  # 1 / sigma per residual component
        self.wrow = np.empty(n * 6, f8)  # whitening times sqrt(Huber weight)
        self.f6 = np.empty(n * 6, f8)  # elimination multipliers
        self.b6 = np.empty(n * 6, f8)  # leave-one-out right-hand sides / solutions
        self.tb6 = np.empty(n * 6, f8)
        self.b6b = np.empty(n * 6, f8)
        self.down = np.empty(n + 1, np.intp)  # indices of down-weighted stations
        self.ipos = np.empty(n, np.intp)
        self.itmp = np.empty(n, np.intp)
        self.meas3 = np.empty((n, 3), f8)  # measured positions, contiguous
        self.q4 = np.empty((n, 4), f8)  # target origin in the station's parent frame
        self.tp = np.empty((n, 3), f8)  # predicted positions
        self.rC = np.empty((n, 3, 3), f8)
        self.rP = np.empty((n, 3, 3), f8)
        self.rE = np.empty((n, 3, 3), f8)
        self.rEE = np.empty((n, 3, 3), f8)
        self.rJi = np.empty((n, 3, 3), f8)  # minus the inverse left Jacobian of SO(3)
        self.rv = np.empty((n, 3), f8)
        self.r9 = np.empty((n, 9), f8)
        self.rs = np.empty((6, n), f8)  # per-station scalars
        self.hw = np.empty(n, f8)  # Huber weights
        self.r2 = np.empty(n, f8)  # whitened squared residual length per station
        self.mask = np.ones(n, f8)  # station weights: 0 dropped, 1/k for k duplicates
        self.vm = np.empty(n, f8)  # weights of the stations a variance estimate uses
        self.vind = np.empty(n, f8)  # their indicator
        self.ball2 = np.empty(n, np.bool_)
        self.e6 = np.empty((n, 6), f8)  # raw residual (e_t, e_r), contiguous
        self.e3 = np.empty((n, 3), f8)  # one component of it, contiguous
        self.Wfull = np.zeros(n * 36, f8)  # per-station whitening L^-1 diag(I, R) (full covariance)
        self.Winv = np.zeros(n * 36, f8)  # and its inverse
        self.feat = np.empty((n, 3), f8)  # structure-test features (centred positions)
        self.f9 = np.empty((n, 9), f8)  # their outer products
        self.key = np.empty(n, f8)  # duplicate-station keys
        self.hsw = np.empty(n, f8)  # their square roots
        self.Gx = np.empty((n, 4, 4), f8)  # derived stacks: inverses, k-fold subsets
        self.Gy = np.empty((n, 4, 4), f8)
        self.Gz = np.empty((n, 4, 4), f8)
        self.kidx = np.empty(n, np.intp)
        self.iota = np.arange(n, dtype=np.intp)
        self.ho_t = np.empty(n, f8)  # held-out closure per station
        self.ho_r = np.empty(n, f8)
        self.bk_t = np.empty(n, f8)  # residuals kept aside while folds are refitted
        self.bk_r = np.empty(n, f8)
        self.srt = np.empty(n, f8)  # percentile scratch
        self.H12 = np.empty((12, 12), f8)
        # Structure test (diagnostics): the feature space has at most 18 dimensions.
        self.z936 = np.empty(9 * 36, f8)
        self.z18a = np.empty((18, 18), f8)
        self.z18b = np.empty((18, 18), f8)
        self.z372 = np.empty(3 * 72, f8)
        self.z18p = np.empty((18, 12), f8)
        self.z18v = np.empty(18, f8)
        self.z18w = np.empty(18, f8)
        self.g12b = np.empty(12, f8)
        self.g12c = np.empty(12, f8)
        self.g12 = np.empty(12, f8)
        self.Hd12 = np.empty((12, 12), f8)
        self.eye3 = np.eye(3)
        self.lastrow = np.array([0.0, 0.0, 0.0, 1.0])

    def check(self, n: int) -> None:
        """Raise ``ValueError`` if ``n`` stations do not fit."""
        if n > self.capacity:
            raise ValueError(
                f"{n} stations do not fit a Workspace of capacity {self.capacity}; "
                f"create Workspace({n}) or larger"
            )
