"""Connection churn: the daemon's resident memory over 10,000 short-lived ZeroMQ clients.

Run: ``.venv/bin/python bench/zmq_churn_bench.py [--cycles 10000] [--compare COMMIT]``. Writes
the ``zmq_churn`` section of bench/RESULTS.md.

``cellcal run`` runs as its own process on loopback, its store holding an active base-frame
result of 40 stations (so ``get_result`` answers with a real body, about 14 KB); its devices
are left unreachable (the daemon is up and answering with its devices offline, as on a cell
whose controller is off). One cycle is what a short-lived client does: a SUB socket connects
and subscribes, a DEALER socket (a new routing id each time, as every ``cellcal ctl`` has)
connects and sends one request, waits for the reply, and both close. Nine cycles in ten
read (``get_result``, ``get_status``, ``list_results``, ``get_snapshot``); one in ten sends a
command that changes state (``abort``, answered "nothing to abort"), whose reply the server
keeps for retries. The daemon's RSS (``VmRSS`` of ``/proc/<pid>/status``) is read before the
churn, after the first 1,000 cycles (allocator arenas and caches warmed) and every 1,000
after; the figure is the growth from the warmed value to the end and the largest on the way.
The target: within 10 MB over 10,000 cycles.

``--compare COMMIT`` also runs the daemon of another commit (its sources on PYTHONPATH, as
``bench/idle_bench.py`` does), first: the figure before the change.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import zmq  # noqa: E402

from bench._results import machine_line, write_section  # noqa: E402
from bench.idle_bench import _pythonpath, make_tree  # noqa: E402
from cellcal.daemon import protocol as P  # noqa: E402
from cellcal.daemon.config import Solve  # noqa: E402
from cellcal.daemon.gates import check_gates  # noqa: E402
from cellcal.daemon.solve import calibration_record  # noqa: E402
from cellcal.daemon.store import Store  # noqa: E402
from cellcal.daemon.wire.endpoints import free_port  # noqa: E402
from cellcal.solver import calibrate_base_frame, synthetic  # noqa: E402
from cellcal.testing import harness as H  # noqa: E402

READS = ("get_result", "get_status", "list_results", "get_snapshot", "get_result", "get_result", "get_status",
         "get_result", "list_results")
TARGET_MB = 10.0


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _seed_store(state_dir: Path) -> None:
    """An active base-frame result of 40 stations, as a run would have stored it."""
    s = synthetic.base_frame_scene(40, np.random.default_rng(0), noise_mm=0.02, noise_deg=0.005)
    result = calibrate_base_frame(s.base_T_flange, s.measured)
    record = calibration_record(result, check_gates(result, Solve()), [])
    with Store(state_dir) as store:
        run = store.create_run("base_frame", {"kind": "generated"}, config_sha256="0" * 64, devices={})
        store.add_result(run, "base_frame", record, {}, activate=True)


@contextlib.contextmanager
def daemon(workdir: Path, tree: Path | None) -> Iterator[tuple[int, str, str]]:
    """``cellcal run`` with an active result and unreachable devices: (pid, cmd, pub endpoint)."""
    cfg = H.daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}", tracker_url=f"socket://127.0.0.1:{free_port()}",
                          workdir=workdir, overrides={"service": {"fault_retry_min_s": 5.0, "fault_retry_max_s": 60.0}})
    _seed_store(workdir / "state")
    conf = H.write_config(workdir / "cellcal.toml", cfg)
    proc = H.DaemonProcess(conf, workdir / "daemon.log")
    with _pythonpath(tree):
        proc.start()
    try:
        yield proc.pid, cfg["zmq"]["cmd_endpoint"], cfg["zmq"]["pub_endpoint"]
    finally:
        proc.terminate()


def _cycle(ctx: zmq.Context, cmd_ep: str, pub_ep: str, i: int) -> None:
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.connect(pub_ep)
    sub.setsockopt(zmq.SUBSCRIBE, P.TOPIC_PREFIX.encode())
    req = ctx.socket(zmq.DEALER)
    req.linger = 0
    req.connect(cmd_ep)
    cmd = "abort" if i % 10 == 9 else READS[i % 10]
    req.send(P.pack({"id": f"churn-{i}", "cmd": cmd, "args": {}}))
    if not req.poll(30_000):
        raise RuntimeError(f"no reply to {cmd} (cycle {i})")
    req.recv()
    req.close()
    sub.close()


def measure(workdir: Path, cycles: int, tree: Path | None) -> dict[str, object]:
    with daemon(workdir, tree) as (pid, cmd_ep, pub_ep):
        ctx = zmq.Context()
        try:
            deadline = time.monotonic() + 60.0
            while True:  # the daemon answers (its start-up: store, sockets)
                try:
                    _cycle(ctx, cmd_ep, pub_ep, 0)
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
            start = rss_kb(pid)
            marks: list[tuple[int, int]] = []
            t0 = time.monotonic()
            for i in range(1, cycles + 1):
                _cycle(ctx, cmd_ep, pub_ep, i)
                if i % 1000 == 0:
                    marks.append((i, rss_kb(pid)))
                    print(f"  {i} cycles: RSS {marks[-1][1] / 1024:.1f} MB", flush=True)
            wall = time.monotonic() - t0
        finally:
            ctx.destroy(linger=0)
    warm = marks[0][1]
    return {"start_mb": start / 1024, "warm_mb": warm / 1024, "end_mb": marks[-1][1] / 1024,
            "growth_mb": (marks[-1][1] - warm) / 1024, "max_growth_mb": (max(r for _, r in marks) - warm) / 1024,
            "from_start_mb": (marks[-1][1] - start) / 1024, "marks": marks, "cycles_per_s": cycles / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10_000)
    ap.add_argument("--compare", metavar="COMMIT", help="also run the daemon of COMMIT first (the figure before)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows: list[tuple[str, dict[str, object]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        order: list[tuple[str, Path | None]] = [("this tree", None)]
        if args.compare:
            order.insert(0, (args.compare, make_tree(args.compare, Path(tmp) / "compare")))
        for k, (name, tree) in enumerate(order):
            print(f"{name}:", flush=True)
            work = Path(tmp) / f"cell{k}"
            work.mkdir()
            rows.append((name, measure(work, args.cycles, tree)))
    ours = rows[-1][1]
    ok = float(ours["max_growth_mb"]) <= TARGET_MB  # type: ignore[arg-type]
    lines = [
        "## ZeroMQ connection churn (`bench/zmq_churn_bench.py`)",
        "",
        machine_line(),
        "",
        f"`cellcal run` as its own process (devices unreachable, an active 40-station result); {args.cycles:,} "
        "cycles of a short-lived client: a SUB connects and subscribes, a DEALER with a new routing id sends one "
        "request and waits for the reply, both close (nine reads in ten: get_result, get_status, list_results, "
        "get_snapshot; one abort, a state-changing command whose reply the server keeps for retries). RSS of the "
        "daemon from `/proc/<pid>/status`; growth from the value after the first 1,000 cycles (the allocator's "
        f"arenas warmed). Target: at most {TARGET_MB:g} MB.",
        "",
        "| daemon | RSS before | after 1,000 | end | growth (max on the way) | from before the churn | cycles/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        lines.append(f"| {name} | {r['start_mb']:.1f} MB | {r['warm_mb']:.1f} MB | {r['end_mb']:.1f} MB | "
                     f"{r['growth_mb']:+.1f} MB ({r['max_growth_mb']:+.1f}) | {r['from_start_mb']:+.1f} MB | "
                     f"{r['cycles_per_s']:.0f} |")
    lines += ["", "RSS every 1,000 cycles (MB): " + "; ".join(
        f"{name}: " + ", ".join(f"{kb / 1024:.1f}" for _, kb in r["marks"]) for name, r in rows),  # type: ignore[union-attr]
        "", f"Within the target: {'yes' if ok else 'NO'}."]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("zmq_churn", text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
