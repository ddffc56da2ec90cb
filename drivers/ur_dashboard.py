"""Universal Robots dashboard server (port 29999): codec and client.

The dashboard server is a line protocol: the controller greets each connection with one
line (``Connected: Universal Robots Dashboard Server``), then answers every command line
(``\\n``-terminated ASCII) with one line. What a calibration client asks
(``docs/protocols/robot.md``):

=====================================  ========================================================
command                                answer
=====================================  ========================================================
``robotmode``                          ``Robotmode: RUNNING`` (POWER_OFF, IDLE, BOOTING, ...)
``safetystatus`` / ``safetymode``      ``Safetystatus: NORMAL`` / ``Safetymode: NORMAL``
``is in remote control``               ``true`` / ``false`` (PolyScope 5.6 and later)
``get serial number``                  the serial number, digits (PolyScope 5.6 and later)
``PolyscopeVersion``                   ``URSoftware 5.23.0.0 (...)``
``programState``                       ``STOPPED <program>`` / ``PLAYING <program>``
``get robot model``                    ``UR5``
``power on`` / ``brake release``       ``Powering on`` / ``Brake releasing``
=====================================  ========================================================

The codec (:func:`parse_reply` and the ``parse_*`` helpers, :class:`LineReader`) is pure;
:class:`DashboardClient` owns the socket, one command at a time, every wait bounded by a
deadline. Unparseable answers (``could not understand: ...``) are
:class:`~cellcal.drivers.errors.ProtocolError`; a lost link
:class:`~cellcal.drivers.errors.DeviceGoneError`.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Self

from cellcal.drivers.errors import DeviceGoneError, DriverTimeoutError, ProtocolError

__all__ = [
    "DEFAULT_DASHBOARD_PORT",
    "MAX_LINE_BYTES",
    "ROBOT_MODES",
    "SAFETY_STATUSES",
    "MOTION_SAFETY_STATUSES",
    "LineReader",
    "parse_prefixed",
    "parse_bool",
    "parse_version",
    "parse_serial",
    "parse_program_state",
    "DashboardStatus",
    "DashboardClient",
]

log = logging.getLogger(__name__)

DEFAULT_DASHBOARD_PORT = 29999
#: Longest answer line accepted.
MAX_LINE_BYTES = 4096
#: ``robotmode`` answers.
ROBOT_MODES = ("NO_CONTROLLER", "DISCONNECTED", "CONFIRM_SAFETY", "BOOTING", "POWER_OFF", "POWER_ON", "IDLE",
               "BACKDRIVE", "RUNNING", "UPDATING_FIRMWARE")
#: ``safetystatus`` answers.
SAFETY_STATUSES = ("NORMAL", "REDUCED", "PROTECTIVE_STOP", "RECOVERY", "SAFEGUARD_STOP", "SYSTEM_EMERGENCY_STOP",
                   "ROBOT_EMERGENCY_STOP", "VIOLATION", "FAULT", "AUTOMATIC_MODE_SAFEGUARD_STOP",
                   "SYSTEM_THREE_POSITION_ENABLING_STOP", "UNDEFINED_SAFETY_MODE", "VALIDATE_JOINT_ID")
#: Safety statuses in which the arm may be commanded (reduced mode limits speeds only).
MOTION_SAFETY_STATUSES = ("NORMAL", "REDUCED")

_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.(\d+)\.(\d+)")


class LineReader:
    """Lines out of a byte stream (no I/O): ``feed`` bytes, then :meth:`lines` (decoded,
    ``\\r\\n`` or ``\\n`` stripped). A line longer than ``max_line_bytes`` raises
    :class:`ProtocolError` (the peer is not a dashboard server)."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self.max_line_bytes = int(max_line_bytes)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def lines(self) -> list[str]:
        out: list[str] = []
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                if len(self._buf) > self.max_line_bytes:
                    n = len(self._buf)
                    self._buf.clear()
                    raise ProtocolError(f"UR dashboard: {n} bytes without a line end")
                return out
            raw = bytes(self._buf[:i]).rstrip(b"\r")
            del self._buf[:i + 1]
            if len(raw) > self.max_line_bytes:
                raise ProtocolError(f"UR dashboard: a line of {len(raw)} bytes")
            out.append(raw.decode("latin-1"))


def parse_prefixed(reply: str, prefix: str, choices: tuple[str, ...] | None = None) -> str:
    """The value of ``"<prefix>: VALUE"`` (``Robotmode: RUNNING`` -> ``RUNNING``).

    Raises
    ------
    ProtocolError
        Another answer, or a value not in ``choices``.
    """
    head, sep, value = reply.partition(":")
    value = value.strip()
    if not sep or head.strip().lower() != prefix.lower() or not value:
        raise ProtocolError(f"UR dashboard: expected '{prefix}: ...', got {reply!r}")
    if choices is not None and value not in choices:
        raise ProtocolError(f"UR dashboard: {prefix} {value!r} is none of {', '.join(choices)}")
    return value


def parse_bool(reply: str) -> bool:
    """``true`` / ``false`` (any case)."""
    s = reply.strip().lower()
    if s in ("true", "false"):
        return s == "true"
    raise ProtocolError(f"UR dashboard: expected true or false, got {reply!r}")


def parse_version(reply: str) -> tuple[int, int, int, int]:
    """The first ``a.b.c.d`` in a ``PolyscopeVersion`` answer."""
    m = _VERSION_RE.search(reply)
    if m is None:
        raise ProtocolError(f"UR dashboard: no version a.b.c.d in {reply!r}")
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]  # four groups


def parse_serial(reply: str) -> str:
    """A serial number: 1-32 digits."""
    s = reply.strip()
    if not (s.isascii() and s.isdigit() and 1 <= len(s) <= 32):
        raise ProtocolError(f"UR dashboard: expected a serial number (digits), got {reply!r}")
    return s


def parse_program_state(reply: str) -> tuple[str, str]:
    """``(state, program)`` of a ``programState`` answer (``STOPPED prog.urp``)."""
    state, _, program = reply.strip().partition(" ")
    if state not in ("STOPPED", "PLAYING", "PAUSED"):
        raise ProtocolError(f"UR dashboard: unknown program state in {reply!r}")
    return state, program.strip()


@dataclass(frozen=True)
class DashboardStatus:
    """What the dashboard says about motion: robot mode, safety status, remote control."""

    robot_mode: str
    safety_status: str
    remote_control: bool

    @property
    def motion_allowed(self) -> bool:
        """Robot mode RUNNING, a safety status that allows motion, remote control on."""
        return self.robot_mode == "RUNNING" and self.safety_status in MOTION_SAFETY_STATUSES and self.remote_control

    def describe(self) -> str:
        return (f"robotmode {self.robot_mode}, safetystatus {self.safety_status}, "
                f"is in remote control: {'true' if self.remote_control else 'false'}")


class DashboardClient:
    """A connection to the dashboard server; thread-safe, one command at a time.

    Parameters
    ----------
    host : str
    port : int
    timeout_s : float
        Per command (connect included).

    Notes
    -----
    The constructor does no I/O; :meth:`connect` (or ``with``) opens the socket and reads
    the greeting. After a lost link the next command reconnects once.
    """

    def __init__(self, host: str, port: int = DEFAULT_DASHBOARD_PORT, timeout_s: float = 2.0) -> None:
        self.host = host
        self.port = int(port)
        self.timeout_s = float(timeout_s)
        self.greeting: str | None = None
        self._sock: socket.socket | None = None
        self._reader = LineReader()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DashboardClient({self.host}:{self.port})"

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> Self:
        """Open the connection and read the greeting (idempotent).

        Raises
        ------
        DeviceGoneError
            No connection.
        DriverTimeoutError
            No greeting in time.
        """
        with self._lock:
            self._connect_locked()
        return self

    def _connect_locked(self) -> None:
        if self._sock is not None:
            return
        deadline = time.monotonic() + self.timeout_s
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise DeviceGoneError(f"{self!r}: cannot connect: {exc}") from exc
        self._sock = sock
        self._reader = LineReader()
        try:
            self.greeting = self._read_line(deadline)
        except BaseException:
            self._drop()
            raise
        if "dashboard" not in self.greeting.lower():
            log.warning("%r: unexpected greeting %r", self, self.greeting)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def _read_line(self, deadline: float) -> str:
        assert self._sock is not None
        while True:
            lines = self._reader.lines()
            if lines:
                if len(lines) > 1:
                    log.debug("%r: %d extra lines dropped", self, len(lines) - 1)
                return lines[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DriverTimeoutError(f"{self!r}: no answer within {self.timeout_s:.3g} s")
            self._sock.settimeout(remaining)
            try:
                data = self._sock.recv(4096)
            except TimeoutError:
                continue
            except OSError as exc:
                raise DeviceGoneError(f"{self!r}: {exc}") from exc
            if not data:
                raise DeviceGoneError(f"{self!r}: closed by the controller")
            self._reader.feed(data)

    def command(self, text: str) -> str:
        """Send one command line, return the answer line (reconnecting once if the link had
        dropped before the command was sent).

        Raises
        ------
        ValueError
            A command with a line break or non-ASCII characters.
        DeviceGoneError, DriverTimeoutError, ProtocolError
        """
        if "\n" in text or "\r" in text or not text.isascii():
            raise ValueError(f"dashboard command must be one ASCII line, got {text!r}")
        with self._lock:
            for attempt in (0, 1):
                self._connect_locked()
                assert self._sock is not None
                try:
                    self._sock.sendall(text.encode("ascii") + b"\n")
                except OSError as exc:
                    self._drop()
                    if attempt:
                        raise DeviceGoneError(f"{self!r}: {exc}") from exc
                    continue
                try:
                    return self._read_line(time.monotonic() + self.timeout_s)
                except (DeviceGoneError, DriverTimeoutError, ProtocolError):
                    self._drop()
                    raise
        raise DeviceGoneError(f"{self!r}: could not send {text!r}")  # pragma: no cover - loop returns or raises

    # -- what a calibration client asks ----------------------------------------------------
    def robot_mode(self) -> str:
        return parse_prefixed(self.command("robotmode"), "Robotmode", ROBOT_MODES)

    def safety_status(self) -> str:
        return parse_prefixed(self.command("safetystatus"), "Safetystatus", SAFETY_STATUSES)

    def is_in_remote_control(self) -> bool:
        return parse_bool(self.command("is in remote control"))

    def serial_number(self) -> str:
        return parse_serial(self.command("get serial number"))

    def polyscope_version(self) -> tuple[int, int, int, int]:
        return parse_version(self.command("PolyscopeVersion"))

    def program_state(self) -> tuple[str, str]:
        return parse_program_state(self.command("programState"))

    def robot_model(self) -> str:
        return self.command("get robot model").strip()

    def status(self) -> DashboardStatus:
        """Robot mode, safety status and remote control, asked now."""
        return DashboardStatus(self.robot_mode(), self.safety_status(), self.is_in_remote_control())
