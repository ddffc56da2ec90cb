"""Leave-one-out closure solve: the LAPACK-chunk route against the batched elimination.

``solver/validation.py::loo_linearised`` solves ``(I - P_i) b_i = e_i`` for every station
(r = 6 for poses, 3 for points). The old route is ``np.linalg.solve`` on chunks of
``LOO_CHUNK`` stations with an elimination fallback for an exactly singular chunk (copied
below as it was, so the comparison survives later edits of the module); the new one is
``validation._ldl_solve``, one batched LDL^T elimination over all N stations in the
workspace's buffers, and ``validation._loo_solve`` the dispatch the solver uses (LAPACK below
``validation.LOO_BATCHED_MIN`` stations, the elimination from there on).

The systems are ``I - Q diag(lev) Q^T`` with leverages in [0, 0.6) and random residuals
(seeded). Every timed call first restores the overwritten stack from a pristine copy into a
preallocated buffer; that copy is the same in every route and is timed alone as well.

Also the default call ``calibrate_base_frame(G, M, workspace=ws)`` (a warmed-up
``Workspace(N)``, ``refine``, ``holdout`` and ``uncertainty`` at their defaults) at N = 20 and
1,000 on ``cellcal.solver.synthetic.base_frame_scene`` stations.

Timing: one process, GC off, one warm-up call each, then rounds in which every route runs
once in turn (interleaved, so background load hits them alike); the median per route is
reported. Prints a markdown table with machine, date and load average; writes nothing.

Run: ``.venv/bin/python bench/loo_bench.py [--rounds 41] [--default-only] [--ns 20,100,1000,10000]``
(``--ns``: the station counts of the solve table, e.g. around the crossover).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench._common import git_state  # noqa: E402
from bench._results import machine_line  # noqa: E402
from cellcal.solver import Workspace, calibrate_base_frame  # noqa: E402
from cellcal.solver import validation as V  # noqa: E402
from cellcal.solver.synthetic import base_frame_scene  # noqa: E402

# --- the old route: LAPACK in chunks (with its elimination fallback), which validation.py keeps
# for fits below LOO_BATCHED_MIN stations, unchanged ------------------------------------------

old_route = V._chunked_solve


# --- inputs --------------------------------------------------------------------------------


def systems(n: int, r: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(n, r, r)))
    lev = rng.uniform(0.0, 0.6, size=(n, r))
    S = np.eye(r) - np.einsum("nij,nj,nkj->nik", Q, lev, Q)
    return np.ascontiguousarray(S), rng.normal(size=(n, r))


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def _routes(S, S0, e, out, n, r, ws):
    return {
        "copy only": lambda: np.copyto(S, S0),
        "old (LAPACK chunks)": lambda: (np.copyto(S, S0), old_route(S, e, out, n, r, ws)),
        "batched LDL^T": lambda: (np.copyto(S, S0), V._ldl_solve(S, e, out, n, r, ws)),
        "new dispatch": lambda: (np.copyto(S, S0), V._loo_solve(S, e, out, n, r, ws)),
    }


def bench_solves(ns, r, rounds):
    rows = []
    for n in ns:
        S0, e = systems(n, r, seed=n)
        ws = Workspace(n)
        S = ws.L36[: n * r * r].reshape(n, r, r)
        out = ws.b6[: n * r].reshape(n, r)
        routes = _routes(S, S0, e, out, n, r, ws)
        reps = max(1, 2000 // n)  # calls per sample, so a sample is well above the timer's grain
        times: dict[str, list[float]] = {k: [] for k in routes}
        with np.errstate(all="ignore"):
            for f in routes.values():
                f()
            for _ in range(rounds):
                for k, f in routes.items():
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        f()
                    times[k].append((time.perf_counter() - t0) / reps)
        # The two routes agree (a sanity check of the benchmark, not a test).
        np.copyto(S, S0)
        old_route(S, e, out, n, r, ws)
        ref = out.copy()
        np.copyto(S, S0)
        V._ldl_solve(S, e, out, n, r, ws)
        dev = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        rows.append((n, {k: _median_ms(v) for k, v in times.items()}, dev))
    return rows


def bench_default(ns, rounds):
    cases = {}
    for n in ns:
        sc = base_frame_scene(n, np.random.default_rng(n), noise_mm=0.02, noise_deg=0.01)
        ws = Workspace(n)
        cases[n] = (sc, ws)
        calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)
    times: dict[int, list[float]] = {n: [] for n in ns}
    for _ in range(rounds):
        for n, (sc, ws) in cases.items():
            t0 = time.perf_counter()
            calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)
            times[n].append(time.perf_counter() - t0)
    return {n: _median_ms(v) for n, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--default-only", action="store_true", help="only the default call")
    ap.add_argument("--ns", default="20,100,1000,10000", help="station counts of the solve table")
    args = ap.parse_args()
    gc.disable()
    print(f"{machine_line()}\n{git_state()}; numpy {np.__version__}; {args.rounds} interleaved rounds.\n")
    if not args.default_only:
        print(f"Batched threshold in the solver: LOO_BATCHED_MIN = {V.LOO_BATCHED_MIN}.\n")
        for r in (6, 3):
            rows = bench_solves([int(x) for x in args.ns.split(",")], r, args.rounds)
            print(f"### Leave-one-out solve, r = {r}: median ms per call (incl. restoring S)\n")
            print("| N | copy only | old (LAPACK chunks) | batched LDL^T | new dispatch | old / new | max rel. dev. |")
            print("|---:|---:|---:|---:|---:|---:|---:|")
            for n, t, dev in rows:
                print(f"| {n:,} | {t['copy only']:.4f} | {t['old (LAPACK chunks)']:.4f} | {t['batched LDL^T']:.4f} "
                      f"| {t['new dispatch']:.4f} | {t['old (LAPACK chunks)'] / t['new dispatch']:.2f} | {dev:.1e} |")
            print()
    d = bench_default((20, 1000), args.rounds)
    print("### Default call `calibrate_base_frame(G, M, workspace=ws)`: median ms\n")
    print("| N | ms |\n|---:|---:|")
    for n, t in d.items():
        print(f"| {n:,} | {t:.3f} |")
    print(f"\n{machine_line()}")


if __name__ == "__main__":
    main()
