"""Diagnostics benchmark: the residual tests' stage before and after issue 28 item 3.

Run ``.venv/bin/python bench/diagnostics_bench.py`` (optionally ``--calls K``). In one
process it times the default call ``calibrate_base_frame(G, M, workspace=Workspace(N))`` at
N = 20 and N = 1,000 with

* **before**: ``cellcal.solver._stats`` and ``cellcal.solver.model_error`` as they were at
  commit :data:`BEFORE_COMMIT` (read with ``git show``, loaded as modules of their own and
  put in place of the current ones in ``cellcal.solver.diagnostics`` for those calls);
* **after**: the modules as they are.

The two alternate call by call (the order flips every call), each with its own workspace,
so a change of the machine's load hits both alike; it reports the medians per call of the
whole call and of its diagnostics stage (``diagnostics.assess``, timed by a wrapper) and
the median of the per-pair ratios, checks that both variants give the same result, field
for field, and prints a cProfile split of the call at N = 20 (after). It prints only: the
figures go into ``bench/RESULTS.md`` by hand, with the machine line printed here.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import math
import pstats
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from bench._common import git_state  # noqa: E402
from bench._results import machine_line  # noqa: E402
from cellcal.solver import Workspace, calibrate_base_frame  # noqa: E402
from cellcal.solver import diagnostics as _diag  # noqa: E402
from cellcal.solver.synthetic import base_frame_scene  # noqa: E402

#: The solver before the change (the last commit before issue 28 item 3's).
BEFORE_COMMIT = "5073cfe"


def _old_module(name: str, path: str, **globals_):
    src = subprocess.run(["git", "show", f"{BEFORE_COMMIT}:{path}"], cwd=_ROOT, text=True, capture_output=True,
                         check=True).stdout
    mod = types.ModuleType(name)
    mod.__file__ = f"{BEFORE_COMMIT}:{path}"
    sys.modules[name] = mod  # dataclasses look their module up
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    for k, v in globals_.items():
        setattr(mod, k, v)
    return mod


OLD_STATS = _old_module("_bench_old_stats", "solver/_stats.py")
OLD_ME = _old_module("_bench_old_model_error", "solver/model_error.py", _stats=OLD_STATS)
AFTER = dict(_stats=_diag._stats, _me=_diag._me)
BEFORE = dict(_stats=OLD_STATS, _me=OLD_ME)


def _install(v: dict) -> None:
    _diag._stats = v["_stats"]
    _diag._me = v["_me"]


_ASSESS = _diag.assess
_stage = [0.0]


def _timed_assess(*a, **k):
    t0 = time.perf_counter()
    try:
        return _ASSESS(*a, **k)
    finally:
        _stage[0] += time.perf_counter() - t0


def _same(r1, r2) -> bool:
    """Every field of two results equal (arrays elementwise, NaN equal to NaN)."""
    if dataclasses.is_dataclass(r1) and not isinstance(r1, type):
        return type(r1) is type(r2) and all(_same(getattr(r1, f.name), getattr(r2, f.name))
                                            for f in dataclasses.fields(r1))
    if isinstance(r1, (tuple, list)):
        return len(r1) == len(r2) and all(_same(a, b) for a, b in zip(r1, r2, strict=True))
    if isinstance(r1, np.ndarray):
        return bool(np.array_equal(r1, r2, equal_nan=r1.dtype.kind == "f"))
    if isinstance(r1, float) and isinstance(r2, float) and math.isnan(r1):
        return math.isnan(r2)
    return bool(r1 == r2)


def _wall_split(n: int = 20, calls: int = 200) -> None:
    """Per-call wall time of the diagnostics' parts (wrappers around the module functions)."""
    from cellcal.solver import _stats
    from cellcal.solver import model_error as me

    acc: dict[str, float] = {}
    parts = ((_diag, "assess"), (me, "field_terms"), (me, "detectable_size"), (me, "field_test"),
             (_diag, "_structure_test"), (_diag, "_kenward_roger"), (_diag, "component_redundancy"),
             (_stats, "chi2_ppf"), (_stats, "chi2_sf"), (_stats, "f_sf"))
    saved = [(mod, name, getattr(mod, name)) for mod, name in parts]

    def wrap(name, f):
        def w(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
        return w

    for mod, name, f in saved:
        setattr(mod, name, wrap(name, f))
    try:
        sc = base_frame_scene(n, np.random.default_rng(100 + n), noise_mm=0.02, noise_deg=0.01)
        ws = Workspace(n)
        for _ in range(5):
            calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)
        acc.clear()
        t0 = time.perf_counter()
        for _ in range(calls):
            calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)
        total = (time.perf_counter() - t0) / calls
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)
    print(f"wall-time split, default call at N = {n}, {calls} calls (after; chi2_sf includes the calls "
          f"inside chi2_ppf): call {1e3 * total:.3f} ms")
    for name, v in sorted(acc.items(), key=lambda kv: -kv[1]):
        print(f"  {name:22s} {1e3 * v / calls:7.3f} ms  {100 * v / calls / total:5.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per variant at N = 20 (a tenth at N = 1,000)")
    args = ap.parse_args()
    _diag.assess = _timed_assess  # type: ignore[assignment]
    print(machine_line())
    print(git_state(), f"; before: solver/_stats.py and solver/model_error.py at {BEFORE_COMMIT}")
    for n, calls in ((20, args.calls), (1000, max(args.calls // 10, 5))):
        sc = base_frame_scene(n, np.random.default_rng(100 + n), noise_mm=0.02, noise_deg=0.01)
        G, M = sc.base_T_flange, sc.measured
        wss = {"before": Workspace(n), "after": Workspace(n)}  # each its own field scratch
        variants = {"before": BEFORE, "after": AFTER}
        res = {}
        for name in ("before", "after"):
            _install(variants[name])
            for _ in range(3):
                res[name] = calibrate_base_frame(G, M, workspace=wss[name])  # warm-up
        same = _same(res["before"], res["after"])
        times: dict[str, list[float]] = {"before": [], "after": []}
        stage: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(calls):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                _install(variants[name])
                _stage[0] = 0.0
                t0 = time.perf_counter()
                calibrate_base_frame(G, M, workspace=wss[name])
                times[name].append(time.perf_counter() - t0)
                stage[name].append(_stage[0])
        _install(AFTER)
        tb, ta = statistics.median(times["before"]), statistics.median(times["after"])
        sb, sa = statistics.median(stage["before"]), statistics.median(stage["after"])
        rt = statistics.median(b / a for b, a in zip(times["before"], times["after"], strict=True))
        rs = statistics.median(b / a for b, a in zip(stage["before"], stage["after"], strict=True))
        print(f"N = {n}: results identical before/after: {same}; {calls} calls each, alternating; medians")
        print(f"  whole call   before {1e3 * tb:8.3f} ms   after {1e3 * ta:8.3f} ms   pair ratio {rt:5.2f}")
        print(f"  diagnostics  before {1e3 * sb:8.3f} ms   after {1e3 * sa:8.3f} ms   pair ratio {rs:5.2f}")
        print(f"  diagnostics share of the call: before {100 * sb / tb:4.1f} %, after {100 * sa / ta:4.1f} %")
    # The stage split of the default call at N = 20, after: wall time by wrappers first
    # (cProfile's per-call overhead inflates the Python-loop stages), then cProfile.
    _diag.assess = _ASSESS  # type: ignore[assignment]
    _wall_split()
    sc = base_frame_scene(20, np.random.default_rng(120), noise_mm=0.02, noise_deg=0.01)
    ws = Workspace(20)
    for _ in range(5):
        calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)
    pr.disable()
    st = pstats.Stats(pr)
    total = max(st.total_tt, 1e-300)  # type: ignore[attr-defined]
    stages = ("calibrate_base_frame", "_pose_finish", "refine", "_absolute_linear", "_holdout", "assess",
              "field_terms", "detectable_size", "field_test", "_structure_test", "_kenward_roger",
              "component_redundancy", "chi2_sf", "chi2_ppf", "f_sf")
    print("cProfile, default call at N = 20, 200 calls (after); cumulative time per call and share:")
    rows = {}
    for (file, _line, func), (_cc, nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if func in stages and "cellcal" in file or (func in stages and "/solver/" in file):
            rows[func] = (nc, ct)
    for func in stages:
        if func in rows:
            nc, ct = rows[func]
            print(f"  {func:22s} {nc / 200:6.1f} calls/solve  {1e3 * ct / 200:7.3f} ms  {100 * ct / total:5.1f} %")
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(12)
    print("\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip())[-1800:])
    print(machine_line())


if __name__ == "__main__":
    main()
