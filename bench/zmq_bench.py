"""ZeroMQ benchmark: publish-to-receive latency of the daemon's PUB socket.

Run: ``.venv/bin/python bench/zmq_bench.py [--cadence-s 10]`` (from anywhere). Writes the
``zmq`` section of bench/RESULTS.md.

What is measured: from just before ``ZmqServer.publish()`` in the publishing thread (a
``time.monotonic_ns()`` stamp carried in the body) to the decoded envelope in a subscriber.
Subscribers live in another process (CLOCK_MONOTONIC is one clock for every process on
Linux), so the publisher and the receivers do not share a GIL. The path: publish() ->
queue + wake-up pipe -> the server's I/O thread (seq, envelope) -> PUB -> TCP loopback ->
SUB -> msgpack decode.

Scenarios: the daemon's 1 Hz heartbeat cadence for ``--cadence-s`` seconds, and a burst of
1,000 messages published back to back; each with 1 and with 50 subscribers. The 50
subscribers are polled by ONE Python process, so under a burst (50,000 deliveries) the
receiver, not the daemon, is the bottleneck: those figures are an upper bound for a
client that reads as slowly as Python does.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import sys
import time
from pathlib import Path

# Run as a script from anywhere: make `bench` and the editable install importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from bench._results import machine_line, write_section  # noqa: E402
from cellcal.daemon import protocol as P  # noqa: E402
from cellcal.daemon.config import Zmq  # noqa: E402
from cellcal.daemon.wire.zmq_server import ZmqServer  # noqa: E402

BURST = 1000


def _heartbeat(k: int, run: str) -> dict:
    # A heartbeat-sized body (the daemon's has the same fields) plus the stamps we need.
    dev = {"connected": True, "url": "rtde://127.0.0.1:30004", "identity": "UR5e 20235500123"}
    return {"cell": "bench", "state": "IDLE", "uptime_s": float(k), "heartbeat_s": 1.0,
            "devices": {"robot": dev, "tracker": dict(dev, url="socket://127.0.0.1:4000")},
            "active_result_id": "r-0007", "suspect": False, "run_id": None, "version": "0.1.0",
            "bench_run": run, "k": k, "t_mono_ns": time.monotonic_ns()}


def _subscribers(endpoint: str, n: int, conn, expected: int, timeout_s: float) -> None:
    """Child process: n SUB sockets; record latency of every message of the current run."""
    ctx = zmq.Context()
    subs = []
    for _ in range(n):
        s = ctx.socket(zmq.SUB)
        s.linger = 0
        s.rcvhwm = 100_000
        s.connect(endpoint)
        s.setsockopt(zmq.SUBSCRIBE, P.TOPIC_HEARTBEAT.encode())
        subs.append(s)
    poller = zmq.Poller()
    for s in subs:
        poller.register(s, zmq.POLLIN)
    # Join: every socket must have seen a probe before the run starts.
    seen = set()
    while len(seen) < n:
        for s, _ in poller.poll(100):
            s.recv_multipart()
            seen.add(s)
    conn.send("joined")
    run = conn.recv()  # the run's tag; probes published before it are ignored
    latencies_ns = []
    got = 0
    deadline = time.monotonic() + timeout_s
    last_rx = time.monotonic()
    while got < expected * n and time.monotonic() < deadline:
        if got and time.monotonic() - last_rx > 3.0:
            break  # the rest was dropped at the high-water mark: reported as delivered < expected
        for s, _ in poller.poll(100):
            last_rx = time.monotonic()
            while True:
                try:
                    frames = s.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                now = time.monotonic_ns()
                body = P.unpack(frames[1])["body"]
                if body.get("bench_run") == run:
                    latencies_ns.append(now - body["t_mono_ns"])
                    got += 1
    conn.send(latencies_ns)
    ctx.destroy(linger=0)


def _load() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def _previous_burst_p99(commit: str | None = None) -> str | None:
    """The 50-subscriber burst p99 that RESULTS.md holds now (before this run rewrites it), or
    held at ``commit``; found by the table's own header (the columns have changed over time)."""
    import subprocess

    from bench._results import RESULTS

    try:
        if commit is None:
            text = RESULTS.read_text()
        else:
            text = subprocess.run(["git", "show", f"{commit}:bench/RESULTS.md"], cwd=RESULTS.parent,
                                  capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"<!-- BEGIN zmq -->(.*?)<!-- END zmq -->", text, re.S)
    if not m:
        return None
    header, row = None, None
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "p99 (ms)" in cells:
            header = cells
        elif header and len(cells) == len(header) and cells[0] == f"burst of {BURST}" and cells[1] == "50":
            row = cells
    if header is None or row is None:
        return None
    run = re.search(r"run ([0-9-]+ [0-9:]+ UTC)", m.group(1))
    load = f", load {row[header.index('load average at start (1 / 5 / 15 min)')]}" if any(
        h.startswith("load average") for h in header) else ", load not recorded"
    return f"{row[header.index('p99 (ms)')]} ms (run {run.group(1) if run else 'of unknown date'}{load})"


def _scenario(srv: ZmqServer, n_subs: int, mode: str, count: int, period_s: float) -> dict:
    load = _load()
    parent, child = mp.Pipe()
    timeout_s = count * period_s + 30.0
    proc = mp.Process(target=_subscribers, args=(srv.pub_endpoint, n_subs, child, count, timeout_s), daemon=True)
    proc.start()
    while not parent.poll(0.02):  # probes until every subscriber is connected
        srv.publish(P.TOPIC_HEARTBEAT, {"probe": True})
    parent.recv()
    time.sleep(0.2)
    run = f"{mode}-{n_subs}"
    parent.send(run)
    time.sleep(0.1)
    call_ns = []
    if mode == "cadence":
        t_next = time.monotonic()
        for k in range(count):
            t0 = time.monotonic_ns()
            srv.publish(P.TOPIC_HEARTBEAT, _heartbeat(k, run))
            call_ns.append(time.monotonic_ns() - t0)
            t_next += period_s
            time.sleep(max(0.0, t_next - time.monotonic()))
    else:
        for k in range(count):
            t0 = time.monotonic_ns()
            srv.publish(P.TOPIC_HEARTBEAT, _heartbeat(k, run))
            call_ns.append(time.monotonic_ns() - t0)
    lat = np.array(parent.recv(), dtype=float) / 1e6
    proc.join(10)
    return {"subs": n_subs, "mode": mode, "sent": count, "received": len(lat), "expected": count * n_subs,
            "p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "p99": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
            "max": float(lat.max()) if len(lat) else float("nan"),
            "call_us": float(np.median(call_ns)) / 1e3, "load": load}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cadence-s", type=float, default=10.0, help="length of each 1 Hz run (default 10 s)")
    ap.add_argument("--previous-from", metavar="COMMIT", default=None,
                    help="quote the burst p99 of bench/RESULTS.md at COMMIT (default: the file as it is now)")
    args = ap.parse_args(argv)
    cfg = Zmq(pub_endpoint="tcp://127.0.0.1:*", cmd_endpoint="tcp://127.0.0.1:*", loopback_tcp_any_user=True)
    body_bytes = len(P.pack(_heartbeat(0, "x")))
    previous = _previous_burst_p99(args.previous_from)
    rows = []
    with ZmqServer(cfg, None) as srv:
        for n_subs in (1, 50):
            for mode, count, period in (("cadence", max(1, int(args.cadence_s)), 1.0), ("burst", BURST, 0.0)):
                r = _scenario(srv, n_subs, mode, count, period)
                rows.append(r)
                print(f"{mode:8s} subs={n_subs:3d} received {r['received']}/{r['expected']}  "
                      f"p50 {r['p50']:.3f} ms  p99 {r['p99']:.3f} ms  max {r['max']:.3f} ms  "
                      f"publish() {r['call_us']:.1f} us", flush=True)
    label = {"cadence": f"1 Hz, {max(1, int(args.cadence_s))} s", "burst": f"burst of {BURST}"}
    lines = [
        "## ZeroMQ transport (`bench/zmq_bench.py`)",
        "",
        machine_line(),
        "",
        "Publish-to-receive latency: from a `time.monotonic_ns()` stamp taken just before "
        "`ZmqServer.publish()` in the publishing thread to the decoded envelope in a subscriber in "
        "another process (CLOCK_MONOTONIC on both sides). Path: publish() -> queue and wake-up "
        "pipe -> the server's I/O thread (seq, envelope) -> PUB -> TCP loopback -> SUB -> msgpack "
        f"decode. Heartbeat-sized body ({body_bytes} bytes packed), `sndhwm` 1000. The 50 "
        "subscribers are polled by one Python process, so under a burst the figures are bounded "
        "by that receiver draining 50,000 messages, not by the daemon. Fewer deliveries than "
        "expected are messages PUB dropped at the high-water mark for a subscriber that fell "
        "behind (by design: the daemon never waits for a subscriber).",
        "",
        "| scenario | subscribers | load average at start (1 / 5 / 15 min) | delivered | p50 (ms) | p99 (ms) | "
        "max (ms) | publish() call (us, median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {label[r['mode']]} | {r['subs']} | {r['load']} | {r['received']} / {r['expected']} | "
                     f"{r['p50']:.3f} | {r['p99']:.3f} | {r['max']:.3f} | {r['call_us']:.1f} |")
    burst50 = next(r for r in rows if r["mode"] == "burst" and r["subs"] == 50)
    lines += ["", f"Burst of {BURST} to 50 subscribers, p99: **{burst50['p99']:.1f} ms** at load {burst50['load']}"
              + (f"; the figure this file held{' at ' + args.previous_from if args.previous_from else ''} was "
                 f"{previous}." if previous else ".")]
    write_section("zmq", "\n".join(lines))
    print(f"wrote the zmq section of {Path(__file__).with_name('RESULTS.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
