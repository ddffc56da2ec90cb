"""Idle cost: CPU of a connected, idle daemon with the robot streaming RTDE at 500 Hz.

The simulated cell runs as its own process (``cellcal sim``, the fast scenario) and the
daemon as another (``cellcal run``); only the daemon's CPU counts (``utime + stime`` of its
process from ``/proc/<pid>/stat``, every thread). The daemon first idles with no device open
(the baseline), then takes a short calibration run (which opens the robot and the tracker
and leaves them open, as after every run) and idles again with the devices open: that
window, ``--seconds`` long (60 s by default), is the figure. The target : at most
3 % of one core. The sim's own CPU is reported beside it, not counted.

Run: ``.venv/bin/python bench/idle_bench.py [--seconds 60] [--baseline-s 20] [--compare COMMIT]``.
``--compare`` also runs the daemon of another commit (``git archive`` of its sources on
PYTHONPATH for the daemon process only; the simulator stays this tree's), interleaved: this
tree, that commit, this tree. Writes the ``idle`` section of bench/RESULTS.md.
:func:`idle_cell` is the set-up ``bench/api_bench.py`` shares.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, write_section  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15


def rtde_bytes_received(port: int) -> int:
    """Bytes received so far on the TCP connections to 127.0.0.1:``port`` (the daemon's RTDE
    link: nobody else connects to the simulator's port), from the kernel (``ss -ti``)."""
    import re
    import subprocess

    out = subprocess.run(["ss", "-tinH", "dst", f"127.0.0.1:{port}"], capture_output=True, text=True,
                         check=True).stdout
    return sum(int(m) for m in re.findall(r"bytes_received:(\d+)", out))


def rtde_package_bytes() -> int:
    """Bytes of one RTDE data package of the driver's recipe (optional outputs included)."""
    from cellcal.drivers import rtde_codec as rc
    from cellcal.drivers.ur_rtde import OPTIONAL_RECIPE, RECIPE

    names = RECIPE + OPTIONAL_RECIPE
    return rc.HEADER.size + rc.Recipe(names, [rc.OUTPUT_FIELDS[n] for n in names]).payload_size


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def cpu_share(pid: int, seconds: float) -> float:
    """Fraction of one core ``pid`` used over the next ``seconds`` of wall time."""
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)  # a measurement window, not a wait for a condition
    return (cpu_s(pid) - c0) / (time.monotonic() - t0)


@dataclass
class IdleCell:
    """A running simulated cell and daemon (processes) with the devices open after a run."""

    cfg: dict[str, Any]
    daemon: Any
    sim: Any
    recorder: Any
    run_id: int
    baseline_share: float | None

    @property
    def cmd_endpoint(self) -> str:
        return str(self.cfg["zmq"]["cmd_endpoint"])

    @property
    def pub_endpoint(self) -> str:
        return str(self.cfg["zmq"]["pub_endpoint"])


@contextlib.contextmanager
def _pythonpath(tree: Path | None) -> Iterator[None]:
    """Child processes started inside import ``cellcal`` from ``tree`` (None: this checkout)."""
    if tree is None:
        yield
        return
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def make_tree(commit: str, dest: Path) -> Path:
    """``dest`` holding a ``cellcal`` package of ``commit``'s sources (the daemon of another
    commit, for an interleaved comparison); returns the directory to put on PYTHONPATH."""
    import subprocess
    import tarfile

    src, pkg = dest / "src", dest / "pkg" / "cellcal"
    src.mkdir(parents=True, exist_ok=True)
    pkg.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "solver", "drivers", "sim", "daemon"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, filter="data")
    for d in ("solver", "drivers", "sim", "daemon"):
        (pkg / d).symlink_to(src / d)
    return dest / "pkg"


@contextlib.contextmanager
def idle_cell(workdir: Path, *, frequency_hz: float = 500.0, n_stations: int = 6, baseline_s: float = 0.0,
              heartbeat_s: float = 1.0, overrides: dict[str, Any] | None = None,
              daemon_tree: Path | None = None) -> Iterator[IdleCell]:
    """Start ``cellcal sim`` and ``cellcal run``, measure the baseline, take one run, yield.

    ``baseline_s`` > 0: the daemon's CPU share over that long before the devices open.
    ``daemon_tree``: run the daemon (only) from that tree (:func:`make_tree`).
    """
    from cellcal.daemon import protocol as P
    from cellcal.testing import harness as H
    from cellcal.testing.soak import _start_run, _wait_heartbeat

    sim = H.SimProcess(H.FAST_SCENARIO, workdir / "sim.log")
    urls = sim.start()
    cfg = H.daemon_config(robot_url=urls["robot"], tracker_url=urls["tracker"], workdir=workdir,
                          n_stations=n_stations,
                          overrides=H._merge({"robot": {"options": {"frequency_hz": frequency_hz}},
                                              "zmq": {"heartbeat_s": heartbeat_s}}, overrides or {}))
    conf = H.write_config(workdir / "cellcal.toml", cfg)
    rec = H.Recorder(cfg["zmq"]["pub_endpoint"])
    daemon = H.DaemonProcess(conf, workdir / "daemon.log")
    try:
        with _pythonpath(daemon_tree):
            daemon.start()
        _wait_heartbeat(rec, daemon, set(), 30.0)
        baseline = cpu_share(daemon.pid, baseline_s) if baseline_s > 0 else None
        run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
        rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b.get("run_id") == str(run_id), 180.0,
                     alive=daemon.alive, what=f"the result of run {run_id}")
        # the run's job ends right after its result: wait for IDLE with the robot connected
        rec.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT and b["state"] == "IDLE"
                     and b["devices"]["robot"]["connected"], 30.0, alive=daemon.alive,
                     what="an IDLE heartbeat with the robot connected")
        yield IdleCell(cfg, daemon, sim, rec, run_id, baseline)
    finally:
        daemon.stop()
        rec.close()
        sim.stop()


class Subscribers:
    """``n`` ZeroMQ SUB sockets on the daemon's PUB endpoint, every topic, drained by one
    thread of this process (what 50 clients of a plant's software cost the daemon)."""

    def __init__(self, endpoint: str, n: int) -> None:
        import threading

        import zmq

        self.ctx = zmq.Context()
        self.socks = []
        for _ in range(n):
            s = self.ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.connect(endpoint)
            self.socks.append(s)
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        import zmq

        poller = zmq.Poller()
        for s in self.socks:
            poller.register(s, zmq.POLLIN)
        while not self._stop.is_set():
            for s, _ev in poller.poll(100):
                while True:
                    try:
                        s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.received += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        for s in self.socks:
            s.close(linger=0)
        self.ctx.term()


def _measure(tmp: Path, args: argparse.Namespace, after_s: float, tree: Path | None) -> dict[str, Any]:
    with idle_cell(tmp, frequency_hz=args.frequency_hz, baseline_s=args.baseline_s, daemon_tree=tree) as cell:
        subs = Subscribers(cell.pub_endpoint, args.subscribers) if args.subscribers > 0 else None
        try:
            return _window(cell, args, after_s, subs)
        finally:
            if subs is not None:
                subs.close()


def _window(cell: IdleCell, args: argparse.Namespace, after_s: float, subs: Subscribers | None) -> dict[str, Any]:
    time.sleep(after_s)  # the daemon idles: the robot monitor stops following after its linger
    load_before = load_text()
    port = int(cell.cfg["robot"]["url"].rsplit(":", 1)[1].split("?")[0].split("/")[0])
    sim_c0 = cpu_s(cell.sim.proc.pid)
    b0 = rtde_bytes_received(port)
    c0, t0 = cpu_s(cell.daemon.pid), time.monotonic()
    time.sleep(args.seconds)  # the measurement window
    wall = time.monotonic() - t0
    share = (cpu_s(cell.daemon.pid) - c0) / wall
    sim_share = (cpu_s(cell.sim.proc.pid) - sim_c0) / wall
    b1 = rtde_bytes_received(port)
    return {
        "share": share, "sim_share": sim_share, "baseline": cell.baseline_share,
        "pkg_rate": (b1 - b0) / wall / rtde_package_bytes(),
        "load": f"{load_before} -> {load_text()}",
        "messages": None if subs is None else subs.received,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle window with the devices open (s)")
    ap.add_argument("--baseline-s", type=float, default=20.0, help="idle window before the devices open (s)")
    ap.add_argument("--frequency-hz", type=float, default=500.0)
    ap.add_argument("--subscribers", type=int, default=50, help="ZeroMQ subscribers connected during the window")
    ap.add_argument("--after-s", type=float, default=None,
                    help="start the window this long after the run ended (default: the robot monitor's linger + 5 s)")
    ap.add_argument("--compare", metavar="COMMIT", default=None,
                    help="also run the daemon of COMMIT (git), interleaved: this tree, COMMIT, this tree")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    from cellcal.daemon.capture import MONITOR_LINGER_S

    after_s = MONITOR_LINGER_S + 5.0 if args.after_s is None else args.after_s
    rows: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        order: list[tuple[str, Path | None]] = [("this tree", None)]
        if args.compare:
            tree = make_tree(args.compare, Path(tmp) / "compare")
            order = [("this tree", None), (args.compare, tree), ("this tree", None)]
        for k, (name, tree_path) in enumerate(order):
            work = Path(tmp) / f"cell{k}"
            work.mkdir()
            r = _measure(work, args, after_s, tree_path)
            print(name, r, flush=True)
            rows.append((name, r))

    lines = [
        "## Idle cost of a connected daemon (`bench/idle_bench.py`)",
        "",
        machine_line(),
        "",
        f"`cellcal run` and `cellcal sim` (fast scenario) as separate processes; the robot streams RTDE at "
        f"{args.frequency_hz:g} Hz. Before the devices open the daemon idles {args.baseline_s:g} s (baseline); then "
        f"a 6-station run opens the robot and the tracker, which stay open. The window ({args.seconds:g} s) starts "
        f"{after_s:g} s after the run ended: the robot monitor follows the samples for {MONITOR_LINGER_S:g} s after "
        "its last use (`capture.MONITOR_LINGER_S`), then sleeps until a job uses it; the driver keeps its link and "
        "the clock model fed. CPU is `utime + stime` of the daemon's process (all threads) from `/proc`; the "
        "simulator's is shown, not counted. Packages received: bytes the kernel received on the daemon's RTDE "
        f"connection (`ss -ti`) / {rtde_package_bytes()} bytes per package; the simulator, itself at the machine's "
        f"mercy, sends at most {args.frequency_hz:g}/s. {args.subscribers} ZeroMQ subscribers (every topic, drained "
        "by the bench's own process) are connected through the window."
        + (" Rows in the order run (interleaved)." if args.compare else ""),
        "",
        "| daemon | load average (1/5/15 min, start -> end) | before devices open (% of a core) | "
        "devices open, idle (% of a core) | RTDE packages/s received | sim (% of a core) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        base = f"{r['baseline'] * 100:.2f}" if r["baseline"] is not None else "-"
        lines.append(f"| {name} | {r['load']} | {base} | **{r['share'] * 100:.2f}** | {r['pkg_rate']:.0f} | "
                     f"{r['sim_share'] * 100:.1f} |")
    ours = [r for name, r in rows if name == "this tree"]
    worst = max(r["share"] for r in ours)
    verdict = "met" if worst <= 0.03 else "NOT met"
    lines += ["", f"Target: at most 3 % of one core with the devices open at 500 Hz and {args.subscribers} "
              f"subscribers: **{verdict}** "
              f"(this tree, worst of {len(ours)}: {worst * 100:.2f} %)."]
    if args.compare:
        theirs = [r for name, r in rows if name != "this tree"][0]
        ratio = theirs["share"] / max(worst, 1e-9)
        lines[-1] += (f" The daemon of {args.compare} in the same run: {theirs['share'] * 100:.2f} % "
                      f"({ratio:.0f}x this tree's worst).")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("idle", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
