"""A warmed-up solve given a Workspace allocates nothing that grows with N (seed 000).

tracemalloc sees every numpy data buffer (numpy reports them to it), so the peak traced
while a solve runs bounds what the solve allocates. It must be the same at N=10 and at
N=5,000, and small in absolute terms: only fixed-size scratch (a few 3x3/4x4 arrays and
the result's own 4x4 transforms) may appear.
"""


import numpy as np
import pytest

from cellcal.solver import Workspace, calibrate_base_frame, calibrate_hand_eye, calibrate_tool_point
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, pivot_scene

from _alloc import peak_bytes

ABS_BOUND_BYTES = 32 * 1024


_peak = peak_bytes


def _kwargs(fn):
    # Only the linear solve is pinned here; refinement has its own allocation test.
    import inspect

    params = inspect.signature(fn).parameters
    return {k: False for k in ("refine", "holdout") if k in params}


@pytest.mark.parametrize("kind", ["base_frame", "hand_eye", "tool_point"])
def test_peak_memory_does_not_grow_with_n(kind):
    peaks = {}
    for n in (10, 5000):
        rng = np.random.default_rng(n)
        ws = Workspace(n)
        if kind == "base_frame":
            sc = base_frame_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
            kw = _kwargs(calibrate_base_frame)
            peaks[n] = _peak(lambda: calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws, **kw))
        elif kind == "hand_eye":
            sc = hand_eye_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
            kw = _kwargs(calibrate_hand_eye)
            peaks[n] = _peak(lambda: calibrate_hand_eye(sc.base_T_flange, sc.measured, workspace=ws, **kw))
        else:
            G, _, _ = pivot_scene(n, rng, noise_mm=0.02)
            peaks[n] = _peak(lambda: calibrate_tool_point(G, workspace=ws))
    assert peaks[5000] <= peaks[10] + 6 * 1024, peaks  # nothing that scales with N (ufunc scratch <= 4 KiB)
    assert peaks[5000] < ABS_BOUND_BYTES, peaks
    # Sanity: the same solve without a workspace does allocate O(N) (the probe can see it).
    sc = base_frame_scene(5000, np.random.default_rng(0))
    assert _peak(lambda: calibrate_base_frame(sc.base_T_flange, sc.measured)) > 500_000
