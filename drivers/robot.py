"""Robot controllers: the device abstraction every backend implements, and ``connect_robot``.

``connect_robot(url, **options)`` picks a backend by the URL scheme from :data:`BACKENDS`
(imported lazily, so a cell on RTDE never imports ``canopen``):

* ``rtde://host[:port][?key=value&...]``: a Universal Robots controller over RTDE
  (:mod:`cellcal.drivers.ur_rtde`);
* ``canopen://<python-can channel>?interface=...&nodes=1-6&model=ur5e[&...]``: six CiA 402
  joint drives (:mod:`cellcal.drivers.canopen402`).

Every query key can also be passed as a keyword option (which wins over the URL); unknown
keys are rejected by name. ``docs/protocols/robot.md`` lists every key.

The public methods of :class:`RobotDriver` own timeouts, validation and logging; backends
implement the ``_..._internal`` hooks only, as python-can's ``BusABC.recv`` /
``_recv_internal`` do. The conventions the robot and tracker bases share (absolute
``time.monotonic()`` deadlines for the hooks, ``open()`` returning the driver, the backend
registry, ``from_url``) are in :mod:`cellcal.drivers.base` (ADR 0008).
"""

from __future__ import annotations

import abc
import enum
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import parse_qsl, unquote

import numpy as np

from cellcal.drivers.base import DeviceDriver, deadline_after, load_backend
from cellcal.drivers.errors import DeviceError, DriverError, DriverTimeoutError
from cellcal.drivers.kinematics import DHModel
from cellcal.drivers.settle import SettleConfig, SettleDetector, SettleStatus

__all__ = [
    "RobotMode",
    "RobotState",
    "RobotDriver",
    "RobotUrl",
    "BACKENDS",
    "connect_robot",
    "parse_robot_url",
    "OptionSpec",
    "ProtectiveStop",
]

log = logging.getLogger(__name__)

N_JOINTS = 6

#: URL scheme -> ``"module:Class"`` of the backend, imported on first use
#: (:func:`cellcal.drivers.base.load_backend`). Register another backend by adding it here.
BACKENDS: dict[str, str] = {
    "rtde": "cellcal.drivers.ur_rtde:UrRtdeDriver",
    "canopen": "cellcal.drivers.canopen402:Cia402Driver",
}


class ProtectiveStop(DeviceError):
    """The controller stopped the robot for safety (UR protective/safeguard stop, CiA 402
    quick stop); motion needs an operator's acknowledgement before it resumes."""

    def __init__(self, message: str, code: str = "PROTECTIVE_STOP") -> None:
        super().__init__(message, code)


class RobotMode(enum.Enum):
    """What the controller is doing, by name (backends map their codes onto these).

    ``RUNNING`` means motion is possible now (UR: robot mode RUNNING with safety NORMAL or
    REDUCED; CiA 402: every drive OPERATION ENABLED). ``IDLE`` is powered and holding but
    not enabled for motion (UR: IDLE / POWER_ON; CiA 402: SWITCH ON DISABLED, READY TO
    SWITCH ON or SWITCHED ON).
    """

    UNKNOWN = "unknown"
    DISCONNECTED = "disconnected"
    BOOTING = "booting"
    POWER_OFF = "power_off"
    IDLE = "idle"
    RUNNING = "running"
    PROTECTIVE_STOP = "protective_stop"
    EMERGENCY_STOP = "emergency_stop"
    FAULT = "fault"


@dataclass(frozen=True, eq=False)
class RobotState:
    """One coherent robot sample.

    Attributes
    ----------
    q_rad : numpy.ndarray, shape (6,)
        Joint angles as the controller reports them (rad).
    qd_rad_s : numpy.ndarray, shape (6,)
        Joint speeds (rad/s). RTDE: ``actual_qd``; CiA 402: differentiated positions.
    base_T_flange : numpy.ndarray, shape (4, 4)
        Flange pose in the base frame (m): RTDE: ``actual_TCP_pose`` with the configured
        TCP offset removed; CiA 402: forward kinematics of ``q_rad``.
    t_device_s : float
        Sample time on the device clock (RTDE ``timestamp``: seconds since controller
        start; CiA 402: the SYNC instant, see ``docs/protocols/robot.md``).
    t_host_ns : int
        Sample time on host ``time.monotonic_ns()``. RTDE: ``timestamp`` mapped through a
        :class:`~cellcal.drivers.clock.StreamClockModel` (the lower envelope of arrival
        times, so it includes the smallest transport delay seen; the receive time until the
        model has its first samples). CiA 402: the host's own stamp of the SYNC.
    moving : bool
        The robot is moving (a joint faster than the backend's ``moving`` threshold, or a
        move in progress).
    mode : RobotMode
        Controller mode.
    flange_speed_m_s, flange_ang_speed_rad_s : float
        Flange linear (m/s) and angular (rad/s) speed, ``|J(q) qd|``.
    target_reached : bool or None
        CiA 402: every drive cellcal commands has its actual position held inside its
        position window of the target for the window time and reports target reached
        (statusword bit 10); ``False`` from a fault seen during the move until the next one
        (``docs/protocols/robot.md`` section 3.6). ``None`` where the backend has no such
        flag (RTDE) or commands no drive (CiA 402 before its first move, ``enable=never``, a
        drive no longer OPERATION ENABLED): settling is then judged from the motion alone.
    t_recv_host_ns : int
        Host ``monotonic_ns`` at which the sample was received.
    seq : int
        Backend sample counter (increments per received sample).
    tcp_offset : numpy.ndarray, shape (6,), or None
        The TCP offset the controller reports it applies to its pose output, UR
        ``p[x, y, z, rx, ry, rz]`` (m, rad; RTDE ``tcp_offset``). ``None`` where the
        controller does not report it (older UR software, CiA 402).
    payload_kg : float or None
        The payload mass the controller reports (RTDE ``payload``), or ``None``.
    """

    q_rad: np.ndarray
    qd_rad_s: np.ndarray
    base_T_flange: np.ndarray
    t_device_s: float
    t_host_ns: int
    moving: bool
    mode: RobotMode
    flange_speed_m_s: float = 0.0
    flange_ang_speed_rad_s: float = 0.0
    target_reached: bool | None = None
    t_recv_host_ns: int = 0
    seq: int = 0
    tcp_offset: np.ndarray | None = None
    payload_kg: float | None = None


def _validate_state(s: RobotState) -> RobotState:
    """Shape and finiteness checks; raises ``ValueError`` (a backend bug, not the wire)."""
    if np.shape(s.q_rad) != (N_JOINTS,) or np.shape(s.qd_rad_s) != (N_JOINTS,):
        raise ValueError(f"robot state: q/qd must be ({N_JOINTS},), got {np.shape(s.q_rad)}")
    if np.shape(s.base_T_flange) != (4, 4):
        raise ValueError("robot state: base_T_flange must be (4, 4)")
    if not (
        np.all(np.isfinite(s.q_rad))
        and np.all(np.isfinite(s.qd_rad_s))
        and np.all(np.isfinite(s.base_T_flange))
        and math.isfinite(s.t_device_s)
    ):
        raise ValueError("robot state: non-finite value")
    if s.tcp_offset is not None and (np.shape(s.tcp_offset) != (6,) or not np.all(np.isfinite(s.tcp_offset))):
        raise ValueError("robot state: tcp_offset must be 6 finite numbers")
    if s.payload_kg is not None and not math.isfinite(s.payload_kg):
        raise ValueError("robot state: non-finite payload")
    return s


# -- URL and options ------------------------------------------------------------------------
@dataclass(frozen=True)
class RobotUrl:
    """A parsed robot URL: ``scheme://target?query``.

    ``target`` is everything between ``//`` and ``?``, percent-decoded (host[:port] for
    RTDE; the python-can channel for CANopen, brackets around an IPv6 group removed).
    """

    scheme: str
    target: str
    query: Mapping[str, str]


def parse_robot_url(url: str) -> RobotUrl:
    """Split a robot URL; rejects a missing scheme or target and repeated query keys."""
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"robot URL {url!r}: expected scheme://target[?key=value&...]")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    target, _, qs = rest.partition("?")
    target = unquote(target)
    if not target:
        raise ValueError(f"robot URL {url!r}: missing host or channel")
    query: dict[str, str] = {}
    for key, value in parse_qsl(qs, keep_blank_values=True, strict_parsing=False):
        if key in query:
            raise ValueError(f"robot URL {url!r}: query key {key!r} given twice")
        query[key] = value
    return RobotUrl(scheme, target, query)


@dataclass(frozen=True)
class OptionSpec:
    """One backend option: its parser (from a URL string or a Python value) and default."""

    parse: Callable[[Any], Any]
    default: Any
    doc: str = ""


def merge_options(
    specs: Mapping[str, OptionSpec], query: Mapping[str, str], options: Mapping[str, Any], where: str
) -> dict[str, Any]:
    """Defaults, then URL query values, then keyword options; every value parsed.

    Raises
    ------
    ValueError
        Naming the unknown key or the key whose value does not parse.
    """
    out = {k: s.default for k, s in specs.items()}
    for source, values in (("URL query", query), ("option", options)):
        for key, raw in values.items():
            if key not in specs:
                raise ValueError(
                    f"{where}: unknown {source} key {key!r} (known: {', '.join(sorted(specs))})"
                )
            try:
                out[key] = specs[key].parse(raw)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {source} {key}={raw!r}: {exc}") from None
    return out


def opt_float(lo: float | None = None, hi: float | None = None, *, positive: bool = False):
    """Parser for a finite float within ``[lo, hi]`` (``> 0`` if ``positive``)."""

    def parse(v: Any) -> float:
        if isinstance(v, bool):
            raise ValueError("expected a number")
        x = float(v)
        if not math.isfinite(x):
            raise ValueError("expected a finite number")
        if positive and not x > 0:
            raise ValueError("must be > 0")
        if lo is not None and x < lo or hi is not None and x > hi:
            raise ValueError(f"must be within [{lo}, {hi}]")
        return x

    return parse


def opt_int(lo: int | None = None, hi: int | None = None):
    def parse(v: Any) -> int:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError("expected an integer")
        x = int(v, 0) if isinstance(v, str) else int(v)
        if lo is not None and x < lo or hi is not None and x > hi:
            raise ValueError(f"must be within [{lo}, {hi}]")
        return x

    return parse


def opt_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def opt_str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("expected a string")
    return v


def opt_vector(n: int, *, positive: bool = False):
    """Parser for ``n`` finite numbers: a sequence, ``"a,b,c"``, or one scalar for all ``n``."""

    def parse(v: Any) -> np.ndarray:
        if isinstance(v, str):
            parts = [p for p in v.replace(" ", "").split(",") if p]
            arr = np.array([float(p) for p in parts], dtype=float)
        else:
            arr = np.array(v, dtype=float).reshape(-1)
        if arr.size == 1:
            arr = np.full(n, float(arr[0]))
        if arr.shape != (n,):
            raise ValueError(f"expected 1 or {n} numbers, got {arr.size}")
        if not np.all(np.isfinite(arr)):
            raise ValueError("expected finite numbers")
        if positive and not np.all(arr > 0):
            raise ValueError("every value must be > 0")
        return arr

    return parse


# -- the device abstraction ------------------------------------------------------------------
class RobotDriver(DeviceDriver):
    """A robot controller. Construct cheaply (no I/O; :func:`connect_robot` builds one from a
    URL), then :meth:`open`, use, and :meth:`close` (or use it as a context manager).

    A backend sets :attr:`backend` to its URL scheme and implements
    :meth:`_from_url_internal` and the ``_..._internal`` hooks; every hook that may wait
    gets an absolute ``deadline``, ``time.monotonic()`` seconds (ADR 0008).

    Parameters
    ----------
    model : DHModel
        Kinematic model: forward kinematics for CiA 402, inverse kinematics for pose moves
        on CiA 402, and flange speed ``|J(q) qd|`` for both backends.
    timeout_s : float
        Default timeout of :meth:`read_state` (s).
    max_age_s : float
        :meth:`read_state` returns the newest sample if it is at most this old, and
        otherwise waits (up to the timeout) for a newer one (s).
    move_timeout_s : float
        Default timeout of :meth:`move_to` with ``wait=True`` (s).
    """

    def __init__(
        self,
        *,
        model: DHModel,
        timeout_s: float = 1.0,
        max_age_s: float = 0.1,
        move_timeout_s: float = 120.0,
    ) -> None:
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_age_s = float(max_age_s)
        self.move_timeout_s = float(move_timeout_s)
        self._opened = False
        self._closed = False

    # -- construction and lifecycle ------------------------------------------------------
    @classmethod
    def from_url(cls, url: str | RobotUrl, options: Mapping[str, Any] | None = None, /, **kw: Any) -> Self:
        """A driver of this backend for ``url`` (``scheme://target?query``), not connected.

        Query keys and keyword options are the backend's options (keywords win); the scheme
        must be this backend's. ``options`` (a mapping, positional) is the older spelling of
        the keywords and is merged under them.

        Raises
        ------
        ValueError
            A malformed URL, another backend's scheme, an unknown or malformed option.
        """
        parsed = url if isinstance(url, RobotUrl) else parse_robot_url(url)
        if parsed.scheme != cls.backend:
            raise ValueError(f"robot URL scheme {parsed.scheme!r} is not {cls.__name__}'s {cls.backend!r}")
        return cls._from_url_internal(parsed, {**(options or {}), **kw})

    def open(self) -> Self:
        """Connect and configure the device (idempotent); returns the driver itself.

        Raises
        ------
        DriverInitError
            The controller could not be reached, or refused the set-up.
        DriverError
            The driver was closed (a closed robot driver is not reopened; make a new one).
        """
        if self._closed:
            raise DriverError(f"{self!r}: closed; create a new driver")
        if self._opened:
            return self
        self._open_internal()
        self._opened = True
        log.info("%r: open", self)
        return self

    def close(self) -> None:
        """Stop background threads and release the device (idempotent, never raises)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._close_internal()
        except Exception:  # noqa: BLE001 - close must not raise
            log.exception("%r: error while closing", self)
        log.info("%r: closed", self)

    def _check_open(self) -> None:
        if self._closed:
            raise DriverError(f"{self!r}: closed")
        if not self._opened:
            raise DriverError(f"{self!r}: not open (call open() or use connect_robot)")

    # -- public API --------------------------------------------------------------------
    def read_state(self, timeout_s: float | None = None) -> RobotState:
        """The newest coherent robot sample.

        Returns the latest sample if it is at most ``max_age_s`` old, otherwise waits for a
        newer one.

        Raises
        ------
        DriverTimeoutError
            No fresh sample within ``timeout_s`` (default: the driver's ``timeout_s``).
        DeviceGoneError
            The link is down (the backend reconnects in the background where it can).
        DeviceError
            The device reported an error (e.g. a CiA 402 heartbeat lost, an SDO abort).
        """
        self._check_open()
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        state = self._read_state_internal(deadline_after(timeout))
        if state is None:
            raise DriverTimeoutError(f"{self!r}: no robot state within {timeout:.3g} s")
        return _validate_state(state)

    def move_to(
        self,
        *,
        base_T_flange: np.ndarray | None = None,
        q_rad: np.ndarray | None = None,
        speed: float = 0.25,
        wait: bool = True,
        timeout_s: float | None = None,
    ) -> None:
        """Move to a flange pose or a joint vector (only for cells where cellcal may move).

        Parameters
        ----------
        base_T_flange : (4, 4) array, optional
            Flange target in the base frame (m). RTDE sends it as ``movel`` (with the TCP
            offset re-applied); CiA 402 solves IK from the current joints.
        q_rad : (6,) array, optional
            Joint target (rad), sent as ``movej`` / profile-position targets.
        speed : float
            Fraction (0, 1] of the driver's ``max_joint_speed`` (and Cartesian speed).
        wait : bool
            Block until the motion has finished (not necessarily settled: use
            :meth:`wait_settled`).
        timeout_s : float, optional
            Timeout for ``wait`` (default ``move_timeout_s``).

        Raises
        ------
        ValueError
            Neither or both targets, a malformed target, or ``speed`` outside (0, 1].
        ProtectiveStop
            The controller stopped the motion (UR safety mode / CiA 402 quick stop).
        DriverTimeoutError
            The motion did not finish in time.
        """
        self._check_open()
        if (base_T_flange is None) == (q_rad is None):
            raise ValueError("move_to: give exactly one of base_T_flange= or q_rad=")
        if not (isinstance(speed, (int, float)) and 0 < speed <= 1):
            raise ValueError(f"move_to: speed must be a fraction in (0, 1], got {speed!r}")
        q = None
        pose = None
        if q_rad is not None:
            q = np.asarray(q_rad, dtype=float).reshape(-1)
            if q.shape != (N_JOINTS,) or not np.all(np.isfinite(q)):
                raise ValueError(f"move_to: q_rad must be {N_JOINTS} finite numbers")
        else:
            from cellcal.solver.se3 import check_transform

            pose = check_transform(np.asarray(base_T_flange), "move_to: base_T_flange")
        timeout = self.move_timeout_s if timeout_s is None else float(timeout_s)
        log.info("%r: move_to %s speed=%.3g", self, "q" if q is not None else "pose", speed)
        self._move_internal(q, pose, float(speed), wait, deadline_after(timeout))

    def stop(self) -> None:
        """Stop any motion now (decelerating), keeping the connection."""
        self._check_open()
        log.info("%r: stop", self)
        self._stop_internal()

    def wait_settled(
        self, config: SettleConfig | None = None, timeout_s: float = 30.0
    ) -> tuple[RobotState, SettleStatus]:
        """Read states until the robot is settled (see :mod:`cellcal.drivers.settle`).

        Returns
        -------
        (RobotState, SettleStatus)
            The sample that completed the dwell window, and the window's figures.

        Raises
        ------
        DriverTimeoutError
            Not settled within ``timeout_s`` (the message carries the last reason).
        """
        self._check_open()
        det = SettleDetector(config)
        deadline = time.monotonic() + timeout_s
        last_seq = -1
        reason = "no sample"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DriverTimeoutError(f"{self!r}: not settled within {timeout_s:.3g} s ({reason})")
            state = self.read_state(timeout_s=min(remaining, max(self.timeout_s, 0.05)))
            if state.seq == last_seq:
                # no new sample yet: wait a little rather than spin on the same one
                time.sleep(0.001)
                continue
            last_seq = state.seq
            status = det.update(state)
            reason = status.reason or f"quiet for {status.quiet_s:.3g} s"
            if status.settled:
                return state, status

    # -- backend hooks -------------------------------------------------------------------
    @classmethod
    def _from_url_internal(cls, url: RobotUrl, options: Mapping[str, Any]) -> Self:
        """Build the driver from a parsed URL of this backend's scheme and the keyword
        options (merge them with :func:`merge_options`); no I/O. Every registered backend
        implements it; a driver built only by its constructor need not."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a URL")

    @abc.abstractmethod
    def _open_internal(self) -> None:
        """Connect, handshake, configure; raise ``DriverInitError`` on failure."""

    @abc.abstractmethod
    def _close_internal(self) -> None:
        """Stop threads, close sockets/buses. Called once."""

    @abc.abstractmethod
    def _read_state_internal(self, deadline: float) -> RobotState | None:
        """A sample no older than ``max_age_s``, waiting until ``deadline`` (``time.monotonic()``
        seconds); ``None`` on timeout. Raise typed errors for a lost link or a device error."""

    @abc.abstractmethod
    def _move_internal(
        self,
        q_rad: np.ndarray | None,
        base_T_flange: np.ndarray | None,
        speed: float,
        wait: bool,
        deadline: float,
    ) -> None:
        """Start (and with ``wait`` finish, by ``deadline``, ``time.monotonic()`` seconds) a
        move to exactly one of the targets."""

    @abc.abstractmethod
    def _stop_internal(self) -> None:
        """Decelerate to a stop."""


def connect_robot(url: str, **options: Any) -> RobotDriver:
    """A robot driver for ``url``, not yet connected (no I/O until ``open()`` / ``with``),
    like :func:`cellcal.drivers.connect_tracker`; so building one also validates a
    configuration without touching the robot.

    Parameters
    ----------
    url : str
        ``rtde://host[:port][?...]`` or ``canopen://<channel>?interface=...&nodes=...``.
    **options
        Backend options; the same names as the URL query keys (keyword options win).

    Returns
    -------
    RobotDriver
        Call ``open()`` (or use ``with``), then ``close()``.

    Raises
    ------
    ValueError
        Unknown scheme (the message lists the known ones) or option, or a malformed value
        (named).

    Examples
    --------
    >>> with connect_robot("rtde://192.168.1.10") as robot:  # doctest: +SKIP
    ...     state = robot.read_state()
    """
    parsed = parse_robot_url(url)
    cls: type[RobotDriver] = load_backend(BACKENDS, parsed.scheme, "robot URL scheme")
    return cls.from_url(parsed, **options)
