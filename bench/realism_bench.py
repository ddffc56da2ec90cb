"""Realism benchmark: what a base-frame calibration gives on a cell as imperfect as a real one.

Run ``.venv/bin/python bench/realism_bench.py [--trials N] [--no-demo]``. It

1. draws ``--trials`` (default 40) arms with hidden kinematic errors at the magnitudes of
   ``config/demo-scenario.toml`` (ADR 0015: each residual DH parameter Gaussian, its 1-sigma the
   RMS of the demo's values of that kind, joint 1/6 zeros and d1/d6 left out because they are the base and
   tool frames), every other error source as in the demo (factory calibration, sag,
   backlash, warm-up; the beam-coordinate tracker with outliers and refraction drift), and
   takes the demo plan's 20 stations (its generator with the trial's seed) on each, offline
   (``cellcal.sim.offline.OfflineCell``, the simulator's own arm and instrument);
2. solves the base frame with ``cellcal.solver.calibrate_base_frame`` three ways (the noise
   declared as scalar figures, as the daemon does today; declared as each station's full
   covariance, as the daemon is to pass it; estimated, a library caller's default) and
   reports, over the trials: the error of ``cell_T_base`` against the truth
   (median, P90), the residual RMS against the tracker's noise floor (the 3-D RMS of the
   stations' reported stds), the **fraction of the residual that is structured** (with
   ``r`` the per-station residuals and ``r0`` those of the same arm and stations with every
   random noise off: ``|r0|^2 / (|r0|^2 + |r - r0|^2)``), and the honesty of the reported
   uncertainty per noise mode (issue 25's figures: the share inside the 95 % and 3-sigma
   bounds, the reported sigma over the RMS actual error, the same at task points among the
   stations, and the results warned ``model_error`` or ``model_error_untested``);
3. runs ``cellcal demo --json`` once (the real daemon over the real wire on the demo cell)
   and reports its figures;

and writes the ``realism`` section of ``bench/RESULTS.md`` (machine, date, load average).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from bench._results import machine_line, write_section  # noqa: E402
from cellcal.daemon.config import load_config  # noqa: E402
from cellcal.daemon.runs.plan import generate_plan  # noqa: E402
from cellcal.drivers.kinematics import dh_model  # noqa: E402
from cellcal.sim.offline import OfflineCell, arm_trial_scenario  # noqa: E402
from cellcal.sim.scenario import parse_scenario  # noqa: E402
from cellcal.sim.truth import NEES_BOUND_3SIGMA_6DOF  # noqa: E402
from cellcal.solver import calibrate_base_frame  # noqa: E402
from cellcal.solver.se3 import rotation_angle, se3_inverse, se3_log  # noqa: E402

NEES95, NEES999 = 12.59, 22.46  # chi-square 6 dof, 95 % and 99.9 %
DEMO_SCENARIO = _ROOT / "config" / "demo-scenario.toml"
DEMO_CONFIG = _ROOT / "config" / "demo.toml"


def _plan(seed: int):
    p = load_config(DEMO_CONFIG).plan
    return generate_plan(dh_model("ur5e"), n=p.n_stations, box_min_m=np.array(p.workspace_min_m),
                         box_max_m=np.array(p.workspace_max_m), max_tilt_rad=p.max_tilt_rad,
                         home_q_rad=np.array(p.home_q_rad), q_min_rad=np.array(p.joint_min_rad),
                         q_max_rad=np.array(p.joint_max_rad), seed=seed)


MODES = ("declared", "covariance", "estimated")


def _noise(mode: str, sts) -> dict:
    """The noise the solver is told: the daemon's scalar figures today (each station's std with
    the robot's repeatability, RMS over the run), each station's full covariance (what the
    daemon is to pass, ADR 0004), or nothing (a library caller's default)."""
    rep_t, rep_r = 1e-5, math.radians(0.005)
    if mode == "estimated":
        return {}
    if mode == "covariance":
        C = np.zeros((len(sts), 6, 6))
        for i, s in enumerate(sts):
            C[i, :3, :3] = s.sample.cov_m2 + rep_t ** 2 * np.eye(3)
            C[i, 3:, 3:] = np.diag(s.sample.std_rad ** 2) + rep_r ** 2 * np.eye(3)
        return {"cell_T_target_cov": C}
    st = np.array([s.sample.std_m for s in sts])
    sr = np.array([s.sample.std_rad for s in sts])
    return {"noise_translation_m": float(np.sqrt(np.mean(st * st) + rep_t ** 2)),
            "noise_rotation_rad": float(np.sqrt(np.mean(sr * sr) + rep_r ** 2))}


def _stations(scen: dict, plan, average_s: float):
    cell = OfflineCell(parse_scenario(scen))
    sts = [cell.station(ps.q_rad, average_s) for ps in plan]
    return cell, sts


def monte_carlo(trials: int, average_s: float = 0.2) -> dict:
    with open(DEMO_SCENARIO, "rb") as f:
        base = tomllib.load(f)
    rows: dict[str, list] = {m: [] for m in MODES}
    for k in range(trials):
        plan = _plan(k)
        rng_seed = 1000 + k
        noisy = arm_trial_scenario(base, np.random.default_rng(rng_seed), noise=True)
        noisy["seed"] = 7 + k
        clean = arm_trial_scenario(base, np.random.default_rng(rng_seed), noise=False)
        cell, sts = _stations(noisy, plan, average_s)
        _, sts0 = _stations(clean, plan, average_s)
        G = np.array([s.base_T_flange for s in sts])
        M = np.array([s.cell_T_target for s in sts])
        M0 = np.array([s.cell_T_target for s in sts0])
        truth = cell.world.cell_T_base()
        std = np.array([s.sample.std_m for s in sts])
        floor = math.sqrt(float(np.mean(np.sum(std * std, axis=1))))
        c = G[:, :3, 3].mean(axis=0)
        tasks = np.array([c, c + [0.2, 0.0, -0.1], c + [-0.1, 0.2, 0.1]])
        for mode in MODES:
            r = calibrate_base_frame(G, M, **_noise(mode, sts))
            pred = r.cell_T_base @ G @ r.flange_T_target
            resid = M[:, :3, 3] - pred[:, :3, 3]
            resid0 = M0[:, :3, 3] - pred[:, :3, 3]
            structured = float(np.sum(resid0 * resid0))
            random_part = float(np.sum((resid - resid0) ** 2))
            xi = se3_log(se3_inverse(r.cell_T_base) @ truth)
            C = np.asarray(r.cell_T_base_covariance, dtype=float)
            tn, ts2, te2 = [], [], []
            for pb in tasks:
                pc = truth[:3, :3] @ pb + truth[:3, 3]
                pe = r.predicted_error_at(pc)
                e = r.cell_T_base[:3, :3].T @ (pc - r.cell_T_base[:3, 3]) - pb
                tn.append(float(e @ np.linalg.solve(pe.covariance_m2, e)))
                ts2.append(pe.sigma_m ** 2)
                te2.append(float(e @ e))
            warns = [w.code for w in r.warnings]
            rows[mode].append({
                "err_t_mm": float(np.linalg.norm(r.cell_T_base[:3, 3] - truth[:3, 3])) * 1e3,
                "err_r_deg": math.degrees(rotation_angle(truth[:3, :3].T @ r.cell_T_base[:3, :3])),
                "rms_mm": r.rms_translation_m * 1e3, "floor_mm": floor * 1e3,
                "structured": structured / (structured + random_part) if structured + random_part > 0 else 0.0,
                "nees": float(xi @ np.linalg.solve(C, xi)), "sigma_mm": float(r.sigma_translation_mm),
                "e2": float(xi[:3] @ xi[:3]), "tn": tn, "ts2": ts2, "te2": te2,
                "model_error": "model_error" in warns, "untested": "model_error_untested" in warns,
            })
    return {"rows": rows}


def demo_run(timeout_s: float = 600.0) -> dict | None:
    # The demo keeps its state directory for a person to open; a benchmark has no use for it.
    with tempfile.TemporaryDirectory(prefix="cellcal-realism-bench-") as state_dir:
        cmd = [sys.executable, "-m", "cellcal.daemon.cli", "demo", "--json", "--no-drift-check",
               "--state-dir", state_dir]
        try:
            out = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None
    if out.returncode != 0 or not out.stdout.strip():
        print(out.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _q(values, p):
    return float(np.percentile(np.asarray(values, dtype=float), p))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--no-demo", action="store_true", help="skip the end-to-end demo run")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    mc = monte_carlo(args.trials)
    rows = mc["rows"]
    demo = None if args.no_demo else demo_run()
    wall = time.monotonic() - t0
    load1 = os.getloadavg()[0]

    def col(key, mode="declared"):
        return [r[key] for r in rows[mode]]

    def honesty(mode):
        rs = rows[mode]
        nees = np.array([r["nees"] for r in rs])
        tn = np.array([r["tn"] for r in rs])
        ratio = math.sqrt(np.mean([(1e-3 * r["sigma_mm"]) ** 2 for r in rs]) / np.mean([r["e2"] for r in rs]))
        tr = np.sqrt(np.mean([r["ts2"] for r in rs], axis=0) / np.mean([r["te2"] for r in rs], axis=0))
        silent = sum(r["nees"] > NEES999 and not (r["model_error"] or r["untested"]) for r in rs)
        return (f"| {mode} | {np.mean(nees <= NEES95):.2f} | {np.mean(nees <= NEES_BOUND_3SIGMA_6DOF):.2f} | "
                f"{np.median(nees):.1f} | {ratio:.2f} | {np.mean(tn <= 7.81):.2f} | {tr.min():.2f}-{tr.max():.2f} | "
                f"{sum(r['model_error'] for r in rs)} / {sum(r['untested'] for r in rs)} | {silent} |")

    n_arms = len(rows["declared"])
    ratio = [r["rms_mm"] / r["floor_mm"] for r in rows["declared"]]
    lines = [
        "## Realism: base-frame calibration on a cell as imperfect as a real one (`bench/realism_bench.py`)",
        "",
        machine_line(),
        f"Load average (1 min) {load0:.2f} at start, {load1:.2f} at the end; whole run {wall:.0f} s.",
        "",
        f"**Monte Carlo** ({n_arms} arms, offline on the simulator's own arm and instrument): hidden "
        "residual DH errors drawn per arm at the demo's magnitudes (ADR 0015, the RMS of the demo's values of "
        "each kind as 1-sigma), every other source as in `config/demo-scenario.toml`, the demo plan's 20 "
        "stations (seed = trial), 0.2 s tracker averages, `calibrate_base_frame` with the noise declared as "
        "the daemon declares it today (scalar figures), declared per station (each station's full covariance, "
        "what the daemon is to pass), or estimated (a library caller's default). "
        "*Structured fraction*: with `r` the per-station translation residuals and `r0` those of the same arm "
        "and stations with every random noise off, `|r0|^2 / (|r0|^2 + |r - r0|^2)`: the share of the "
        "residual's energy that repeats without noise.",
        "",
        "| figure (declared noise) | median | P90 | max |",
        "|---|---:|---:|---:|",
        f"| `cell_T_base` error vs truth, translation (mm) | {_q(col('err_t_mm'), 50):.3f} | {_q(col('err_t_mm'), 90):.3f} "
        f"| {max(col('err_t_mm')):.3f} |",
        f"| `cell_T_base` error vs truth, rotation (deg) | {_q(col('err_r_deg'), 50):.4f} | {_q(col('err_r_deg'), 90):.4f} "
        f"| {max(col('err_r_deg')):.4f} |",
        f"| residual RMS (mm) | {_q(col('rms_mm'), 50):.3f} | {_q(col('rms_mm'), 90):.3f} | {max(col('rms_mm')):.3f} |",
        f"| tracker noise floor, 3-D RMS of reported stds (mm) | {_q(col('floor_mm'), 50):.4f} | "
        f"{_q(col('floor_mm'), 90):.4f} | {max(col('floor_mm')):.4f} |",
        f"| residual RMS / noise floor | {_q(ratio, 50):.1f} | {_q(ratio, 90):.1f} | {max(ratio):.1f} |",
        f"| structured fraction of the residual | {_q(col('structured'), 50):.3f} | {_q(col('structured'), 90):.3f} | "
        f"{max(col('structured')):.3f} |",
        f"| reported 1-sigma translation (mm) | {_q(col('sigma_mm'), 50):.3f} | {_q(col('sigma_mm'), 90):.3f} | "
        f"{max(col('sigma_mm')):.3f} |",
        f"| NEES of `cell_T_base` (6 dof; honest: mean 6, 3-sigma bound {NEES_BOUND_3SIGMA_6DOF}) | "
        f"{_q(col('nees'), 50):.1f} | {_q(col('nees'), 90):.1f} | {max(col('nees')):.1f} |",
        "",
        "**Honesty of the reported uncertainty** (issue 25's figures: inside the 95 % bound >= 93 %, reported "
        "translation sigma 0.8-1.8x the RMS actual error; task points: the stations' centroid and two points "
        "0.2 m from it, 3-dof bound 7.81):",
        "",
        "| noise | inside 95 % | inside 3 sigma | median NEES | sigma / RMS error | task points inside 95 % | "
        "task sigma / RMS error | model_error / untested | silent beyond 99.9 % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ] + [honesty(m) for m in MODES]
    if demo is not None:
        te, rv = demo["truth_error"], demo["residual_vs_noise"]
        lines += [
            "",
            f"**`cellcal demo`** (the daemon over the real wire, {demo['n_stations']} stations, demo cell): "
            f"error vs truth {te['translation_m'] * 1e3:.3f} mm / {math.degrees(te['rotation_rad']):.4f} deg; "
            f"residual RMS {rv['rms_translation_m'] * 1e3:.3f} mm = {rv['ratio']:.1f}x the tracker's noise floor "
            f"{rv['tracker_noise_m'] * 1e3:.4f} mm; NEES {te['nees']:.1f} (bound {te['nees_3sigma_bound']}), within 3 sigma: "
            f"{'yes' if te['within_3_sigma'] else 'no'}; warnings: "
            f"{', '.join(w.get('code', '?') for w in demo.get('warnings') or []) or 'none'}; provenance robot_serial "
            f"{demo['provenance'].get('robot_serial')}, kinematics_digest "
            f"{str(demo['provenance'].get('kinematics_digest'))[:19]}...",
        ]
    lines += [
        "",
        "**How to read.** The arm's kinematic error leaves residuals an order of magnitude above the tracker's noise, "
        "nearly all of them structured (they repeat with the noise off), and biases `cell_T_base` by 2-3x the residual "
        "RMS: the part of the error a rigid base frame absorbs leaves no residual. An honest result reports a covariance "
        "that covers that bias (NEES under the bound); one estimated from the residuals as if they were noise does not.",
    ]
    body = "\n".join(lines)
    print(body)
    write_section("realism", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
