"""The fused kernels of the linear pose solves (issue 28) against the exact checks and
kernels they stand in for: the screen of both input stacks never certifies an input an
exact check would refuse or warn about, and the fused quaternions equal the per-stack ones."""

import numpy as np
import pytest

from cellcal.solver import Workspace, _core, _validate
from cellcal.solver import sanity as _sanity
from cellcal.solver.synthetic import base_frame_scene

LIMITS = (_sanity.UNITS_FLANGE_M, _sanity.UNITS_MEASURED_M)


def _scene(n=12, seed=3):
    sc = base_frame_scene(n, np.random.default_rng(seed), noise_mm=0.02, noise_deg=0.01)
    return np.ascontiguousarray(sc.base_T_flange), np.ascontiguousarray(sc.measured)


def test_screen_certifies_valid_stacks():
    G, M = _scene()
    assert _validate.screen_pair(G, M, Workspace(12), LIMITS)


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("bad", ["nan", "inf", "last_row", "last_one", "scaled", "reflection", "far", "mm"])
def test_screen_does_not_certify_what_a_check_refuses_or_warns_about(which, bad):
    G, M = _scene()
    T = (G, M)[which]
    if bad == "nan":
        T[5, 1, 2] = np.nan
    elif bad == "inf":
        T[5, 0, 3] = np.inf
    elif bad == "last_row":
        T[5, 3, 1] = 2e-9
    elif bad == "last_one":
        T[5, 3, 3] = -1.0
    elif bad == "scaled":
        T[5, :3, :3] *= 1.0 + 2e-6
    elif bad == "reflection":
        T[5, :3, 0] *= -1.0
    elif bad == "far":
        T[5, :3, 3] = [2e5, 0.0, 0.0]
    else:
        T[:, :3, 3] *= 1000.0
    assert not _validate.screen_pair(G, M, Workspace(12), LIMITS)


def test_screen_declines_strided_stacks():
    G, M = _scene()
    Gs = np.concatenate([G, G], axis=0)[::2]
    assert not Gs.flags.c_contiguous
    assert not _validate.screen_pair(Gs, M, Workspace(12), LIMITS)


def test_fused_quaternions_equal_the_per_stack_kernel():
    G, M = _scene(n=40, seed=8)
    ws = Workspace(40)
    qa, qb = (q.copy() for q in _core.quats_of_stacks(G, M, ws))
    ref = Workspace(40)
    for T, q in ((G, qa), (M, qb)):
        R = np.ascontiguousarray(T[:, :3, :3])
        out = np.empty((40, 4))
        _core.quats_from_rotations(R, out, ref)
        assert np.array_equal(out, q)


def test_rotate_stack_equals_the_batch_product():
    G, M = _scene(n=30, seed=5)
    A = G[0, :3, :3].copy()
    ws = Workspace(30)
    got = _core.rotate_stack(A, M, ws).copy()
    np.testing.assert_allclose(got, np.matmul(A, M[:, :3, :3]), rtol=0, atol=1e-15)
