"""Accuracy benchmark: the refined base-frame calibration against OpenCV.

Run ``cd /work/main && .venv/bin/python bench/accuracy_bench.py``. It

1. verifies the OpenCV argument mappings at zero noise (aborts if any error >= 1e-6),
2. measures the median and P90 error of ``cell_T_base`` over seeded trials at N = 10, 20,
   50 and two tracker-like noise levels, for our linear and refined answers and for every
   OpenCV method (``calibrateHandEye`` x5, ``calibrateRobotWorldHandEye`` SHAH and LI),
   plus how well our reported uncertainty describes our errors (mean NEES, 6 expected),
3. times the refinement at N = 20 (median wall time, interleaved rounds),

and writes the ``accuracy`` section of ``bench/RESULTS.md`` (also printed).

OpenCV mapping (ADR 0001; ``a2b`` in OpenCV means ``b_T_a``), with
``G_i = base_T_flange`` and ``M_i = cell_T_target``:

* ``calibrateRobotWorldHandEye(R/t_world2cam = inv(M_i), R/t_base2gripper = inv(G_i))``
  returns ``base2world = cell_T_base``;
* ``calibrateHandEye(R/t_gripper2base = inv(M_i), R/t_target2cam = G_i)`` returns
  ``cam2gripper = cell_T_base``.

``method=`` is always passed by keyword (positionally it lands in an output slot).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from bench._common import git_state, inv_stack, pose_error  # noqa: E402
from bench._results import machine_line, write_section  # noqa: E402

try:
    import cv2  # noqa: E402
except ImportError:  # pragma: no cover - environment problem, not a result
    sys.exit("accuracy_bench: OpenCV is missing: pip install 'opencv-python-headless<5' (extra 'bench')")

from cellcal.solver import Workspace, calibrate_base_frame  # noqa: E402
from cellcal.solver.se3 import se3_inverse, se3_log  # noqa: E402
from cellcal.solver.synthetic import base_frame_scene  # noqa: E402

for _fn in ("calibrateHandEye", "calibrateRobotWorldHandEye"):
    if not hasattr(cv2, _fn):
        sys.exit(f"accuracy_bench: cv2 {cv2.__version__} does not bind {_fn}: install 'opencv-python-headless<5'")

ACC_N = (10, 20, 50)
TRIALS = {10: 100, 20: 200, 50: 100}
NOISES = ((0.02, 0.01), (0.2, 0.1))  # (mm, deg) 1-sigma per axis
TARGET_N, TARGET_NOISE = 20, (0.2, 0.1)
TARGET_RATIO = 0.2
TARGET_REFINE_MS = 2.0
#: A second scene for the target row: the same cell with the flange tilted at most 20 deg
#: (the default scene tilts up to 60 deg). Small relative rotations are where linear
#: AX=XB methods lose most (their translation comes from (R_A - I) t_X = ..., which
#: amplifies the tracker's orientation noise by the 2 m lever arm).
NARROW_TILT_DEG = 20.0
TIME_N = 20
TIME_ROUNDS = 15
TIME_REPS = 60
SEED = 7_000_007
ZERO_NOISE_TOL = 1e-6

RWHE = {"SHAH": cv2.CALIB_ROBOT_WORLD_HAND_EYE_SHAH, "LI": cv2.CALIB_ROBOT_WORLD_HAND_EYE_LI}
HE = {
    "TSAI": cv2.CALIB_HAND_EYE_TSAI,
    "PARK": cv2.CALIB_HAND_EYE_PARK,
    "HORAUD": cv2.CALIB_HAND_EYE_HORAUD,
    "ANDREFF": cv2.CALIB_HAND_EYE_ANDREFF,
    "DANIILIDIS": cv2.CALIB_HAND_EYE_DANIILIDIS,
}
OURS = ("ours linear", "ours refined")
OPENCV = tuple(f"OpenCV RWHE {k}" for k in RWHE) + tuple(f"OpenCV HE {k}" for k in HE)
ROWS = OURS + OPENCV


# --- helpers --------------------------------------------------------------------------------------


def opencv_solutions(G: np.ndarray, M: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{row name: (R, t)}`` of ``cell_T_base`` from every OpenCV method."""
    Mi, Gi = inv_stack(M), inv_stack(G)
    out = {}
    for name, m in RWHE.items():
        R, t, _, _ = cv2.calibrateRobotWorldHandEye(
            R_world2cam=list(Mi[:, :3, :3]), t_world2cam=list(Mi[:, :3, 3:4]),
            R_base2gripper=list(Gi[:, :3, :3]), t_base2gripper=list(Gi[:, :3, 3:4]), method=m)
        out[f"OpenCV RWHE {name}"] = (R, t.ravel())
    for name, m in HE.items():
        R, t = cv2.calibrateHandEye(
            R_gripper2base=list(Mi[:, :3, :3]), t_gripper2base=list(Mi[:, :3, 3:4]),
            R_target2cam=list(G[:, :3, :3]), t_target2cam=list(G[:, :3, 3:4]), method=m)
        out[f"OpenCV HE {name}"] = (R, t.ravel())
    return out


def fmt(x: float) -> str:
    if not math.isfinite(x):
        return "inf"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 0.01:
        return f"{x:.4g}" if abs(x) < 1 else f"{x:.3g}"
    return f"{x:.2e}"


# --- 1. mapping check --------------------------------------------------------------------------------


def zero_noise_check() -> float:
    worst = 0.0
    for n in (5, 20):
        sc = base_frame_scene(n, np.random.default_rng(SEED + n))
        G, M = sc.base_T_flange, sc.measured
        sols = opencv_solutions(G, M)
        for kw in (dict(refine=False, holdout=False), {}):
            T = calibrate_base_frame(G, M, **kw).cell_T_base
            sols[f"ours {kw}"] = (T[:3, :3], T[:3, 3])
        for name, (R, t) in sols.items():
            ang, tmm = pose_error(R, t, sc.X)
            err = max(math.radians(ang), tmm * 1e-3)
            if not err < ZERO_NOISE_TOL:
                sys.exit(f"accuracy_bench: zero-noise mapping check failed for {name} at N={n}: {err:.3g}")
            worst = max(worst, err)
    return worst


# --- 2. accuracy --------------------------------------------------------------------------------------


def accuracy(n: int, noise: tuple[float, float], max_tilt_deg: float = 60.0) -> tuple[dict, dict]:
    """Per-row arrays of (rot deg, trans mm) errors over the trials, and our extra figures."""
    errs = {r: [] for r in ROWS}
    nees, ho_p90, sig_t = [], [], []
    ws = Workspace(n)
    rng = np.random.default_rng(SEED + 1000 * n + int(noise[0] * 1000) + int(max_tilt_deg))
    for _ in range(TRIALS[n]):
        sc = base_frame_scene(n, rng, noise_mm=noise[0], noise_deg=noise[1], max_tilt_deg=max_tilt_deg)
        G, M = sc.base_T_flange, sc.measured
        lin = calibrate_base_frame(G, M, workspace=ws, refine=False, holdout=False)
        errs["ours linear"].append(pose_error(lin.cell_T_base[:3, :3], lin.cell_T_base[:3, 3], sc.X))
        ref = calibrate_base_frame(G, M, workspace=ws)  # the default call: refined, held-out closure
        errs["ours refined"].append(pose_error(ref.cell_T_base[:3, :3], ref.cell_T_base[:3, 3], sc.X))
        d = se3_log(se3_inverse(sc.X) @ ref.cell_T_base)
        nees.append(float(d @ np.linalg.solve(ref.cell_T_base_covariance, d)))
        ho_p90.append(ref.holdout.p90_translation_m * 1e3)
        sig_t.append(ref.sigma_translation_mm)
        for name, (R, t) in opencv_solutions(G, M).items():
            errs[name].append(pose_error(R, t, sc.X))
    extra = dict(nees=float(np.mean(nees)), ho_p90_mm=float(np.median(ho_p90)), sigma_mm=float(np.median(sig_t)))
    return {k: np.array(v) for k, v in errs.items()}, extra


# --- 3. timing ------------------------------------------------------------------------------------------


def timing() -> dict[str, float]:
    sc = base_frame_scene(TIME_N, np.random.default_rng(SEED), noise_mm=0.2, noise_deg=0.1)
    G, M = sc.base_T_flange, sc.measured
    ws = Workspace(TIME_N)
    calls = {
        "linear (refine=False, holdout=False)": lambda: calibrate_base_frame(G, M, workspace=ws, refine=False, holdout=False),
        "refined, noise estimated (holdout=False)": lambda: calibrate_base_frame(G, M, workspace=ws, holdout=False),
        "refined, noise given (holdout=False)": lambda: calibrate_base_frame(
            G, M, workspace=ws, holdout=False, noise_translation_m=2e-4, noise_rotation_rad=math.radians(0.1)),
        "default call (refined + held-out closure)": lambda: calibrate_base_frame(G, M, workspace=ws),
        "linear + k-fold closure (refine=False)": lambda: calibrate_base_frame(G, M, workspace=ws, refine=False),
    }
    times = {k: [] for k in calls}
    for f in calls.values():
        f()
    gc.collect()
    gc.disable()
    try:
        for _ in range(TIME_ROUNDS):
            for k, f in calls.items():
                t0 = time.perf_counter()
                for _ in range(TIME_REPS):
                    f()
                times[k].append((time.perf_counter() - t0) / TIME_REPS)
    finally:
        gc.enable()
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


# --- report ----------------------------------------------------------------------------------------------


def load() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main() -> None:
    t_start = time.perf_counter()
    load_start = load()
    worst = zero_noise_check()
    results = {}
    for n in ACC_N:
        for noise in NOISES:
            results[(n, noise)] = accuracy(n, noise)
            print(f"accuracy N={n} noise={noise} done", file=sys.stderr)
    narrow = {noise: accuracy(TARGET_N, noise, NARROW_TILT_DEG) for noise in NOISES}
    tm = timing()
    lin_ms = tm["linear (refine=False, holdout=False)"]
    ref_ms = tm["refined, noise estimated (holdout=False)"] - lin_ms
    ref_given_ms = tm["refined, noise given (holdout=False)"] - lin_ms

    out = ["## Accuracy: refined calibration vs OpenCV (`bench/accuracy_bench.py`)", ""]
    out.append(machine_line())
    out.append(f"OpenCV {cv2.__version__}, numpy {np.__version__}; cellcal {git_state()}; whole run "
               f"{time.perf_counter() - t_start:.0f} s; load average 1/5/15 min {load_start} at start, "
               f"{load()} at end (other jobs share this 2-core machine: absolute times are noisy, "
               f"the rows of the timing table are interleaved so they see the same load).")
    out.append("")
    out.append(
        "**How to read.** Base frame (`cell_T_base`) from `cellcal.solver.synthetic.base_frame_scene` "
        "(base 2 m from the tracker, flange in a 0.4 m box, tilts up to 60 deg), tracker noise per axis "
        "(translation mm, rotation deg, 1-sigma). Every row sees the same stations in each trial. "
        "*ours linear* = `calibrate_base_frame(..., refine=False, holdout=False)`; *ours refined* = the "
        "plain default call (maximum-likelihood refinement with the noise estimated from the data, ADR "
        "0004). Errors: angle of `R_est^T R_true` (deg) and `|t_est - t_true|` (mm), median and P90 over "
        "the trials. RWHE = `calibrateRobotWorldHandEye`, HE = `calibrateHandEye`; **bold** = best "
        "OpenCV figure in the column. OpenCV mapping in the script's docstring.")
    out.append("")
    out.append(f"Zero-noise mapping check passed (N = 5, 20; every OpenCV method and ours): worst error "
               f"{worst:.1e} (bound {ZERO_NOISE_TOL:g}).")
    out.append("")

    # targets
    def target_row(errs: dict, label: str) -> str:
        med_t = {k: float(np.median(v[:, 1])) for k, v in errs.items()}
        best_cv = min(OPENCV, key=lambda k: med_t[k])
        ratio = med_t["ours refined"] / med_t[best_cv]
        return (
            f"| translation error, N={TARGET_N}, {TARGET_NOISE[1]} deg / {TARGET_NOISE[0]} mm, {label}: ours "
            f"refined / best OpenCV (median) | <= {TARGET_RATIO} | {ratio:.3f} ({fmt(med_t['ours refined'])} vs "
            f"{fmt(med_t[best_cv])} mm, {best_cv.replace('OpenCV ', '')}; ours linear "
            f"{fmt(med_t['ours linear'])} mm) | {'yes' if ratio <= TARGET_RATIO else 'NO'} |")

    out.append("### Targets (refinement, ADR 0004)")
    out.append("")
    out.append("| target | required | measured | met |")
    out.append("|---|---|---|---|")
    out.append(target_row(results[(TARGET_N, TARGET_NOISE)][0], "default scene (tilts <= 60 deg)"))
    out.append(target_row(narrow[TARGET_NOISE][0], f"narrow scene (tilts <= {NARROW_TILT_DEG:g} deg)"))
    out.append(
        f"| refinement time, N={TIME_N} (refined minus linear, noise estimated) | < {TARGET_REFINE_MS} ms | "
        f"{ref_ms:.3f} ms (noise given: {ref_given_ms:.3f} ms) | {'yes' if ref_ms < TARGET_REFINE_MS else 'NO'} |")
    out.append("")
    out.append(
        "The refined answer is statistically efficient: `tests/test_efficiency.py` finds its mean squared "
        "error at 0.96-0.98x the Cramer-Rao bound of this measurement model (600 Monte Carlo trials, "
        "bound built by finite differences), so no unbiased estimator can do better on the same stations. "
        "How far that bound lies below the linear methods depends on the geometry, not on the solver: "
        "with large flange rotations (default scene) the linear methods are already within ~3.5x of it, "
        "with small rotations they lose more and the 0.2x ratio is reached. The issue's figures (OpenCV "
        "~1.7 mm, ML ~0.25 mm) came from a scene we do not have; both scenes here are "
        "`base_frame_scene` with only `max_tilt_deg` changed.")
    out.append("")
    ne = narrow[TARGET_NOISE][0]
    out.append(f"Narrow scene, N = {TARGET_N}, {TRIALS[TARGET_N]} trials per noise level (translation mm, median / P90):")
    out.append("")
    out.append("| solver | " + " | ".join(f"@ {deg} deg, {mm} mm" for mm, deg in NOISES) + " |")
    out.append("|---|" + "---:|" * len(NOISES))
    for row in ROWS:
        cells = []
        for noise in NOISES:
            e = narrow[noise][0][row][:, 1]
            cells.append(f"{fmt(float(np.median(e)))} / {fmt(float(np.percentile(e, 90)))}")
        out.append(f"| {row} | " + " | ".join(cells) + " |")
    del ne
    out.append("")

    # accuracy tables
    for n in ACC_N:
        out.append(f"### N = {n} ({TRIALS[n]} seeded trials per noise level)")
        out.append("")
        hdr = "| solver |"
        sep = "|---|"
        for mm, deg in NOISES:
            hdr += f" trans mm median / P90 @ {deg} deg, {mm} mm | rot deg median / P90 @ {deg} deg, {mm} mm |"
            sep += "---:|---:|"
        out.append(hdr)
        out.append(sep)
        best = {}
        for noise in NOISES:
            e, _ = results[(n, noise)]
            for col, j in (("t", 1), ("r", 0)):
                best[(noise, col)] = min(float(np.median(e[k][:, j])) for k in OPENCV)
        for row in ROWS:
            line = f"| {row} |"
            for noise in NOISES:
                e, _ = results[(n, noise)]
                for col, j in (("t", 1), ("r", 0)):
                    med, p90 = float(np.median(e[row][:, j])), float(np.percentile(e[row][:, j], 90))
                    m = fmt(med)
                    if row in OPENCV and med == best[(noise, col)]:
                        m = f"**{m}**"
                    line += f" {m} / {fmt(p90)} |"
            out.append(line)
        out.append("")
        ex = "; ".join(
            f"{deg} deg / {mm} mm: mean NEES {results[(n, (mm, deg))][1]['nees']:.2f}, reported 1-sigma "
            f"{fmt(results[(n, (mm, deg))][1]['sigma_mm'])} mm (median), held-out P90 closure "
            f"{fmt(results[(n, (mm, deg))][1]['ho_p90_mm'])} mm (median)"
            for mm, deg in NOISES)
        out.append(f"Ours refined, uncertainty check (NEES of `cell_T_base` under its reported covariance; 6 "
                   f"when the covariance is right): {ex}.")
        out.append("")

    out.append(f"### Time per call at N = {TIME_N} (median of {TIME_ROUNDS} interleaved rounds x {TIME_REPS} calls, "
               "warmed-up Workspace)")
    out.append("")
    out.append("| call | ms |")
    out.append("|---|---:|")
    for k, v in tm.items():
        out.append(f"| {k} | {v:.3f} |")
    out.append("")
    out.append(
        "The refinement costs the difference between the refined and the linear rows. With the noise "
        "estimated (the default) the variance-component rounds add evaluations; given noise skips them. "
        "The held-out closure of a refined fit is the linearised leave-one-out (one batch of 6x6 solves); "
        "for a linear answer it is 10 refits of the linear solve, hence the last row. The speed "
        "benchmark of the linear solve (`bench/solver_bench.py`) calls `refine=False, holdout=False`.")
    text = "\n".join(out)
    print(text)
    write_section("accuracy", text)


if __name__ == "__main__":
    main()
