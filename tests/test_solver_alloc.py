"""A warmed-up solve given a Workspace allocates nothing that grows with N.

tracemalloc sees every numpy data buffer (numpy reports them to it), so the peak traced
while a solve runs bounds what the solve allocates. It must be the same at N=10 and at
N=5,000, and small in absolute terms: only fixed-size scratch (a few 3x3/4x4 arrays and
the result's own 4x4 transforms) may appear. A solve *without* a workspace makes a
transient one and keeps nothing of it once it returns: its result holds copies, not views.
"""


import numpy as np
import pytest
from _alloc import peak_bytes

from cellcal.solver import Workspace, calibrate_base_frame, calibrate_hand_eye, calibrate_tool_point
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, pivot_scene

ABS_BOUND_BYTES = 32 * 1024


_peak = peak_bytes


#: The linear solve and the default call (refined, with covariance and held-out closure).
CALLS = {"linear": {"refine": False, "holdout": False}, "default": {}}


@pytest.mark.parametrize(("kind", "call"), [("base_frame", "linear"), ("base_frame", "default"), ("hand_eye", "linear"),
                                           ("hand_eye", "default"), ("tool_point", "default")])
def test_peak_memory_does_not_grow_with_n(kind, call):
    peaks = {}
    # 1,000 too: numpy copies strided operands through its ufunc buffers at moderate sizes only
    # (none at 5,000), which 10 against 5,000 alone would not show.
    for n in (10, 1000, 5000):
        rng = np.random.default_rng(n)
        ws = Workspace(n)
        if kind == "base_frame":
            sc = base_frame_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
            kw = CALLS[call]
            peaks[n] = _peak(lambda sc=sc, ws=ws, kw=kw: calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws, **kw))
        elif kind == "hand_eye":
            sc = hand_eye_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
            kw = CALLS[call]
            peaks[n] = _peak(lambda sc=sc, ws=ws, kw=kw: calibrate_hand_eye(sc.base_T_flange, sc.measured, workspace=ws, **kw))
        else:
            G, _, _ = pivot_scene(n, rng, noise_mm=0.02)
            peaks[n] = _peak(lambda G=G, ws=ws: calibrate_tool_point(G, workspace=ws))  # no linear switch
    assert max(peaks[1000], peaks[5000]) <= peaks[10] + 6 * 1024, peaks  # nothing that scales with N (ufunc scratch <= 4 KiB)
    assert peaks[5000] < ABS_BOUND_BYTES, peaks
    # Sanity: the same solve with a fresh workspace does allocate O(N) (the probe can see it).
    sc = base_frame_scene(5000, np.random.default_rng(0))
    assert _peak(lambda: calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=Workspace(5000))) > 500_000


def _arrays(obj, path="result"):
    """Every numpy array reachable from a result (dataclass fields, tuples, dicts)."""
    import dataclasses

    if isinstance(obj, np.ndarray):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _arrays(getattr(obj, f.name), f"{path}.{f.name}")
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _arrays(v, f"{path}[{i}]")


def _owner(a: np.ndarray):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


_NO_WORKSPACE = {
    "base_frame": lambda sc, G: calibrate_base_frame(sc.base_T_flange, sc.measured),
    "base_frame_linear": lambda sc, G: calibrate_base_frame(sc.base_T_flange, sc.measured, refine=False),
    "base_frame_huber": lambda sc, G: calibrate_base_frame(sc.base_T_flange, sc.measured, huber=3.0),
    "hand_eye": lambda sc, G: calibrate_hand_eye(sc.base_T_flange, sc.measured),
    "tool_point": lambda sc, G: calibrate_tool_point(G),
}


@pytest.mark.parametrize("kind", sorted(_NO_WORKSPACE))
def test_a_solve_without_a_workspace_keeps_none_alive(kind):
    import gc
    import mmap
    import weakref

    from cellcal.solver import workspace as wsmod

    n = 400
    rng = np.random.default_rng(3)
    sc = base_frame_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
    G, _, _ = pivot_scene(n, rng, noise_mm=0.02)
    made = []
    orig = wsmod.Workspace.__init__

    def spy(self, capacity, **kw):
        orig(self, capacity, **kw)
        made.append(weakref.ref(self))

    wsmod.Workspace.__init__ = spy
    try:
        r = _NO_WORKSPACE[kind](sc, G)
    finally:
        wsmod.Workspace.__init__ = orig
    gc.collect()
    assert made, "the solve made no workspace of its own"
    assert all(w() is None for w in made), "the solve's workspace outlived it"
    # No array of the result is a view into a block larger than itself (a workspace's).
    for path, a in _arrays(r):
        base = _owner(a)
        assert base.nbytes <= max(a.nbytes, 1) * 2 + 1024, (path, a.nbytes, base.nbytes)
    # The transient workspace of 400 stations (~1.9 MB) is an anonymous mapping, unmapped with it.
    block = _owner(wsmod.Workspace(n, transient=True).T44a)
    assert isinstance(block.base, memoryview) and isinstance(block.base.obj, mmap.mmap)
    # What stays is the result itself: O(N) only for its per-station figures (5 arrays of N).
    gc.collect()
    import tracemalloc

    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        r2 = _NO_WORKSPACE[kind](sc, G)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r2 is not None
    assert after - before < 64 * n + 32 * 1024, after - before
