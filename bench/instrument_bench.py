"""Instrument benchmark: one stationary point measurement round trip per protocol.

Run: ``.venv/bin/python bench/instrument_bench.py`` (from the repository root). Writes the
``instruments`` section of bench/RESULTS.md.

``TrackerDriver.measure("point", average_s=0)`` through the public driver
(:func:`cellcal.drivers.connect_tracker`) against each simulated instrument, device latency 0,
p50 / p90 / p99 / max over N calls after a warm-up. What one round trip is differs by
protocol, and the table says it: the cellcal protocol is one MEAS/PT exchange; emScon TPI is
StartMeasurement, its answer, then the result packet; GeoCOM is three calls (AUT_FineAdjust,
TMC_DoMeasure, TMC_GetSimpleMea), each a line and its reply, with the simulated EDM's
measuring time set to 0 so the figure is the protocol's cost, not a distance measurement's.
This is the host-side cost (driver, codec, pty or loopback, simulator thread), not an
instrument's: a real emScon tracker spends its stationary measuring time and a real total
station one to a few seconds of EDM on top.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench._results import machine_line, write_section  # noqa: E402
from cellcal.drivers import connect_tracker  # noqa: E402
from cellcal.sim.emscon_sim import SimEmscon  # noqa: E402
from cellcal.sim.geocom_sim import SimGeocom  # noqa: E402
from cellcal.sim.scenario import parse_scenario  # noqa: E402
from cellcal.sim.tracker_sim import SimTracker  # noqa: E402

N_CALLS = 500
N_WARMUP = 30

SCENARIO = """
seed = 1
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [2.5, -0.8, 0.1]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.05]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = 0.01
noise_deg = 0.001
latency_ms = 0.0
"""

CASES = [
    ("cellcal protocol 1.0", "pty", "MEAS -> PT", lambda w, c: SimTracker(w, c, transport="pty")),
    ("cellcal protocol 1.0", "tcp", "MEAS -> PT", lambda w, c: SimTracker(w, c, transport="tcp")),
    ("emScon TPI", "tcp", "StartMeasurement -> answer, result",
     lambda w, c: SimEmscon(w, c)),
    ("GeoCOM", "pty", "FineAdjust, DoMeasure, GetSimpleMea",
     lambda w, c: SimGeocom(w, c, transport="pty", edm_time_s=0.0)),
    ("GeoCOM", "tcp", "FineAdjust, DoMeasure, GetSimpleMea",
     lambda w, c: SimGeocom(w, c, transport="tcp", edm_time_s=0.0)),
]


def bench(make) -> np.ndarray:
    sc = parse_scenario(SCENARIO)
    world = sc.make_world()
    with make(world, sc.tracker) as sim, connect_tracker(sim.url, timeout_s=2.0, clock_resync_s=1e9) as tracker:
        for _ in range(N_WARMUP):
            tracker.measure("point")
        lat = np.empty(N_CALLS)
        for i in range(N_CALLS):
            t0 = time.perf_counter_ns()
            tracker.measure("point")
            lat[i] = time.perf_counter_ns() - t0
    return lat / 1e6  # ms


def main() -> None:
    load0 = os.getloadavg()
    rows = []
    for name, transport, exchange, make in CASES:
        lat = bench(make)
        p50, p90, p99 = np.percentile(lat, [50, 90, 99])
        rows.append(f"| {name} | {transport} | {exchange} | {N_CALLS} | {p50:.2f} | {p90:.2f} | {p99:.2f} | "
                    f"{lat.max():.2f} |")
        print(rows[-1], flush=True)
    load1 = os.getloadavg()
    md = f"""## Instruments: one point measurement per protocol (`bench/instrument_bench.py`)

{machine_line()} Load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load0)} before,
{'/'.join(f'{x:.2f}' for x in load1)} after.

`TrackerDriver.measure("point", average_s=0)` through `connect_tracker(url)` against each
simulated instrument (device latency 0, GeoCOM EDM time 0), {N_WARMUP} warm-up calls, then
{N_CALLS} timed, milliseconds. Host-side cost only (driver, codec, pty or loopback socket,
simulator thread): a real tracker adds its measuring time, a total station 1 to a few s of EDM.

| protocol | transport | exchange per measurement | N | p50 ms | p90 ms | p99 ms | max ms |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

The station capture time per protocol through the daemon (command to accepted station) is the
`stations` section (`bench/station_bench.py`). Run `.venv/bin/python bench/instrument_bench.py`
to refresh.
"""
    write_section("instruments", md)
    print(md)


if __name__ == "__main__":
    main()
