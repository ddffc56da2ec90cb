"""Helpers the solver benchmarks share: rigid inverses, pose errors, the solver's git state."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parent.parent


def git_state() -> str:
    """Commit and whether the solver differs from it (benchmarks of uncommitted code say so)."""
    try:
        head = subprocess.run(["git", "log", "-1", "--format=%h", "--", "solver"], cwd=_ROOT,
                              text=True, capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "solver"], cwd=_ROOT,
                               text=True, capture_output=True, check=True).stdout.split("\n")
        dirty = [ln[3:] for ln in dirty if ln.strip()]
    except (OSError, subprocess.CalledProcessError):
        return "git state unknown"
    if dirty:
        return f"solver/ at {head} plus uncommitted changes to {', '.join(dirty)}"
    return f"solver/ at {head} (last commit touching it), no local changes"


def inv_stack(T: np.ndarray) -> np.ndarray:
    """Rigid inverse of an (N, 4, 4) stack."""
    out = np.zeros_like(T)
    Rt = T[:, :3, :3].transpose(0, 2, 1)
    out[:, :3, :3] = Rt
    out[:, :3, 3] = -np.einsum("nij,nj->ni", Rt, T[:, :3, 3])
    out[:, 3, 3] = 1.0
    return out


def pose_error(R, t, X) -> tuple[float, float]:
    """(rotation error deg, translation error mm) of (R, t) against the 4x4 truth ``X``."""
    R = np.asarray(R, float)
    t = np.asarray(t, float).ravel()
    if not (np.all(np.isfinite(R)) and np.all(np.isfinite(t))):
        return math.inf, math.inf
    E = X[:3, :3].T @ R
    s = math.hypot(E[2, 1] - E[1, 2], E[0, 2] - E[2, 0], E[1, 0] - E[0, 1]) / 2.0
    ang = math.degrees(math.atan2(s, (np.trace(E) - 1.0) / 2.0))  # accurate near 0 and pi
    return ang, float(np.linalg.norm(t - X[:3, 3]) * 1e3)
