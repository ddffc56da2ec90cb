"""Solver outputs pinned on seeded data: speed work must not change a single answer.

Every number a result carries (transforms, covariances, residuals, held-out closure, test
figures, warnings) is compared with the figures recorded in ``solver_pinned.json`` before
the solver was optimised, to 1e-12 relative to each array's own scale (reordered floating
point sums differ in the last bits; anything larger is a changed result). Strings (solver
text, stop reasons, noise source) must match exactly.

``python tests/test_solver_pinned.py`` rewrites the file from the solver as it is: do that
only for a deliberate change of results, and say so in the commit.

The figures are computed in a child process with OpenBLAS's AVX2 kernels
(``OPENBLAS_CORETYPE=Haswell`` on x86-64, :data:`BLAS_ENV`), the ones they were pinned with:
OpenBLAS picks its kernels by CPU, and the AVX-512 ones sum in another order, which moves
derived figures (p-values, held-out percentiles) by a few 1e-12 on the same code. The kernel
is the machine's variable, not the solver's, so it is held fixed here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import platform
import subprocess
import sys

import numpy as np
import pytest

from cellcal.solver import (
    Workspace,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, pivot_scene

PINNED = pathlib.Path(__file__).with_name("solver_pinned.json")
REL_TOL = 1e-12
#: The OpenBLAS kernel family the figures were pinned with (module docstring).
BLAS_ENV = {"OPENBLAS_CORETYPE": "Haswell"} if platform.machine().lower() in ("x86_64", "amd64") else {}

#: Fields a deliberate change of method moved (the case names them); everything else pinned.
#: A linear answer's held-out closure is now the linearised update at that answer instead of
#: k-fold refits (tests/test_holdout.py checks it against true refits); the rest of those
#: results stays pinned.
_SKIP: dict[str, tuple[str, ...]] = {
    name: ("holdout",)
    for name in ("base_linear_holdout_n20", "base_linear_holdout_n200", "hand_eye_linear_holdout",
                 "points_linear_holdout")
}


def _flatten(obj, prefix: str, out: dict) -> None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _flatten(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name, out)
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}[{i}]", out)
    elif isinstance(obj, np.ndarray):
        out[prefix] = {"shape": list(obj.shape), "values": [_num(v) for v in obj.ravel().tolist()]}
    elif isinstance(obj, (bool, np.bool_)) or obj is None:
        out[prefix] = None if obj is None else bool(obj)
    elif isinstance(obj, (int, np.integer)):
        out[prefix] = int(obj)
    elif isinstance(obj, (float, np.floating)):
        out[prefix] = {"float": _num(float(obj))}
    elif isinstance(obj, str):
        out[prefix] = obj
    else:
        raise TypeError(f"{prefix}: cannot pin a {type(obj).__name__}")


def _num(v: float):
    # JSON has no inf/nan; repr() of a float round-trips exactly.
    return v if math.isfinite(v) else repr(v)


def _val(v) -> float:
    return float(v)


def _scene(n: int, seed: int, **kw):
    return base_frame_scene(n, np.random.default_rng(seed), noise_mm=0.02, noise_deg=0.01, **kw)


def _outliers(n: int, seed: int):
    sc = _scene(n, seed)
    M = sc.measured.copy()
    M[3, :3, 3] += 0.004  # 4 mm: a gross outlier
    M[11, :3, 3] -= 0.003
    return sc.base_T_flange, M


def _cases():
    """name -> zero-argument callable returning a result (seeded, deterministic)."""
    c = {}
    for n in (20, 200):
        sc = _scene(n, 100 + n)
        G, M = sc.base_T_flange, sc.measured
        c[f"base_default_n{n}_ws"] = lambda G=G, M=M, n=n: calibrate_base_frame(G, M, workspace=Workspace(n))
        c[f"base_default_n{n}"] = lambda G=G, M=M: calibrate_base_frame(G, M)
        c[f"base_linear_bare_n{n}"] = lambda G=G, M=M, n=n: calibrate_base_frame(
            G, M, workspace=Workspace(n), refine=False, holdout=False, uncertainty=False)
        c[f"base_linear_cov_n{n}"] = lambda G=G, M=M: calibrate_base_frame(G, M, refine=False, holdout=False)
        c[f"base_linear_holdout_n{n}"] = lambda G=G, M=M: calibrate_base_frame(G, M, refine=False)
    sc = _scene(1000, 7)
    c["base_default_n1000"] = lambda: calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=Workspace(1000))
    sc8 = _scene(8, 8)
    c["base_default_n8"] = lambda: calibrate_base_frame(sc8.base_T_flange, sc8.measured)
    for pairs in ("ring", "consecutive", "star"):
        sc2 = _scene(30, 31)
        c[f"base_pairs_{pairs}"] = lambda sc2=sc2, pairs=pairs: calibrate_base_frame(
            sc2.base_T_flange, sc2.measured, pairs=pairs)
    sc3 = _scene(25, 25)
    c["base_translation_pairs"] = lambda: calibrate_base_frame(sc3.base_T_flange, sc3.measured, translation="pairs")
    c["base_declared_noise"] = lambda: calibrate_base_frame(
        sc3.base_T_flange, sc3.measured, noise_translation_m=2e-5, noise_rotation_rad=math.radians(0.01))
    Go, Mo = _outliers(30, 5)
    c["base_huber"] = lambda: calibrate_base_frame(Go, Mo, huber=3.0)
    c["base_reject"] = lambda: calibrate_base_frame(Go, Mo, huber=3.0, reject_k=4.0)
    std = np.tile([2e-5, 2e-5, 2e-5, 2e-4, 2e-4, 2e-4], (25, 1))
    c["base_std"] = lambda: calibrate_base_frame(sc3.base_T_flange, sc3.measured, cell_T_target_std=std)
    cov = np.tile(np.diag([4e-10, 4e-10, 9e-10, 3e-8, 3e-8, 3e-8]), (25, 1, 1))
    c["base_cov"] = lambda: calibrate_base_frame(sc3.base_T_flange, sc3.measured, cell_T_target_cov=cov)
    he = hand_eye_scene(20, np.random.default_rng(41), noise_mm=0.02, noise_deg=0.01)
    c["hand_eye_default"] = lambda: calibrate_hand_eye(he.base_T_flange, he.measured)
    c["hand_eye_linear"] = lambda: calibrate_hand_eye(he.base_T_flange, he.measured, refine=False, holdout=False)
    c["hand_eye_linear_holdout"] = lambda: calibrate_hand_eye(he.base_T_flange, he.measured, refine=False)
    c["eye_to_hand_default"] = lambda: calibrate_eye_to_hand(he.base_T_flange, he.measured)
    Gp, _, _ = pivot_scene(20, np.random.default_rng(42), noise_mm=0.02)
    c["tool_point_default"] = lambda: calibrate_tool_point(Gp)
    scp = _scene(15, 77)
    y = np.array([0.01, 0.04, 0.12])
    p0 = (scp.X @ scp.base_T_flange @ np.append(y, 1.0))[:, :3]
    p = p0 + np.random.default_rng(78).normal(scale=2e-5, size=p0.shape)
    c["points_default"] = lambda: calibrate_base_frame_points(scp.base_T_flange, p)
    c["points_linear_holdout"] = lambda: calibrate_base_frame_points(scp.base_T_flange, p, refine=False)
    return c


def outputs(name: str) -> dict:
    out: dict = {}
    _flatten(_cases()[name](), "", out)
    return out


def _close(key: str, got, want) -> str | None:
    if isinstance(want, dict) and "shape" in want:
        if got.get("shape") != want["shape"]:
            return f"{key}: shape {got.get('shape')} != {want['shape']}"
        g = np.array([_val(v) for v in got["values"]], dtype=float)
        w = np.array([_val(v) for v in want["values"]], dtype=float)
        if g.size == 0:
            return None
        if not np.array_equal(g[~np.isfinite(w)], w[~np.isfinite(w)], equal_nan=True):
            return f"{key}: non-finite entries differ"
        fin = np.isfinite(w)
        if not np.isfinite(g[fin]).all():
            return f"{key}: non-finite where the pinned figure is finite"
        scale = float(np.max(np.abs(w[fin]))) if fin.any() else 0.0
        err = float(np.max(np.abs(g[fin] - w[fin]))) if fin.any() else 0.0
        if err > REL_TOL * max(scale, 1e-300):
            return f"{key}: max difference {err:.3g} at scale {scale:.3g}"
        return None
    if isinstance(want, dict) and "float" in want:
        g, w = _val(got["float"]), _val(want["float"])
        if math.isnan(w):
            return None if math.isnan(g) else f"{key}: {g!r} != nan"
        if math.isinf(w) or math.isinf(g):
            return None if g == w else f"{key}: {g!r} != {w!r}"
        return None if abs(g - w) <= REL_TOL * max(abs(w), 1e-300) else f"{key}: {g!r} != {w!r}"
    return None if got == want else f"{key}: {got!r} != {want!r}"


@pytest.fixture(scope="module")
def pinned() -> dict:
    return json.loads(PINNED.read_text())


@pytest.fixture(scope="module")
def computed() -> dict:
    # One child process for all cases, so its BLAS kernel is the pinned one (module docstring).
    r = subprocess.run([sys.executable, __file__, "--print"], env={**os.environ, **BLAS_ENV},
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_outputs_match_the_pinned_figures(name, pinned, computed):
    want = pinned[name]
    got = computed[name]
    skip = _SKIP.get(name, ())
    keys = [k for k in want if not any(k == s or k.startswith(s + ".") for s in skip)]
    assert sorted(k for k in got if k in keys) == sorted(keys), f"{name}: result fields changed"
    bad = [msg for k in keys if (msg := _close(k, got[k], want[k])) is not None]
    assert not bad, f"{name}: " + "; ".join(bad[:10])


def test_the_comparison_would_see_a_change(pinned):
    # Sensitivity: one ulp-scale edit passes, a 1e-9 relative edit of the largest covariance entry fails.
    want = pinned["base_default_n20_ws"]
    got = json.loads(json.dumps(want))
    cov = got["cell_T_base_covariance"]["values"]
    cov[0] = cov[0] * (1 + 1e-15)
    assert _close("c", got["cell_T_base_covariance"], want["cell_T_base_covariance"]) is None
    cov[0] = cov[0] * (1 + 1e-9)
    assert _close("c", got["cell_T_base_covariance"], want["cell_T_base_covariance"]) is not None


if __name__ == "__main__":  # pragma: no cover - the test's child process, or regenerates the figures
    if any(os.environ.get(k) != v for k, v in BLAS_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **BLAS_ENV})
    data = {name: outputs(name) for name in sorted(_cases())}
    if sys.argv[1:] == ["--print"]:
        print(json.dumps(data, sort_keys=True))
    else:
        PINNED.write_text(json.dumps(data, sort_keys=True) + "\n")
        print(f"wrote {len(data)} cases to {PINNED}", file=sys.stderr)
