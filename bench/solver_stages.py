"""Stage profile of the base-frame solve, before and after the solver's speed work (issue 28).

Run ``.venv/bin/python bench/solver_stages.py [--old REV] [--rounds K]``. The solver of commit
``REV`` (default ``5073cfe``, the tree before issue 28's rewrite) is unpacked with
``git archive`` into ``bench/_work/`` and both trees run in child processes, alternating round
by round so that both see the same load; OpenCV's ``calibrateRobotWorldHandEye`` (SHAH) runs
in every child beside them, so each tree's ratio to SHAH is measured interleaved too.

Per tree, N = 20 and N = 1,000, a warmed-up ``Workspace(N)``, the scene of
``cellcal.solver.synthetic.base_frame_scene`` (0.02 mm / 0.01 deg):

* the median wall time of the **linear call** (``refine=False, holdout=False,
  uncertainty=False``), of the **default call** and of SHAH (its inputs built outside the
  timing: the rigid inverses and lists it needs);
* the default call's **stage split**: wall time inside each stage, exclusive of the stages it
  calls, found by wrapping the stage functions with a timer (``time.perf_counter``; the
  wrappers cost about 1 us a call, a few per solve): input checks (``_prepare``,
  ``_input_checks``), linear solve (``_absolute_linear``), refinement (``refine.refine``),
  diagnostics (``diagnostics.assess``), hold-out (``_pose_solve._holdout``), and the rest
  (covariance figures, the result records).

The section ``solver-stages`` of bench/RESULTS.md is rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SIZES = (20, 1000)
REPS = {20: 200, 1000: 12}
STAGES = ("input checks", "linear solve", "refinement", "diagnostics", "hold-out", "rest")
# stage -> (module, attribute) pairs to wrap: the stage functions where their callers look them up.
_WRAP = {
    "input checks": [("_pose_solve", "_prepare"), ("calibrate", "_prepare"), ("_pose_solve", "_input_checks"),
                     ("calibrate", "_input_checks")],
    "linear solve": [("_pose_solve", "_absolute_linear"), ("calibrate", "_absolute_linear")],
    "refinement": [("refine", "refine")],
    "diagnostics": [("diagnostics", "assess")],
    "hold-out": [("_pose_solve", "_holdout")],
}


def _use_tree(src: str) -> None:
    """Map ``cellcal.solver`` onto ``src/solver`` before anything imports it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cellcal.solver", os.path.join(src, "solver", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(src, "solver")])
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["cellcal.solver"] = mod
    spec.loader.exec_module(mod)


def _median_s(fn, k: int) -> float:
    times = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _child(src: str | None) -> dict:
    if src:
        _use_tree(src)
    import gc
    import importlib

    import cv2
    import numpy as np

    from bench.solver_bench import prep_rwhe  # SHAH's inputs as the solver benchmark builds them
    from cellcal.solver import Workspace, calibrate_base_frame
    from cellcal.solver.synthetic import base_frame_scene

    spent = dict.fromkeys(STAGES, 0.0)
    stack: list[list] = []  # [stage, start, time in nested stages]

    def wrap(stage: str, fn):
        def timed(*a, **kw):
            stack.append([stage, time.perf_counter(), 0.0])
            try:
                return fn(*a, **kw)
            finally:
                st, t0, inner = stack.pop()
                dt = time.perf_counter() - t0
                spent[st] += dt - inner
                if stack:
                    stack[-1][2] += dt
        return timed

    wrapped: dict[int, object] = {}
    for stage, places in _WRAP.items():
        for mod_name, attr in places:
            mod = importlib.import_module(f"cellcal.solver.{mod_name}")
            fn = getattr(mod, attr)
            if id(fn) not in wrapped:
                wrapped[id(fn)] = wrap(stage, fn)
            setattr(mod, attr, wrapped[id(fn)])

    out: dict = {"file": sys.modules["cellcal.solver"].__file__}
    gc.disable()
    for n in SIZES:
        sc = base_frame_scene(n, np.random.default_rng(7), noise_mm=0.02, noise_deg=0.01)
        G, M = sc.base_T_flange, sc.measured
        ws = Workspace(n)
        cv_args = dict(prep_rwhe(G, M), method=cv2.CALIB_ROBOT_WORLD_HAND_EYE_SHAH)
        k = REPS[n]

        def lin(G=G, M=M, ws=ws) -> None:
            calibrate_base_frame(G, M, workspace=ws, refine=False, holdout=False, uncertainty=False)

        def full(G=G, M=M, ws=ws) -> None:
            calibrate_base_frame(G, M, workspace=ws)

        def shah(cv_args=cv_args) -> None:
            cv2.calibrateRobotWorldHandEye(**cv_args)

        for f in (lin, full, shah):
            f()
        t_lin = _median_s(lin, k)
        for s in STAGES:
            spent[s] = 0.0
        total = time.perf_counter()
        t_full = _median_s(full, k)
        total = time.perf_counter() - total
        t_shah = _median_s(shah, k)
        split = dict(spent)
        split["rest"] = total - sum(v for s, v in spent.items() if s != "rest")
        out[str(n)] = {"linear": t_lin, "default": t_full, "shah": t_shah,
                       "split": {s: split[s] / total for s in STAGES}}
    return out


def _old_tree(rev: str) -> str:
    dest = ROOT / "bench" / "_work" / f"solver-{rev}"
    if not (dest / "solver" / "__init__.py").exists():
        dest.mkdir(parents=True, exist_ok=True)
        data = subprocess.run(["git", "archive", rev, "solver"], cwd=ROOT, check=True, capture_output=True).stdout
        tar = dest / "solver.tar"
        tar.write_bytes(data)
        with tarfile.open(tar) as t:
            t.extractall(dest, filter="data")
        tar.unlink()
    return str(dest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default="5073cfe", help="commit whose solver/ is the 'before' (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(_child(args.child or None)))
        return 0
    from bench._results import machine_line, write_section

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "solver"], cwd=ROOT, capture_output=True, text=True).stdout
    trees = [("after", ""), ("before", _old_tree(args.old))]
    got: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, src in (trees if r % 2 == 0 else trees[::-1]):
            # One BLAS thread, as the cellcal command runs the solver (ADR 0033).
            p = subprocess.run([sys.executable, __file__, "--child", src], check=True, capture_output=True, text=True,
                               env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            got[name].append(json.loads(p.stdout))

    def med(name: str, n: int, key: str) -> float:
        return statistics.median(d[str(n)][key] for d in got[name])

    def ratio(name: str, n: int, key: str) -> float:
        # per child (both timed in the same process, back to back), then the median
        return statistics.median(d[str(n)][key] / d[str(n)]["shah"] for d in got[name])

    md = ["## Solver stage profile, before and after issue 28 (`bench/solver_stages.py`)", "", machine_line(),
          f"Trees: *after* = solver/ at {head}{' plus uncommitted changes' if dirty else ''}; *before* = solver/ at "
          f"{args.old} (`git archive`). {args.rounds} rounds, the two trees alternating in child processes; "
          "OpenCV's SHAH timed in every child beside them; one BLAS thread (`OPENBLAS_NUM_THREADS=1`, as the "
          "`cellcal` command runs, ADR 0033).", "",
          "**How to read.** Median wall time of one call (ms) with a warmed-up `Workspace(N)`; *x SHAH* is "
          "the median over children of ours / SHAH measured in the same process. Issue 28's targets: linear "
          "call at most 0.5x SHAH at N = 20 and 0.1x at N = 1,000; default call at most 2.0x at N = 20 "
          "(1.5x the aim) and 0.25x at N = 1,000.", "",
          "| N | call | before ms | before x SHAH | after ms | after x SHAH | target | met |",
          "|---:|---|---:|---:|---:|---:|---:|---|"]
    targets = {(20, "linear"): 0.5, (1000, "linear"): 0.1, (20, "default"): 2.0, (1000, "default"): 0.25}
    for n in SIZES:
        for key in ("linear", "default"):
            after = ratio("after", n, key)
            md.append(f"| {n:,} | {key} | {1e3 * med('before', n, key):.3f} | {ratio('before', n, key):.2f} | "
                      f"{1e3 * med('after', n, key):.3f} | {after:.2f} | {targets[(n, key)]:g} | "
                      f"{'yes' if after <= targets[(n, key)] else 'NO'} |")
        md.append(f"| {n:,} | SHAH | {1e3 * med('before', n, 'shah'):.3f} | 1 | {1e3 * med('after', n, 'shah'):.3f} "
                  "| 1 | | |")
    md += ["", "Stage split of the default call (share of its wall time, median over children):", "",
           "| stage | " + " | ".join(f"N = {n:,} before | N = {n:,} after" for n in SIZES) + " |",
           "|---|" + "---:|" * (2 * len(SIZES))]
    for s in STAGES:
        cells = []
        for n in SIZES:
            for name in ("before", "after"):
                cells.append(f"{100 * statistics.median(d[str(n)]['split'][s] for d in got[name]):.0f} %")
        md.append(f"| {s} | " + " | ".join(cells) + " |")
    text = "\n".join(md) + "\n"
    print(text)
    if not args.no_write:
        write_section("solver-stages", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
