"""Idle cost: CPU of a connected, idle daemon with the robot streaming RTDE at 500 Hz, with and
without 50 ZeroMQ subscribers.

The simulated cell runs as its own process (``cellcal sim``, the fast scenario), the daemon as
another (``cellcal run``) and the subscribers as a third (50 SUB sockets on the daemon's PUB
endpoint, subscribed to the topics a plant's client follows: heartbeat, state, station (a run's
progress), result, drift); only the daemon's CPU counts (``utime + stime`` of its process from
``/proc/<pid>/stat``, every thread, over each window). Two phases, each a series of windows
(``--seconds`` long, 30 s by default) that alternate 50 subscribers and none, the subscribers
first: *no run* (the daemon connected its devices by itself at its start and has run nothing:
the first window starts at the first heartbeat with the robot connected), then *after a run*
(a short calibration run opens the robot and the tracker, which stay open; the windows start
after the robot monitor's linger). The target: at most 3 % of one core with 50 subscribers,
every window. The sim's and the subscribers' CPU are reported beside it, not counted.

Run: ``.venv/bin/python bench/idle_bench.py [--seconds 30] [--rounds 2] [--compare COMMIT]``.
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
from collections.abc import Callable, Iterator
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
              daemon_tree: Path | None = None,
              before_run: Callable[[IdleCell], None] | None = None) -> Iterator[IdleCell]:
    """Start ``cellcal sim`` and ``cellcal run``, measure the baseline, take one run, yield.

    ``baseline_s`` > 0: the daemon's CPU share over that long from its first heartbeat
    (the daemon connects its devices by itself at its start; no run yet).
    ``before_run``: called with the cell (``run_id`` 0) once a heartbeat says the robot is
    connected, before the run.
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
        if before_run is not None:
            rec.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT and b["devices"]["robot"]["connected"], 60.0,
                         alive=daemon.alive, what="a heartbeat with the robot connected")
            before_run(IdleCell(cfg, daemon, sim, rec, 0, baseline))
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


def _subscribers(endpoint: str, n: int, topics: tuple[str, ...], ready: Any, stop: Any, received: Any) -> None:
    """Child process: ``n`` SUB sockets subscribed to ``topics``, drained until ``stop`` is set;
    ``ready`` once every socket has had a message (each heard a heartbeat: subscribed for real)."""
    import zmq

    ctx = zmq.Context()
    poller = zmq.Poller()
    socks = []
    for _ in range(n):
        s = ctx.socket(zmq.SUB)
        s.linger = 0
        for t in topics:
            s.setsockopt_string(zmq.SUBSCRIBE, t)
        s.connect(endpoint)
        poller.register(s, zmq.POLLIN)
        socks.append(s)
    heard: set[int] = set()
    count = 0
    while not stop.is_set():
        for s, _ev in poller.poll(100):
            while True:
                try:
                    s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                count += 1
                heard.add(id(s))
        if len(heard) == n:
            ready.set()
    received.value = count
    for s in socks:
        s.close(linger=0)
    ctx.term()


@contextlib.contextmanager
def subscribers(endpoint: str, n: int, timeout_s: float = 30.0) -> Iterator[Any]:
    """``n`` subscribers in another process, all of them receiving, for the ``with`` block;
    yields ``(process, received)``: ``received.value`` is the messages they took, set at exit."""
    import multiprocessing as mp

    from cellcal.daemon import protocol as P

    topics = (P.TOPIC_HEARTBEAT, P.TOPIC_STATE, P.TOPIC_STATION, P.TOPIC_RESULT, P.TOPIC_DRIFT)
    mpctx = mp.get_context("spawn")
    ready, stop, received = mpctx.Event(), mpctx.Event(), mpctx.Value("q", -1)
    proc = mpctx.Process(target=_subscribers, args=(endpoint, n, topics, ready, stop, received), daemon=True)
    proc.start()
    try:
        if not ready.wait(timeout_s):
            raise RuntimeError(f"{n} subscribers did not all hear the daemon within {timeout_s} s")
        yield proc, received
    finally:
        stop.set()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()


def _window(cell: IdleCell, seconds: float, n_subs: int) -> dict[str, Any]:
    """One measurement window of ``seconds`` with ``n_subs`` subscribers connected (0: none)."""
    port = int(cell.cfg["robot"]["url"].rsplit(":", 1)[1].split("?")[0].split("/")[0])
    with contextlib.ExitStack() as stack:
        subs = stack.enter_context(subscribers(cell.pub_endpoint, n_subs)) if n_subs else None
        load_before = load_text()
        sim_c0 = cpu_s(cell.sim.proc.pid)
        sub_c0 = cpu_s(subs[0].pid) if subs else 0.0
        b0 = rtde_bytes_received(port)
        c0, t0 = cpu_s(cell.daemon.pid), time.monotonic()
        time.sleep(seconds)  # the measurement window
        wall = time.monotonic() - t0
        share = (cpu_s(cell.daemon.pid) - c0) / wall
        sim_share = (cpu_s(cell.sim.proc.pid) - sim_c0) / wall
        sub_share = (cpu_s(subs[0].pid) - sub_c0) / wall if subs else None
        b1 = rtde_bytes_received(port)
        load_after = load_text()
    return {
        "subscribers": n_subs, "share": share, "sim_share": sim_share, "sub_share": sub_share,
        "pkg_rate": (b1 - b0) / wall / rtde_package_bytes(), "load": f"{load_before} -> {load_after}",
        "messages": subs[1].value if subs else None,
    }


def _measure(tmp: Path, args: argparse.Namespace, after_s: float, tree: Path | None) -> list[dict[str, Any]]:
    """Both phases against one daemon (this tree's, or the one in ``tree``)."""
    pattern = [args.subscribers, 0] * args.rounds
    rows: list[dict[str, Any]] = []

    def no_run(cell: IdleCell) -> None:
        for n in pattern:
            rows.append({"phase": "no run", **_window(cell, args.seconds, n)})
            print(rows[-1], flush=True)

    with idle_cell(tmp, frequency_hz=args.frequency_hz, daemon_tree=tree, before_run=no_run) as cell:
        time.sleep(after_s)  # the daemon idles: the robot monitor stops following after its linger
        for n in pattern:
            rows.append({"phase": "after a run", **_window(cell, args.seconds, n)})
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each window (s)")
    ap.add_argument("--rounds", type=int, default=2, help="windows with and without subscribers per phase")
    ap.add_argument("--frequency-hz", type=float, default=500.0)
    ap.add_argument("--subscribers", type=int, default=50, help="ZeroMQ subscribers connected in every other window")
    ap.add_argument("--after-s", type=float, default=None,
                    help="start the windows this long after the run ended (default: the robot monitor's linger + 5 s)")
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
            rows += [(name, r) for r in _measure(work, args, after_s, tree_path)]

    lines = [
        "## Idle cost of a connected daemon (`bench/idle_bench.py`)",
        "",
        machine_line(),
        "",
        f"`cellcal run`, `cellcal sim` (fast scenario) and {args.subscribers} ZeroMQ subscribers as three processes; "
        f"the robot streams RTDE at {args.frequency_hz:g} Hz. The subscribers are SUB sockets on the daemon's PUB "
        "endpoint (loopback tcp) subscribed to heartbeat, state, station (a run's progress), result and drift, "
        "drained by their own process (the bench's own recorder, one more SUB socket, stays connected "
        "throughout); a window with them starts once each has received a message. Windows of "
        f"{args.seconds:g} s alternate {args.subscribers} subscribers and none, the subscribers first, in two "
        "phases: *no run*, from the first heartbeat with the robot connected (the daemon opened its devices by "
        f"itself at its start and has run nothing), then *after a run* (a 6-station run; the windows start {after_s:g} s "
        f"after it ended: the robot monitor follows the samples for {MONITOR_LINGER_S:g} s after its last use, "
        "`capture.MONITOR_LINGER_S`). CPU is `utime + stime` of the daemon's process (all threads) from `/proc` "
        "over the window; the simulator's and the subscribers' are shown, not counted. Packages received: bytes "
        f"the kernel received on the daemon's RTDE connection (`ss -ti`) / {rtde_package_bytes()} bytes per package; "
        f"the simulator, itself at the machine's mercy, sends at most {args.frequency_hz:g}/s. Messages: what the "
        f"{args.subscribers} subscribers received from their start to the window's end, all of them."
        + (" Daemons in the order run (interleaved)." if args.compare else ""),
        "",
        "| daemon | phase | subscribers | load average (1/5/15 min, start -> end) | daemon (% of a core) | "
        "RTDE packages/s received | messages | sim (% of a core) | subscribers (% of a core) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        msgs = "-" if r["messages"] is None else str(r["messages"])
        sub = "-" if r["sub_share"] is None else f"{r['sub_share'] * 100:.1f}"
        lines.append(f"| {name} | {r['phase']} | {r['subscribers']} | {r['load']} | **{r['share'] * 100:.2f}** | "
                     f"{r['pkg_rate']:.0f} | {msgs} | {r['sim_share'] * 100:.1f} | {sub} |")
    ours = [r for name, r in rows if name == "this tree"]
    with_subs = [r["share"] for r in ours if r["subscribers"] > 0]
    without = [r["share"] for r in ours if r["subscribers"] == 0]
    worst = max(with_subs)
    verdict = "met" if worst <= 0.03 else "NOT met"
    lines += ["", f"Target: at most 3 % of one core, connected at {args.frequency_hz:g} Hz with {args.subscribers} "
              f"subscribers, every window of both phases: **{verdict}** (this tree, worst of {len(with_subs)}: "
              f"{worst * 100:.2f} %; without subscribers worst {max(without) * 100:.2f} %)."]
    if args.compare:
        theirs = [r for name, r in rows if name != "this tree"]
        t_worst = max(r["share"] for r in theirs if r["subscribers"] > 0)
        t_first = theirs[0]
        lines[-1] += (f" The daemon of {args.compare} in the same run: worst with subscribers {t_worst * 100:.2f} %, "
                      f"its first window after its start {t_first['share'] * 100:.2f} %.")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("idle", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
