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
    Memory is about ``capacity * 1.2`` KiB. Motion pairs never outnumber stations (ADR
    0003), so every per-pair buffer has ``capacity`` rows too.
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
        self.eye3 = np.eye(3)
        self.lastrow = np.array([0.0, 0.0, 0.0, 1.0])

    def check(self, n: int) -> None:
        """Raise ``ValueError`` if ``n`` stations do not fit."""
        if n > self.capacity:
            raise ValueError(
                f"{n} stations do not fit a Workspace of capacity {self.capacity}; "
                f"create Workspace({n}) or larger"
            )
