"""The linear pose solves against OpenCV's SHAH: wall time and numpy calls per call.

Run ``.venv/bin/python bench/linear_bench.py`` (needs the ``bench`` extra, OpenCV). It times,
interleaved in one process (every round runs each solver in turn, so load from other processes
hits them alike), at N = 20 and N = 1,000 on the same seeded stations:

* ``cv2.calibrateRobotWorldHandEye(..., method=CALIB_ROBOT_WORLD_HAND_EYE_SHAH)``, the full user
  cost (building its inverted argument lists included, as in ``bench/solver_bench.py``);
* our linear base-frame call ``calibrate_base_frame(G, M, workspace=ws, refine=False,
  holdout=False, uncertainty=False)`` with a warmed-up ``Workspace(N)``;
* the same linear call of the hand-eye and eye-to-hand solves, and the point solver's
  (``refine=False``), for the call counts and times beside it.

and counts the numpy calls of one warmed-up call of each (``bench/_npcount.py``: every
``np.*`` function or ufunc the solver modules call and every ndarray method they call).
It prints the figures with the machine, date and load average; it writes no file (the lead
copies figures into ``bench/RESULTS.md``).
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import cv2  # noqa: E402  (solver_bench exits with a hint when it is missing)
import numpy as np  # noqa: E402

from bench._common import git_state  # noqa: E402
from bench._npcount import count_numpy_calls  # noqa: E402
from bench._results import machine_line  # noqa: E402
from bench.solver_bench import prep_rwhe, time_interleaved  # noqa: E402
from cellcal.solver import (  # noqa: E402
    Workspace,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
)
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene  # noqa: E402

SIZES = (20, 1000)
SEED = 20240613
LINEAR = dict(refine=False, holdout=False, uncertainty=False)


def _solvers(n: int) -> dict:
    rng = np.random.default_rng(SEED + n)
    sc = base_frame_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
    he = hand_eye_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
    G, M = sc.base_T_flange, sc.measured
    pts = np.ascontiguousarray(M[:, :3, 3])
    ws = {k: Workspace(n) for k in ("base", "he", "eth", "pts")}

    def shah():
        cv2.calibrateRobotWorldHandEye(**prep_rwhe(G, M), method=cv2.CALIB_ROBOT_WORLD_HAND_EYE_SHAH)

    return {
        "OpenCV SHAH (calibrateRobotWorldHandEye)": shah,
        "ours base frame, linear": lambda: calibrate_base_frame(G, M, workspace=ws["base"], **LINEAR),
        "ours hand-eye, linear": lambda: calibrate_hand_eye(he.base_T_flange, he.measured,
                                                            workspace=ws["he"], **LINEAR),
        "ours eye-to-hand, linear": lambda: calibrate_eye_to_hand(he.base_T_flange, he.measured,
                                                                  workspace=ws["eth"], **LINEAR),
        "ours points, linear start": lambda: calibrate_base_frame_points(G, pts, workspace=ws["pts"],
                                                                         refine=False, holdout=False),
    }


def main() -> None:
    print(machine_line())
    print(git_state())
    for n in SIZES:
        fns = _solvers(n)
        res = time_interleaved(fns)
        shah = res["OpenCV SHAH (calibrateRobotWorldHandEye)"][0]
        print(f"\nN = {n}")
        print(f"{'solver':44s} {'median ms':>10s} {'x SHAH':>8s} {'calls':>6s} {'numpy calls':>12s}")
        for label, (t, reps) in res.items():
            calls = "" if label.startswith("OpenCV") else str(sum(count_numpy_calls(fns[label]).values()))
            print(f"{label:44s} {t * 1e3:10.4f} {t / shah:8.3f} {reps:6d} {calls:>12s}")
    print()
    print(machine_line())


if __name__ == "__main__":
    main()
