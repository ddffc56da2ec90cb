"""Downtime to a target uncertainty: a run to ``[plan] target_sigma_mm`` against a fixed plan.

In the simulated demo cell (``config/demo-scenario.toml`` without faults or drift: the arm
with its hidden kinematic errors, the tracker with beam-coordinate noise), the daemon
(``config/demo.toml``) runs, interleaved in one process:

* **fixed**: the fixed 20-station plan the daemon generated before the planner (tilts from
  the home orientation about golden-angle axes, :func:`legacy_plan`, the daemon's own fallback plan),
  passed to ``start_run`` as an explicit plan;
* **target**: a run to ``target_sigma_mm`` (0.05 by default) at the task point of
  ``config/demo.toml``: the first 4 planned stations, then the planner's next station after
  each accepted one until the predicted error at the task point is at most the target.

Per run: stations, wall time from ``start_run`` to the stored result, the result's predicted
error at the task point, and the error against the simulator's truth there; for the fixed
plan also after how many of its stations the prediction first reached the target. The
figure is the ratio of the wall times (target at most 0.6).

Run: ``.venv/bin/python bench/plan_bench.py [--scale S] [--repeats R] [--target-mm T]``.
Writes the ``plan`` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, write_section  # noqa: E402


def legacy_plan(model: Any, p: Any, n: int) -> list[Any]:
    """The daemon's generated plan before the planner (main before this benchmark): Halton
    positions in the box, tilts from the home orientation about golden-angle axes with a
    turn about the tool axis, IK from the previous station, a nearest-neighbour tour. It is
    still the daemon's plan when the tracker's position is not configured
    (``cellcal.daemon.runs.plan._tilt_plan``), which is called here rather than copied."""
    from cellcal.daemon.runs.plan import _tilt_plan

    return _tilt_plan(model, n=n, box_min_m=p.workspace_min_m, box_max_m=p.workspace_max_m,
                      max_tilt_rad=p.max_tilt_rad, home_q_rad=p.home_q_rad, q_min_rad=p.joint_min_rad,
                      q_max_rad=p.joint_max_rad, seed=p.seed)


def _task_error(result: Any, truth_X: np.ndarray, task: np.ndarray) -> float:
    """|base_p(result) - base_p(truth)| of the task point, m."""
    def base_p(X: np.ndarray) -> np.ndarray:
        return X[:3, :3].T @ (task - X[:3, 3])

    return float(np.linalg.norm(base_p(result.cell_T_base) - base_p(truth_X)))


def one_run(mode: str, scenario: Any, target_m: float, n_fixed: int) -> dict:
    from cellcal.daemon import protocol as P
    from cellcal.daemon.runs import plan as dplan
    from cellcal.daemon.store import RunStatus
    from cellcal.testing.harness import inprocess_cell

    overrides: dict[str, Any] = {"drift": {"enabled": False}}
    if mode == "target":
        # With the tracker's rough position (the comment in config/demo.toml): the planner's
        # stations face it from the first one on.
        overrides["plan"] = {"target_sigma_mm": target_m * 1e3, "tracker_xyz_mm": [-1200.0, 2330.0, -100.0]}
    with tempfile.TemporaryDirectory() as tmp, inprocess_cell(
            Path(tmp), scenario=scenario, base_config=ROOT / "config" / "demo.toml", n_stations=n_fixed,
            overrides=overrides, zmq=False) as cell:
        cfg = cell.cfg
        plan = legacy_plan(cell.svc._devices.model, cfg.plan, n_fixed) if mode == "fixed" else None
        t0 = time.monotonic()
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, plan=plan, reason="plan bench")
        deadline = t0 + 1800.0
        # A deadline on the run's end (done or failed), polled: the figure is minutes long.
        while time.monotonic() < deadline and cell.svc.store.get_run(run_id).status in (
                RunStatus.CAPTURING, RunStatus.SOLVING):
            time.sleep(0.05)
        wall = time.monotonic() - t0
        records = cell.svc.store.stations(run_id)
        truth = cell.world.cell_T_base()
        task = np.asarray(cfg.solve.task_points_m[0], float)
        tcfg = dataclasses.replace(cfg, plan=dataclasses.replace(cfg.plan, target_sigma_m=target_m))
        sigma, result = dplan.predicted_task_sigma(records, tcfg)
        first_reached = None
        if mode == "fixed":
            for k in range(3, len(records) + 1):
                if dplan.predicted_task_sigma(records[:k], tcfg)[0] <= target_m:
                    first_reached = k
                    break
        status = cell.svc.store.get_run(run_id).status.value
    return {"mode": mode, "wall_s": wall, "n": len(records), "sigma_m": sigma, "status": status,
            "err_m": _task_error(result, truth, task) if result is not None else math.nan,
            "first_reached": first_reached}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="simulated seconds per wall second (1: real time)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved pairs (fixed, target)")
    ap.add_argument("--target-mm", type=float, default=0.05)
    ap.add_argument("--stations", type=int, default=20, help="stations of the fixed plan")
    ap.add_argument("--cells", default="tracker-limited,demo",
                    help="comma list: demo (the demo cell as it is), tracker-limited (its arm without hidden errors)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from cellcal.daemon.config import load_config
    from cellcal.sim.scenario import load_scenario

    task_mm = [round(v * 1e3, 1) for v in load_config(ROOT / "config" / "demo.toml").solve.task_points_m[0]]
    demo = load_scenario(ROOT / "config" / "demo-scenario.toml")
    demo = dataclasses.replace(demo, time_scale=args.scale, drift=(), tracker=dataclasses.replace(demo.tracker, faults=()))
    # The same cell with an arm whose controller knows it exactly: no hidden kinematic
    # errors, sag, warm-up or backlash; the tracker's noise is then what limits.
    exact_arm = {k: v for k, v in demo.robot.items() if k not in ("residual", "compliance", "thermal", "backlash_deg")}
    cells = {"tracker-limited": dataclasses.replace(demo, robot=exact_arm), "demo": demo}
    names = [c.strip() for c in args.cells.split(",") if c.strip()]
    target_m = args.target_mm * 1e-3
    load_before = os.getloadavg()
    runs = []
    for _ in range(args.repeats):
        for cell in names:
            for mode in ("fixed", "target"):
                r = one_run(mode, cells[cell], target_m, args.stations)
                r["cell"] = cell
                print(r, flush=True)
                runs.append(r)
    load_after = os.getloadavg()

    def med(cell: str, mode: str, key: str) -> float:
        v = sorted(r[key] for r in runs if r["mode"] == mode and r["cell"] == cell)
        return float(np.median(v)) if v else math.nan

    rows = []
    for r in runs:
        reach = "" if r["mode"] != "fixed" else (f"{r['first_reached']}" if r["first_reached"] else "never")
        rows.append(f"| {r['cell']} | {r['mode']} | {r['n']} | {reach} | {r['wall_s']:.1f} s | "
                    f"{r['sigma_m'] * 1e3:.4f} mm | {r['err_m'] * 1e3:.4f} mm ({r['err_m'] / r['sigma_m']:.2f} sigma) "
                    f"| {r['status']} |")
    ratios = []
    for cell in names:
        ratio = med(cell, "target", "wall_s") / med(cell, "fixed", "wall_s")
        ratios.append(f"**{cell}**: wall-time ratio target / fixed (medians) **{ratio:.2f}** "
                      f"({'at most 0.6' if ratio <= 0.6 else 'above 0.6'}), stations {med(cell, 'target', 'n'):.0f} "
                      f"against {med(cell, 'fixed', 'n'):.0f}.")
    md = [
        "## Downtime to a target uncertainty (`bench/plan_bench.py`)",
        "",
        machine_line(),
        f"Load average (1, 5, 15 min) before {load_before[0]:.2f}, {load_before[1]:.2f}, {load_before[2]:.2f}; "
        f"after {load_after[0]:.2f}, {load_after[1]:.2f}, {load_after[2]:.2f} (2 cores shared with other work).",
        "",
        f"Simulated cell `config/demo-scenario.toml` without faults or drift (the arm's hidden kinematic errors, sag "
        f"and backlash are in), time scale {args.scale:g}, daemon `config/demo.toml`; task point "
        f"{task_mm} mm (cell frame, `config/demo.toml`). **fixed**: the "
        f"{args.stations}-station plan the daemon generated before the planner (tilts from the home orientation, "
        "`legacy_plan` in the benchmark), as an explicit plan; **target**: `[plan] target_sigma_mm = "
        f"{args.target_mm:g}` with `tracker_xyz_mm = [-1200, 2330, -100]` (first 4 planned stations, then "
        "`suggest_next_station` for the task point after each "
        f"accepted station). Runs interleaved in one process, {args.repeats} pair(s); wall time from `start_run` to "
        "the stored result (moves, settling, measuring, the decisions and the solve). \"prediction\" is the "
        "result's `predicted_error_at` at the task point (root of the trace); \"error\" is against the simulator's "
        "truth there; \"reached after\" is the first station count of the fixed plan whose prediction is at most "
        "the target.",
        "",
        "Cells: **demo** is the demo cell as it is; **tracker-limited** is the same cell with an arm "
        "whose controller knows it exactly (no hidden kinematic errors, sag, warm-up or backlash), so that "
        "the tracker's noise is what limits.",
        "",
        "| cell | run | stations | reached after | wall time | prediction | error vs truth | status |",
        "|---|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
        *ratios,
    ]
    text = "\n".join(md)
    print(text)
    if not args.no_write:
        write_section("plan", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
