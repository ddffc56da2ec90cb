"""Simulated UR controller: an RTDE server (port 30004 on a real robot), the URScript
subset on the secondary-interface port (30002), and (:mod:`cellcal.sim.ur_interfaces`) the
dashboard server (29999) and the primary interface (30001), all serving one
:class:`SimRobot`. A realtime port (30003) may be served too: it takes scripts like the
URScript port (ur-rtde's control interface uploads its control script there; the subset
refuses it with a text message).

RTDE: protocol versions 1 and 2 (up to ``rtde_max_protocol``), the controller version,
output recipes over every standard output field (:data:`~cellcal.drivers.rtde_codec.OUTPUT_FIELDS`;
fields the simulation has no physics for are answered with plausible constants or zeros,
so independent clients such as ``ur-rtde``, which ask for ~60 fields, work), input recipes
for the ``input_*`` registers (accepted and ignored), start/pause, and text messages (the
server pushes one whenever it rejects a script, and on :meth:`RtdeServer.send_text`).
Data packages go out at the requested frequency (wall clock), capped at
``max_stream_rate_hz``; their ``timestamp`` is the simulated controller clock.

URScript (one motion command per script; see ``docs/protocols/robot.md``)::

    movej([q1, ..., q6], a=1.4, v=1.05)     joint target, rad
    movej(p[x, y, z, rx, ry, rz], ...)      TCP target via the controller's IK
    movel(p[x, y, z, rx, ry, rz], a=1.2, v=0.25)
    stopj(a)   stopl(a)

optionally wrapped in ``def name():`` ... ``end``.

Faults: while ``disconnect`` is active, every connection is closed and new ones are closed
on accept. Wire garbage for the client's framing: :meth:`RtdeServer.inject_bytes` (one burst
between two packets) and :meth:`RtdeServer.garble` (every data package replaced by as many
random bytes for a while, so bytes keep arriving and none frames). ``tcp_change`` and
``payload_change`` show in ``actual_TCP_pose``, ``tcp_offset`` and ``payload``; the
scenario's ``rtde_missing_outputs`` are answered ``NOT_FOUND``, as an older controller's
software does. Every socket has a timeout and every thread stops on :meth:`RtdeServer.close`.
"""

from __future__ import annotations

import logging
import math
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from cellcal.drivers import rtde_codec as rc
from cellcal.drivers.errors import ProtocolError
from cellcal.sim.robot_sim import SimRefused, SimRobot, SimSample
from cellcal.solver.se3 import make_transform, so3_exp, so3_log

__all__ = ["RtdeServer", "parse_urscript", "UrScriptCommand"]

log = logging.getLogger(__name__)

_JOINT_MODE_RUNNING = 253  # UR joint_mode for a running joint
_DEFAULT_V1_RATE_HZ = 125.0
_ROBOT_STATUS_POWER_ON = 1 << 0
_ROBOT_STATUS_PROGRAM_RUNNING = 1 << 1
_SAFETY_STATUS_NORMAL = 1 << 0
_SAFETY_STATUS_PROTECTIVE_STOP = 1 << 2


# -- URScript subset -----------------------------------------------------------------------
class UrScriptCommand:
    """One parsed motion command: ``name`` in movej/movel/stopj/stopl, ``target`` (6,) or
    None, ``is_pose`` (a ``p[...]`` target), keyword args ``a``, ``v`` (floats or None)."""

    __slots__ = ("name", "target", "is_pose", "a", "v")

    def __init__(self, name: str, target: np.ndarray | None, is_pose: bool, a: float | None, v: float | None):
        self.name, self.target, self.is_pose, self.a, self.v = name, target, is_pose, a, v

    def __repr__(self) -> str:
        return f"UrScriptCommand({self.name}, pose={self.is_pose}, a={self.a}, v={self.v})"


_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_MOVE_RE = re.compile(
    rf"^(movej|movel)\(\s*(p?)\[\s*((?:{_NUM}\s*,\s*){{5}}{_NUM})\s*\]\s*((?:,\s*[avtr]\s*=\s*{_NUM}\s*)*)\)$"
)
_STOP_RE = re.compile(rf"^(stopj|stopl)\(\s*({_NUM})\s*\)$")
_KW_RE = re.compile(rf"([avtr])\s*=\s*({_NUM})")


def parse_urscript(text: str) -> UrScriptCommand:
    """The single motion command of a script (optionally inside ``def ...: ... end``).

    Raises
    ------
    ValueError
        Anything outside the subset, or more than one command.
    """
    lines = [ln.strip() for ln in text.replace("\r", "\n").split("\n")]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if lines and re.match(r"^def\s+\w+\(\)\s*:$", lines[0]):
        if lines[-1] != "end":
            raise ValueError("URScript: 'def' without 'end'")
        lines = lines[1:-1]
    if len(lines) != 1:
        raise ValueError(f"URScript subset: exactly one motion command per script, got {len(lines)}")
    line = lines[0]
    m = _MOVE_RE.match(line)
    if m:
        name, p, nums, kws = m.groups()
        target = np.array([float(x) for x in nums.split(",")])
        kw = {k: float(v) for k, v in _KW_RE.findall(kws)}
        if not np.all(np.isfinite(target)) or any(not math.isfinite(v) or v <= 0 for v in kw.values() if v is not None):
            raise ValueError("URScript: non-finite or non-positive argument")
        if name == "movel" and not p:
            raise ValueError("URScript subset: movel needs a pose p[...]")
        return UrScriptCommand(name, target, bool(p), kw.get("a"), kw.get("v"))
    m = _STOP_RE.match(line)
    if m:
        return UrScriptCommand(m.group(1), None, False, float(m.group(2)), None)
    raise ValueError(f"URScript subset: unsupported statement {line[:60]!r}")


# -- the server -------------------------------------------------------------------------
class RtdeServer:
    """RTDE + URScript server for one :class:`SimRobot`.

    Parameters
    ----------
    robot : SimRobot
        The arm to serve.
    host : str
        Address to bind (loopback by default).
    port, urscript_port : int
        TCP ports; 0 picks free ones (read :attr:`port` / :attr:`urscript_port` after
        :meth:`start`). ``urscript_port=None`` serves no URScript port.
    on_publish : callable, optional
        Called with each data package's field dict just before it is sent (the ur-rtde
        peer test records what was published with it).
    dashboard_port, primary_port : int or None
        The dashboard server and the primary interface (0: free ports; None: not served).
    realtime_port : int or None
        A second script port, as the realtime interface (30003) takes scripts; None (the
        default): not served.
    """

    def __init__(
        self,
        robot: SimRobot,
        host: str = "127.0.0.1",
        port: int = 0,
        urscript_port: int | None = 0,
        *,
        on_publish: Callable[[dict[str, Any]], None] | None = None,
        dashboard_port: int | None = 0,
        primary_port: int | None = 0,
        realtime_port: int | None = None,
    ) -> None:
        from cellcal.sim.ur_interfaces import DashboardServer, PrimaryServer

        self.robot = robot
        self.host = host
        self._req_port = port
        self._req_script_port = urscript_port
        self._req_realtime_port = realtime_port
        self.port = 0
        self.urscript_port = 0
        self.realtime_port = 0
        version = tuple(robot.scenario.controller_version)
        self.dashboard = (DashboardServer(robot, host, dashboard_port, version)  # type: ignore[arg-type]
                          if dashboard_port is not None else None)
        self.primary = (PrimaryServer(robot, host, primary_port, version)  # type: ignore[arg-type]
                        if primary_port is not None else None)
        self.on_publish = on_publish
        sc = robot.scenario
        self.max_protocol = sc.rtde_max_protocol
        self.version = rc.ControllerVersion(*sc.controller_version)
        self.max_rate_hz = sc.max_stream_rate_hz
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listeners: list[socket.socket] = []
        self._sessions: set[_Session] = set()
        self._lock = threading.Lock()
        self._recipe_ids = 0
        self.scripts_run = 0
        self._garble_until = -math.inf
        self._garble_rng = np.random.default_rng(0)
        self._jitter_rng = np.random.default_rng([robot.scenario.seed, 4])
        #: ``timestamp`` of the first data package sent intact after the last garbage
        self.first_good_after_garbage_s: float | None = None
        self._after_garbage = False

    @property
    def dashboard_port(self) -> int:
        """The dashboard server's port (0 when not served)."""
        return self.dashboard.port if self.dashboard is not None else 0

    @property
    def primary_port(self) -> int:
        """The primary interface's port (0 when not served)."""
        return self.primary.port if self.primary is not None else 0

    @property
    def url(self) -> str:
        """``rtde://host:port?urscript_port=N&dashboard_port=N&primary_port=N[&model=...][&tcp_offset=...]``
        (a port not served is given as 0: the driver then does not use that interface)."""
        q = [f"urscript_port={self.urscript_port}"] if self.urscript_port else []
        q.append(f"dashboard_port={self.dashboard_port}")
        q.append(f"primary_port={self.primary_port}")
        if self.robot.nominal_model.name in ("ur3e", "ur5e", "ur10e"):
            q.append(f"model={self.robot.nominal_model.name}")
        else:
            q.append("tcp_check_mm=0")
        if np.any(self.robot.scenario.tcp_offset != 0):
            q.append("tcp_offset=" + ",".join(repr(float(x)) for x in self.robot.scenario.tcp_offset))
        return f"rtde://{self.host}:{self.port}" + ("?" + "&".join(q) if q else "")

    def start(self) -> RtdeServer:
        """Bind and start accepting (idempotent)."""
        if self._listeners:
            return self
        ls = self._listen(self._req_port)
        self.port = ls.getsockname()[1]
        self._spawn(self._accept_loop, (ls, self._serve_rtde), "rtde-accept")
        if self._req_script_port is not None:
            ss = self._listen(self._req_script_port)
            self.urscript_port = ss.getsockname()[1]
            self._spawn(self._accept_loop, (ss, self._serve_script), "urscript-accept")
        if self._req_realtime_port is not None:
            rs = self._listen(self._req_realtime_port)
            self.realtime_port = rs.getsockname()[1]
            self._spawn(self._accept_loop, (rs, self._serve_script), "realtime-accept")
        for svc in (self.dashboard, self.primary):
            if svc is not None:
                svc.start()
        log.info("sim RTDE server on %s:%d (URScript %d, dashboard %d, primary %d)", self.host, self.port,
                 self.urscript_port, self.dashboard_port, self.primary_port)
        return self

    def _listen(self, port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((self.host, port))
        s.listen(8)
        s.settimeout(0.1)
        self._listeners.append(s)
        return s

    def _spawn(self, fn: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        t = threading.Thread(target=fn, args=args, name=name, daemon=True)
        t.start()
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def close(self) -> None:
        """Close every connection and stop every thread (idempotent)."""
        self._stop.set()
        for svc in (self.dashboard, self.primary):
            if svc is not None:
                svc.close()
        for s in self._listeners:
            s.close()
        with self._lock:
            sessions = list(self._sessions)
            threads = list(self._threads)
        for sess in sessions:
            sess.kill()
        for t in threads:
            t.join(timeout=2.0)

    def __enter__(self) -> RtdeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def disconnect_all(self) -> None:
        """Drop every RTDE connection now (clients see EOF)."""
        with self._lock:
            sessions = list(self._sessions)
        for sess in sessions:
            sess.kill()

    def send_text(self, message: str, level: rc.TextLevel = rc.TextLevel.INFO, source: str = "sim") -> None:
        """Push a text message to every connected RTDE client."""
        with self._lock:
            sessions = list(self._sessions)
        for sess in sessions:
            sess.queue_text(rc.TextMessage(message, source, level))
        if self.primary is not None:
            self.primary.send_text(message)

    def inject_bytes(self, data: bytes) -> None:
        """Send ``data`` raw to every streaming RTDE client, between two packets."""
        with self._lock:
            sessions = list(self._sessions)
            self.first_good_after_garbage_s = None
        for sess in sessions:
            sess.queue_raw(bytes(data))

    def _garbage_sent(self) -> None:
        with self._lock:
            self._after_garbage = True
            self.first_good_after_garbage_s = None

    def garble(self, duration_s: float, *, seed: int = 0) -> None:
        """For ``duration_s`` (wall clock) from now, replace every data package sent by as
        many random bytes (seeded): the client keeps receiving bytes at the stream rate and
        not one valid package."""
        with self._lock:
            self._garble_rng = np.random.default_rng(seed)
            self._garble_until = time.monotonic() + float(duration_s)
            self._after_garbage = True
            self.first_good_after_garbage_s = None

    def _outgoing(self, packet: bytes, timestamp_s: float) -> bytes:
        """The bytes to send for a data package: garbage while garbling."""
        with self._lock:
            if time.monotonic() < self._garble_until:
                return self._garble_rng.integers(0, 256, len(packet), dtype=np.uint8).tobytes()
            if self._after_garbage:
                self._after_garbage = False
                self.first_good_after_garbage_s = timestamp_s
        return packet

    def _accept_loop(self, ls: socket.socket, handler: Callable[[socket.socket], None]) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = ls.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.robot.fault_active("disconnect"):
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._spawn(handler, (conn,), "rtde-session")

    # -- URScript ----------------------------------------------------------------------
    def _serve_script(self, conn: socket.socket) -> None:
        buf = b""
        conn.settimeout(0.1)
        deadline = time.monotonic() + 5.0
        try:
            while not self._stop.is_set() and time.monotonic() < deadline and len(buf) < 65536:
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    if buf.endswith(b"\n") and _script_complete(buf):
                        break
                    continue
                if not data:
                    break
                buf += data
        except OSError:
            pass
        finally:
            conn.close()
        if buf.strip():
            self.run_script(buf.decode("ascii", "replace"))

    def run_script(self, text: str) -> None:
        """Execute a URScript program of the supported subset (errors become text messages)."""
        try:
            refusal = self.robot.script_refusal()
            if refusal is not None:
                raise SimRefused(refusal)
            try:
                cmd = parse_urscript(text)
            except ValueError as exc:
                raise ValueError(f"{exc} (the simulated controller runs one movej, movel, stopj or stopl per "
                                 "script, no other programs)") from None
            robot = self.robot
            target = cmd.target
            if cmd.name in ("stopj", "stopl"):
                robot.stop(cmd.a if cmd.name == "stopj" else None)
            elif target is None:
                raise ValueError(f"{cmd.name} needs a target")
            elif cmd.is_pose:
                T = make_transform(so3_exp(target[3:]), target[:3])
                if cmd.name == "movel":
                    robot.command_pose(T, cmd.v)
                else:
                    robot.command_pose(T)
            else:
                robot.command_joints(target, cmd.v, cmd.a)
            self.scripts_run += 1
        except (ValueError, SimRefused) as exc:
            log.info("sim URScript rejected: %s", exc)
            self.send_text(f"script rejected: {exc}", rc.TextLevel.ERROR, "URControl")

    # -- RTDE ----------------------------------------------------------------------------
    def _serve_rtde(self, conn: socket.socket) -> None:
        sess = _Session(self, conn)
        with self._lock:
            self._sessions.add(sess)
        try:
            sess.run()
        finally:
            with self._lock:
                self._sessions.discard(sess)
            sess.kill()

    def next_recipe_id(self) -> int:
        with self._lock:
            self._recipe_ids = self._recipe_ids % 255 + 1
            return self._recipe_ids

    def fields(self, s: SimSample, names: Collection[str] | None = None) -> dict[str, Any]:
        """The output fields the simulation has a value for, at sample ``s``: every one, or
        those of ``names`` it knows (a session's recipe). The kinematic ones (a forward
        kinematics, a rotation log, a Jacobian each) are computed only when asked for: at
        the controller's rate they are most of a simulated cell's idle CPU."""
        want = _ALL_FIELDS if names is None else frozenset(names)
        robot = self.robot
        out: dict[str, Any] = {
            "timestamp": s.timestamp_s,
            "actual_q": s.q_rad,
            "actual_qd": s.qd_rad_s,
            "actual_TCP_pose": s.tcp_pose,
            "target_q": s.target_q_rad,
            "robot_mode": s.robot_mode,
            "safety_mode": s.safety_mode,
            "safety_status": s.safety_mode,
            "runtime_state": s.runtime_state,
            "joint_mode": (_JOINT_MODE_RUNNING,) * 6,
            "speed_scaling": 1.0,
            "target_speed_fraction": 1.0,
            "actual_main_voltage": 48.0,
            "actual_robot_voltage": 48.0,
            "actual_joint_voltage": (48.0,) * 6,
            "joint_temperatures": (30.0,) * 6,
            "actual_execution_time": 0.5,
            "actual_tool_accelerometer": (0.0, 0.0, 9.81),
            "tcp_force_scalar": 0.0,
            "actual_momentum": 0.0,
            "tcp_offset": s.tcp_offset,
            "payload": s.payload_kg,
        }
        if "target_TCP_pose" in want:
            target_T = robot.model.forward(s.target_q_rad) @ robot.tcp_at(s.t_sim_s)[1]
            out["target_TCP_pose"] = np.concatenate([target_T[:3, 3], so3_log(target_T[:3, :3])])
        if "actual_TCP_speed" in want:
            out["actual_TCP_speed"] = (*(robot.model.jacobian(s.q_rad) @ s.qd_rad_s),)
        if want & {"robot_status_bits", "safety_status_bits"}:
            powered = robot.robot_mode_name() != "POWER_OFF"
            out["robot_status_bits"] = ((_ROBOT_STATUS_POWER_ON if powered else 0)
                                        | (_ROBOT_STATUS_PROGRAM_RUNNING if s.moving else 0))
            out["safety_status_bits"] = _SAFETY_STATUS_PROTECTIVE_STOP if s.protective_stop else _SAFETY_STATUS_NORMAL
        return out


#: Every field :meth:`RtdeServer.fields` can give.
_ALL_FIELDS = frozenset((
    "timestamp", "actual_q", "actual_qd", "actual_TCP_pose", "target_q", "target_TCP_pose", "actual_TCP_speed",
    "robot_mode", "safety_mode", "safety_status", "runtime_state", "joint_mode", "speed_scaling",
    "target_speed_fraction", "actual_main_voltage", "actual_robot_voltage", "actual_joint_voltage",
    "joint_temperatures", "actual_execution_time", "robot_status_bits", "safety_status_bits",
    "actual_tool_accelerometer", "tcp_force_scalar", "actual_momentum", "tcp_offset", "payload",
))


def _script_complete(buf: bytes) -> bool:
    text = buf.decode("ascii", "replace").strip()
    return not text.startswith("def") or text.endswith("end")


class _Session:
    """One RTDE client connection."""

    def __init__(self, server: RtdeServer, conn: socket.socket) -> None:
        self.server = server
        self.conn = conn
        self.reader = rc.PacketReader()
        self.protocol = rc.PROTOCOL_V1  # until the client negotiates
        self.recipe: rc.Recipe | None = None
        self.rate_hz = _DEFAULT_V1_RATE_HZ
        self.streaming = False
        self._texts: list[rc.TextMessage] = []
        self._raw: list[bytes] = []
        self._text_lock = threading.Lock()
        self._dead = False
        self._send_lock = threading.Lock()
        self._last_sample_s = -math.inf  # the stamp of the last package sent (they never go back)

    def kill(self) -> None:
        if self._dead:
            return
        self._dead = True
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()

    def queue_text(self, msg: rc.TextMessage) -> None:
        with self._text_lock:
            self._texts.append(msg)

    def queue_raw(self, data: bytes) -> None:
        with self._text_lock:
            self._raw.append(data)

    def send(self, data: bytes) -> None:
        with self._send_lock:
            self.conn.sendall(data)

    def run(self) -> None:
        srv = self.server
        self.conn.settimeout(1.0)
        next_t = time.monotonic()
        try:
            while not srv._stop.is_set() and not self._dead:
                if srv.robot.fault_active("disconnect"):
                    log.info("sim RTDE: disconnect fault, dropping client")
                    return
                with self._text_lock:
                    texts, self._texts = self._texts, []
                    raw, self._raw = self._raw, []
                for msg in texts:
                    self.send(rc.encode_text_message(msg, self.protocol))
                for data in raw:
                    self.send(data)
                    srv._garbage_sent()
                now = time.monotonic()
                wait = max(0.0, next_t - now) if self.streaming else 0.05
                r, _, _ = select.select([self.conn], [], [], min(wait, 0.05))
                if r:
                    data = self.conn.recv(65536)
                    if not data:
                        return
                    self.reader.feed(data)
                    for ptype, payload in self.reader.packets():
                        self.handle(ptype, payload)
                if self.streaming and time.monotonic() >= next_t:
                    self.publish()
                    next_t += 1.0 / self.rate_hz
                    if next_t < time.monotonic() - 0.1:  # fell far behind: do not burst
                        next_t = time.monotonic()
        except (OSError, ProtocolError) as exc:
            log.debug("sim RTDE session ended: %s", exc)

    def publish(self) -> None:
        assert self.recipe is not None
        robot = self.server.robot
        jitter_ms = robot.scenario.latency_jitter_ms
        if jitter_ms > 0:
            # The package leaves late: its sample (and stamp) is older than the sending. A
            # controller samples in order and TCP keeps the order, so a package never carries
            # an older stamp than the one before it (a late one is followed by stale ones).
            late_s = float(self.server._jitter_rng.exponential(jitter_ms)) / 1000.0
            now = robot.world.now_s()
            t = min(now, max(now - robot.world.time_scale * late_s, self._last_sample_s))
            self._last_sample_s = t
            f = self.server.fields(robot.sample(t), self.recipe.names)
        else:
            f = self.server.fields(robot.sample(), self.recipe.names)
        values = {k: f.get(k) for k in self.recipe.names}
        if self.server.on_publish is not None:
            self.server.on_publish(values)
        self.send(self.server._outgoing(self.recipe.encode(values), float(f["timestamp"])))

    def handle(self, ptype: int, payload: bytes) -> None:
        P = rc.PacketType
        srv = self.server
        if ptype == P.REQUEST_PROTOCOL_VERSION:
            v = rc.decode_protocol_version_request(payload)
            ok = 1 <= v <= srv.max_protocol
            if ok:
                self.protocol = v
            self.send(rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, ok))
        elif ptype == P.GET_URCONTROL_VERSION:
            self.send(rc.encode_controller_version(srv.version))
        elif ptype == P.CONTROL_PACKAGE_SETUP_OUTPUTS:
            freq, names = rc.decode_setup_outputs_request(payload, self.protocol)
            missing = srv.robot.scenario.rtde_missing_outputs
            types = [rc.OUTPUT_FIELDS[n].name if n in rc.OUTPUT_FIELDS and n not in missing else rc.NOT_FOUND
                     for n in names]
            rid = srv.next_recipe_id() if self.protocol >= rc.PROTOCOL_V2 else 0
            if rc.NOT_FOUND not in types and names:
                self.recipe = rc.Recipe(names, types, rid, self.protocol)
                self.rate_hz = min(freq or _DEFAULT_V1_RATE_HZ, srv.max_rate_hz)
            else:
                rid = 0
            self.send(rc.encode_setup_reply(P.CONTROL_PACKAGE_SETUP_OUTPUTS, rid, types, self.protocol))
        elif ptype == P.CONTROL_PACKAGE_SETUP_INPUTS:
            names = rc.decode_setup_inputs_request(payload)
            types = [
                rc.OUTPUT_FIELDS[n].name if n.startswith("input_") and n in rc.OUTPUT_FIELDS else rc.NOT_FOUND
                for n in names
            ]
            rid = 0 if rc.NOT_FOUND in types else srv.next_recipe_id()
            self.send(rc.encode_setup_reply(P.CONTROL_PACKAGE_SETUP_INPUTS, rid, types, self.protocol))
        elif ptype == P.CONTROL_PACKAGE_START:
            ok = self.recipe is not None
            self.streaming = ok
            self.send(rc.encode_accepted(P.CONTROL_PACKAGE_START, ok))
        elif ptype == P.CONTROL_PACKAGE_PAUSE:
            self.streaming = False
            self.send(rc.encode_accepted(P.CONTROL_PACKAGE_PAUSE, True))
        elif ptype == P.TEXT_MESSAGE:
            try:
                msg = rc.decode_text_message(payload, self.protocol)
                log.info("sim RTDE: client says [%s] %s", msg.source, msg.message)
            except ProtocolError:
                pass
        elif ptype == P.DATA_PACKAGE:
            pass  # input registers: accepted, no effect in the simulation
        else:
            log.debug("sim RTDE: skipped packet type %d", ptype)
