"""Station capture time per tracker protocol: the move command to the accepted station.

Run: ``.venv/bin/python bench/station_bench.py [--scale S] [--stations N]`` (from the
repository root). Writes the ``stations`` section of bench/RESULTS.md.

The simulated cell of ``config/demo-scenario.toml`` without its faults and drift (the
hidden truth, the arm's settling), the daemon of ``config/demo.toml`` in process
(``cellcal.testing.harness.inprocess_cell``, no ZeroMQ: nobody listens), one base-frame run
per instrument (``cellcal.daemon.cli.instruments``): the cellcal tracker protocol measuring
poses and points, a Leica emScon tracker (TPI on loopback TCP) and a GeoCOM total station
(a pty and loopback TCP, checksums on). Per station, on the host's monotonic clock:

* **command -> accepted**: the daemon commanding the move (``CaptureEngine.move_to``
  called) to the station committed and published (its ``station`` event);
* **at rest -> accepted**: the move reported done to the station committed: what the
  protocol and the capture's checks cost (dwell confirmation, the two halves of the
  tracker's averaging, each with its round trips, the consistency checks, the commit).

The moves are the same in every run (the same plan, the same simulated arm), so the
differences between the rows are the instruments'. A real emScon tracker spends its
stationary measuring time as the simulator does (``tracker.average_s``); a real total
station spends one to a few seconds of EDM per measurement where the simulator spends 0.3 s,
plus the telescope's fine adjust.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, write_section  # noqa: E402

#: (label, instrument, transport, [tracker] measure)
CASES = [
    ("cellcal protocol 1.0, pose", "cellcal", "tcp", "pose"),
    ("cellcal protocol 1.0, point", "cellcal", "tcp", "point"),
    ("emScon TPI, point", "emscon", "tcp", "point"),
    ("GeoCOM, point", "geocom", "pty", "point"),
    ("GeoCOM, point", "geocom", "tcp", "point"),
]


def run_case(instrument: str, transport: str, measure: str, scenario, n: int) -> dict:
    """One run; per station ``(commanded, moved, accepted)`` host seconds and the rejections."""
    from cellcal.daemon import capture
    from cellcal.daemon import protocol as P
    from cellcal.daemon.store import RunStatus
    from cellcal.testing.harness import inprocess_cell

    commanded: dict[int, float] = {}
    moved: dict[int, float] = {}
    accepted: dict[int, float] = {}
    rejected: list[str] = []
    original = capture.CaptureEngine.move_to

    def timed_move(self, planned):  # the engine's own move, with its start and end noted
        commanded.setdefault(planned.index, time.monotonic())
        original(self, planned)
        moved[planned.index] = time.monotonic()

    def on_event(topic: str, body: dict) -> None:
        if topic == P.TOPIC_STATION:
            if body["accepted"]:
                accepted[body["index"]] = time.monotonic()
            else:
                rejected.append(body["reason"])

    capture.CaptureEngine.move_to = timed_move  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp, inprocess_cell(
                Path(tmp), scenario=scenario, base_config=ROOT / "config" / "demo.toml", n_stations=n,
                instrument=instrument, tracker_transport=transport,
                overrides={"drift": {"enabled": False}, "tracker": {"measure": measure}}, zmq=False) as cell:
            cell.svc.add_listener(on_event)
            run_id = cell.svc.start_run(P.KIND_BASE_FRAME)
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and cell.svc.store.get_run(run_id).is_open:
                time.sleep(0.05)
            run = cell.svc.store.get_run(run_id)
            result = cell.svc.store.active_result()
            if run.status != RunStatus.DONE or result is None:
                raise SystemExit(f"{instrument}/{transport}: run ended {run.status.value}: {run.status_reason}")
            cfg = cell.cfg
    finally:
        capture.CaptureEngine.move_to = original  # type: ignore[method-assign]
    idx = sorted(accepted)
    return {
        "total": np.array([accepted[i] - commanded[i] for i in idx]),
        "capture": np.array([accepted[i] - moved[i] for i in idx]),
        "rejected": rejected,
        "n": len(idx),
        "rms_m": result.result["rms_translation_m"],
        "average_s": cfg.tracker.average_s,
        "dwell_s": cfg.robot.settle.dwell_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=5.0, help="simulated seconds per wall second (the demo's 5)")
    ap.add_argument("--stations", type=int, default=12)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from cellcal.sim.scenario import load_scenario

    scenario = load_scenario(ROOT / "config" / "demo-scenario.toml")
    scenario = dataclasses.replace(scenario, time_scale=args.scale, drift=(),
                                   tracker=dataclasses.replace(scenario.tracker, faults=()))
    load0 = os.getloadavg()
    rows = []
    info: dict = {}
    for label, instrument, transport, measure in CASES:
        r = run_case(instrument, transport, measure, scenario, args.stations)
        info = r
        t50, t90 = np.percentile(r["total"], [50, 90])
        c50, c90 = np.percentile(r["capture"], [50, 90])
        rej = ", ".join(f"{k} {r['rejected'].count(k)}" for k in sorted(set(r["rejected"]))) or "none"
        rows.append(f"| {label} | {transport} | {r['n']} | {t50:.2f} | {t90:.2f} | {r['total'].max():.2f} | "
                    f"{c50:.2f} | {c90:.2f} | {r['capture'].max():.2f} | {rej} | {r['rms_m'] * 1e3:.4f} |")
        print(rows[-1], flush=True)
    load1 = os.getloadavg()
    md = f"""## Station capture time per protocol (`bench/station_bench.py`)

{machine_line()} Load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load0)} before,
{'/'.join(f'{x:.2f}' for x in load1)} after.

One base-frame run of {args.stations} stations per row through the daemon (in process, real
store), simulated cell `config/demo-scenario.toml` without faults or drift at time x{args.scale:g},
daemon `config/demo.toml` (dwell {info['dwell_s']:g} s, tracker average {info['average_s']:g} s:
two halves per station), the same plan and arm in every row. **command -> accepted**: the
daemon commanding the station's move to the station committed; **at rest -> accepted**: the
move reported done to the station committed (the protocol's and the checks' share). Seconds,
host monotonic clock; rejections are retried and counted in the station's time.

| instrument | transport | stations | command -> accepted p50 s | p90 s | max s | at rest -> accepted p50 s | p90 s \
| max s | rejected | RMS closure mm |
|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|
{chr(10).join(rows)}

The emScon tracker measures each half for `average_s / 2` of wall time, as the cellcal
tracker averages for that long of device time; the simulated total station spends its EDM
time (0.3 s) per half whatever `average_s` says, plus a fine adjust, so its stations take
longer. A real total station's EDM takes 1 to a few seconds. The host-side cost of one
measurement's round trips alone is the `instruments` section.
Run `.venv/bin/python bench/station_bench.py` to refresh.
"""
    if not args.no_write:
        write_section("stations", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
