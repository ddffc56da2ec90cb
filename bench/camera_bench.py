"""Camera benchmark: our GigE Vision client against Aravis's on the same simulated stream,
GVCP round trips, and the mid-exposure time against the simulator's truth.

Run: ``.venv/bin/python bench/camera_bench.py`` (from the repository root). Writes the
``camera`` section of bench/RESULTS.md. Everything runs on loopback addresses (127.0.0.0/8).

* Stream: the simulated camera (``cellcal.sim.gige_device``) runs in a process of its own,
  free-running at 30 frames/s, Mono8; for each image size and packet size our driver grabs
  for ``SECONDS`` and then ``arv-camera-test-0.8`` (Aravis's C client) acquires from the same
  device for as long. Frames received, frames given up (torn), and CPU seconds the client
  process used per second of streaming (user + system; 1.0 = one core).
* GVCP round trip: ``read_reg(CCP)`` by our client, p50 / p99 over ``N_RTT`` calls, against
  the simulated camera and against ``arv-fake-gv-camera-0.8``.
* Clock: frames of a simulated camera whose clock runs 200 ppm fast with an offset; each
  frame's mid-exposure ``t_host_ns`` against the instant its exposure really began plus half
  the exposure (the simulator's truth), by the timestamp latch and by the stream fallback.
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402

from bench._common import git_state  # noqa: E402
from bench._results import machine_line, write_section  # noqa: E402
from cellcal.drivers import gige_codec as gc  # noqa: E402
from cellcal.drivers.camera import connect_camera  # noqa: E402
from cellcal.drivers.gige_link import GvcpClient  # noqa: E402
from cellcal.sim.gige_device import DeviceClock, FrameRequest, GigeDevice, RenderedFrame, TestPatternSource  # noqa: E402

SECONDS = 4.0
FPS = 30.0
SIZES = [(640, 480), (1280, 1024)]
PACKETS = [1400, 8192]
N_RTT = 500
ADDRESS = "127.0.77.2"

def serve(w: int, h: int, psize: int) -> subprocess.Popen:
    """The simulated camera in a process of its own (``python -m cellcal.sim.gige_device``)."""
    proc = subprocess.Popen([sys.executable, "-m", "cellcal.sim.gige_device", "--address", ADDRESS,
                             "--sensor", f"{w}x{h}", "--fps", str(FPS), "--packet-size", str(psize)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("serving")
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=10)


def ours(w: int, h: int) -> tuple[float, int, float]:
    with connect_camera(f"gige://{ADDRESS}") as cam:
        cam.start()
        cam.grab(timeout_s=3.0, after_ns=0)
        torn0 = cam.frames_incomplete
        c0, t0 = time.process_time(), time.monotonic()
        got = 0
        while time.monotonic() - t0 < SECONDS:
            f = cam.grab(timeout_s=3.0, after_ns=0)
            assert f.width == w
            got += 1
        dt = time.monotonic() - t0
        cpu = time.process_time() - c0
        return got / dt, cam.frames_incomplete - torn0, cpu / dt


def aravis(w: int) -> tuple[float, int, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["arv-camera-test-0.8", "-n", ADDRESS, f"--duration={int(SECONDS)}"],
                         capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stats = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(n_\w+)\s+= (\d+)$", out.stdout, re.M)}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return stats["n_completed_buffers"] / SECONDS, stats["n_failures"], cpu / SECONDS


def rtt(host: str) -> tuple[float, float]:
    client = GvcpClient(host, gc.GVCP_PORT)
    client.open()
    try:
        times = []
        for _ in range(N_RTT):
            t = time.perf_counter_ns()
            client.read_reg(gc.Reg.CCP, time.monotonic() + 1.0)
            times.append((time.perf_counter_ns() - t) / 1e3)
    finally:
        client.close()
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


class Truth(TestPatternSource):
    def __init__(self) -> None:
        self.starts: dict[int, int] = {}
        self.lock = threading.Lock()

    def frame(self, request: FrameRequest) -> RenderedFrame:
        with self.lock:
            self.starts[request.index] = request.t_start_ns
        return super().frame(request)


def clock_errors(mode: str, n: int = 90) -> tuple[np.ndarray, np.ndarray]:
    src = Truth()
    dev = GigeDevice(ADDRESS, source=src, sensor=(320, 240), frame_rate_hz=FPS, exposure_s=0.008,
                     clock=DeviceClock(125_000_000, offset_s=3600.0, drift_ppm=200.0)).start()
    try:
        with connect_camera(f"gige://{ADDRESS}", clock=mode, heartbeat_timeout_s=1.5) as cam:
            time.sleep(1.5)  # a second of heartbeats (latch) or frames (stream) before measuring
            frames = [cam.grab(timeout_s=3.0, after_ns=0) for _ in range(n)]
        err, unc = [], []
        for f in frames:
            truth = src.starts[f.frame_id - 1] + round(0.004 * 1e9)
            err.append((f.t_host_ns - truth) / 1e3)
            unc.append(f.t_host_uncertainty_ns / 1e3)
        return np.array(err), np.array(unc)
    finally:
        dev.stop()


def main() -> None:
    rows = []
    for w, h in ([] if "--clock-only" in sys.argv else SIZES):
        for psize in PACKETS:
            proc = serve(w, h, psize)
            try:
                o = ours(w, h)
                a = aravis(w)
            finally:
                stop(proc)
            rows.append(f"| {w} x {h} | {psize} | {o[0]:.1f} | {o[1]} | {o[2]:.2f} | {a[0]:.1f} | {a[1]} | {a[2]:.2f} |")
            print(rows[-1], flush=True)
    sim_rtt = None
    proc = serve(64, 48, 1400)
    try:
        sim_rtt = rtt(ADDRESS)
    finally:
        stop(proc)
    fake = subprocess.Popen(["arv-fake-gv-camera-0.8", "-i", "127.0.0.1", "-s", "BENCH"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        fake_rtt = rtt("127.0.0.1")
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    clock_rows = []
    for mode in ("latch", "stream"):
        err, unc = clock_errors(mode)
        clock_rows.append(
            f"| {mode} | {np.median(err):+.1f} | {np.percentile(np.abs(err), 95):.1f} | {np.max(np.abs(err)):.1f} | "
            f"{np.median(unc):.1f} | {int(np.sum(np.abs(err) <= unc))} / {err.size} |")
        print(clock_rows[-1], flush=True)
    body = "\n".join([
        "## Camera: GigE Vision stream, GVCP, mid-exposure time (`bench/camera_bench.py`)",
        "",
        machine_line(),
        f"cellcal: {git_state()}.",
        "",
        f"**Stream.** The simulated camera in its own process, free-running at {FPS:.0f} frames/s, Mono8, on "
        f"{ADDRESS}; {SECONDS:.0f} s per client. *CPU* is the client process's user + system seconds per second "
        "(1.0 = one core); ours includes its heartbeat and clock threads.",
        "",
        "| image | packet size (B) | ours frames/s | ours torn | ours CPU | Aravis frames/s | Aravis failures | Aravis CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"**GVCP round trip** (`read_reg(CCP)`, {N_RTT} calls): simulated camera p50 {sim_rtt[0]:.0f} us, "
        f"p99 {sim_rtt[1]:.0f} us; Aravis's fake camera p50 {fake_rtt[0]:.0f} us, p99 {fake_rtt[1]:.0f} us.",
        "",
        "**Mid-exposure time** against the simulator's truth (device clock 125 MHz, 200 ppm fast, 1 h offset; "
        "8 ms exposure; 90 frames after 1.5 s of mapping). Error = `t_host_ns` - (exposure start + 4 ms), us.",
        "",
        "| clock | median error | p95 abs | max abs | median stated bound | within bound |",
        "|---|---:|---:|---:|---:|---:|",
        *clock_rows,
        "",
        "The stream fallback maps each leader's exposure end (timestamp + exposure) to its arrival, so it reads "
        "late by what comes between: readout and transfer (here the simulator rendering and sending the frame). "
        "Its stated bound does not cover that (docs/protocols/gige.md); the latch is used whenever the device's "
        "latch moves. The stream figures are limited by the simulated camera (one Python process sending every "
        "packet), not by either client: compare the clients' CPU, not their frame rates.",
    ])
    write_section("camera", body)


if __name__ == "__main__":
    main()
