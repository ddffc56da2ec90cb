"""The simulated UR controller's other interfaces: the dashboard server and the primary interface.

* :class:`DashboardServer` (port 29999 on a real robot): one greeting line, then one answer
  line per command line. The subset served (``docs/protocols/robot.md``): ``robotmode``,
  ``safetystatus``, ``safetymode``, ``is in remote control``, ``get serial number``,
  ``PolyscopeVersion`` (and ``version``), ``programState``, ``running``, ``get robot model``,
  ``get loaded program``, ``get operational mode``, ``isProgramSaved``, ``power on``,
  ``power off``, ``brake release``, ``unlock protective stop``, ``close safety popup``,
  ``close popup``, ``popup``, ``addToLog``, ``stop``, ``pause``, ``play``, ``quit``; anything
  else is answered ``could not understand: '<line>'`` as a real controller does.
* :class:`PrimaryServer` (port 30001): the version message on every connection, then a
  robot-state message every 0.1 s of wall time with robot mode data and ``KinematicsInfo``
  (the controller's factory DH table, :mod:`cellcal.drivers.ur_primary`); text messages the
  controller says (a rejected script) go to every client. What clients send is read and
  dropped (a real controller would run it as a script).

Both serve one :class:`~cellcal.sim.robot_sim.SimRobot` on loopback; every socket has a
timeout and every thread stops on ``close()``. :class:`~cellcal.sim.rtde_server.RtdeServer`
starts them next to RTDE and URScript.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from cellcal.drivers import ur_primary as up
from cellcal.drivers.errors import ProtocolError
from cellcal.drivers.ur_dashboard import LineReader

__all__ = ["DashboardServer", "PrimaryServer", "dashboard_answer", "ur_model_name"]

log = logging.getLogger(__name__)

GREETING = "Connected: Universal Robots Dashboard Server"
PRIMARY_PERIOD_S = 0.1


def ur_model_name(model_name: str) -> str:
    """Dashboard ``get robot model`` of a model name (``ur5e`` -> ``UR5``)."""
    name = model_name.lower()
    if name.startswith("ur") and name.rstrip("e")[2:].isdigit():
        return "UR" + name.rstrip("e")[2:]
    return "UR5"


def dashboard_answer(robot: Any, line: str, version: tuple[int, int, int, int]) -> str | None:
    """The answer of the simulated controller to one dashboard command line (None: ``quit``,
    answered ``Disconnected`` and closed by the caller)."""
    cmd = line.strip()
    low = cmd.lower()
    v = ".".join(str(x) for x in version)
    moving = robot.sample().moving
    if low == "robotmode":
        return f"Robotmode: {robot.robot_mode_name()}"
    if low == "safetystatus":
        return f"Safetystatus: {robot.safety_status()}"
    if low == "safetymode":
        return f"Safetymode: {robot.safety_status()}"
    if low == "is in remote control":
        return "true" if robot.remote_control() else "false"
    if low == "get serial number":
        return str(robot.scenario.serial_number)
    if low in ("polyscopeversion", "version"):
        return f"URSoftware {v} (simulated)"
    if low == "programstate":
        return f"{'PLAYING' if moving else 'STOPPED'} <unnamed>"
    if low == "running":
        return f"Program running: {'true' if moving else 'false'}"
    if low == "get robot model":
        return ur_model_name(robot.nominal_model.name)
    if low == "get loaded program":
        return "No program loaded"
    if low == "get operational mode":
        return "NONE"
    if low == "isprogramsaved":
        return "false <unnamed>"
    if low == "power on":
        return robot.power_on()
    if low == "power off":
        return robot.power_off()
    if low == "brake release":
        return robot.brake_release()
    if low == "unlock protective stop":
        if not robot.fault_active("protective_stop"):
            return "Protective stop releasing"  # nothing to release: a controller answers the same
        robot.clear("protective_stop")
        return "Protective stop releasing"
    if low == "close safety popup":
        return "closing safety popup"
    if low == "close popup":
        return "closing popup"
    if low.startswith("popup "):
        return "showing popup"
    if low.startswith("addtolog "):
        return "Added log message"
    if low == "stop":
        robot.stop()
        return "Stopped"
    if low == "pause":
        return "Pausing program"
    if low == "play":
        return "Failed to execute: play"
    if low == "quit":
        return None
    return f"could not understand: '{cmd}'"


def _down(robot: Any) -> bool:
    """Whether the dashboard and primary interface refuse connections now: a ``disconnect``
    (everything is gone) or ``interfaces_down`` (RTDE is back first, as after a controller's
    reboot, and these two are not yet)."""
    return robot.fault_active("disconnect") or robot.fault_active("interfaces_down")


class _TcpService:
    """One loopback listener whose connections each get a thread running ``handler``."""

    def __init__(self, name: str, host: str, port: int, handler: Callable[[socket.socket], None]) -> None:
        self.name = name
        self.host = host
        self._req_port = port
        self.port = 0
        self._handler = handler
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self, alive: Callable[[], bool]) -> None:
        s = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((self.host, self._req_port))
            s.listen(8)
        except OSError:
            s.close()
            raise
        s.settimeout(0.1)
        self._listener = s
        self.port = s.getsockname()[1]
        self._spawn(self._accept, (alive,))

    def _spawn(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        t = threading.Thread(target=fn, args=args, name=f"sim-{self.name}", daemon=True)
        t.start()
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _accept(self, alive: Callable[[], bool]) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not alive():
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            self._spawn(self._run_one, (conn,))

    def _run_one(self, conn: socket.socket) -> None:
        try:
            self._handler(conn)
        except OSError as exc:
            log.debug("sim %s session ended: %s", self.name, exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def drop_all(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        self.drop_all()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(timeout=2.0)


class DashboardServer:
    """The dashboard server of one simulated robot (see the module docstring).

    Parameters
    ----------
    robot : SimRobot
    host : str
    port : int
        0: a free port (read :attr:`port` after :meth:`start`).
    version : tuple of 4 int
        What ``PolyscopeVersion`` reports (the RTDE controller version).
    """

    def __init__(self, robot: Any, host: str = "127.0.0.1", port: int = 0,
                 version: tuple[int, int, int, int] = (5, 23, 0, 0)) -> None:
        self.robot = robot
        self.version = version
        self.commands: list[str] = []  # every command line received (tests read it)
        self._svc = _TcpService("dashboard", host, port, self._serve)

    @property
    def port(self) -> int:
        return self._svc.port

    def start(self) -> DashboardServer:
        self._svc.start(lambda: not _down(self.robot))
        return self

    def close(self) -> None:
        self._svc.close()

    def disconnect_all(self) -> None:
        self._svc.drop_all()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        conn.sendall((GREETING + "\n").encode("ascii"))
        reader = LineReader()
        while not self._svc.stopping:
            if _down(self.robot):
                return
            try:
                data = conn.recv(4096)
            except TimeoutError:
                continue
            if not data:
                return
            reader.feed(data)
            try:
                lines = reader.lines()
            except ProtocolError:
                conn.sendall(b"could not understand: line too long\n")
                return
            for line in lines:
                self.commands.append(line)
                answer = dashboard_answer(self.robot, line, self.version)
                if answer is None:
                    conn.sendall(b"Disconnected\n")
                    return
                conn.sendall(answer.encode("latin-1", "replace") + b"\n")


class PrimaryServer:
    """The primary interface of one simulated robot (see the module docstring).

    Parameters
    ----------
    robot : SimRobot
    host : str
    port : int
        0: a free port.
    version : tuple of 4 int
        The version message's major, minor, bugfix, build.
    period_s : float
        Robot-state period (wall seconds; 0.1 on a real controller).
    """

    def __init__(self, robot: Any, host: str = "127.0.0.1", port: int = 0,
                 version: tuple[int, int, int, int] = (5, 23, 0, 0), period_s: float = PRIMARY_PERIOD_S) -> None:
        self.robot = robot
        self.version = version
        self.period_s = float(period_s)
        self._texts: list[list[bytes]] = []
        self._tlock = threading.Lock()
        self._svc = _TcpService("primary", host, port, self._serve)
        model = robot.model  # the controller's factory calibration
        theta, a, d, alpha = (tuple(float(x) for x in v) for v in model.ur_table())
        self.kinematics = up.KinematicsInfo(up.joint_checksums(theta, a, d, alpha), theta, a, d, alpha, 1)

    @property
    def port(self) -> int:
        return self._svc.port

    def start(self) -> PrimaryServer:
        self._svc.start(lambda: not _down(self.robot))
        return self

    def close(self) -> None:
        self._svc.close()

    def send_text(self, text: str) -> None:
        """A text message to every connected client."""
        msg = up.encode_text_message(up.TextMessage(text, self._timestamp_ms(), 0))
        with self._tlock:
            for q in self._texts:
                q.append(msg)

    def _timestamp_ms(self) -> int:
        return int(self.robot.controller_time(self.robot.world.now_s()) * 1000)

    def state_message(self) -> bytes:
        """One robot-state message as the controller would send it now."""
        r = self.robot
        s = r.sample()
        mode = up.RobotModeData(
            self._timestamp_ms(), True, True, r.robot_mode_name() != "POWER_OFF", False, s.protective_stop,
            bool(s.moving), False, int(s.robot_mode), 0, 1.0, 1.0, 1.0)
        return up.encode_robot_state([up.encode_robot_mode_data(mode), up.encode_kinematics_info(self.kinematics)])

    def _serve(self, conn: socket.socket) -> None:
        major, minor, bugfix, build = self.version
        conn.settimeout(0.05)
        conn.sendall(up.encode_version_message(up.VersionMessage("URControl", major, minor, bugfix, build,
                                                                 "simulated", self._timestamp_ms(), 254)))
        queue: list[bytes] = []
        with self._tlock:
            self._texts.append(queue)
        try:
            next_t = time.monotonic()
            while not self._svc.stopping:
                if _down(self.robot):
                    return
                now = time.monotonic()
                if now >= next_t:
                    conn.sendall(self.state_message())
                    next_t = max(next_t + self.period_s, now)
                with self._tlock:
                    texts, queue[:] = list(queue), []
                for t in texts:
                    conn.sendall(t)
                try:
                    data = conn.recv(65536)  # scripts sent here are read and dropped
                except TimeoutError:
                    continue
                if not data:
                    return
        finally:
            with self._tlock:
                self._texts = [q for q in self._texts if q is not queue]
