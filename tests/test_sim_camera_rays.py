"""The simulated camera's ray map (``cellcal.sim.camera._rays``): undistorted on a coarse grid
and interpolated, it stays within ``RAY_TOL_PX`` of an exact undistortion of every sub-pixel
and valid exactly where the exact one converged, for a mild lens (the demo's kind, where the
interpolation carries it), a strong one and a lens that folds inside the image (where the
exact fallback must take over)."""

from __future__ import annotations

import numpy as np
import pytest

from cellcal.sim import camera as C
from cellcal.solver.camera_model import CameraModel

LENSES = {
    # the demo camera's distortion over the same field of view, on a smaller sensor
    "mild": ([415.0, 415.0, 80.3, 63.7, -0.08, 0.04, 2e-4, -1e-4, 0.0], (160, 128)),
    "strong": ([125.0, 125.0, 80.0, 64.0, -0.3, 0.1, 1e-3, -1e-3, 0.02], (160, 128)),
    "pincushion": ([80.0, 80.0, 80.0, 64.0, 0.5, 0.3, 0.0, 0.0, 0.0], (160, 128)),
    # k1 = -0.45 at this field of view: the polynomial folds, half the image has no ray
    "fold": ([100.0, 100.0, 80.0, 64.0, -0.45, 0.0, 0.0, 0.0, 0.0], (160, 128)),
}


@pytest.mark.parametrize("ss", [1, 2, 3])
@pytest.mark.parametrize("lens", sorted(LENSES))
def test_the_interpolated_ray_map_is_the_exact_one_within_its_tolerance(lens, ss):
    params, size = LENSES[lens]
    cam = CameraModel.from_parameters(np.array(params), size)
    with C._RAYS_LOCK:
        C._RAYS.clear()
    x, y, ok = C._rays(cam, ss)
    w, h = size
    us = (np.arange(w * ss) + 0.5) / ss - 0.5
    vs = (np.arange(h * ss) + 0.5) / ss - 0.5
    xy, ok_exact = cam.undistort(np.stack(np.meshgrid(us, vs), axis=-1))
    assert x.shape == (h * ss, w * ss) and not x.flags.writeable
    np.testing.assert_array_equal(ok, ok_exact)
    assert ok.any()
    err_px = max(np.max(np.abs(xy[ok, 0] - x[ok])) * params[0], np.max(np.abs(xy[ok, 1] - y[ok])) * params[1])
    assert err_px <= C.RAY_TOL_PX, err_px
    assert np.all(x[~ok] == 0.0) and np.all(y[~ok] == 0.0)
    if lens == "fold":
        assert 0.3 < ok.mean() < 0.7
