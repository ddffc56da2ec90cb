"""The daemon's test and benchmark harness: the simulated cell in-process or as processes.

One place for what the end-to-end tests (``tests/test_daemon_*.py``,
``tests/test_contract.py``) and the benchmarks (``bench/kill_soak.py``,
``bench/downtime_bench.py``) need to build a cell; it may import ``cellcal.sim``.

* **Configuration**: :func:`daemon_config` (the daemon's TOML keys for the fast simulated
  cell, or on top of a given file), :func:`to_toml`, :func:`write_config`,
  :func:`free_port` (127.0.0.1 only), :data:`FAST_SCENARIO` (``fast_scenario.toml``: the
  demo's truth at time x10, an exact arm and tracker) and :func:`scenario_with` (a copy with
  faults appended).
* **Realistic cell**: :data:`REALISTIC_SCENARIO` (``realistic_scenario.toml``: the demo's
  imperfect arm and tracker at time x10). The harness chooses the cell by name
  (:data:`SCENARIOS`: ``"exact"``, ``"realistic"``) and, with it, the daemon settings such a
  cell needs (:data:`PROFILE_OVERRIDES`): :func:`inprocess_cell`, :func:`daemon_config`,
  ``soak.reference_run`` and ``soak.soak`` take ``scenario="realistic"`` (or ``profile=``).
* **In-process cell**: :func:`inprocess_cell` runs the simulated robot (RTDE on loopback,
  or CiA 402 drives on python-can's virtual bus), the simulated tracker (a pty or loopback
  TCP; the cellcal tracker protocol, or with ``instrument=`` a Leica emScon tracker or
  GeoCOM total station, ``cellcal.daemon.cli.instruments``) and the daemon
  (``cellcal.daemon.app.App``: store + service + ZeroMQ server on loopback) in this
  process, recording every event (:class:`InProcessCell`); a test injects a fault at a
  chosen moment with :meth:`InProcessCell.on_first` (inside the service's emit of an
  event, e.g. right after a station was committed) and reads what followed with
  :meth:`InProcessCell.mark`, :meth:`~InProcessCell.since` and :meth:`~InProcessCell.states`.
* **Camera**: ``inprocess_cell(camera="eye_in_hand" | "eye_to_hand")`` serves a rendered
  camera as a GigE Vision device on a loopback address of its own
  (``cellcal.sim.camera_cell.start_camera``, which ``cellcal demo --camera`` uses too) and
  gives the daemon its ``[camera]`` section (``camera_section``, from the same module: the
  device's URL, the board's target file, the view pose and pivot the simulator's truth puts
  the board at); a camera in another process is
  ``SimProcess(..., "--camera", mounting, "--camera-address", address)`` with a free address
  from :func:`free_camera_address`.
* **Processes**: :class:`SimProcess` (``cellcal sim``), :class:`DaemonProcess` (``cellcal
  run``), :class:`Recorder` (a raw SUB socket), :func:`audit_store` (the store read with a
  separate read-only connection).
* **kill -9 soak**: ``cellcal.testing.soak`` kills ``cellcal run`` at random moments of its
  capture, restarts it and audits the store (``bench/kill_soak.py`` is its command line);
  results are compared with :func:`transform_and_cov` and :func:`deviation_sigmas`.

Everything talks to 127.0.0.1, ptys and in-process buses only; every wait has a deadline
and raises :class:`HarnessError` (an ``AssertionError``, so a test fails with the message).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt
import zmq

from cellcal.daemon import protocol as P
from cellcal.daemon.app import App
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.cli.instruments import config_overrides
from cellcal.daemon.config import Config, load_config_text
from cellcal.daemon.service import Service
from cellcal.daemon.store import RunStatus
from cellcal.daemon.wire.client import Client, ClientTimeout, CommandFailed
from cellcal.daemon.wire.endpoints import free_port
from cellcal.daemon.wire.zmq_server import ZmqServer
from cellcal.sim.camera_cell import TARGET_FILE, camera_addresses, camera_section
from cellcal.sim.camera_device import SimCameraDevice
from cellcal.sim.link import LinkServer
from cellcal.sim.robot_sim import SimRobotHandle
from cellcal.sim.scenario import Scenario, load_scenario
from cellcal.sim.world import World
from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import se3_inverse, so3_log
from cellcal.testing.simulators import simulated_devices

__all__ = [
    "FAST_SCENARIO", "REALISTIC_SCENARIO", "SCENARIOS", "FAST_TIME_SCALE",
    "PROFILE_OVERRIDES", "profile_of", "CELLCAL", "K_SIGMA",
    "HarnessError", "SoakError", "free_port", "to_toml", "daemon_config",
    "write_config", "scenario_with", "stop_process", "SimProcess", "DaemonProcess", "Recorder", "audit_store",
    "run_status", "transform_and_cov", "deviation_sigmas", "InProcessCell", "inprocess_cell", "nonconforming_bodies",
    "camera_section", "free_camera_address", "TARGET_FILE",
]

#: The fast simulated cell (the demo's truth, time x10, no faults), a file in this package.
FAST_SCENARIO = Path(str(resources.files("cellcal.testing").joinpath("fast_scenario.toml")))
#: The realistic simulated cell (the demo's imperfect arm and tracker, time x10, no faults).
REALISTIC_SCENARIO = Path(str(resources.files("cellcal.testing").joinpath("realistic_scenario.toml")))
#: ``inprocess_cell(time_scale=...)`` for a test that is not about timing: x30 simulated time
#: halves a realistic kinematics run's wall time (moves and the arm's ringing are simulated
#: time; the tracker's averaging is not), with the settle dwell at the daemon's 50 ms floor
#: (1.5 simulated seconds, more than the four ringing periods the x10 cells' dwell covers).
FAST_TIME_SCALE = 30.0
#: The cells the harness knows by name.
SCENARIOS: dict[str, Path] = {"exact": FAST_SCENARIO, "realistic": REALISTIC_SCENARIO}
#: Daemon settings (TOML keys) each named cell needs, merged under a test's own overrides.
#: The realistic tracker has about 0.02 mm and 0.007 deg of noise per axis in each half of a
#: 0.2 s station average (docs/adr/0013), so the halves agree within 0.15 mm / 0.04 deg; the
#: arm's kinematic error leaves ~0.25 mm RMS (up to ~0.5 mm) that the gates and the drift
#: checks (which compare with the model) must allow. That error is what the solver's
#: ``model_error`` warning names, and its covariance is widened to cover it (about 0.7 mm
#: 1-sigma at the base origin from 10 stations, more from fewer): the realistic cell's
#: runs accept the warning (``allow_model_error``) and gate that sigma at 2 mm.
PROFILE_OVERRIDES: dict[str, dict[str, object]] = {
    "exact": {},
    "realistic": {
        "tracker": {"average_s": 0.2, "settle": {"max_std_mm": 0.05, "max_std_deg": 0.02, "agree_mm": 0.15,
                                                 "agree_deg": 0.04}},
        "solve": {"max_rms_mm": 0.8, "max_rms_deg": 0.1, "allow_model_error": True,
                  "max_sigma_mm_at_task_points": 2.0},
        "drift": {"warn_mm": 0.6, "fail_mm": 0.9, "warn_deg": 0.06, "fail_deg": 0.1, "cusum_k_mm": 0.6,
                  "cusum_h_mm": 0.9},
    },
}


def profile_of(scenario: str | os.PathLike[str] | Scenario | None) -> str:
    """The profile name of a scenario given by name or path (``"exact"`` for any other file)."""
    if isinstance(scenario, str) and scenario in SCENARIOS:
        return scenario
    if scenario is None or isinstance(scenario, Scenario):
        return "exact"
    return "realistic" if Path(scenario).resolve() == REALISTIC_SCENARIO.resolve() else "exact"
#: ``cellcal`` of the interpreter running us (the venv's), without relying on PATH.
CELLCAL = [sys.executable, "-m", "cellcal.daemon.cli"]
#: Results agree when every component of the difference is within this many sigma.
K_SIGMA = 6.0
_OPEN = (RunStatus.CAPTURING.value, RunStatus.SOLVING.value)


class HarnessError(CellcalError, AssertionError):
    """The cell under test broke a promise, or did not do something within its deadline."""


class SoakError(HarnessError):
    """The daemon broke a promise during the kill -9 soak (or the soak could not drive it)."""


# ---- configuration ------------------------------------------------------------------------


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {type(v).__name__}")


def _is_table_list(v: object) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, Mapping) for x in v)


def to_toml(d: Mapping[str, object], prefix: str = "") -> str:
    """TOML text of nested dicts of scalars and lists (tables after the keys, as TOML wants).

    A non-empty list of dicts becomes an array of tables (``[[plan.stations]]``).
    """
    lines = [f"{k} = {_toml_value(v)}" for k, v in d.items() if not isinstance(v, Mapping) and not _is_table_list(v)]
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, Mapping):
            lines.append(f"\n[{name}]")
            lines.append(to_toml(v, name))
        elif _is_table_list(v):
            for item in v:  # type: ignore[attr-defined]  # _is_table_list: a list of mappings
                lines.append(f"\n[[{name}]]")
                lines.append(to_toml(item, name))
    return "\n".join(lines) + "\n"


def _merge(base: dict, over: Mapping[str, object]) -> dict:
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
    n_stations: int | None = 8,
    overrides: Mapping[str, object] | None = None,
    base: str | os.PathLike[str] | None = None,
    profile: str = "exact",
) -> dict:
    """The daemon configuration (TOML keys, as a dict) for the fast simulated cell.

    ``profile``: the named cell's settings (:data:`PROFILE_OVERRIDES`), merged before
    ``overrides``.

    ``base``: start from this TOML file instead (e.g. ``config/demo.toml``); the devices'
    URLs, the state and runtime directories, the endpoints and (unless None) ``n_stations``
    are set either way, then ``overrides`` (TOML keys, nested dicts) are merged in.

    Why the fast cell's values:

    * ``tracker.average_s = 0.04``: the tracker averages in device time (not scaled); 40
      samples at 1 kHz give 10-15 um / sqrt(40) = 1.6-2.4 um per axis per station.
    * ``robot.settle.dwell_s = 0.1`` host seconds = 1 simulated second at x10, four
      ringing periods of the simulated arm.
    * retries 0.2 .. 1 s: a device fault is retried quickly in tests.
    """
    workdir = Path(workdir)
    if base is not None:
        with open(base, "rb") as f:
            cfg = _merge(tomllib.load(f), {
                "robot": {"url": robot_url}, "tracker": {"url": tracker_url},
                "service": {"state_dir": str(workdir / "state"), "runtime_dir": str(workdir / "run")},
                "zmq": {"pub_endpoint": pub_endpoint or f"tcp://127.0.0.1:{free_port()}",
                        "cmd_endpoint": cmd_endpoint or f"tcp://127.0.0.1:{free_port()}",
                        # the test cell's clients are this machine's: any local user may command it
                        "loopback_tcp_any_user": True},
            })
        if n_stations is not None:
            cfg = _merge(cfg, {"plan": {"n_stations": n_stations}})
        return _merge(_merge(cfg, PROFILE_OVERRIDES[profile]), overrides or {})
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
            "kind": "generated", "n_stations": 8 if n_stations is None else n_stations,
            "workspace_min_mm": [-650.0, -350.0, 200.0], "workspace_max_mm": [-350.0, 150.0, 550.0],
            "max_tilt_deg": 35.0, "home_q_deg": [0.0, -90.0, 90.0, -90.0, -90.0, 0.0], "seed": 0,
        },
        "solve": {"kind": "base_frame", "max_rms_mm": 0.5, "max_rms_deg": 0.1},
        "drift": {"enabled": False},
        "zmq": {
            "pub_endpoint": pub_endpoint or f"tcp://127.0.0.1:{free_port()}",
            "cmd_endpoint": cmd_endpoint or f"tcp://127.0.0.1:{free_port()}",
            "null_role": "operator", "heartbeat_s": 0.5, "republish_s": 60.0,
            "loopback_tcp_any_user": True,  # the test cell on loopback: any local user may command it
        },
    }
    return _merge(_merge(cfg, PROFILE_OVERRIDES[profile]), overrides or {})


def write_config(path: Path, cfg: Mapping[str, object]) -> Path:
    """Write ``cfg`` (TOML keys, as :func:`daemon_config` makes them) to ``path`` as TOML."""
    path = Path(path)
    path.write_text(to_toml(cfg))
    return path


def scenario_with(path: Path, extra_toml: str, *, base: Path | str | None = None, scale: float | None = None) -> Path:
    """A copy of the fast scenario (or ``base``: a path or a name of :data:`SCENARIOS`) with
    tables appended (faults) and, optionally, another scale."""
    text = Path(SCENARIOS.get(base, base) if isinstance(base, str) else base if base is not None
                else FAST_SCENARIO).read_text()
    if scale is not None:
        text = text.replace("scale = 10.0", f"scale = {scale!r}")
    Path(path).write_text(text + "\n" + extra_toml)
    return Path(path)


# ---- a camera ---------------------------------------------------------------------------------


def free_camera_address() -> str:
    """A loopback address whose GVCP port (UDP 3956) is free now, for a simulated camera in
    another process (``cellcal sim --camera-address``); 127.0.0.1 is never offered (Aravis's
    fake camera can serve only there, and its tests wait for it)."""
    for address in camera_addresses():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.bind((address, 3956))
            except OSError:
                continue
        return address
    raise HarnessError("no free loopback address for a simulated camera")


# ---- processes ------------------------------------------------------------------------------


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 5.0) -> int | None:
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
        rc = stop_process(self.proc)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        return rc

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """One line of ``proc``'s stdout, or SoakError after ``timeout_s`` (never blocks longer)."""
    if proc.stdout is None:
        raise HarnessError(f"{proc.args!r}: started without a stdout pipe")
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SoakError(f"no line from {proc.args!r} within {timeout_s} s (got {buf!r})")
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.2))
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise SoakError(f"{proc.args!r} exited with {proc.wait()} before printing a line")
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

    def serving(self, cmd_endpoint: str, timeout_s: float = 120.0) -> DaemonProcess:
        """Wait until the daemon answers ``get_status`` on ``cmd_endpoint`` (a child's start,
        its imports and binds, takes seconds on a loaded machine: a first command sent with a
        client's own few retries can run out before the daemon listens).

        Raises
        ------
        HarnessError
            The daemon exited, or did not answer within ``timeout_s`` (with its log's tail).
        """
        deadline = time.monotonic() + timeout_s
        with Client(cmd_endpoint, timeout_s=1.0, retries=0) as client:
            while True:
                if not self.alive():
                    raise HarnessError(f"cellcal run exited ({self.returncode}) before serving:\n{self.log_tail()}")
                try:
                    client.call("get_status")
                    return self
                except CommandFailed:  # an answer (a refusal of this client) is serving too
                    return self
                except ClientTimeout:
                    if time.monotonic() > deadline:
                        raise HarnessError(f"cellcal run did not answer on {cmd_endpoint} within {timeout_s:g} s:\n"
                                           f"{self.log_tail()}") from None

    @property
    def started(self) -> subprocess.Popen:
        """The child process (HarnessError before :meth:`start`)."""
        if self.proc is None:
            raise HarnessError(f"cellcal run ({self.config_path}) was not started")
        return self.proc

    @property
    def pid(self) -> int:
        return self.started.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self, timeout_s: float = 5.0) -> int:
        self.started.send_signal(signal.SIGKILL)
        return self.started.wait(timeout=timeout_s)

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; the daemon finishes its transaction and exits (0 expected)."""
        proc = self.started
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)
            raise SoakError(f"cellcal run did not exit within {timeout_s} s of SIGTERM ({self.log_path})") from None

    def wait(self, timeout_s: float) -> int:
        return self.started.wait(timeout=timeout_s)

    def stop(self) -> int | None:
        return stop_process(self.proc)

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
        self._zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.setsockopt(zmq.RECONNECT_IVL, 50)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, P.TOPIC_PREFIX)
        self.sock.connect(pub_endpoint)
        self.messages: list[tuple[str, P.Envelope]] = []  # (topic, envelope), arrival order
        self.problems: list[str] = []

    def pump(self, timeout_s: float = 0.05) -> list[tuple[str, P.Envelope]]:
        """Receive what is there (waiting up to ``timeout_s`` for the first message)."""
        got: list[tuple[str, P.Envelope]] = []
        wait_ms = max(0, int(timeout_s * 1000))
        while self.sock.poll(wait_ms, self._zmq.POLLIN):
            wait_ms = 0
            frames = self.sock.recv_multipart(self._zmq.NOBLOCK)
            if len(frames) != 2:
                self.problems.append(f"{len(frames)} frames")
                continue
            topic = frames[0].decode()
            env = P.unpack(frames[1], max_array=1 << 24, max_map=1 << 20)
            bad = P.check_envelope(env)
            if bad:
                self.problems.append(f"{topic}: {bad}")
                continue
            got.append((topic, cast(P.Envelope, env)))  # check_envelope just said it is one
        self.messages.extend(got)
        return got

    def mark(self) -> int:
        """A position in :attr:`messages` (receive what is there first): ``wait_for(since=...)``."""
        self.pump(0.0)
        return len(self.messages)

    def wait_for(self, pred: Callable[[str, dict], bool], timeout_s: float, *,
                 alive: Callable[[], bool] | None = None, what: str = "message",
                 since: int | None = None) -> tuple[str, P.Envelope]:
        """Pump until a message satisfies ``pred(topic, body)``; SoakError on timeout.

        By default only messages received from now on count; ``since`` (a :meth:`mark`) also
        looks at those received after that mark, so several waits after one action cannot
        miss a message that came in the same batch as an earlier one.
        """
        deadline = time.monotonic() + timeout_s
        if since is not None:
            for topic, env in self.messages[since:]:
                if pred(topic, env["body"]):
                    return topic, env
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


def transform_and_cov(result: Mapping[str, object], name: str = "cell_T_base"
                      ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """A result's transform ``name`` (4x4) and its 6x6 covariance (right perturbation, m and rad)."""
    transforms, unc = result.get("transforms"), result.get("uncertainty")
    if not isinstance(transforms, Mapping) or not isinstance(unc, Mapping) or not isinstance(
            cov := unc.get("covariance"), Mapping) or not isinstance(c := cov.get(name), Mapping):
        raise HarnessError(f"the result has no {name} with its covariance")
    T = transform_from_wire(transforms[name])
    return T, np.asarray(c["values"], dtype=float).reshape(c["shape"])


def deviation_sigmas(T_ref: npt.NDArray[np.float64], C_ref: npt.NDArray[np.float64], T: npt.NDArray[np.float64],
                     C: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``xi = log(T_ref^-1 T)`` as (rho [m], phi [rad]) and each component in sigma units of
    ``C_ref + C`` (the two estimates are independent: different stations' noise)."""
    D = se3_inverse(T_ref) @ T
    phi = so3_log(D[:3, :3])
    xi = np.concatenate([D[:3, 3], phi])  # rho ~ translation for the tiny angles here
    sig = np.sqrt(np.clip(np.diag(C_ref + C), 1e-30, None))
    return xi, np.abs(xi) / sig


# ---- the soak ---------------------------------------------------------------------------------


# ---- the in-process cell ----------------------------------------------------------------------


def nonconforming_bodies(events: list[tuple[float, str, dict]]) -> list[tuple[str, list[str], str]]:
    """``(topic, problems, body excerpt)`` of every recorded body that does not conform to its
    topic's TypedDict (``protocol.check_body``), as the wire carries it."""
    bad = []
    for _t, topic, body in events:
        # The ZeroMQ server sets ``retained`` on the result topic; the listener sees the body
        # before that, so check what the wire carries.
        wire = dict(body, retained=bool(body.get("retained", False))) if topic == P.TOPIC_RESULT else body
        problems = P.check_body(topic, P.unpack(P.pack(wire), max_array=1 << 24, max_map=1 << 20))
        if problems:
            bad.append((topic, problems[:3], str(body)[:200]))
    return bad


class InProcessCell:
    """A running in-process cell: the sims, the daemon's :class:`~cellcal.daemon.app.App`, and
    every event the service emitted (``(seconds since start, topic, body)``).

    Attributes
    ----------
    scenario, world
        The simulated cell and the truth it hides (``world.cell_T_base()``).
    robot, tracker
        The simulator handles (``.url``).
    cfg : Config
    app : App
    svc : Service
    server : ZmqServer
    """

    def __init__(self, scenario: Scenario, world: World, robot: SimRobotHandle, tracker: LinkServer,
                 cfg: Config, camera: SimCameraDevice | None = None) -> None:
        self.scenario, self.world, self.robot, self.tracker, self.cfg = scenario, world, robot, tracker, cfg
        #: The simulated camera (``inprocess_cell(camera=...)``), else None.
        self.camera = camera
        self.app: App | None = None
        self.events: list[tuple[float, str, dict]] = []
        self._cond = threading.Condition()
        self.t0 = time.monotonic()

    def _app(self) -> App:
        if self.app is None:
            raise HarnessError("the cell's daemon is not running")
        return self.app

    @property
    def svc(self) -> Service:
        return self._app().service

    @property
    def server(self) -> ZmqServer | None:
        return self._app().server

    def on_event(self, topic: str, body: dict) -> None:
        with self._cond:
            self.events.append((time.monotonic() - self.t0, topic, body))
            self._cond.notify_all()

    def bodies(self, topic: str) -> list[dict]:
        with self._cond:
            return [b for _t, top, b in self.events if top == topic]

    def wait_for(self, pred: Callable[[str, dict], bool], timeout_s: float, what: str) -> dict:
        """The first event body (from the start) with ``pred(topic, body)``; HarnessError after the timeout."""
        deadline = time.monotonic() + timeout_s
        i = 0
        with self._cond:
            while True:
                for _t, topic, body in self.events[i:]:
                    if pred(topic, body):
                        return body
                i = len(self.events)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    last = [(round(t, 2), top, str(b)[:120]) for t, top, b in self.events[-8:]]
                    raise HarnessError(f"no {what} within {timeout_s} s; state {self.svc.state.value} "
                                       f"{self.svc.state_detail!r}; last events: {last}")
                self._cond.wait(min(remaining, 0.5))

    def wait_result(self, run_id: int | str, timeout_s: float = 40.0) -> dict:
        """The (not retained) result body of run ``run_id``; the HarnessError of a run that
        gave none says how the run ended (its status and reason in the store). A run that
        ended without a result (failed, aborted) raises as soon as the store says so, not at
        the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            step = min(1.0, max(deadline - time.monotonic(), 0.0))
            try:
                return self.wait_for(lambda t, b: t == P.TOPIC_RESULT and b.get("run_id") == str(run_id)
                                     and not b.get("retained"), step, f"result of run {run_id}")
            except HarnessError as exc:
                try:
                    run = self.svc.store.get_run(int(str(run_id).removeprefix("run-")))
                    how = f"run {run_id} is {run.status.value}: {run.status_reason or 'no reason recorded'}"
                    ended = not run.is_open and run.status != RunStatus.DONE
                except (CellcalError, sqlite3.Error, ValueError) as why:  # the diagnosis must not hide the timeout
                    how, ended = f"run {run_id}: its record could not be read ({why})", False
                if ended or time.monotonic() >= deadline:
                    raise HarnessError(f"{exc}; {how}") from None

    def nonconforming(self) -> list[tuple[str, list[str], str]]:
        with self._cond:
            return nonconforming_bodies(list(self.events))

    def on_first(self, pred: Callable[[str, dict], bool], action: Callable[[], None]) -> threading.Event:
        """Run ``action()`` once, inside the service's emit of the first event with
        ``pred(topic, body)`` (so before the worker moves on: e.g. right after a station was
        committed and published); the returned event is set once it ran."""
        done = threading.Event()

        def listener(topic: str, body: dict) -> None:
            if not done.is_set() and pred(topic, body):
                try:
                    action()
                finally:
                    done.set()

        self.svc.add_listener(listener)
        return done

    def states(self, since: int = 0) -> list[dict]:
        """The ``state`` bodies emitted from event number ``since`` on (see :meth:`mark`)."""
        with self._cond:
            return [b for _t, top, b in self.events[since:] if top == P.TOPIC_STATE]

    def mark(self) -> int:
        """The number of events so far (a position for :meth:`states` and :meth:`since`)."""
        with self._cond:
            return len(self.events)

    def since(self, mark: int, topic: str | None = None) -> list[dict]:
        """Bodies emitted from event number ``mark`` on (of ``topic``, if given)."""
        with self._cond:
            return [b for _t, top, b in self.events[mark:] if topic is None or top == topic]


@contextmanager
def inprocess_cell(
    workdir: Path,
    *,
    scenario: str | os.PathLike[str] | Scenario | None = None,
    n_stations: int | None = 6,
    overrides: Mapping[str, object] | None = None,
    base_config: str | os.PathLike[str] | None = None,
    state_dir: Path | None = None,
    robot_transport: str = "rtde",
    tracker_transport: str | None = None,
    instrument: str = "cellcal",
    validate_bodies: bool = False,
    zmq: bool = True,
    profile: str | None = None,
    camera: str | None = None,
    camera_views: int = 12,
    time_scale: float | None = None,
) -> Iterator[InProcessCell]:
    """The simulated cell and the daemon in this process; stopped and closed on exit.

    Parameters
    ----------
    workdir : Path
        For the store (``workdir/state``, unless ``state_dir``) and the runtime directory.
    scenario : Path, Scenario or str, optional
        Default :data:`FAST_SCENARIO`; a name of :data:`SCENARIOS` (``"realistic"``) also
        brings that cell's daemon settings (:data:`PROFILE_OVERRIDES`, under ``overrides``).
    n_stations, overrides, base_config
        As :func:`daemon_config` (``base_config`` is its ``base``).
    robot_transport : {"rtde", "canopen"}
        RTDE on loopback, or six CiA 402 drives on a python-can virtual bus of its own.
    tracker_transport : {"pty", "tcp"}, optional
        Default: the instrument's first (a pty; emScon: TCP).
    instrument : {"cellcal", "emscon", "geocom"}
        The simulated instrument (``cellcal.daemon.cli.instruments``): the cellcal tracker
        protocol (6-DoF, default), a Leica emScon tracker or a GeoCOM total station; the
        ``[tracker]`` keys it needs (``measure = "point"`` ...) are merged under
        ``overrides`` (which win).
    validate_bodies : bool
        The ZeroMQ server also checks every body it publishes.
    zmq : bool
        Serve ZeroMQ (default); False for a benchmark that only needs the service.
    profile : str, optional
        The daemon settings of a named cell (:data:`PROFILE_OVERRIDES`) for a scenario given
        as a path or a Scenario (e.g. a copy of the realistic cell with a fault appended).
    camera : {"eye_in_hand", "eye_to_hand"}, optional
        Also a rendered camera as a GigE Vision device on a loopback address of its own, and
        the daemon's ``[camera]`` for it (:func:`camera_section`, ``camera_views`` views;
        ``overrides["camera"]`` merged over it).
    time_scale : float, optional
        Run the cell's simulated time this many times faster than the wall clock instead of
        the scenario's ``[time] scale`` (x10 for the harness's cells), for a test that is not
        about timing: moves and the arm's ringing take simulated time, so a higher scale
        shortens every station's move and settling (the tracker averages in its own time,
        unchanged). The daemon's settle dwell follows, one simulated second
        (``robot.settle.dwell_s = 1 / time_scale``, at least the daemon's 50 ms) unless
        ``overrides`` set it; scheduled
        events (``[[drift]] at_s``) come sooner in wall time by the same factor.
    """
    if profile is None:
        profile = "exact" if scenario is None or isinstance(scenario, Scenario) else profile_of(scenario)
    if isinstance(scenario, str) and scenario in SCENARIOS:
        scenario = SCENARIOS[scenario]
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(FAST_SCENARIO if scenario is None else Path(scenario))
    if time_scale is not None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        sc = dataclasses.replace(sc, time_scale=float(time_scale))
        # The daemon's floor is 50 ms: above x20 the dwell is more than one simulated second.
        dwell_s = max(1.0 / float(time_scale), 0.05)
        overrides = _merge({"robot": {"settle": {"dwell_s": dwell_s}}}, dict(overrides or {}))
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with simulated_devices(sc, instrument=instrument, robot_transport=robot_transport,
                           tracker_transport=tracker_transport, camera=camera) as devices:
        over = _merge(config_overrides(instrument), overrides or {})
        if devices.camera is not None and camera is not None:
            section = camera_section(devices.camera.url, camera, sc, workdir, n_views=camera_views)
            over = _merge(over, {"camera": _merge(section, dict(over.get("camera") or {}))})
        robot_url = devices.robot.url
        if robot_url.startswith("canopen://") and "interface=virtual" in robot_url:
            # The drives here are threads of this process, sharing its interpreter with the daemon:
            # on a loaded machine an SDO answer can take longer than a real drive's 0.5 s budget.
            robot_url += "&sdo_timeout_s=2.0"
        cfgd = daemon_config(robot_url=robot_url, tracker_url=devices.tracker.url, workdir=workdir,
                             n_stations=n_stations, overrides=over, base=base_config, profile=profile)
        if state_dir is not None:
            cfgd["service"]["state_dir"] = str(state_dir)
        cfg = load_config_text(to_toml(cfgd), source=str(workdir / "cellcal.toml"))
        cell = InProcessCell(sc, devices.world, devices.robot, devices.tracker, cfg, devices.camera)
        app = App(cfg, listeners=[cell.on_event], supervise=True, validate_bodies=validate_bodies, zmq=zmq,
                  shutdown_timeout_s=15.0)
        cell.app = app
        app.open()
        try:
            yield cell
        finally:
            app.close()
