"""Refinement benchmark: the default base-frame call and the refinement stage alone, two trees
of the solver interleaved in one run.

Run ``.venv/bin/python bench/refine_bench.py [--old DIR]``. Without ``--old`` it times this
tree's solver only. With ``--old DIR`` (a folder holding an older ``solver/``, e.g. made by
``git archive <rev> solver | tar -x -C DIR``) it alternates child processes, one per tree and
round, so that both trees see the same load: the ratios are from one run, interleaved.

Timed, median wall time per call over a block of calls after a warm-up, with a warmed-up
``Workspace(N)``:

* ``default``: ``calibrate_base_frame(G, M, workspace=ws)`` (every default: refinement with
  estimated noise, covariance, hold-out closure, diagnostics);
* ``refine``: :func:`cellcal.solver.refine.refine` alone on a :class:`PoseModel`, from the
  true transforms moved by a small twist, with noise estimated (the variance-component rounds
  and the covariance are inside it).

Nothing is written to ``bench/RESULTS.md``: the figures are printed (machine, date, load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

SIZES = (20, 100, 1000)


def _child(src: str | None, reps: dict[int, int]) -> dict:
    """Times both stages for every N; ``src`` is a folder whose ``solver/`` replaces ours."""
    if src:
        import importlib.util

        # Map cellcal.solver onto the other tree before anything imports it.
        spec = importlib.util.spec_from_file_location(
            "cellcal.solver", os.path.join(src, "solver", "__init__.py"),
            submodule_search_locations=[os.path.join(src, "solver")])
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["cellcal.solver"] = mod
        spec.loader.exec_module(mod)
    import numpy as np

    from cellcal.solver import Workspace, calibrate_base_frame
    from cellcal.solver import refine as R
    from cellcal.solver.se3 import se3_exp
    from cellcal.solver.synthetic import base_frame_scene

    out: dict = {"file": R.__file__}
    for n in SIZES:
        sc = base_frame_scene(n, np.random.default_rng(7), noise_mm=0.05, noise_deg=0.01)
        ws = Workspace(n)
        k = reps[n]

        def default(sc=sc, ws=ws) -> None:
            calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)

        A0 = sc.X @ se3_exp(np.array([1e-3, -2e-3, 1e-3, 1e-3, 2e-3, -1e-3]))
        B0 = sc.Y @ se3_exp(np.array([-1e-3, 1e-3, 2e-3, -2e-3, 1e-3, 1e-3]))

        def stage(sc=sc, ws=ws, n=n, A0=A0, B0=B0) -> None:
            nz = R.prepare_noise(None, "std", None, None, n, ws, 6)
            model = R.PoseModel(sc.measured, sc.base_T_flange, n, ws)
            R.refine(model, (A0, B0), nz)

        for name, fn in (("default", default), ("refine", stage)):
            for _ in range(max(3, k // 10)):
                fn()
            times = []
            for _ in range(k):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[f"{name}_{n}"] = statistics.median(times)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", help="folder with the old solver/ to interleave against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    reps = {20: 300, 100: 150, 1000: 30}
    if args.child is not None:
        print(json.dumps(_child(args.child or None, reps)))
        return
    from bench._results import machine_line

    trees = [("new", "")] + ([("old", os.path.abspath(args.old))] if args.old else [])
    got: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, src in (trees if r % 2 == 0 else trees[::-1]):
            p = subprocess.run([sys.executable, __file__, "--child", src], check=True, capture_output=True,
                               text=True, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            got[name].append(json.loads(p.stdout))
    print(machine_line())
    for name, _ in trees:
        print(f"{name}: {got[name][0]['file']}")
    print(f"medians over {args.rounds} interleaved rounds (each a median of a block of calls), ms")
    head = f"{'stage':>8} {'N':>6}" + "".join(f" {name:>9}" for name, _ in trees)
    print(head + ("   old/new" if args.old else ""))
    for stage in ("default", "refine"):
        for n in SIZES:
            key = f"{stage}_{n}"
            med = {name: statistics.median(d[key] for d in got[name]) for name, _ in trees}
            line = f"{stage:>8} {n:>6}" + "".join(f" {1e3 * med[name]:9.3f}" for name, _ in trees)
            if args.old:
                # Ratio per round (both trees ran back to back), then its median.
                ratios = [o[key] / w[key] for o, w in zip(got["old"], got["new"], strict=True)]
                line += f"   {statistics.median(ratios):7.2f}x"
            print(line)


if __name__ == "__main__":
    main()
