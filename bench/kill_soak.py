"""kill -9 soak of the daemon: SIGKILL ``cellcal run`` at random moments while it captures.

Run as ``.venv/bin/python bench/kill_soak.py [--kills 200] [--seed 0]``; prints a summary
and writes the ``kill_soak`` section of ``bench/RESULTS.md``.

What it does (DESIGN.md section 7: "no accepted station is ever lost, kill -9 at any
moment"):

1. ``cellcal sim`` on the fast scenario (``tests/data/daemon_fast_scenario.toml``, time
   x10) in its own process, alive for the whole soak: the robot and the tracker (pty) do
   not notice that the daemon in front of them dies and comes back.
2. A **reference**: one uninterrupted base-frame run with its own state directory.
3. The **soak**: ``cellcal run`` on a second state directory; a run is started over
   ZeroMQ; every daemon instance is killed with SIGKILL after a random number (0-2) of
   accepted stations plus a random delay (so the kill lands anywhere in a station: moving,
   settling, measuring, committing), then started again on the same state directory,
   where it resumes the unfinished run. When a run completes, the next one is started.
   A raw SUB socket records every ``cellcal/v1/station`` message each instance published.
4. The **audit**: ``PRAGMA integrity_check`` is ok, no ``(run_id, plan_index)`` twice,
   every station any instance published as accepted is in the store (a station is
   published only after its transaction committed), every run finished, each with exactly
   one result, and each result agrees with the reference within the noise (each of the
   six components of ``log(X_ref^-1 X)`` within ``K_SIGMA`` times the square root of the
   sum of the two results' own covariances, which the solver estimates from the
   residuals, i.e. from the tracker noise the stations really had).

The helpers (config writer, sim and daemon processes, the SUB recorder, the store audit)
are shared with ``tests/test_daemon_*.py``, whose kill test runs :func:`soak` with 20+
kills.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

DATA = ROOT / "tests" / "data"
FAST_SCENARIO = DATA / "daemon_fast_scenario.toml"
#: ``cellcal`` of the interpreter running us (the venv's), without relying on PATH.
CELLCAL = [sys.executable, "-m", "cellcal.daemon.cli"]
#: Results agree when every component of the difference is within this many sigma.
K_SIGMA = 6.0


class SoakError(AssertionError):
    """The daemon broke a promise (or the harness could not drive it)."""


# ---- configuration ------------------------------------------------------------------------


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {type(v).__name__}")


def to_toml(d: Mapping[str, Any], prefix: str = "") -> str:
    """TOML text of nested dicts of scalars and lists (tables after the keys, as TOML wants)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, Mapping)]
    for k, v in d.items():
        if isinstance(v, Mapping):
            name = f"{prefix}.{k}" if prefix else k
            lines.append(f"\n[{name}]")
            lines.append(to_toml(v, name))
    return "\n".join(lines) + "\n"


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def daemon_config(
    *,
    robot_url: str,
    tracker_url: str,
    workdir: Path,
    pub_endpoint: str | None = None,
    cmd_endpoint: str | None = None,
    n_stations: int = 8,
    overrides: Mapping[str, Any] | None = None,
) -> dict:
    """The daemon configuration (TOML keys, as a dict) for the fast simulated cell.

    Why these values:

    * ``tracker.average_s = 0.04``: the tracker averages in device time (not scaled); 40
      samples at 1 kHz give 10-15 um / sqrt(40) = 1.6-2.4 um per axis per station.
    * ``robot.settle.dwell_s = 0.1`` host seconds = 1 simulated second at x10, four
      ringing periods of the simulated arm.
    * retries 0.2 .. 1 s: a device fault is retried quickly in tests.
    """
    workdir = Path(workdir)
    cfg = {
        "config_version": 1,
        "service": {
            "name": "test-cell", "state_dir": str(workdir / "state"), "runtime_dir": str(workdir / "run"),
            "log_level": "info", "fault_retry_min_s": 0.2, "fault_retry_max_s": 1.0,
        },
        "robot": {
            "url": robot_url, "read_timeout_s": 1.0,
            "settle": {"max_joint_speed_deg_s": 0.05, "max_flange_speed_mm_s": 0.5, "max_flange_ang_speed_deg_s": 0.05,
                       "dwell_s": 0.1, "max_sample_gap_s": 0.25},
        },
        "tracker": {
            "url": tracker_url, "measure": "pose", "average_s": 0.04,
            "settle": {"max_std_mm": 0.05, "max_std_deg": 0.01, "agree_mm": 0.05, "agree_deg": 0.01},
            "options": {"timeout_s": 1.0},
        },
        "capture": {
            "motion_mode": "command", "move_speed": 1.0, "sync_window_s": 0.2, "station_timeout_s": 10.0,
            "max_attempts_per_station": 3, "max_consecutive_rejections": 8,
        },
        "plan": {
            "kind": "generated", "n_stations": n_stations,
            "workspace_min_mm": [-650.0, -350.0, 200.0], "workspace_max_mm": [-350.0, 150.0, 550.0],
            "max_tilt_deg": 35.0, "home_q_deg": [0.0, -90.0, 90.0, -90.0, -90.0, 0.0], "seed": 0,
        },
        "solve": {"kind": "base_frame", "max_rms_mm": 0.5, "max_rms_deg": 0.1},
        "drift": {"enabled": False},
        "zmq": {
            "pub_endpoint": pub_endpoint or f"tcp://127.0.0.1:{free_port()}",
            "cmd_endpoint": cmd_endpoint or f"tcp://127.0.0.1:{free_port()}",
            "null_role": "operator", "heartbeat_s": 0.5, "republish_s": 60.0,
        },
    }
    return _merge(cfg, overrides or {})


def write_config(path: Path, cfg: Mapping[str, Any]) -> Path:
    path = Path(path)
    path.write_text(to_toml(cfg))
    return path


def scenario_with(path: Path, extra_toml: str, *, base: Path = FAST_SCENARIO, scale: float | None = None) -> Path:
    """A copy of the fast scenario with tables appended (faults) and, optionally, another scale."""
    text = Path(base).read_text()
    if scale is not None:
        text = text.replace("scale = 10.0", f"scale = {scale!r}")
    Path(path).write_text(text + "\n" + extra_toml)
    return Path(path)


# ---- processes ------------------------------------------------------------------------------


def _stop_process(proc: subprocess.Popen | None, timeout_s: float = 5.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit code (never hangs)."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL cannot stop
        return None


class SimProcess:
    """``cellcal sim --scenario S`` in a child process; :meth:`start` returns its URLs."""

    def __init__(self, scenario: Path, log_path: Path, *args: str) -> None:
        self.scenario = Path(scenario)
        self.log_path = Path(log_path)
        self.args = list(args)
        self.proc: subprocess.Popen | None = None
        self.urls: dict[str, str] = {}

    def start(self, timeout_s: float = 20.0) -> dict[str, str]:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*CELLCAL, "sim", "--scenario", str(self.scenario), *self.args],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            )
        line = _read_line(self.proc, timeout_s)
        try:
            self.urls = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SoakError(f"cellcal sim printed {line!r}, not its JSON line ({self.log_path})") from exc
        return self.urls

    def stop(self) -> int | None:
        rc = _stop_process(self.proc)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """One line of ``proc``'s stdout, or SoakError after ``timeout_s`` (never blocks longer)."""
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SoakError(f"no line from {proc.args} within {timeout_s} s (got {buf!r})")
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.2))
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise SoakError(f"{proc.args} exited with {proc.wait()} before printing a line")
            buf += chunk
    return buf.split(b"\n", 1)[0].decode()


class DaemonProcess:
    """``cellcal run --config C`` in a child process, stderr appended to ``log_path``."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.config_path = Path(config_path)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None

    def start(self) -> DaemonProcess:
        with open(self.log_path, "ab") as log:
            log.write(f"---- cellcal run started at {time.monotonic():.3f}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [*CELLCAL, "run", "--config", str(self.config_path)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL,
            )
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self, timeout_s: float = 5.0) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=timeout_s)

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; the daemon finishes its transaction and exits (0 expected)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5.0)
            raise SoakError(f"cellcal run did not exit within {timeout_s} s of SIGTERM ({self.log_path})") from None

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> int | None:
        return _stop_process(self.proc)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# ---- the published messages ----------------------------------------------------------------


class Recorder:
    """A raw ZeroMQ SUB socket on the daemon's PUB endpoint, recording every message.

    Raw on purpose (not the Clone-pattern client): the soak wants exactly what each daemon
    instance put on the wire, per ``boot_id``, with no snapshot repair. Connected before the
    daemon binds, ZeroMQ reconnects by itself to every new instance.
    """

    def __init__(self, pub_endpoint: str) -> None:
        import zmq

        from cellcal.daemon import protocol as P

        self._P = P
        self._zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.RECONNECT_IVL, 50)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, P.TOPIC_PREFIX)
        self.sock.connect(pub_endpoint)
        self.messages: list[tuple[str, dict]] = []  # (topic, envelope), arrival order
        self.problems: list[str] = []

    def pump(self, timeout_s: float = 0.05) -> list[tuple[str, dict]]:
        """Receive what is there (waiting up to ``timeout_s`` for the first message)."""
        got = []
        wait_ms = max(0, int(timeout_s * 1000))
        while self.sock.poll(wait_ms, self._zmq.POLLIN):
            wait_ms = 0
            frames = self.sock.recv_multipart(self._zmq.NOBLOCK)
            if len(frames) != 2:
                self.problems.append(f"{len(frames)} frames")
                continue
            topic = frames[0].decode()
            env = self._P.unpack(frames[1], max_array=1 << 24, max_map=1 << 20)
            bad = self._P.check_envelope(env)
            if bad:
                self.problems.append(f"{topic}: {bad}")
                continue
            got.append((topic, env))
        self.messages.extend(got)
        return got

    def wait_for(self, pred: Callable[[str, dict], bool], timeout_s: float, *,
                 alive: Callable[[], bool] | None = None, what: str = "message") -> tuple[str, dict]:
        """Pump until a message satisfies ``pred(topic, body)``; SoakError on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            for topic, env in self.pump(0.05):
                if pred(topic, env["body"]):
                    return topic, env
            if alive is not None and not alive():
                raise SoakError(f"the daemon exited while waiting for {what}")
            if time.monotonic() > deadline:
                raise SoakError(f"no {what} within {timeout_s} s")

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


# ---- the store ---------------------------------------------------------------------------


def audit_store(state_dir: Path) -> dict:
    """What the store holds, read with a separate read-only SQLite connection."""
    path = Path(state_dir) / "cellcal.sqlite3"
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
    try:
        integrity = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        dups = conn.execute(
            "SELECT run_id, plan_index, COUNT(*) FROM stations GROUP BY run_id, plan_index HAVING COUNT(*) > 1"
        ).fetchall()
        stations = sorted(conn.execute("SELECT run_id, plan_index FROM stations").fetchall())
        runs = {r[0]: {"status": r[1], "reason": r[2]} for r in conn.execute("SELECT id, status, status_reason FROM runs")}
        results = conn.execute("SELECT id, run_id, active, result_json FROM results ORDER BY id").fetchall()
    finally:
        conn.close()
    return {
        "integrity": integrity, "duplicates": dups, "stations": stations, "runs": runs,
        "results": [{"id": r[0], "run_id": r[1], "active": bool(r[2]), "result": json.loads(r[3])} for r in results],
    }


def run_status(state_dir: Path, run_id: int) -> str | None:
    path = Path(state_dir) / "cellcal.sqlite3"
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
    try:
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    finally:
        conn.close()
    return None if row is None else row[0]


# ---- comparing results ----------------------------------------------------------------------


def transform_and_cov(result: Mapping[str, Any], name: str = "cell_T_base") -> tuple[np.ndarray, np.ndarray]:
    """A result's transform ``name`` (4x4) and its 6x6 covariance (right perturbation, m and rad)."""
    from cellcal.daemon.report import transform_from_wire

    T = transform_from_wire(result["transforms"][name])
    c = result["uncertainty"]["covariance"][name]
    return T, np.asarray(c["values"], dtype=float).reshape(c["shape"])


def deviation_sigmas(T_ref: np.ndarray, C_ref: np.ndarray, T: np.ndarray, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``xi = log(T_ref^-1 T)`` as (rho [m], phi [rad]) and each component in sigma units of
    ``C_ref + C`` (the two estimates are independent: different stations' noise)."""
    from cellcal.solver.se3 import se3_inverse, so3_log

    D = se3_inverse(T_ref) @ T
    phi = so3_log(D[:3, :3])
    xi = np.concatenate([D[:3, 3], phi])  # rho ~ translation for the tiny angles here
    sig = np.sqrt(np.clip(np.diag(C_ref + C), 1e-30, None))
    return xi, np.abs(xi) / sig


# ---- the soak ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Instance:
    """One daemon process of the soak."""

    boot_id: str | None
    started_s: float
    killed_s: float | None = None
    accepted: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (run_id, index)
    state_at_kill: str | None = None
    committed: int = 0  # stations the store gained while this instance ran


@dataclasses.dataclass
class SoakReport:
    kills: int
    instances: list[Instance]
    published_accepted: set[tuple[int, int]]
    audit: dict
    reference: dict
    runs_done: list[int]
    worst_sigma: float
    worst_translation_m: float
    worst_rotation_rad: float
    wall_s: float
    kills_by_accepted_before: dict[int, int]
    rejections_seen: int
    runs_resumed: int = 0

    def summary(self) -> str:
        stations = len(self.audit["stations"])
        return (
            f"{self.kills} kill -9 over {len(self.instances)} daemon starts in {self.wall_s:.1f} s; "
            f"{stations} stations committed in {len(self.runs_done)} finished runs, "
            f"{len(self.published_accepted)} seen published as accepted, all present once; "
            f"worst result deviation from the uninterrupted run {self.worst_translation_m * 1e6:.2f} um, "
            f"{math.degrees(self.worst_rotation_rad) * 1e3:.3f} mdeg ({self.worst_sigma:.2f} sigma, limit {K_SIGMA:g})"
        )


def _wait_heartbeat(rec: Recorder, daemon: DaemonProcess, known_boots: set[str], timeout_s: float) -> tuple[str, str]:
    """``(boot_id, state)`` from the first heartbeat of a new daemon instance.

    The instance's first messages (a resumed run's CAPTURING) may go out before this SUB
    socket has reconnected (ZeroMQ's slow joiner); the heartbeat repeats the state.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for topic, env in rec.pump(0.05):
            if topic == "cellcal/v1/heartbeat" and env["boot_id"] not in known_boots:
                return env["boot_id"], env["body"]["state"]
        if not daemon.alive():
            raise SoakError(f"cellcal run exited with {daemon.proc.returncode}:\n{daemon.log_tail()}")
    raise SoakError(f"no heartbeat from the new daemon within {timeout_s} s:\n{daemon.log_tail()}")


def _start_run(cmd_endpoint: str) -> int:
    from cellcal.daemon.client import Client

    with Client(cmd_endpoint, timeout_s=3.0, retries=2) as c:
        return int(c.call("start_run", kind="base_frame")["run_id"])


def reference_run(sim_urls: Mapping[str, str], workdir: Path, *, n_stations: int, timeout_s: float = 60.0) -> dict:
    """One uninterrupted run through ``cellcal run`` (stopped with SIGTERM after its result)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = daemon_config(robot_url=sim_urls["robot"], tracker_url=sim_urls["tracker"], workdir=workdir, n_stations=n_stations)
    conf = write_config(workdir / "cellcal.toml", cfg)
    rec = Recorder(cfg["zmq"]["pub_endpoint"])
    daemon = DaemonProcess(conf, workdir / "daemon.log")
    try:
        daemon.start()
        _wait_heartbeat(rec, daemon, set(), 20.0)
        run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
        _t, env = rec.wait_for(lambda t, b: t == "cellcal/v1/result" and b.get("run_id") == str(run_id),
                               timeout_s, alive=daemon.alive, what=f"the result of reference run {run_id}")
        rc = daemon.terminate()
        if rc != 0:
            raise SoakError(f"reference daemon exited {rc} after SIGTERM:\n{daemon.log_tail()}")
        return env["body"]
    finally:
        daemon.stop()
        rec.close()


def soak(
    kills: int,
    *,
    workdir: Path,
    seed: int = 0,
    n_stations: int = 8,
    scenario: Path = FAST_SCENARIO,
    log: Callable[[str], None] = lambda _m: None,
    per_step_timeout_s: float = 30.0,
) -> SoakReport:
    """Kill ``cellcal run`` with SIGKILL ``kills`` times while it captures; audit; return the report.

    Raises SoakError when a promise is broken (a published station missing, a duplicate, a
    run that does not finish, a result that disagrees with the uninterrupted run).
    """
    t0 = time.monotonic()
    rng = random.Random(seed)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    sim = SimProcess(scenario, workdir / "sim.log")
    daemon: DaemonProcess | None = None
    rec: Recorder | None = None
    try:
        urls = sim.start()
        log(f"sim: {urls}")
        reference = reference_run(urls, workdir / "reference", n_stations=n_stations)
        log(f"reference run: {reference['n_stations']} stations, rms {reference['rms_translation_m'] * 1e6:.2f} um")

        kdir = workdir / "killed"
        kdir.mkdir()
        cfg = daemon_config(robot_url=urls["robot"], tracker_url=urls["tracker"], workdir=kdir, n_stations=n_stations)
        conf = write_config(kdir / "cellcal.toml", cfg)
        state_dir = Path(cfg["service"]["state_dir"])
        rec = Recorder(cfg["zmq"]["pub_endpoint"])
        instances: list[Instance] = []
        boots: set[str] = set()
        published: set[tuple[int, int]] = set()
        by_accepted: dict[int, int] = {}
        rejections = 0
        run_id: int | None = None
        n_kills = 0
        n_committed = 0
        interrupted: set[int] = set()  # runs open when an instance was killed
        while n_kills < kills:
            # Every message of the new instance counts, also those that came in before its
            # first heartbeat reached us (the first one can fall in ZeroMQ's join window).
            cursor = len(rec.messages)
            daemon = DaemonProcess(conf, kdir / "daemon.log").start()
            inst = Instance(None, time.monotonic() - t0)
            instances.append(inst)
            inst.boot_id, state = _wait_heartbeat(rec, daemon, boots, per_step_timeout_s)
            boots.add(inst.boot_id)
            if run_id is None or run_status(state_dir, run_id) not in ("capturing", "solving"):
                # The previous run finished (maybe just before the last kill): start the next.
                run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
                log(f"run {run_id} started")
            # Kill after a random number of this instance's accepted stations, then a random
            # delay up to about one station's time: the kill lands in any phase of a station.
            want = rng.choice((0, 0, 1, 1, 2))
            delay = rng.uniform(0.0, 0.6)
            deadline = time.monotonic() + per_step_timeout_s
            kill_at = None
            next_poll = time.monotonic() + 0.2
            while True:
                rec.pump(0.02)
                new, cursor = rec.messages[cursor:], len(rec.messages)
                for topic, env in new:
                    if env["boot_id"] != inst.boot_id:
                        continue
                    b = env["body"]
                    if topic == "cellcal/v1/station":
                        if b["accepted"]:
                            key = (int(b["run_id"]), int(b["index"]))
                            if key in published:
                                raise SoakError(f"station {key} published as accepted twice")
                            published.add(key)
                            inst.accepted.append(key)
                        else:
                            rejections += 1
                    elif topic in ("cellcal/v1/state", "cellcal/v1/heartbeat"):
                        state = b["state"]
                    elif topic == "cellcal/v1/result" and b.get("run_id") == str(run_id) and not b.get("retained"):
                        # The run finished before this instance's kill: start another one
                        # and kill this instance during *its* capture instead.
                        log(f"run {run_id} done ({b.get('n_stations')} stations)")
                        run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
                        log(f"run {run_id} started")
                        kill_at = None
                    elif topic == "cellcal/v1/fault":
                        log(f"fault: {b.get('message')}")
                if (kill_at is None and state == "IDLE" and time.monotonic() >= next_poll
                        and run_status(state_dir, run_id) not in ("capturing", "solving")):
                    # The run closed without us seeing its result (a resumed run that only had
                    # to be closed, its message sent before our SUB caught up): start the next.
                    log(f"run {run_id} closed")
                    run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
                    log(f"run {run_id} started")
                    state = None
                if state == "IDLE" and time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + 0.2
                if kill_at is None and len(inst.accepted) >= want and state == "CAPTURING":
                    kill_at = time.monotonic() + delay
                if kill_at is not None and time.monotonic() >= kill_at:
                    break
                if not daemon.alive():
                    raise SoakError(f"cellcal run exited by itself ({daemon.proc.returncode}):\n{daemon.log_tail()}")
                if time.monotonic() > deadline:
                    raise SoakError(f"instance {len(instances)} did not capture within {per_step_timeout_s} s:\n{daemon.log_tail()}")
            inst.state_at_kill = state
            interrupted.add(run_id)
            rc = daemon.kill9()
            if rc != -signal.SIGKILL:
                raise SoakError(f"kill -9 gave exit code {rc}")
            inst.killed_s = time.monotonic() - t0
            n_kills += 1
            by_accepted[len(inst.accepted)] = by_accepted.get(len(inst.accepted), 0) + 1
            # Everything this instance published must be in the store already.
            now_stored = set(map(tuple, audit_store(state_dir)["stations"]))
            inst.committed, n_committed = len(now_stored) - n_committed, len(now_stored)
            missing = set(inst.accepted) - now_stored
            if missing:
                raise SoakError(f"stations published as accepted but not in the store after kill {n_kills}: {sorted(missing)}")
            if n_kills % 10 == 0:
                log(f"{n_kills} kills, {len(published)} stations published so far")

        # A last instance finishes the open run; SIGTERM stops it cleanly.
        cursor = len(rec.messages)
        daemon = DaemonProcess(conf, kdir / "daemon.log").start()
        inst = Instance(None, time.monotonic() - t0)
        instances.append(inst)
        inst.boot_id, _state = _wait_heartbeat(rec, daemon, boots, per_step_timeout_s)
        if run_status(state_dir, run_id) in ("capturing", "solving"):
            deadline = time.monotonic() + per_step_timeout_s * 2
            while run_status(state_dir, run_id) in ("capturing", "solving"):
                rec.pump(0.05)
                new, cursor = rec.messages[cursor:], len(rec.messages)
                for topic, env in new:
                    if topic == "cellcal/v1/station" and env["boot_id"] == inst.boot_id and env["body"]["accepted"]:
                        published.add((int(env["body"]["run_id"]), int(env["body"]["index"])))
                if not daemon.alive():
                    raise SoakError(f"the last daemon exited:\n{daemon.log_tail()}")
                if time.monotonic() > deadline:
                    raise SoakError(f"run {run_id} did not finish after the last restart:\n{daemon.log_tail()}")
        rec.pump(0.1)
        rc = daemon.terminate()
        if rc != 0:
            raise SoakError(f"the last daemon exited {rc} after SIGTERM:\n{daemon.log_tail()}")
        daemon = None

        audit = audit_store(state_dir)
        _check_audit(audit, published, n_stations)
        T_ref, C_ref = transform_and_cov(reference)
        worst = (0.0, 0.0, 0.0)
        runs_done = sorted(r for r, v in audit["runs"].items() if v["status"] == "done")
        for res in audit["results"]:
            T, C = transform_and_cov(res["result"])
            xi, sig = deviation_sigmas(T_ref, C_ref, T, C)
            if float(sig.max()) > K_SIGMA:
                raise SoakError(
                    f"result {res['id']} (run {res['run_id']}) differs from the uninterrupted run by "
                    f"{np.array2string(xi, precision=9)} = {np.array2string(sig, precision=2)} sigma (limit {K_SIGMA})"
                )
            worst = (max(worst[0], float(sig.max())), max(worst[1], float(np.linalg.norm(xi[:3]))),
                     max(worst[2], float(np.linalg.norm(xi[3:]))))
        return SoakReport(
            kills=n_kills, instances=instances, published_accepted=published, audit=audit, reference=reference,
            runs_done=runs_done, worst_sigma=worst[0], worst_translation_m=worst[1], worst_rotation_rad=worst[2],
            wall_s=time.monotonic() - t0, kills_by_accepted_before=by_accepted, rejections_seen=rejections,
            runs_resumed=len(interrupted & set(runs_done)),
        )
    finally:
        if daemon is not None:
            daemon.stop()
        if rec is not None:
            rec.close()
        sim.stop()


def _check_audit(audit: dict, published: set[tuple[int, int]], n_stations: int) -> None:
    if audit["integrity"] != ["ok"]:
        raise SoakError(f"PRAGMA integrity_check: {audit['integrity']}")
    if audit["duplicates"]:
        raise SoakError(f"stations stored twice: {audit['duplicates']}")
    stored = set(map(tuple, audit["stations"]))
    if missing := published - stored:
        raise SoakError(f"stations published as accepted but missing from the store: {sorted(missing)}")
    for run_id, r in audit["runs"].items():
        if r["status"] != "done":
            raise SoakError(f"run {run_id} ended {r['status']} ({r['reason']})")
        got = sorted(i for (rid, i) in stored if rid == run_id)
        if got != list(range(n_stations)):
            raise SoakError(f"run {run_id} has stations {got}, expected 0..{n_stations - 1} once each")
    per_run: dict[int, int] = {}
    for res in audit["results"]:
        per_run[res["run_id"]] = per_run.get(res["run_id"], 0) + 1
    if per_run != {r: 1 for r in audit["runs"]}:
        raise SoakError(f"results per run {per_run}: every run must have exactly one")


@contextmanager
def _workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        p = Path(keep)
        p.mkdir(parents=True, exist_ok=True)
        yield p
    else:
        with tempfile.TemporaryDirectory(prefix="cellcal-kill-soak-") as d:
            yield Path(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=200, help="SIGKILLs of the daemon (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--stations", type=int, default=8, help="stations per run")
    ap.add_argument("--workdir", default=None, help="keep state, logs and configs here (default: a temporary directory)")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with _workdir(args.workdir) as wd:
        try:
            rep = soak(args.kills, workdir=wd, seed=args.seed, n_stations=args.stations, log=say)
        except SoakError as exc:
            print(f"kill soak FAILED: {exc}", file=sys.stderr)
            return 1
    print(rep.summary())
    from bench._results import machine_line, write_section

    dist = ", ".join(f"{k}: {v}" for k, v in sorted(rep.kills_by_accepted_before.items()))
    killed = [i.state_at_kill for i in rep.instances if i.killed_s is not None]
    states = ", ".join(f"{st}: {killed.count(st)}" for st in sorted(set(killed), key=str))
    md = "\n".join([
        "## kill -9 soak (`bench/kill_soak.py`)",
        "",
        machine_line(),
        "",
        f"`cellcal run` killed with SIGKILL {rep.kills} times at random moments of its capture "
        f"(after 0-2 accepted stations plus 0-0.6 s), restarted on the same state directory each "
        f"time; simulated cell at x10 (`tests/data/daemon_fast_scenario.toml`), {args.stations} stations per run, seed {args.seed}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| kills | {rep.kills} |",
        f"| daemon starts | {len(rep.instances)} |",
        f"| wall time | {rep.wall_s:.1f} s |",
        f"| runs finished (each with exactly one result) | {len(rep.runs_done)} |",
        f"| runs interrupted by a kill and resumed | {rep.runs_resumed} |",
        f"| stations committed | {len(rep.audit['stations'])} |",
        f"| stations seen published as accepted | {len(rep.published_accepted)} (all in the store) |",
        "| stations lost / duplicated | 0 / 0 |",
        f"| `PRAGMA integrity_check` | {rep.audit['integrity'][0]} |",
        f"| kills by stations the instance had accepted | {dist} |",
        f"| daemon state at the kill | {states} |",
        f"| worst result deviation from an uninterrupted run | {rep.worst_translation_m * 1e6:.2f} um, "
        f"{math.degrees(rep.worst_rotation_rad) * 1e3:.3f} mdeg ({rep.worst_sigma:.2f} sigma; limit {K_SIGMA:g}) |",
    ])
    if not args.no_write:
        write_section("kill_soak", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
