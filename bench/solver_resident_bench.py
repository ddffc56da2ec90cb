"""What a solve without a workspace leaves resident in the process (RSS), per station.

Run ``.venv/bin/python bench/solver_resident_bench.py``. A solve given no ``workspace``
makes a transient one (about 5.7 kB per station) for the duration of the call. This
measures the growth of the resident set (``VmRSS`` of ``/proc/self/status``) over
``CALLS`` such solves at N = 5,000 once one solve has warmed everything up, with every
result kept alive (the results themselves own 5 per-station arrays, 40 B per station),
and writes the ``solver-resident`` section of ``bench/RESULTS.md``.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from bench._common import git_state  # noqa: E402
from bench._results import machine_line, write_section  # noqa: E402
from cellcal.solver import Workspace, calibrate_base_frame  # noqa: E402
from cellcal.solver.synthetic import base_frame_scene  # noqa: E402

N = 5000
CALLS = 5


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    load0 = os.getloadavg()
    sc = base_frame_scene(N, np.random.default_rng(0), noise_mm=0.02, noise_deg=0.01)
    G, M = sc.base_T_flange, sc.measured
    ws_bytes = sum(v.nbytes for v in vars(Workspace(N)).values() if isinstance(v, np.ndarray))
    rows = []
    for label, kw in (("default call", {}), ("linear (refine=False, holdout=False)", {"refine": False, "holdout": False})):
        calibrate_base_frame(G, M, **kw)  # warm-up: imports, caches, the allocator's arenas
        gc.collect()
        r0 = rss_kib()
        kept = [calibrate_base_frame(G, M, **kw) for _ in range(CALLS)]
        gc.collect()
        grown = (rss_kib() - r0) * 1024
        rows.append((label, grown, len(kept)))
        del kept
        gc.collect()
    load1 = os.getloadavg()
    md = ["## Solver: memory a call without a workspace leaves resident (`bench/solver_resident_bench.py`)", ""]
    md.append(machine_line())
    md.append(f"cellcal: {git_state()}. Load average (1 min) {load0[0]:.2f} at start, {load1[0]:.2f} at the end.")
    md.append("")
    md.append(f"Growth of the resident set over {CALLS} solves of N = {N:,} stations without a `workspace` "
              f"(results kept; each solve's transient workspace is {ws_bytes:,} B, "
              f"{ws_bytes / N:,.0f} B per station):")
    md.append("")
    md.append("| call | RSS growth | per solve and station |")
    md.append("|---|---:|---:|")
    for label, grown, k in rows:
        md.append(f"| {label} | {grown / 1024:,.0f} KiB | {grown / k / N:,.1f} B |")
    md.append("")
    md.append("The results own 5 per-station arrays (residuals and held-out closure, 40 B per station); "
              "the transient workspace is an anonymous mapping returned to the system when the call ends. "
              "RSS moves in pages, so small figures are page rounding.")
    text = "\n".join(md) + "\n"
    print(text)
    write_section("solver-resident", text)


if __name__ == "__main__":
    main()
