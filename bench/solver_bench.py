"""Solver benchmark: cellcal's base-frame solve against OpenCV, on the same synthetic data.

Run ``cd /work/main && .venv/bin/python bench/solver_bench.py`` (or ``make bench``). It

1. verifies the OpenCV argument mappings at zero noise (aborts if any error >= 1e-6),
2. times a solve (median wall time) for N = 5, 20, 100, 1,000, 10,000,
3. measures the median rotation / translation error of ``cell_T_base`` over seeded trials at
   two tracker-like noise levels, for every variant of ours and every OpenCV method,
4. measures the ``tracemalloc`` peak of one warmed-up solve at N = 10 and N = 5,000,

and writes the ``solver`` section of ``bench/RESULTS.md`` (also printed to stdout).

OpenCV mapping (ADR 0001; ``a2b`` in OpenCV means ``b_T_a``), with ``G_i =
base_T_flange`` and ``M_i = cell_T_target``:

* ``calibrateRobotWorldHandEye(world2cam = inv(M_i), base2gripper = inv(G_i))`` returns
  ``base2world = cell_T_base`` (and ``gripper2cam = inv(flange_T_target)``);
* ``calibrateHandEye(gripper2base = inv(M_i), target2cam = G_i)`` returns
  ``cam2gripper = cell_T_base``.

``method=`` is always passed by keyword: positionally it lands in an output slot and TSAI
runs silently.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import sys
import time
import tracemalloc
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from cellcal.daemon.blas import prefer_one_blas_thread  # noqa: E402

# Before numpy loads: one BLAS thread, as the cellcal command runs the solver (ADR 0033).
prefer_one_blas_thread()

import numpy as np  # noqa: E402

from bench._common import git_state, inv_stack, pose_error  # noqa: E402
from bench._results import machine_line, write_section  # noqa: E402

try:
    import cv2  # noqa: E402
except ImportError:  # pragma: no cover - environment problem, not a result
    sys.exit("solver_bench: OpenCV is missing: pip install 'opencv-python-headless<5' (extra 'bench')")

from cellcal.solver import Workspace, _core, calibrate_base_frame  # noqa: E402
from cellcal.solver.options import SolverOptions  # noqa: E402
from cellcal.solver.synthetic import base_frame_scene  # noqa: E402

for _fn in ("calibrateHandEye", "calibrateRobotWorldHandEye"):
    if not hasattr(cv2, _fn):
        sys.exit(
            f"solver_bench: cv2 {cv2.__version__} does not bind {_fn} "
            "(opencv-python-headless 5.x drops it): install 'opencv-python-headless<5'"
        )

# --- configuration --------------------------------------------------------------------------------

SPEED_N = (5, 20, 100, 1000, 10000)
HAND_EYE_MAX_N = 1000  # calibrateHandEye builds all N(N-1)/2 pairs: skipped above this
HAND_EYE_BIG_REPS = 1  # timed calls of calibrateHandEye at N = HAND_EYE_MAX_N (seconds each)
TIME_BUDGET_S = 0.6  # wall time spent per (solver, N) timing cell
MIN_REPS, MAX_REPS = 10, 3000
ROUNDS = 10  # timing rounds, interleaving every solver at one N
ACC_N = (10, 20, 50)
ACC_TRIALS = {10: 100, 20: 200, 50: 100}
NOISES = ((0.02, 0.01), (0.2, 0.1))  # (mm, deg) 1-sigma per axis
ALLOC_N = (10, 5000)
ZERO_NOISE_TOL = 1e-6
SEED = 20240613

RWHE_METHODS = {
    "SHAH": cv2.CALIB_ROBOT_WORLD_HAND_EYE_SHAH,
    "LI": cv2.CALIB_ROBOT_WORLD_HAND_EYE_LI,
}
HE_METHODS = {
    "TSAI": cv2.CALIB_HAND_EYE_TSAI,
    "PARK": cv2.CALIB_HAND_EYE_PARK,
    "HORAUD": cv2.CALIB_HAND_EYE_HORAUD,
    "ANDREFF": cv2.CALIB_HAND_EYE_ANDREFF,
    "DANIILIDIS": cv2.CALIB_HAND_EYE_DANIILIDIS,
}

# --- our solver's calling convention --------------------------------------------------------------

#: The options every calibrate function takes (as ``options=`` or as keywords) and their
#: defaults: the fields of :class:`cellcal.solver.options.SolverOptions`.
_PARAMS = {f.name: f for f in dataclasses.fields(SolverOptions)}
#: Keywords that switch ours to the linear solve, for those that exist in this checkout.
LINEAR_KW = {k: False for k in ("refine", "holdout", "uncertainty") if k in _PARAMS}
#: True if a plain call is not the linear solve (some switch exists and does not default off).
DEFAULT_DIFFERS = any(_PARAMS[k].default is not False for k in LINEAR_KW)
_LINEAR_KW_TEXT = ", ".join(f"{k}=False" for k in LINEAR_KW)
DEFAULT_PAIRS = _PARAMS["pairs"].default if "pairs" in _PARAMS else "ring"
DEFAULT_TRANSLATION = _PARAMS["translation"].default if "translation" in _PARAMS else "stations"
#: The brief's three schemes plus any others this checkout accepts (e.g. "all"), default first.
_SCHEMES = tuple(getattr(_core, "PAIR_SCHEMES", ())) + ("ring", "consecutive", "star")
PAIRS = tuple(dict.fromkeys((DEFAULT_PAIRS,) + _SCHEMES))
TRANSLATIONS = tuple(dict.fromkeys((DEFAULT_TRANSLATION, "stations", "pairs")))
DEFAULTS_LABEL = f"ours linear, {DEFAULT_PAIRS}, {DEFAULT_TRANSLATION} (defaults)"


# --- helpers -----------------------------------------------------------------------------------


def prep_rwhe(G: np.ndarray, M: np.ndarray) -> dict:
    """Arguments of calibrateRobotWorldHandEye for the base frame (what a user must build)."""
    Mi, Gi = inv_stack(M), inv_stack(G)
    return dict(
        R_world2cam=list(Mi[:, :3, :3]), t_world2cam=list(Mi[:, :3, 3:4]),
        R_base2gripper=list(Gi[:, :3, :3]), t_base2gripper=list(Gi[:, :3, 3:4]),
    )


def prep_he(G: np.ndarray, M: np.ndarray) -> dict:
    """Arguments of calibrateHandEye for the base frame (what a user must build)."""
    Mi = inv_stack(M)
    return dict(
        R_gripper2base=list(Mi[:, :3, :3]), t_gripper2base=list(Mi[:, :3, 3:4]),
        R_target2cam=list(G[:, :3, :3]), t_target2cam=list(G[:, :3, 3:4]),
    )


def run_rwhe(G, M, method: int):
    """Full user cost: build the inputs, solve; returns (R, t) of cell_T_base."""
    out = cv2.calibrateRobotWorldHandEye(**prep_rwhe(G, M), method=method)
    return out[0], out[1].ravel(), out


def run_he(G, M, method: int):
    R, t = cv2.calibrateHandEye(**prep_he(G, M), method=method)
    return R, t.ravel()


def run_ours(G, M, ws, kw: dict, pairs: str | None = None, translation: str | None = None):
    """Our solve; ``pairs``/``translation`` are passed only when given (else the defaults)."""
    if pairs is not None:
        kw = {**kw, "pairs": pairs}
    if translation is not None:
        kw = {**kw, "translation": translation}
    r = calibrate_base_frame(G, M, workspace=ws, **kw)
    T = r.cell_T_base
    return T[:3, :3], T[:3, 3]


def median_time(fn, *, reps: int | None = None, warm: bool = True) -> tuple[float, int]:
    """Median wall time of ``fn()`` (s) and the number of timed calls; GC off while timing."""
    if warm:
        fn()
    gc.collect()
    gc.disable()
    try:
        if reps is None:
            t0 = time.perf_counter()
            fn()
            single = time.perf_counter() - t0
            reps = int(min(MAX_REPS, max(MIN_REPS, TIME_BUDGET_S / max(single, 1e-7))))
        times = np.empty(reps)
        for i in range(reps):
            t0 = time.perf_counter()
            fn()
            times[i] = time.perf_counter() - t0
    finally:
        gc.enable()
    return float(np.median(times)), reps


def time_interleaved(fns: dict, rounds: int = ROUNDS) -> dict:
    """Median wall time (s) and timed calls of each ``fn``, interleaved in ``rounds`` rounds.

    Every solver's calls are spread over the same rounds, so a burst of load from other
    processes hits all of them alike instead of one cell of the table.
    """
    per = {}
    for label, fn in fns.items():
        fn()  # warm-up
        t0 = time.perf_counter()
        fn()
        single = time.perf_counter() - t0
        total = int(min(MAX_REPS, max(MIN_REPS, TIME_BUDGET_S / max(single, 1e-7))))
        per[label] = max(1, -(-total // rounds))
    times: dict[str, list[float]] = {label: [] for label in fns}
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for label, fn in fns.items():
                acc = times[label]
                for _ in range(per[label]):
                    t0 = time.perf_counter()
                    fn()
                    acc.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return {label: (float(np.median(v)), len(v)) for label, v in times.items()}


def fmt_ms(s: float) -> str:
    ms = s * 1e3
    if ms >= 100:
        return f"{ms:,.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def fmt_err(x: float) -> str:
    if not math.isfinite(x):
        return "fail"
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.2f}"
    if x >= 0.01:
        return f"{x:.4f}"
    return f"{x:.2e}"


def log(msg: str) -> None:
    print(f"[solver_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- 1. zero-noise mapping check ----------------------------------------------------------------


def verify_mappings() -> list[str]:
    lines = []
    worst = {}
    for seed, n in ((SEED, 5), (SEED + 1, 20), (SEED + 2, 100)):
        sc = base_frame_scene(n, np.random.default_rng(seed))
        G, M, X, Y = sc.base_T_flange, sc.measured, sc.X, sc.Y
        Yi = np.linalg.inv(Y)
        checks = []  # (name, R, t, truth)
        ws = Workspace(n)
        checks.append(("ours linear", *run_ours(G, M, ws, LINEAR_KW), X))
        if DEFAULT_DIFFERS:
            checks.append(("ours default", *run_ours(G, M, ws, {}), X))
        for name, meth in RWHE_METHODS.items():
            R, t, out = run_rwhe(G, M, meth)
            checks.append((f"RWHE {name} base2world", R, t, X))
            # gripper2cam must be inv(flange_T_target): checks the whole mapping, not just X.
            checks.append((f"RWHE {name} gripper2cam", out[2], out[3], Yi))
        for name, meth in HE_METHODS.items():
            checks.append((f"HE {name} cam2gripper", *run_he(G, M, meth), X))
        for name, R, t, truth in checks:
            e_deg, e_mm = pose_error(R, t, truth)
            prev = worst.get(name, (0.0, 0.0))
            worst[name] = (max(prev[0], math.radians(e_deg)), max(prev[1], e_mm * 1e-3))
    bad = {k: v for k, v in worst.items() if not (v[0] < ZERO_NOISE_TOL and v[1] < ZERO_NOISE_TOL)}
    if bad:
        msg = "; ".join(f"{k}: {v[0]:.3g} rad, {v[1]:.3g} m" for k, v in bad.items())
        sys.exit(
            "solver_bench: ABORT: zero-noise mapping check failed (errors must be < 1e-6 m / "
            f"1e-6 rad): {msg}. Fix the OpenCV argument mapping before comparing anything."
        )
    w_rad = max(v[0] for v in worst.values())
    w_m = max(v[1] for v in worst.values())
    lines.append(
        f"Zero-noise mapping check passed (N = 5, 20, 100; every solver, plus OpenCV's "
        f"`gripper2cam` = inv(`flange_T_target`)): worst error {w_rad:.1e} rad, {w_m:.1e} m "
        f"(bound {ZERO_NOISE_TOL:g})."
    )
    return lines


# --- 2. speed ------------------------------------------------------------------------------------


def speed() -> tuple[dict, dict]:
    """Returns ({row: {N: median s or None}}, {row: {N: timed calls}})."""
    rows: dict[str, dict[int, float | None]] = {}
    reps: dict[str, dict[int, int]] = {}
    big: dict = {}
    ours_rows = [("ours linear", LINEAR_KW)]
    if DEFAULT_DIFFERS:
        ours_rows.append(("ours default", {}))
        if "refine" in _PARAMS:
            # The linear answer with everything the default reports (covariance, held-out).
            ours_rows.append(("ours linear + covariance + held-out", {"refine": False}))
    for p in PAIRS:
        if p != DEFAULT_PAIRS:
            ours_rows.append((f"ours linear, pairs={p!r}", {**LINEAR_KW, "pairs": p}))
    for n in SPEED_N:
        sc = base_frame_scene(n, np.random.default_rng(SEED + 100 + n), noise_mm=0.02, noise_deg=0.01)
        G, M = sc.base_T_flange, sc.measured
        log(f"speed N={n}")
        fns = {}
        for label, kw in ours_rows:
            ws = Workspace(n)
            run_ours(G, M, ws, kw)  # warm-up: first touch of every buffer
            fns[label] = (lambda ws=ws, kw=kw, G=G, M=M: calibrate_base_frame(G, M, workspace=ws, **kw))
        for name, meth in RWHE_METHODS.items():
            fns[f"OpenCV calibrateRobotWorldHandEye {name}"] = (
                lambda meth=meth, G=G, M=M: cv2.calibrateRobotWorldHandEye(**prep_rwhe(G, M), method=meth))
        for name, meth in HE_METHODS.items():
            label = f"OpenCV calibrateHandEye {name}"

            def f(meth=meth, G=G, M=M):
                return cv2.calibrateHandEye(**prep_he(G, M), method=meth)

            if n > HAND_EYE_MAX_N:
                rows.setdefault(label, {})[n] = None
            elif n == HAND_EYE_MAX_N:
                big[label] = f
            else:
                fns[label] = f
        for label, (m, r) in time_interleaved(fns).items():
            rows.setdefault(label, {})[n] = m
            reps.setdefault(label, {})[n] = r
        for label, f in big.items():
            m, r = median_time(f, reps=HAND_EYE_BIG_REPS, warm=False)
            rows.setdefault(label, {})[n] = m
            reps.setdefault(label, {})[n] = r
        big.clear()
        m, r = median_time(lambda G=G, M=M: prep_rwhe(G, M))
        rows.setdefault("  of which input prep, RWHE (inverses + lists)", {})[n] = m
        m, r = median_time(lambda G=G, M=M: prep_he(G, M))
        rows.setdefault("  of which input prep, calibrateHandEye", {})[n] = m
    return rows, reps


# --- 3. accuracy ---------------------------------------------------------------------------------


def accuracy_methods():
    """[(label, fn(G, M, ws) -> (R, t))] in table order."""
    out = []
    for tr in TRANSLATIONS:
        for p in PAIRS:
            label = f"ours linear, {p}, {tr}"
            if p == DEFAULT_PAIRS and tr == DEFAULT_TRANSLATION:
                label = DEFAULTS_LABEL
            out.append((label, lambda G, M, ws, p=p, tr=tr: run_ours(G, M, ws, LINEAR_KW, p, tr)))
    if DEFAULT_DIFFERS:
        out.append(("ours default call", lambda G, M, ws: run_ours(G, M, ws, {})))
    for name, meth in RWHE_METHODS.items():
        out.append((f"OpenCV RWHE {name}", lambda G, M, ws, meth=meth: run_rwhe(G, M, meth)[:2]))
    for name, meth in HE_METHODS.items():
        out.append((f"OpenCV HE {name}", lambda G, M, ws, meth=meth: run_he(G, M, meth)))
    return out


def accuracy() -> dict:
    """{(n, noise): {label: (median rot deg, median trans mm, rot array, trans array)}}."""
    methods = accuracy_methods()
    res = {}
    failed: set[str] = set()
    for n in ACC_N:
        ws = Workspace(n)
        for k, (mm, deg) in enumerate(NOISES):
            trials = ACC_TRIALS[n]
            log(f"accuracy N={n} noise {deg} deg / {mm} mm, {trials} trials")
            er = {lab: np.empty(trials) for lab, _ in methods}
            et = {lab: np.empty(trials) for lab, _ in methods}
            for i in range(trials):
                rng = np.random.default_rng([SEED, n, k, i])
                sc = base_frame_scene(n, rng, noise_mm=mm, noise_deg=deg)
                for lab, fn in methods:
                    try:
                        R, t = fn(sc.base_T_flange, sc.measured, ws)
                        er[lab][i], et[lab][i] = pose_error(R, t, sc.X)
                    except Exception as exc:  # noqa: BLE001 - a refusal counts as a failure
                        if lab not in failed:
                            log(f"{lab} failed at N={n} trial {i}: {exc!r} (counted as inf)")
                        failed.add(lab)
                        er[lab][i] = et[lab][i] = math.inf
            res[(n, (mm, deg))] = {
                lab: (float(np.median(er[lab])), float(np.median(et[lab])), er[lab], et[lab])
                for lab, _ in methods
            }
    return res


# --- 4. allocation -------------------------------------------------------------------------------


def allocation() -> dict:
    out = {}
    for n in ALLOC_N:
        sc = base_frame_scene(n, np.random.default_rng(SEED + 7), noise_mm=0.02, noise_deg=0.01)
        G, M = sc.base_T_flange, sc.measured
        ws = Workspace(n)
        for _ in range(3):
            calibrate_base_frame(G, M, workspace=ws, **LINEAR_KW)
        gc.collect()
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            r = calibrate_base_frame(G, M, workspace=ws, **LINEAR_KW)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        del r
        ws_bytes = sum(v.nbytes for v in vars(ws).values() if isinstance(v, np.ndarray))
        out[n] = (peak - base, ws_bytes)
    return out


# --- report --------------------------------------------------------------------------------------


def load_caveat(start: float, end: float, cores: int) -> list[str]:
    """A warning paragraph when the timing phase ran on an oversubscribed machine."""
    if max(start, end) <= cores:
        return []
    return [
        f"**Load caveat.** The timing phase ran at a load average of {start:.1f} / {end:.1f} on "
        f"{cores} cores, i.e. oversubscribed. Interleaving spreads the load over every solver, but "
        "not alike: a call shorter than a scheduler time slice (OpenCV at small N) mostly runs "
        "unpreempted, while a longer one (ours default, a few ms) is preempted and waits for the "
        "other runnable processes, so its median is inflated far more. The speed ratios above "
        "are what this run measured and prove nothing either way about the targets; re-run on a "
        "quiet machine (load below the core count) before judging them.",
        "",
    ]


def main() -> None:
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    git0 = git_state()
    log(f"cv2 {cv2.__version__}, numpy {np.__version__}, ours linear kw: {LINEAR_KW or '(none exist)'}")
    try:
        check_lines = verify_mappings()
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - abort with a message, not a bare traceback
        sys.exit(f"solver_bench: ABORT: zero-noise mapping check raised {exc!r}")
    log(check_lines[0])
    load_s0 = os.getloadavg()
    rows, reps = speed()
    load_s1 = os.getloadavg()
    acc = accuracy()
    alloc = allocation()
    load1 = os.getloadavg()
    git1 = git_state()
    elapsed = time.perf_counter() - t_start

    md: list[str] = []
    md.append("## Solver: cellcal vs OpenCV (`bench/solver_bench.py`)")
    md.append("")
    md.append(machine_line())
    md.append(
        f"OpenCV {cv2.__version__} (`opencv-python-headless`, {cv2.getNumThreads()} threads), "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} (ADR 0033), "
        f"numpy {np.__version__}. cellcal: {git0}"
        + ("" if git1 == git0 else f" (by the end of the run: {git1}; the code measured is the one imported at the start)")
        + f". Load average (1 min) {load0[0]:.2f} at start, {load_s0[0]:.2f} / {load_s1[0]:.2f} "
        f"at the start / end of the timing phase, {load1[0]:.2f} at the end; "
        f"whole run {elapsed:.0f} s."
    )
    md.append("")
    md.append("**How to read.** Problem: base frame (`cell_T_base`) from paired robot "
              "(`base_T_flange`) and tracker (`cell_T_target`) stations of "
              "`cellcal.solver.synthetic.base_frame_scene` (base 2 m from the tracker, flange in a "
              "0.4 m box, tilts up to 60 deg). Times are the median wall time of one solve "
              "(`time.perf_counter`, GC off while timing, one warm-up call first; at each N all solvers "
              f"are timed interleaved in {ROUNDS} rounds so background load hits them alike). *ours linear* "
              f"is `calibrate_base_frame(G, M, workspace=ws{', ' + _LINEAR_KW_TEXT if LINEAR_KW else ''})` "
              f"with a warmed-up `Workspace(N)` and the default `pairs={DEFAULT_PAIRS!r}`, "
              f"`translation={DEFAULT_TRANSLATION!r}`; the `pairs=...` rows time the other "
              "motion-pair schemes"
              + ((" (this checkout has no `refine`/`holdout` keywords, so the plain call is the "
                  "linear solve and there is no separate *default* row)") if not LINEAR_KW else
                 ("; *ours default* is the plain call `calibrate_base_frame(G, M, workspace=ws)`, "
                  "i.e. " + ", ".join(f"`{k}={_PARAMS[k].default!r}`" for k in LINEAR_KW)
                  + " (refinement of the linear estimate, held-out closure); *ours linear + covariance + "
                  "held-out* is `refine=False` with the other defaults (the linear answer, its covariance and "
                  "its held-out closure by the linearised leave-one-out update)") if DEFAULT_DIFFERS
                 else "")
              + ". OpenCV's times **include building its inputs** (rigid inverses of the (N,4,4) "
                "stacks and the per-station Python lists), because a user holding (N,4,4) arrays "
                "pays that; the *of which input prep* rows show that part alone. RWHE = "
                "`calibrateRobotWorldHandEye`, HE = `calibrateHandEye`. Errors are medians over "
                "seeded trials of the angle of `R_est^T R_true` (deg) and `|t_est - t_true|` (mm); "
                "all methods see the same stations in each trial. Every OpenCV method is "
                "closed-form (no iterative refinement), so all seven count as \"linear\" for the "
                "accuracy target; **bold** marks the best OpenCV figure in each column.")
    md.append("")
    md.extend(check_lines)
    md.append("")

    # speed table
    md.append("### Speed: median ms per solve")
    md.append("")
    md.append("| solver | " + " | ".join(f"N={n:,}" for n in SPEED_N) + " |")
    md.append("|---|" + "---:|" * len(SPEED_N))
    for label, by_n in rows.items():
        cells = []
        for n in SPEED_N:
            v = by_n.get(n)
            if v is None:
                cells.append("skipped, O(N^2)")
            else:
                cells.append(fmt_ms(v))
        md.append(f"| {label} | " + " | ".join(cells) + " |")
    md.append("")
    rep_parts = []
    for label in rows:
        if label in reps:
            rep_parts.append(f"{label.replace('OpenCV ', '')}: " + "/".join(
                str(reps[label].get(n, "-")) for n in SPEED_N))
    md.append("Timed calls per cell (N=" + "/".join(str(n) for n in SPEED_N) + "): "
              + "; ".join(rep_parts) + f". `calibrateHandEye` at N={HAND_EYE_MAX_N:,} is timed "
              f"{HAND_EYE_BIG_REPS}x (no warm-up: it runs for seconds and allocates ~GBs building "
              f"N(N-1)/2 pairs) and skipped above.")
    md.append("")

    # targets
    shah = rows["OpenCV calibrateRobotWorldHandEye SHAH"]
    md.append("### Targets")
    md.append("")
    md.append("Speed targets of issue 28 (plain numpy, no compiled kernel: ADR 0017): the linear call at most "
              "0.5x SHAH at N=20 and 0.1x at N=1,000; the default call at most 2.0x at N=20 (1.5x the aim) "
              "and 0.25x at N=1,000. `bench/solver_stages.py` gives the default call's stage profile that "
              "explains what is missed.")
    md.append("")
    md.append("| target | required | measured | met |")
    md.append("|---|---|---|---|")
    speed_targets = [("ours linear", "linear call", 20, 0.5), ("ours linear", "linear call", 1000, 0.1)]
    if DEFAULT_DIFFERS:
        speed_targets += [("ours default", "default call", 20, 2.0), ("ours default", "default call", 1000, 0.25)]
    for label, what, n, bound in speed_targets:
        q = rows[label][n] / shah[n]
        md.append(f"| speed, N={n:,}, {what}: ours / SHAH | <= {bound:g} | {q:.2f} ({fmt_ms(rows[label][n])} vs "
                  f"{fmt_ms(shah[n])} ms) | {'yes' if q <= bound else 'NO'} |")
    verdict_rows = [(DEFAULTS_LABEL, "ours (linear, defaults)")]
    if DEFAULT_DIFFERS:
        verdict_rows.append(("ours default call", "ours (default call, refined)"))
    for (n, noise), table in acc.items():
        cv = {k: v for k, v in table.items() if k.startswith("OpenCV")}
        best_r = min(cv, key=lambda k: cv[k][0])
        best_t = min(cv, key=lambda k: cv[k][1])
        for label, name in verdict_rows:
            o = table[label]
            # paired win rate on the same trials
            win_r = float(np.mean(o[2] <= cv[best_r][2]))
            win_t = float(np.mean(o[3] <= cv[best_t][3]))
            ok_r = o[0] <= cv[best_r][0]
            ok_t = o[1] <= cv[best_t][1]
            md.append(
                f"| accuracy, N={n}, {noise[1]} deg / {noise[0]} mm: {name} vs best OpenCV | "
                f"<= best, rotation and translation | rot {fmt_err(o[0])} vs "
                f"{fmt_err(cv[best_r][0])} deg ({best_r.replace('OpenCV ', '')}, ratio "
                f"{o[0] / cv[best_r][0]:.2f}, ours better in {win_r:.0%} of trials); trans "
                f"{fmt_err(o[1])} vs {fmt_err(cv[best_t][1])} mm ({best_t.replace('OpenCV ', '')}, "
                f"ratio {o[1] / cv[best_t][1]:.2f}, ours better in {win_t:.0%}) | "
                f"rot {'yes' if ok_r else 'NO'}, trans {'yes' if ok_t else 'NO'} |"
            )
    if "ours linear + covariance + held-out" in rows:
        ol = rows["ours linear + covariance + held-out"]
        md.append(f"| (no target) linear + covariance + held-out, N=20 / N=1,000: ours / SHAH | - | "
                  f"{ol[20] / shah[20]:.2f} / {ol[1000] / shah[1000]:.2f} | - |")
    a10, a5000 = alloc[ALLOC_N[0]][0], alloc[ALLOC_N[1]][0]
    md.append(f"| allocation: none that grows with N | peak(N=5,000) ~ peak(N=10) | "
              f"{a10:,} B vs {a5000:,} B (growth {a5000 - a10:+,} B) | "
              f"{'yes' if a5000 - a10 < 1024 else 'NO'} |")
    md.append("")

    md.extend(load_caveat(load_s0[0], load_s1[0], os.cpu_count() or 1))
    # accuracy tables
    md.append("\"Best OpenCV\" is the smallest of seven medians per column, picked after the fact, "
              "which favours OpenCV slightly; \"ours better in x% of trials\" compares ours with "
              "that method trial by trial on the same data.")
    md.append("")
    md.append("### Accuracy: median error of `cell_T_base`")
    md.append("")
    for n in ACC_N:
        md.append(f"N={n}, {ACC_TRIALS[n]} seeded trials per noise level (same data for every row).")
        md.append("")
        hdr = []
        for mm, deg in NOISES:
            hdr += [f"rot deg @ {deg} deg/{mm} mm", f"trans mm @ {deg} deg/{mm} mm"]
        md.append("| solver | " + " | ".join(hdr) + " |")
        md.append("|---|" + "---:|" * len(hdr))
        tables = [acc[(n, noise)] for noise in NOISES]
        best = []
        for t in tables:
            cv = {k: v for k, v in t.items() if k.startswith("OpenCV")}
            best.append((min(v[0] for v in cv.values()), min(v[1] for v in cv.values())))
        for lab in tables[0]:
            cells = []
            for t, (br, bt) in zip(tables, best, strict=True):
                r, tr = t[lab][0], t[lab][1]
                cr, ct = fmt_err(r), fmt_err(tr)
                if lab.startswith("OpenCV"):
                    if r == br:
                        cr = f"**{cr}**"
                    if tr == bt:
                        ct = f"**{ct}**"
                cells += [cr, ct]
            md.append(f"| {lab} | " + " | ".join(cells) + " |")
        md.append("")

    # allocation
    md.append("### Allocation: `tracemalloc` peak of one warmed-up solve (ours linear, with workspace)")
    md.append("")
    md.append("| N | traced peak during the solve | preallocated `Workspace(N)` buffers (not part of the solve) |")
    md.append("|---:|---:|---:|")
    for n, (peak, wsb) in alloc.items():
        md.append(f"| {n:,} | {peak:,} B | {wsb:,} B |")
    md.append("")
    md.append("The peak counts what the solve allocates beyond what was live before it (the "
              "result object and small fixed-size temporaries); it must not grow with N. "
              "`tracemalloc` sees only Python/numpy allocations, so OpenCV's C++ heap cannot be "
              "compared this way (~1.7 GB for `calibrateHandEye` at N=1,000, measured when the solver was first benchmarked).")
    md.append("")

    text = "\n".join(md)
    write_section("solver", text)
    print(text)


if __name__ == "__main__":
    main()
