"""API latency with the devices open: ``get_status`` and ``to_base`` round trips, heartbeat period.

The cell of ``bench/idle_bench.py`` (``cellcal sim`` and ``cellcal run`` as processes, RTDE
at 500 Hz, the robot and the tracker open after a short run, which also makes the active
result ``to_base`` needs), plus 50 ZeroMQ subscribers on the daemon's PUB socket in another
process. This process calls ``get_status`` and ``to_base`` in turn through
``cellcal.daemon.wire.client.Client`` (one DEALER, loopback TCP) and times each round trip with
``time.perf_counter``; meanwhile a raw SUB socket records the heartbeats. The heartbeat
period is measured from the heartbeats' own ``uptime_s`` (the daemon's monotonic clock when
it built each beat): the mean over the window against ``[zmq] heartbeat_s``, and the largest
deviation of a single interval.

Two windows: right after the run, while the robot monitor still follows every sample (it
does for ``capture.MONITOR_LINGER_S`` after its last use), and after that, the steady state
of a connected idle daemon. Targets: p99 of both calls under 5 ms, heartbeat
period within 0.2 % of the configured value.

Run: ``.venv/bin/python bench/api_bench.py [--seconds 25] [--compare COMMIT]`` (``--compare``:
also the daemon of another commit, interleaved, as in ``bench/idle_bench.py``). Writes the
``api`` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench._results import machine_line, write_section  # noqa: E402
from bench.idle_bench import idle_cell, load_text, make_tree  # noqa: E402

N_SUBSCRIBERS = 50


def _subscribers(endpoint: str, n: int, stop) -> None:
    """Child process: ``n`` SUB sockets on every topic, drained until ``stop`` is set."""
    import zmq

    from cellcal.daemon import protocol as P

    ctx = zmq.Context()
    poller = zmq.Poller()
    subs = []
    for _ in range(n):
        s = ctx.socket(zmq.SUB)
        s.linger = 0
        s.connect(endpoint)
        s.setsockopt_string(zmq.SUBSCRIBE, P.TOPIC_PREFIX)
        poller.register(s, zmq.POLLIN)
        subs.append(s)
    while not stop.is_set():
        for s, _ev in poller.poll(100):
            while True:
                try:
                    s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
    for s in subs:
        s.close(linger=0)
    ctx.term()


def _window(cell, seconds: float, heartbeat_s: float) -> dict:
    """Interleaved get_status / to_base calls for ``seconds``; heartbeats recorded meanwhile."""
    from cellcal.daemon import protocol as P
    from cellcal.daemon.wire.client import Client

    status_ms: list[float] = []
    to_base_ms: list[float] = []
    mark = cell.recorder.mark()
    load0 = load_text()
    with Client(cell.cmd_endpoint, timeout_s=5.0, retries=0) as c:
        c.call("get_status")  # connect before timing
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            c.call("get_status")
            t1 = time.perf_counter()
            c.call("to_base", point_m=[1.0, 0.5, 0.2])
            t2 = time.perf_counter()
            status_ms.append((t1 - t0) * 1e3)
            to_base_ms.append((t2 - t1) * 1e3)
            cell.recorder.pump(0.0)
    cell.recorder.pump(0.2)
    beats = [env["body"]["uptime_s"] for topic, env in cell.recorder.messages[mark:] if topic == P.TOPIC_HEARTBEAT]
    up = np.array(beats, dtype=float)
    intervals = np.diff(up)
    return {
        "load": f"{load0} -> {load_text()}",
        "calls": len(status_ms),
        "status": np.array(status_ms), "to_base": np.array(to_base_ms),
        "beats": len(up),
        "period_s": float((up[-1] - up[0]) / (len(up) - 1)) if len(up) > 1 else float("nan"),
        "worst_interval_dev_s": float(np.max(np.abs(intervals - heartbeat_s))) if len(intervals) else float("nan"),
    }


def _one(work: Path, args: argparse.Namespace, tree: Path | None) -> tuple[dict, dict]:
    """Both windows against one daemon (this tree's, or the one in ``tree``)."""
    from cellcal.daemon.capture import MONITOR_LINGER_S

    mpctx = mp.get_context("spawn")
    stop = mpctx.Event()
    with idle_cell(work, heartbeat_s=args.heartbeat_s, daemon_tree=tree) as cell:
        t_end_run = time.monotonic()
        subs = mpctx.Process(target=_subscribers, args=(cell.pub_endpoint, N_SUBSCRIBERS, stop), daemon=True)
        subs.start()
        try:
            following = _window(cell, args.seconds, args.heartbeat_s)
            # the steady state: past the robot monitor's linger after the run
            time.sleep(max(0.0, t_end_run + MONITOR_LINGER_S + 5.0 - time.monotonic()))
            idle = _window(cell, args.seconds, args.heartbeat_s)
        finally:
            stop.set()
            subs.join(timeout=10)
            if subs.is_alive():
                subs.kill()
    return following, idle


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=25.0, help="length of each window (s)")
    ap.add_argument("--heartbeat-s", type=float, default=1.0)
    ap.add_argument("--compare", metavar="COMMIT", default=None,
                    help="also run the daemon of COMMIT (git), interleaved: this tree, COMMIT, this tree")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    from cellcal.daemon.capture import MONITOR_LINGER_S

    if args.seconds > MONITOR_LINGER_S - 2.0:
        ap.error(f"--seconds must be below the robot monitor's linger ({MONITOR_LINGER_S:g} s) minus 2")
    order: list[tuple[str, Path | None]] = [("this tree", None)]
    results: list[tuple[str, dict, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.compare:
            tree = make_tree(args.compare, Path(tmp) / "compare")
            order = [("this tree", None), (args.compare, tree), ("this tree", None)]
        for k, (name, tree_path) in enumerate(order):
            work = Path(tmp) / f"cell{k}"
            work.mkdir()
            following, idle = _one(work, args, tree_path)
            results.append((name, following, idle))
            print(name, "done", flush=True)

    hb = args.heartbeat_s
    lines = [
        "## API latency with the devices open (`bench/api_bench.py`)",
        "",
        machine_line(),
        "",
        "`cellcal run` with the robot (RTDE at 500 Hz) and the tracker open after a run, "
        f"{N_SUBSCRIBERS} subscribers connected to its PUB socket (another process), `[zmq] heartbeat_s = {hb:g}`. "
        "Round trips through `cellcal.daemon.wire.client.Client` over loopback TCP, `get_status` and `to_base` "
        "alternating; heartbeat period from the beats' own `uptime_s`."
        + (f" Rounds interleaved: this tree, {args.compare}, this tree." if args.compare else ""),
        "",
        "| daemon | window | load average (1/5/15 min, start -> end) | calls | get_status p50 / p99 / max (ms) | "
        "to_base p50 / p99 / max (ms) | heartbeats | mean period (s) | off by | worst single interval off by (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for k, (daemon, following, idle) in enumerate(results):
        daemon = f"{daemon} (round {k + 1})" if len(results) > 1 else daemon
        for name, w in (("robot monitor following (right after the run)", following),
                        (f"connected idle (from {MONITOR_LINGER_S + 5:g} s after the run)", idle)):
            off = (w["period_s"] - hb) / hb
            lines.append(
                f"| {daemon} | {name} | {w['load']} | {w['calls']} | "
                f"{_pct(w['status'], 50):.2f} / {_pct(w['status'], 99):.2f} / {w['status'].max():.2f} | "
                f"{_pct(w['to_base'], 50):.2f} / {_pct(w['to_base'], 99):.2f} / {w['to_base'].max():.2f} | "
                f"{w['beats']} | {w['period_s']:.5f} | {off * 100:+.3f} % | {w['worst_interval_dev_s'] * 1e3:.1f} |")
            if not daemon.startswith("this tree"):
                continue
            ok_calls = _pct(w["status"], 99) < 5.0 and _pct(w["to_base"], 99) < 5.0
            ok_hb = abs(off) <= 0.002
            verdicts.append(f"{daemon}, {name}: p99 under 5 ms **{'met' if ok_calls else 'NOT met'}**, heartbeat "
                            f"period within 0.2 % **{'met' if ok_hb else 'NOT met'}**")
    lines += ["", "Targets:", ""] + [f"- {v}" for v in verdicts]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("api", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
