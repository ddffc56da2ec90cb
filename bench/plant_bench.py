"""Plant interfaces: 500 cells' retained topics on one broker, and each interface's cost to the daemon.

1. **500 cells on one broker.** A Mosquitto broker (Debian's, on 127.0.0.1, no persistence)
   and 500 simulated cells: each is cellcal's own MQTT publisher
   (``cellcal.daemon.plant.mqtt.MqttPublisher``, its connection, last will and retained
   topics) fed the bodies of a real calibration of the fast simulated cell, with the cell
   name changed. Measured: the time until every cell's three retained topics (``state``,
   ``result/active``, ``drift``) are on the broker, the time a dashboard that subscribes to
   ``cellcal/+/#`` late takes to receive all 1,500 retained messages, their size, the broker's
   resident memory, and a broker killed and restarted without persistence: the time until
   all 1,500 are back, a drift check each cell made during the outage the retained one.
2. **Cost per result and per heartbeat.** Each interface alone in this process, fed the same
   real bodies: the process's CPU (all threads, ``/proc/self/stat``) per result and per
   heartbeat, above its idle CPU over the same time (measured first). MQTT publishes to the
   broker; OPC UA writes its address space (``update_s`` 0.01 s and the events spaced so each
   is applied: at the default 0.5 s heartbeats are coalesced); metrics count on events and
   do their work at a scrape, so a scrape (by ``curl``, another process) is measured too.

Run: ``.venv/bin/python bench/plant_bench.py [--cells 500]``. Writes the ``plant`` section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, write_section  # noqa: E402


def cpu_s() -> float:
    """CPU seconds (user + system, all threads) of this process, to the nanosecond
    (``CLOCK_PROCESS_CPUTIME_ID``; ``/proc``'s ticks of 10 ms are too coarse per event)."""
    return time.process_time()


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def wait(pred: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)


# ---- the bodies of a real calibration ------------------------------------------------------------


def real_bodies(workdir: Path) -> dict[str, dict]:
    """Heartbeat, state, result and drift bodies of one run of the fast simulated cell."""
    from cellcal.daemon import protocol as P
    from cellcal.testing.harness import inprocess_cell

    with inprocess_cell(workdir, n_stations=6, zmq=False) as cell:
        run_id = cell.svc.start_run("base_frame", reason="bench")
        result = cell.wait_result(run_id)
        cell.svc.request_drift_check("bench")
        drift = cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT, 30.0, "a drift check")
        cell.svc.wait_idle(20.0)
        return {"heartbeat": dict(cell.svc.status()), "state": cell.bodies(P.TOPIC_STATE)[-1], "result": result,
                "drift": drift}


class BenchPort:
    """A simulated daemon for one cell: the interface's ``DaemonPort`` over fixed bodies."""

    def __init__(self, cell: str, bodies: Mapping[str, dict]) -> None:
        from cellcal.daemon.plant import DaemonPort

        self.bodies = bodies
        hb = dict(bodies["heartbeat"], cell=cell)
        self.port = DaemonPort(cell=cell, boot_id=f"bench-{cell}", version="bench", motion_mode="command",
                               status=lambda: hb, handler=self, last_run=lambda: None, publish_fault=lambda body: None)

    def handle(self, cmd: str, args: dict, caller: Any) -> Any:
        if cmd == "get_result":
            return self.bodies["result"]
        raise NotImplementedError(cmd)


class Broker:
    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("mosquitto", path="/usr/sbin:/usr/bin:/sbin:/bin")
        if self.binary is None:
            sys.exit("plant_bench: mosquitto is not installed: run `make os-deps`")
        from cellcal.testing.harness import free_port

        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        # 500 connections and a dashboard: above the default limits of neither broker nor kernel.
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                             "max_queued_messages 100000\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Broker:
        self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

        def accepts() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        wait(accepts, 15.0, "mosquitto")
        return self

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Dashboard:
    """A subscriber to ``cellcal/+/#``: the retained messages it was given, by topic (with
    ``live``, also those delivered live: after a broker restart the cells may republish
    after the dashboard subscribed, and the broker then forwards them without the flag)."""

    def __init__(self, port: int, *, live: bool = False) -> None:
        import paho.mqtt.client as mqtt

        self.retained: dict[str, bytes] = {}
        self.live = live
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"dashboard-{time.monotonic_ns()}")
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe("cellcal/+/#", qos=1)
        self.c.on_message = self._on
        self.c.connect("127.0.0.1", port, keepalive=30)
        self.c.loop_start()

    def _on(self, client: Any, userdata: Any, msg: Any) -> None:
        if msg.retain or self.live:
            with self.lock:
                self.retained[msg.topic] = msg.payload

    def count(self) -> int:
        with self.lock:
            return len(self.retained)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


#: Simulated cells per worker process: paho's network loop uses select(), which takes no
#: descriptor above 1023, and each client holds three (its socket and a wake-up pair); one
#: daemon has one client, a process of 500 would have 1,500.
CELLS_PER_PROCESS = 100


def _cells_worker(conn: Any, first: int, count: int, bodies: Mapping[str, dict], url: str) -> None:
    """``count`` simulated cells in one process, driven by the parent over ``conn``."""
    from cellcal.daemon import protocol as P
    from cellcal.daemon.plant.config import Mqtt
    from cellcal.daemon.plant.mqtt import MqttPublisher

    cfg = Mqtt(enabled=True, url=url, reconnect_min_s=0.2, reconnect_max_s=1.0, heartbeat=False)
    pubs = []
    for i in range(first, first + count):
        p = MqttPublisher(cfg, BenchPort(f"cell-{i:03d}", bodies).port, lambda *a, **k: None)
        p.start()
        p.on_event(P.TOPIC_DRIFT, bodies["drift"])
        pubs.append(p)
    try:
        wait(lambda: all(p.stats["published"] >= 3 for p in pubs), 300.0, "every cell's retained topics")
        conn.send("published")
        assert conn.recv() == "outage"
        wait(lambda: all(not p._connected() for p in pubs), 60.0, "every cell to notice the outage")
        during = dict(bodies["drift"], check_id=bodies["drift"]["check_id"] + 1)
        for p in pubs:
            p.on_event(P.TOPIC_DRIFT, during)
        conn.send("checked")
        assert conn.recv() == "stop"
    finally:
        for p in pubs:
            p.stop()
        conn.send("stopped")


def many_cells(n: int, bodies: Mapping[str, dict], workdir: Path) -> dict[str, Any]:
    import multiprocessing as mp

    broker = Broker(workdir).start()
    url = f"mqtt://127.0.0.1:{broker.port}"
    ctx = mp.get_context("spawn")
    workers = []
    try:
        t0 = time.monotonic()
        for first in range(0, n, CELLS_PER_PROCESS):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_cells_worker, args=(child, first, min(CELLS_PER_PROCESS, n - first), bodies, url),
                               daemon=True)
            proc.start()
            workers.append((proc, parent))
        for _proc, pipe in workers:
            if not pipe.poll(300.0) or pipe.recv() != "published":
                raise TimeoutError("a worker's cells did not publish")
        t_publish = time.monotonic() - t0  # (includes starting the worker processes)
        dash = Dashboard(broker.port)
        wait(lambda: dash.count() >= 3 * n, 120.0, "a late dashboard's retained messages")
        t_late = time.monotonic() - dash.t0
        size = sum(len(v) for v in dash.retained.values())
        dash.close()
        rss = rss_mib(broker.proc.pid)  # type: ignore[union-attr]
        # The broker goes, the cells check their drift meanwhile, the broker comes back empty.
        broker.kill()
        for _proc, pipe in workers:
            pipe.send("outage")
        for _proc, pipe in workers:
            if not pipe.poll(120.0) or pipe.recv() != "checked":
                raise TimeoutError("a worker's cells did not see the outage")
        check_id = bodies["drift"]["check_id"] + 1
        t1 = time.monotonic()
        broker.start()
        dash = Dashboard(broker.port, live=True)

        def all_back() -> bool:
            with dash.lock:
                drift = [v for t, v in dash.retained.items() if t.endswith("/drift")]
                return len(dash.retained) >= 3 * n and all(b'"check_id":%d' % check_id in v for v in drift)

        wait(all_back, 300.0, "every retained topic back after the restart", poll_s=0.05)
        t_back = time.monotonic() - t1
        dash.close()
        late = Dashboard(broker.port)
        wait(lambda: late.count() >= 3 * n, 120.0, "the restarted broker's retained messages")
        late.close()
        return {"cells": n, "t_publish": t_publish, "t_late": t_late, "bytes": size, "rss": rss, "t_back": t_back,
                "processes": len(workers)}
    finally:
        for proc, pipe in workers:
            try:
                pipe.send("stop")
                pipe.poll(30.0)
            except (OSError, EOFError):
                pass
            proc.join(timeout=30.0)
            if proc.is_alive():
                proc.kill()
        broker.stop()


# ---- cost per result and per heartbeat ------------------------------------------------------------------


def _results(bodies: Mapping[str, dict], n: int) -> list[dict]:
    """``n`` distinct active results (ids differ, so nothing is coalesced as a repeat)."""
    out = []
    for i in range(n):
        r = copy.deepcopy(bodies["result"])
        r["result_id"] = str(1000 + i)
        out.append(r)
    return out


def cost(name: str, bodies: Mapping[str, dict], workdir: Path, n_hb: int, n_res: int) -> dict[str, Any]:
    from cellcal.daemon import protocol as P
    from cellcal.daemon.plant.config import Metrics, Mqtt, OpcUa
    from cellcal.testing.harness import free_port

    port = BenchPort("cost", bodies).port
    broker = None
    extra: dict[str, Any] = {}
    if name == "mqtt":
        from cellcal.daemon.plant.mqtt import MqttPublisher

        broker = Broker(workdir).start()
        a: Any = MqttPublisher(Mqtt(enabled=True, url=f"mqtt://127.0.0.1:{broker.port}"), port, lambda *x, **k: None)

        def done(k: int) -> Callable[[], bool]:
            base = a.stats["published"]
            return lambda: a.stats["published"] >= base + k
    elif name == "opcua":
        from cellcal.daemon.plant.opcua import OpcUaServer

        pw = workdir / "pw"
        pw.write_text("bench\n")
        a = OpcUaServer(OpcUa(enabled=True, endpoint=f"opc.tcp://127.0.0.1:{free_port()}", security=["none"],
                              allow_none_on_loopback=True, anonymous=True, update_s=0.01), port, lambda *x, **k: None)

        def done(k: int) -> Callable[[], bool]:
            base = a.updates
            return lambda: a.updates >= base + 1
    else:
        from cellcal.daemon.plant.metrics import MetricsExporter

        a = MetricsExporter(Metrics(enabled=True, listen=f"127.0.0.1:{free_port()}"), port, lambda *x, **k: None)

        def done(k: int) -> Callable[[], bool]:
            return lambda: True
    a.start()
    try:
        time.sleep(1.0)
        c0, t0 = cpu_s(), time.monotonic()
        time.sleep(3.0)
        idle = (cpu_s() - c0) / (time.monotonic() - t0)

        def feed(topic: str, items: list[dict], spacing_s: float) -> float:
            c0, t0 = cpu_s(), time.monotonic()
            for body in items:
                check = done(1)
                a.on_event(topic, body)
                wait(check, 30.0, f"{name} to take a {topic}", poll_s=0.002)
                time.sleep(spacing_s)
            elapsed = time.monotonic() - t0
            return max(0.0, cpu_s() - c0 - idle * elapsed) / len(items)

        per_hb = feed(P.TOPIC_HEARTBEAT, [dict(bodies["heartbeat"], uptime_s=float(i)) for i in range(n_hb)], 0.02)
        per_res = feed(P.TOPIC_RESULT, _results(bodies, n_res), 0.05)
        if name == "metrics":
            curl = shutil.which("curl")
            if curl is not None:
                n = 100
                c0, t0 = cpu_s(), time.monotonic()
                for _ in range(n):
                    subprocess.run([curl, "-s", "-o", "/dev/null", a.url], check=True)
                extra["per_scrape"] = max(0.0, cpu_s() - c0 - idle * (time.monotonic() - t0)) / n
                extra["scrape_bytes"] = len(subprocess.run([curl, "-s", a.url], capture_output=True, check=True).stdout)
        return {"name": name, "idle": idle, "per_hb": per_hb, "per_res": per_res, **extra}
    finally:
        a.stop()
        if broker is not None:
            broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=500)
    ap.add_argument("--heartbeats", type=int, default=200)
    ap.add_argument("--results", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="plant-bench-") as tmp:
        work = Path(tmp)
        bodies = real_bodies(work / "cell")
        costs = []
        for name in ("mqtt", "opcua", "metrics"):
            (work / name).mkdir()
            costs.append(cost(name, bodies, work / name, args.heartbeats, args.results))
            print(costs[-1], flush=True)
        many = many_cells(args.cells, bodies, work)
        print(many, flush=True)
    result_kib = len(__import__("json").dumps(bodies["result"])) / 1024
    lines = [
        "## Plant interfaces: 500 cells on one broker, and each interface's cost (`bench/plant_bench.py`)",
        "",
        machine_line(),
        "",
        f"**{many['cells']} cells on one Mosquitto** (127.0.0.1, no persistence): each cell is cellcal's own MQTT "
        "publisher (its connection, last will and retained topics) fed the bodies of a real calibration of the fast "
        f"simulated cell (a result body is {result_kib:.1f} KiB of JSON), {CELLS_PER_PROCESS} cells per process "
        f"({many['processes']} processes: paho's loop uses select(), which takes no descriptor above 1023).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| all {many['cells']} cells connected, their 3 retained topics published (from starting the processes) | "
        f"{many['t_publish']:.2f} s |",
        f"| a dashboard subscribing to `cellcal/+/#` late: all {3 * many['cells']} retained messages received | "
        f"{many['t_late']:.2f} s ({many['bytes'] / 2**20:.1f} MiB) |",
        f"| broker resident memory with them | {many['rss']:.1f} MiB |",
        f"| broker killed and restarted empty: all {3 * many['cells']} retained back, each cell's drift check of the "
        f"outage the retained `drift` | {many['t_back']:.2f} s (reconnection backoff 0.2 .. 1 s) |",
        "",
        "**Cost to the daemon** (each interface alone in the process, real bodies; CPU of the process, all threads "
        "(`CLOCK_PROCESS_CPUTIME_ID`), above its idle CPU over the same time; OPC UA with `update_s` = 0.01 and "
        "every event applied, no client subscribed; MQTT to the broker above; metrics count on events and work at a "
        "scrape, by `curl`):",
        "",
        "| interface | idle (% of a core) | CPU per heartbeat | CPU per result |",
        "|---|---|---|---|",
    ]
    for c in costs:
        lines.append(f"| {c['name']} | {100 * c['idle']:.2f} | {1e3 * c['per_hb']:.3f} ms | {1e3 * c['per_res']:.2f} ms |")
    m = next(c for c in costs if c["name"] == "metrics")
    if "per_scrape" in m:
        lines += ["", f"A scrape of `/metrics` ({m['scrape_bytes'] / 1024:.1f} KiB) costs the daemon "
                      f"{1e3 * m['per_scrape']:.2f} ms of CPU."]
    steady = ", ".join(f"{c['name']} {100 * (c['idle'] + c['per_hb']):.2f} %" for c in costs)
    lines += ["", f"At the daemon's 1 Hz heartbeat (idle plus one heartbeat a second): {steady} of a core; a result "
                  "adds the per-result figure once. The figures are noisy on this shared machine (load average above)."]
    write_section("plant", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
