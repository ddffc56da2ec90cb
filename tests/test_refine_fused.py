"""The fused normal equations of the refinement (scalar noise figures, no station weights)
against the station-by-station ones: the same fit, covariance and workspace contents.

Per-station standard deviations that all equal the scalar figures whiten exactly as the
scalar figures do, but take the station-by-station path (:func:`cellcal.solver.refine._system`);
so the two paths are compared on the same problem without reaching into either.
"""

import numpy as np
import pytest

from cellcal.solver import Workspace
from cellcal.solver import refine as R
from cellcal.solver.se3 import se3_exp
from cellcal.solver.synthetic import base_frame_scene

SIGMA_T, SIGMA_R = 5e-5, 2e-4


def _close(a, b, rel=1e-10):
    a, b = np.asarray(a, float), np.asarray(b, float)
    scale = max(float(np.max(np.abs(b))), 1e-300)
    assert float(np.max(np.abs(a - b))) <= rel * scale, (a, b)


def _pose_problem(n, seed):
    sc = base_frame_scene(n, np.random.default_rng(seed), noise_mm=0.05, noise_deg=0.01)
    A0 = sc.X @ se3_exp(np.array([2e-3, -1e-3, 1e-3, 3e-3, -2e-3, 1e-3]))
    B0 = sc.Y @ se3_exp(np.array([-1e-3, 2e-3, 1e-3, 1e-3, 2e-3, -3e-3]))
    return sc.measured, sc.base_T_flange, (A0, B0)


def _point_problem(n, seed):
    sc = base_frame_scene(n, np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    y = np.array([0.05, -0.02, 0.1])
    p = (sc.X @ sc.base_T_flange @ np.append(y, 1.0))[:, :3] + rng.normal(scale=SIGMA_T, size=(n, 3))
    A0 = sc.X @ se3_exp(np.array([2e-3, -1e-3, 1e-3, 3e-3, -2e-3, 1e-3]))
    return p, sc.base_T_flange, (A0, y + 1e-3)


def _fit(kind, n, seed, per_station, fn):
    if kind == "pose":
        M, G, start = _pose_problem(n, seed)
        rows = 6
    else:
        M, G, start = _point_problem(n, seed)
        rows = 3
    ws = Workspace(n)
    std = None
    if per_station:
        std = np.tile([SIGMA_T] * 3 + ([SIGMA_R] * 3 if rows == 6 else []), (n, 1))
    nz = R.prepare_noise(std, "std", None if per_station else SIGMA_T,
                         None if per_station or rows == 3 else SIGMA_R, n, ws, rows)
    model = R.PoseModel(M, G, n, ws) if kind == "pose" else R.PointModel(M, G, n, ws)
    assert isinstance(R._system(model, n, ws, None, nz, False), R._Generic if per_station else R._Fused)
    fit = fn(model, start, nz)
    Jw, ew, ewh = model.views()
    red = R.component_redundancy(model, n, ws, fit.covariance, None)
    return fit, Jw.copy(), ew.copy(), ewh.copy(), ws.et[:n].copy(), red


@pytest.mark.parametrize("kind", ["pose", "point"])
@pytest.mark.parametrize("n", [6, 40])
@pytest.mark.parametrize("stage", ["refine", "covariance_at"])
def test_fused_and_station_by_station_paths_agree(kind, n, stage):
    fn = R.refine if stage == "refine" else R.covariance_at
    fused = _fit(kind, n, 3, False, fn)
    generic = _fit(kind, n, 3, True, fn)
    ff, gf = fused[0], generic[0]
    assert ff.ok and gf.ok
    assert ff.iterations == gf.iterations and ff.stop_reason == gf.stop_reason
    for a, b in zip(ff.state, gf.state, strict=True):
        _close(a, b, 1e-12)
    _close(ff.covariance, gf.covariance)
    _close(ff.cost, gf.cost)
    _close(ff.chi2, gf.chi2)
    assert ff.dof == gf.dof
    # What the fit leaves in the workspace for the hold-out closure and the diagnostics.
    for a, b in zip(fused[1:5], generic[1:5], strict=True):
        _close(a, b)
    for (rf, qf), (rg, qg) in zip(fused[5], generic[5], strict=True):
        if np.isnan(rg):
            assert np.isnan(rf)
        else:
            _close(rf, rg)
            _close(qf, qg)


def test_fused_redundancies_are_the_per_station_ones():
    """The p x p traces of the fused path give the redundancy numbers the per-station pass
    over ``ws.Jw`` gives, and they add up to the degrees of freedom."""
    M, G, start = _pose_problem(30, 5)
    ws = Workspace(30)
    nz = R.prepare_noise(None, "std", SIGMA_T, SIGMA_R, 30, ws, 6)
    model = R.PoseModel(M, G, 30, ws)
    system = R._system(model, 30, ws, None, nz, False)
    assert isinstance(system, R._Fused)
    system.load(start)
    Hinv = system.inverse()
    fused = system.components(Hinv, None)
    system.finish()
    per_station = R.component_redundancy(model, 30, ws, Hinv, None)
    for (rf, qf), (rp, qp) in zip(fused, per_station, strict=True):
        _close(rf, rp, 1e-11)
        _close(qf, qp, 1e-11)
    assert abs(fused[0][0] + fused[1][0] - (6 * 30 - 12)) < 1e-9
