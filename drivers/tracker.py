"""Laser tracker driver: the device abstraction, its typed errors and the serial backend.

Layout follows python-can's ``BusABC``: :class:`TrackerDriver` owns everything a caller
relies on -- timeouts, argument and reply validation, retries of corrupted exchanges,
reconnection, clock mapping, logging -- and a backend implements only the ``_..._internal``
hooks that talk to its device, each given an absolute deadline in ``time.monotonic()``
seconds. The conventions the robot and tracker bases share (deadlines, ``open()``
returning the driver, the backend registry :data:`BACKENDS`, ``from_url``) are in
:mod:`cellcal.drivers.base` (ADR 0008). :class:`SerialTrackerDriver` speaks the
cellcal tracker protocol (``docs/protocols/tracker.md``) over any port
``serial.serial_for_url`` opens: a device path, ``socket://host:port`` (a
serial-to-Ethernet bridge or a tracker on TCP), a pty, or ``spy://`` for field debugging.

Frames: the tracker's own frame *is* the cell frame, so a measurement of the target is
``cell_T_target`` (pose) or ``cell_p_target`` (point), SI units (m, rad) inside cellcal;
the wire's mm and degrees are converted here, at the edge.
"""

from __future__ import annotations

import abc
import logging
import math
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np

from cellcal.drivers import tracker_codec as codec
from cellcal.drivers.base import DeviceDriver, deadline_after, load_backend
from cellcal.drivers.clock import ExchangeClockModel
from cellcal.drivers.errors import (
    DeviceError,
    DeviceGoneError,
    DriverError,
    DriverInitError,
    DriverTimeoutError,
    ProtocolError,
)
from cellcal.drivers.tracker_codec import MeasKind, MeasurementFlags, NakCode, StatusFlags
from cellcal.solver.se3 import transform_from_xyz_quat

__all__ = [
    "connect_tracker",
    "connect_configured_tracker",
    "TrackerDriver",
    "SerialTrackerDriver",
    "TrackerInfo",
    "TrackerMeasurement",
    "TrackerStatus",
    "MeasKind",
    "MeasurementFlags",
    "StatusFlags",
    "TrackerDeviceError",
    "NoTargetError",
    "BeamBrokenError",
    "NotStableError",
    "NotWarmedUpError",
    "OutOfRangeError",
    "TrackerBusyError",
    "MeasurementAbortedError",
    "RequestRejectedError",
    "TrackerTimeoutError",
    "TrackerGoneError",
    "NotInitializedError",
    "NoStationaryResultError",
    "ImplausibleMeasurementError",
    "HostClockTrackerDriver",
    "BACKENDS",
    "URL_SCHEMES",
    "backend_for_url",
]

log = logging.getLogger(__name__)

_MM_TO_M = 1e-3
_NS_PER_S = 1_000_000_000
_US_TO_S = 1e-6
#: Largest deviation from unit norm accepted for a wire quaternion (9 decimals each).
_QUAT_NORM_TOL = 1e-6
#: A device clock that jumps back by more than this has restarted.
_DEVICE_RESTART_BACKSTEP_US = 1_000_000
#: Default baud rate of a real serial line (ignored by socket:// and ptys).
DEFAULT_BAUDRATE = 115_200
#: Longest single blocking read; the deadline loop re-checks time in between.
_READ_POLL_S = 0.05
#: How long close() waits for a request on another thread before interrupting it.
_CLOSE_WAIT_S = 0.2
_WRITE_TIMEOUT_S = 1.0


# -- errors ----------------------------------------------------------------------------------


class TrackerDeviceError(DeviceError):
    """The tracker refused a request; ``code`` is the protocol's NAK code."""


class NoTargetError(TrackerDeviceError):
    """No target is locked (none in the beam, or lock never acquired)."""


class BeamBrokenError(TrackerDeviceError):
    """The beam was interrupted during the measurement; the tracker lost the target."""


class NotStableError(TrackerDeviceError):
    """The target (or the instrument itself) was not steady during the averaging window."""


class NoStationaryResultError(NotStableError):
    """A stationary measurement ended without a result while the target stayed locked
    (emScon's ``NoStationaryResult``): the reflector did not stay still long enough.
    A :class:`NotStableError`, so a caller that waits for the arm to settle and asks again
    treats both alike."""


class NotInitializedError(TrackerDeviceError):
    """The instrument is not initialised (or its tracking subsystem is off) and refuses to
    measure: run its initialisation (the emScon backend's ``initialize`` option, GeoCOM's
    ATR switched on) and ask again."""


class NotWarmedUpError(TrackerDeviceError):
    """The tracker has not reached thermal equilibrium; measurements are refused."""


class OutOfRangeError(TrackerDeviceError):
    """The target is outside the tracker's measuring range."""


class ImplausibleMeasurementError(TrackerDeviceError):
    """The instrument answered with a value it cannot physically report (an angle outside
    its circle, a distance beyond its range, an absurd std): the measurement is refused,
    never used. ``code`` is ``IMPLAUSIBLE``; ``field`` names the value."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message, "IMPLAUSIBLE")
        self.field = field


class TrackerBusyError(TrackerDeviceError):
    """A measurement is already in progress."""


class MeasurementAbortedError(TrackerDeviceError):
    """The measurement was aborted by STOP."""


class RequestRejectedError(TrackerDeviceError):
    """The device rejected the request itself (bad request, unknown command, version)."""


class TrackerTimeoutError(DriverTimeoutError):
    """No (complete, valid) answer before the deadline; also a builtin ``TimeoutError``."""


class TrackerGoneError(DeviceGoneError):
    """The port failed or the connection closed; the next call tries to reconnect."""


_NAK_ERRORS: dict[str, type[TrackerDeviceError]] = {
    NakCode.NO_TARGET: NoTargetError,
    NakCode.BEAM_BROKEN: BeamBrokenError,
    NakCode.NOT_STABLE: NotStableError,
    NakCode.NOT_WARMED_UP: NotWarmedUpError,
    NakCode.OUT_OF_RANGE: OutOfRangeError,
    NakCode.BUSY: TrackerBusyError,
    NakCode.ABORTED: MeasurementAbortedError,
    NakCode.BAD_REQUEST: RequestRejectedError,
    NakCode.UNKNOWN_COMMAND: RequestRejectedError,
    NakCode.UNSUPPORTED_VERSION: RequestRejectedError,
}


class _CorruptedExchange(ProtocolError):
    """Our request or its reply was damaged on the wire; the request may be repeated."""


# -- records ---------------------------------------------------------------------------------


def _frozen_array(a: Any) -> np.ndarray:
    out = np.array(a, dtype=float)
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class TrackerInfo:
    """What a tracker says it is (answer to HELLO).

    Attributes
    ----------
    model, serial, firmware : str
        As reported by the device.
    protocol_version : str
        The version both ends agreed on, ``"major.minor"``.
    units : str
        The wire units the device declared (``"MM_DEG"`` in protocol 1.x).
    """

    model: str
    serial: str
    firmware: str
    protocol_version: str
    units: str = codec.UNITS_MM_DEG


@dataclass(frozen=True)
class TrackerStatus:
    """Device status (answer to STAT); ``t_device_s`` is the device clock when sent."""

    flags: StatusFlags
    t_device_s: float

    @property
    def warmed_up(self) -> bool:
        return bool(self.flags & StatusFlags.WARMED_UP)

    @property
    def target_locked(self) -> bool:
        return bool(self.flags & StatusFlags.TARGET_LOCKED)

    @property
    def stable(self) -> bool:
        return bool(self.flags & StatusFlags.STABLE)

    @property
    def measuring(self) -> bool:
        return bool(self.flags & StatusFlags.MEASURING)


@dataclass(frozen=True)
class TrackerMeasurement:
    """One (averaged) tracker measurement of the target, in the cell (tracker) frame.

    Attributes
    ----------
    kind : str
        ``"pose"`` (6-DoF) or ``"point"`` (3-DoF), as passed to ``measure()``.
    cell_T_target : numpy.ndarray, shape (4, 4), or None
        Target pose in the cell frame, metres (``POSE`` only; read-only array).
    cell_p_target : numpy.ndarray, shape (3,)
        Target position in the cell frame, metres (both kinds).
    std_translation_m : numpy.ndarray, shape (3,)
        Standard uncertainty of the averaged position along cell x, y, z, metres.
    std_rotation_rad : numpy.ndarray, shape (3,), or None
        Standard uncertainty of the orientation about the target's own x, y, z axes,
        radians (``POSE`` only).
    t_device_s : float
        Centre of the averaging window on the device clock, seconds.
    t_host_ns : int
        The same instant on the host's ``time.monotonic_ns()``, through the clock model.
    t_host_uncertainty_ns : float
        The clock model's bound on ``t_host_ns``.
    sample_count : int
        Raw samples averaged.
    average_s : float
        Averaging time asked for, seconds.
    flags : MeasurementFlags
        Informational flags from the device.
    """

    kind: str
    cell_T_target: np.ndarray | None
    cell_p_target: np.ndarray
    std_translation_m: np.ndarray
    std_rotation_rad: np.ndarray | None
    t_device_s: float
    t_host_ns: int
    t_host_uncertainty_ns: float
    sample_count: int
    average_s: float
    flags: MeasurementFlags


@dataclass(frozen=True)
class RawMeasurement:
    """What a backend hands the base class: device units already converted to SI."""

    kind: MeasKind
    xyz_m: tuple[float, float, float]
    quat_wxyz: tuple[float, float, float, float] | None
    std_xyz_m: tuple[float, float, float]
    std_rot_rad: tuple[float, float, float] | None
    t_device_s: float
    sample_count: int
    flags: MeasurementFlags


# -- the abstract driver -----------------------------------------------------------------------


class TrackerDriver(DeviceDriver):
    """A laser tracker; backends implement the ``_..._internal`` hooks.

    Constructing a driver does no I/O: :meth:`open` (or entering the context manager)
    connects, identifies the device and synchronises its clock.

    Parameters
    ----------
    timeout_s : float
        Deadline for a short request (HELLO, PING, STAT, STOP) and the margin added to the
        averaging time for MEAS.
    retries : int
        Times a request is repeated after it or its reply was corrupted on the wire.
    clock_sync_count : int
        PING exchanges on open (and after a reconnect or device restart).
    clock_resync_s : float
        A measurement is preceded by one PING when the last one is older than this, so the
        clock model keeps tracking skew.
    auto_reconnect : bool
        After the link dropped, the next call reopens it (once per call).
    """

    #: The measurement kinds this backend's instrument can take (``"pose"``, ``"point"``);
    #: :meth:`measure` refuses any other with a ``ValueError`` before any I/O.
    measure_kinds: ClassVar[frozenset[str]] = frozenset({"pose", "point"})

    def __init__(
        self,
        *,
        timeout_s: float = 1.0,
        retries: int = 2,
        clock_sync_count: int = 8,
        clock_resync_s: float = 5.0,
        auto_reconnect: bool = True,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries!r}")
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.clock_sync_count = max(1, int(clock_sync_count))
        self.clock_resync_s = float(clock_resync_s)
        self.auto_reconnect = bool(auto_reconnect)
        self.clock = ExchangeClockModel()
        self._lock = threading.RLock()
        # Set by close() while another thread holds the link: its request gives up at the
        # backend's next read poll (:meth:`_check_interrupt`) instead of running to its end.
        self._interrupt = threading.Event()
        self._open = False
        self._gone = False
        self._info: TrackerInfo | None = None
        self._last_sync = -math.inf

    # -- construction and lifecycle ------------------------------------------------------------
    @classmethod
    def from_url(cls, url: str, /, **options: Any) -> Self:
        """A driver of this backend for ``url`` (a pyserial URL or device path), not connected.

        Raises
        ------
        ValueError
            An empty URL, or an unknown or malformed option.
        """
        if not isinstance(url, str) or not url:
            raise ValueError(f"tracker URL must be a non-empty string, got {url!r}")
        return cls._from_url_internal(url, options)

    def open(self) -> Self:
        """Connect, identify the device and synchronise its clock (idempotent); returns the
        driver itself.

        Raises
        ------
        DriverInitError
            If the port cannot be opened or the device does not identify itself in time.
        """
        with self._lock:
            if self._open:
                return self
            self._connect(deadline_after(self._open_budget_s()))
            return self

    def close(self) -> None:
        """Close the link (idempotent, never raises for a link already gone).

        A request another thread has in progress (an aborted run's measurement, still
        averaging) is interrupted: it raises :class:`TrackerGoneError` at its next read poll,
        so closing never waits out a long average.
        """
        if not self._lock.acquire(timeout=_CLOSE_WAIT_S):
            self._interrupt.set()
            self._lock.acquire()
        try:
            self._interrupt.clear()
            was_open, self._open, self._gone = self._open, False, False
            if was_open:
                try:
                    self._close_internal()
                except Exception:  # noqa: BLE001 - close must not raise; say what happened
                    log.warning("%s: error while closing", self, exc_info=True)
        finally:
            self._lock.release()

    def _check_interrupt(self) -> None:
        """Raise :class:`TrackerGoneError` when :meth:`close` waits for the link (backends
        call it in their read loops, between polls)."""
        if self._interrupt.is_set():
            raise TrackerGoneError(f"{self}: closed while a request was in progress")

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def info(self) -> TrackerInfo | None:
        """The last :class:`TrackerInfo` the device sent (``None`` before :meth:`open`)."""
        return self._info

    def reconnect(self) -> None:
        """Close and reopen the link, identify and resynchronise the clock."""
        with self._lock:
            self.close()
            self.open()

    # -- public requests ---------------------------------------------------------------------
    def identify(self, *, timeout_s: float | None = None) -> TrackerInfo:
        """Ask the device what it is (HELLO); checks the protocol version and units."""
        with self._lock:
            deadline = self._deadline(timeout_s)
            self._ready(deadline)
            info = self._call(self._identify_internal, deadline)
            self._check_info(info)
            self._info = info
            return info

    def measure(
        self,
        kind: str | MeasKind = "pose",
        average_s: float = 0.0,
        *,
        timeout_s: float | None = None,
    ) -> TrackerMeasurement:
        """Measure the target, averaged over ``average_s`` seconds of device time.

        Parameters
        ----------
        kind : {"pose", "point"}
            6-DoF pose (position and orientation) or 3-DoF point.
        average_s : float
            Averaging time in [0, 60] s; 0 takes one sample.
        timeout_s : float, optional
            Deadline after the averaging time; defaults to the driver's ``timeout_s``.

        Raises
        ------
        ValueError
            For a bad ``kind`` or ``average_s``.
        TrackerDeviceError
            A subclass for each refusal: :class:`NoTargetError`, :class:`BeamBrokenError`,
            :class:`NotStableError`, :class:`NotWarmedUpError`, :class:`OutOfRangeError`,
            :class:`TrackerBusyError`, :class:`MeasurementAbortedError`.
        TrackerTimeoutError
            No valid reply in time (also a ``TimeoutError``).
        TrackerGoneError
            The link dropped (and could not be reopened).
        ProtocolError
            The device sent a reply that parses but is not valid (e.g. quaternion norm).
        """
        kind = _parse_kind(kind)
        if kind.value.lower() not in self.measure_kinds:
            raise ValueError(
                f"{self}: this instrument measures {' and '.join(sorted(self.measure_kinds))} "
                f"only, not {kind.value.lower()!r}"
            )
        average_s = float(average_s)
        if not 0.0 <= average_s <= codec.MAX_AVERAGE_MS / 1000:
            raise ValueError(f"average_s must be in [0, {codec.MAX_AVERAGE_MS / 1000}], got {average_s!r}")
        with self._lock:
            deadline = self._deadline(timeout_s, extra_s=self._measure_budget_s(average_s))
            self._ready(deadline)
            if time.monotonic() - self._last_sync > self.clock_resync_s:
                self._sync(1, deadline)
            raw = self._call(self._measure_internal, kind, round(average_s * 1000), deadline)
            if self.clock.n_samples == 0:
                # The device restarted during the call: map its new epoch before using it.
                self._sync(self.clock_sync_count, self._deadline(None))
            m = self._build_measurement(raw, average_s)
            log.debug(
                "%s: %s n=%d t_dev=%.6f s std=%s m",
                self, kind.value, m.sample_count, m.t_device_s, m.std_translation_m,
            )
            return m

    def status(self, *, timeout_s: float | None = None) -> TrackerStatus:
        """Device status (STAT): warmed up, target locked, stable, measuring."""
        with self._lock:
            deadline = self._deadline(timeout_s)
            self._ready(deadline)
            return self._call(self._status_internal, deadline)

    def stop(self, *, timeout_s: float | None = None) -> None:
        """Abort a measurement in progress (STOP); harmless when idle."""
        with self._lock:
            deadline = self._deadline(timeout_s)
            self._ready(deadline)
            self._call(self._stop_internal, deadline)

    def sync_clock(self, count: int | None = None, *, timeout_s: float | None = None) -> int:
        """Run ``count`` PING exchanges into :attr:`clock`; returns how many succeeded."""
        n = self.clock_sync_count if count is None else int(count)
        with self._lock:
            deadline = self._deadline(timeout_s, extra_s=self.timeout_s * n)
            self._ready(deadline)
            return self._sync(n, deadline)

    # -- backend hooks ---------------------------------------------------------------------------
    # Every ``deadline`` is absolute, ``time.monotonic()`` seconds.
    @classmethod
    def _from_url_internal(cls, url: str, options: Mapping[str, Any]) -> Self:
        """Build the driver for ``url`` with the keyword ``options``; no I/O. Every registered
        backend implements it; a driver built only by its constructor need not."""
        raise NotImplementedError(f"{cls.__name__} cannot be built from a URL")

    @abc.abstractmethod
    def _open_internal(self, deadline: float) -> None:
        """Open the link (raise :class:`DriverInitError` on failure)."""

    @abc.abstractmethod
    def _close_internal(self) -> None:
        """Close the link."""

    @abc.abstractmethod
    def _identify_internal(self, deadline: float) -> TrackerInfo:
        """One HELLO exchange."""

    @abc.abstractmethod
    def _measure_internal(self, kind: MeasKind, average_ms: int, deadline: float) -> RawMeasurement:
        """One MEAS exchange, converted to SI."""

    @abc.abstractmethod
    def _status_internal(self, deadline: float) -> TrackerStatus:
        """One STAT exchange."""

    @abc.abstractmethod
    def _stop_internal(self, deadline: float) -> None:
        """One STOP exchange."""

    @abc.abstractmethod
    def _ping_internal(self, deadline: float) -> tuple[int, float, float, int]:
        """One clock exchange: ``(t1_host_ns, t2_device_s, t3_device_s, t4_host_ns)``."""

    def _device_restarted(self) -> bool:
        """Backends return True once after seeing the device clock jump back."""
        return False

    def _open_budget_s(self) -> float:
        """Seconds :meth:`open` allows for connecting, identifying and the clock sync; a
        backend whose instrument needs longer (an emScon tracker initialising) adds to it."""
        return self.timeout_s * (2 + self.clock_sync_count)

    def _measure_budget_s(self, average_s: float) -> float:
        """Seconds a measurement may take beyond ``timeout_s``: the averaging time, plus
        what a backend's instrument needs on top (a total station's fine adjust and EDM)."""
        return average_s

    def _check_info(self, info: TrackerInfo) -> None:
        """Refuse an identity this backend cannot work with (the cellcal protocol: major
        version and units); a backend for another protocol overrides it."""
        major = info.protocol_version.split(".")[0]
        if major != str(codec.PROTOCOL_VERSION[0]):
            raise RequestRejectedError(
                f"{self}: device speaks protocol {info.protocol_version}, "
                f"this driver {codec.PROTOCOL_VERSION[0]}.x", NakCode.UNSUPPORTED_VERSION.value,
            )
        if info.units != codec.UNITS_MM_DEG:
            raise ProtocolError(f"{self}: device declared units {info.units!r}, expected MM_DEG")

    # -- internals ---------------------------------------------------------------------------
    def _deadline(self, timeout_s: float | None, extra_s: float = 0.0) -> float:
        t = self.timeout_s if timeout_s is None else float(timeout_s)
        if not t > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        return deadline_after(t + extra_s)

    def _connect(self, deadline: float) -> None:
        try:
            self._open_internal(deadline)
        except DriverError:
            raise
        except Exception as exc:  # a backend's own exception type: keep the cause
            raise DriverInitError(f"{self}: cannot open: {exc}") from exc
        self._open, self._gone = True, False
        try:
            self._info = self._with_retries(self._identify_internal, deadline)
            self._check_info(self._info)
            self.clock.reset()
            self._sync(self.clock_sync_count, deadline)
        except DriverError as exc:
            self.close()
            if isinstance(exc, DriverInitError):
                raise
            raise DriverInitError(f"{self}: device did not identify: {exc}") from exc
        log.info(
            "%s: connected to %s %s (firmware %s, protocol %s)",
            self, self._info.model, self._info.serial, self._info.firmware,
            self._info.protocol_version,
        )

    def _ready(self, deadline: float) -> None:
        if self._open and not self._gone:
            return
        if self._gone and self.auto_reconnect:
            log.warning("%s: link was lost; reconnecting", self)
            try:
                self._close_internal()
            except Exception:  # noqa: BLE001 - the link is already broken
                pass
            self._open = False
            try:
                self._connect(deadline)
            except DriverError as exc:
                self._gone, self._open = True, True  # stay "open but gone": retry next call
                raise TrackerGoneError(f"{self}: reconnect failed: {exc}") from exc
            return
        if self._gone:
            raise TrackerGoneError(f"{self}: link lost (auto_reconnect is off; call reconnect())")
        raise DriverError(f"{self}: not open (call open() or use it as a context manager)")

    def _call(self, fn, *args):
        """Run a backend hook with retries; a lost link marks the driver for reconnection."""
        try:
            out = self._with_retries(fn, *args)
        except DeviceGoneError:
            self._gone = True
            raise
        if self._device_restarted():
            log.warning("%s: device clock jumped back (restart?); resynchronising", self)
            self.clock.reset()
            self._last_sync = -math.inf
        return out

    def _with_retries(self, fn, *args):
        for attempt in range(self.retries + 1):
            try:
                return fn(*args)
            except _CorruptedExchange as exc:
                if attempt == self.retries:
                    raise TrackerTimeoutError(
                        f"{self}: no intact reply after {self.retries + 1} attempts ({exc})"
                    ) from exc
                log.warning("%s: corrupted exchange (%s); repeating", self, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def _sync(self, count: int, deadline: float) -> int:
        ok = 0
        for _ in range(count):
            try:
                t1, t2, t3, t4 = self._call(self._ping_internal, deadline)
            except TrackerTimeoutError:
                if ok:
                    break
                raise
            self.clock.add_exchange(t1, t2, t3, t4)
            ok += 1
        self._last_sync = time.monotonic()
        return ok

    def _build_measurement(self, raw: RawMeasurement, average_s: float) -> TrackerMeasurement:
        xyz = np.array(raw.xyz_m, dtype=float)
        std_t = np.array(raw.std_xyz_m, dtype=float)
        if raw.kind is not MeasKind.POSE and raw.kind is not MeasKind.POINT:
            raise ProtocolError(f"{self}: unknown measurement kind {raw.kind!r}")
        if not (np.all(np.isfinite(xyz)) and np.all(np.isfinite(std_t)) and np.all(std_t >= 0)):
            raise ProtocolError(f"{self}: non-finite or negative values in {raw!r}")
        if raw.sample_count < 1:
            raise ProtocolError(f"{self}: sample count {raw.sample_count} < 1")
        cell_T_target = None
        std_r = None
        if raw.kind is MeasKind.POSE:
            if raw.quat_wxyz is None or raw.std_rot_rad is None:
                raise ProtocolError(f"{self}: pose without orientation")
            q = np.array(raw.quat_wxyz, dtype=float)
            norm = float(np.linalg.norm(q))
            if not abs(norm - 1.0) <= _QUAT_NORM_TOL:
                raise ProtocolError(f"{self}: quaternion norm {norm!r} is not 1")
            std_r = np.array(raw.std_rot_rad, dtype=float)
            if not (np.all(np.isfinite(std_r)) and np.all(std_r >= 0)):
                raise ProtocolError(f"{self}: bad rotation std {std_r}")
            cell_T_target = _frozen_array(transform_from_xyz_quat(xyz, q / norm))
            std_r = _frozen_array(std_r)
        return TrackerMeasurement(
            kind=raw.kind.value.lower(),
            cell_T_target=cell_T_target,
            cell_p_target=_frozen_array(xyz),
            std_translation_m=_frozen_array(std_t),
            std_rotation_rad=std_r,
            t_device_s=raw.t_device_s,
            t_host_ns=self.clock.to_host_ns(raw.t_device_s),
            t_host_uncertainty_ns=self.clock.uncertainty_ns,
            sample_count=raw.sample_count,
            average_s=average_s,
            flags=raw.flags,
        )


def _parse_kind(kind: str | MeasKind) -> MeasKind:
    if isinstance(kind, MeasKind):
        return kind
    try:
        return MeasKind(str(kind).upper())
    except ValueError:
        raise ValueError(f"kind must be 'pose' or 'point', got {kind!r}") from None


def close_serial_port(port: Any) -> None:
    """Close a port ``serial.serial_for_url`` opened, without pyserial's 0.3 s sleep."""
    from serial.urlhandler import protocol_socket

    if isinstance(port, protocol_socket.Serial) and port._socket is not None:  # type: ignore[attr-defined]
        # pyserial's socket close() sleeps 0.3 s "in case of quick reconnects", which
        # would eat a reconnecting call's whole deadline; close the socket ourselves
        # (pyserial 3.5 attributes) and let close() find nothing left to do.
        sock, port._socket = port._socket, None  # type: ignore[attr-defined]
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        port.is_open = False
    port.close()


# -- serial backend -----------------------------------------------------------------------------


class SerialTrackerDriver(TrackerDriver):
    """The cellcal tracker protocol over any URL ``serial.serial_for_url`` accepts.

    Parameters
    ----------
    url : str
        ``/dev/ttyUSB0``, ``socket://10.0.0.5:4000``, a pty path, ``spy://...``.
    baudrate : int
        Line speed of a real serial port (8N1, no flow control).
    **options
        Passed to :class:`TrackerDriver`.
    """

    def __init__(self, url: str, *, baudrate: int = DEFAULT_BAUDRATE, **options: Any) -> None:
        super().__init__(**options)
        self.url = str(url)
        self.baudrate = int(baudrate)
        self._port: Any = None
        self._decoder = codec.Decoder(accept=codec.REPLY_TYPES)
        self._seq = 0
        self._last_ts_us: int | None = None
        self._restart_seen = False
        self.corrupt_frames = 0  # frames and garbage runs discarded (diagnostics)

    backend = "serial"

    @classmethod
    def _from_url_internal(cls, url: str, options: Mapping[str, Any]) -> Self:
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"SerialTrackerDriver({self.url!r})"

    # hooks
    def _open_internal(self, deadline: float) -> None:
        import serial  # pyserial, imported here so the module imports without a port

        try:
            port = serial.serial_for_url(
                self.url,
                baudrate=self.baudrate,
                timeout=_READ_POLL_S,
                write_timeout=_WRITE_TIMEOUT_S,
            )
        except (serial.SerialException, OSError, ValueError) as exc:
            raise DriverInitError(f"{self}: cannot open {self.url}: {exc}") from exc
        try:
            # Bytes queued before we opened belong to nobody (a reply to a previous
            # session, line noise): drop them.
            port.reset_input_buffer()
        except (serial.SerialException, OSError):
            pass
        self._port = port
        self._decoder.reset()
        self._last_ts_us = None

    def _close_internal(self) -> None:
        port, self._port = self._port, None
        if port is not None:
            close_serial_port(port)

    def _identify_internal(self, deadline: float) -> TrackerInfo:
        version = "{}.{}".format(*codec.PROTOCOL_VERSION)
        rec, _ = self._transact(codec.Hello(self._next_seq(), version), codec.Ident, deadline)
        return TrackerInfo(rec.model, rec.serial, rec.firmware, rec.version, rec.units)

    def _measure_internal(self, kind: MeasKind, average_ms: int, deadline: float) -> RawMeasurement:
        expect = codec.PoseReply if kind is MeasKind.POSE else codec.PointReply
        rec, _ = self._transact(codec.Meas(self._next_seq(), kind, average_ms), expect, deadline)
        xyz = (rec.x_mm * _MM_TO_M, rec.y_mm * _MM_TO_M, rec.z_mm * _MM_TO_M)
        std = (rec.std_x_mm * _MM_TO_M, rec.std_y_mm * _MM_TO_M, rec.std_z_mm * _MM_TO_M)
        quat = std_rot = None
        if kind is MeasKind.POSE:
            quat = (rec.qw, rec.qx, rec.qy, rec.qz)
            std_rot = (math.radians(rec.std_rx_deg), math.radians(rec.std_ry_deg), math.radians(rec.std_rz_deg))
        return RawMeasurement(
            kind, xyz, quat, std, std_rot, rec.t_us * _US_TO_S, rec.sample_count, rec.flags
        )

    def _status_internal(self, deadline: float) -> TrackerStatus:
        rec, _ = self._transact(codec.Stat(self._next_seq()), codec.Status, deadline)
        return TrackerStatus(rec.flags, rec.ts_us * _US_TO_S)

    def _stop_internal(self, deadline: float) -> None:
        self._transact(codec.Stop(self._next_seq()), codec.Ack, deadline)

    def _ping_internal(self, deadline: float) -> tuple[int, float, float, int]:
        rec, (t1, t4) = self._transact(codec.Ping(self._next_seq()), codec.Pong, deadline)
        return t1, rec.rx_us * _US_TO_S, rec.ts_us * _US_TO_S, t4

    def _device_restarted(self) -> bool:
        seen, self._restart_seen = self._restart_seen, False
        return seen

    # internals
    def _next_seq(self) -> int:
        # 1..SEQ_MAX, wrapping to 1: 0 is what a device uses for "cannot tell".
        self._seq = self._seq % codec.SEQ_MAX + 1
        return self._seq

    def _transact(self, request, expect: type[codec._Record], deadline: float):
        """Send ``request``; return ``(reply, (t_sent_ns, t_received_ns))``.

        Replies to other sequence numbers (late answers to a request that timed out) are
        discarded. A NAK for our number raises its typed error.
        """
        import serial

        port = self._port
        if port is None:
            raise TrackerGoneError(f"{self}: port is closed")
        frame = codec.encode(request)
        seq = request.seq
        try:
            t_sent = t_rx = time.monotonic_ns()
            port.write(frame)
        except serial.SerialTimeoutException as exc:
            raise TrackerTimeoutError(f"{self}: write timed out") from exc
        except (serial.SerialException, OSError) as exc:
            raise TrackerGoneError(f"{self}: write failed: {exc}") from exc
        while True:
            while True:
                try:
                    rec = self._decoder.read()
                except codec.TrackerProtocolError as exc:
                    self._on_bad_frame(exc, seq)
                    continue
                if rec is None:
                    break
                out = self._on_record(rec, request, expect)
                if out is not None:
                    return out, (t_sent, t_rx)
            self._check_interrupt()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TrackerTimeoutError(
                    f"{self}: no {expect.TYPE} for {request.TYPE} seq {seq} in time"
                )
            try:
                waiting = port.in_waiting
                data = port.read(max(1, waiting))
            except (serial.SerialException, OSError) as exc:
                raise TrackerGoneError(f"{self}: read failed: {exc}") from exc
            t_rx = time.monotonic_ns()
            if data:
                self._decoder.feed(data)

    def _on_bad_frame(self, exc: codec.TrackerProtocolError, seq: int) -> None:
        self.corrupt_frames += 1
        if exc.seq is not None and exc.seq == seq:
            # Intact CRC but not something we can use: the device is broken or speaks a
            # dialect; repeating will not help.
            raise ProtocolError(f"{self}: unusable reply to seq {seq}: {exc}") from exc
        if exc.fault in (codec.FrameFault.BAD_CRC, codec.FrameFault.MALFORMED,
                         codec.FrameFault.UNTERMINATED, codec.FrameFault.OVERLONG):
            parts = exc.raw.split(b",", 2)
            if len(parts) > 1 and parts[1] == str(seq).encode():
                raise _CorruptedExchange(f"reply to seq {seq} damaged: {exc}")
        log.debug("%s: discarded bytes: %s", self, exc)

    def _on_record(self, rec, request, expect):
        ts = getattr(rec, "ts_us", None)
        if ts is not None:
            if self._last_ts_us is not None and ts + _DEVICE_RESTART_BACKSTEP_US < self._last_ts_us:
                self._restart_seen = True
            self._last_ts_us = ts
        if isinstance(rec, codec.Nak):
            if rec.seq == request.seq:
                cls = _NAK_ERRORS.get(rec.code, TrackerDeviceError)
                raise cls(f"{self}: {request.TYPE} refused: {rec.code}", rec.code)
            if rec.seq == codec.SEQ_UNKNOWN and rec.code == NakCode.BAD_CRC:
                # The device received a damaged frame: very likely our request.
                raise _CorruptedExchange("device received a damaged request (NAK BAD_CRC)")
            return None
        if rec.seq != request.seq:
            log.debug("%s: discarding stale %s seq %d", self, rec.TYPE, rec.seq)
            return None
        if not isinstance(rec, expect):
            raise ProtocolError(f"{self}: {request.TYPE} answered with {rec.TYPE}")
        return rec


# -- instruments without a device clock ---------------------------------------------------------


class HostClockTrackerDriver(TrackerDriver):
    """Base of backends whose instrument stamps nothing (emScon, GeoCOM): the host clock
    stands in for the device clock.

    A clock exchange is one cheap round trip of the instrument's protocol
    (:meth:`_null_exchange_internal`); it reports the host's own midpoint as the device's
    receive and send times, so the clock model maps host to host with half the round trip
    as its bound, and a measurement's ``t_device_s`` is a host ``time.monotonic()`` estimate
    of the centre of its window. The exchanges also prove the link alive on open.
    """

    #: What :attr:`TrackerInfo.units` must say (the units the backend set on the instrument).
    units: ClassVar[str] = "M_RAD"

    def _ping_internal(self, deadline: float) -> tuple[int, float, float, int]:
        t1 = time.monotonic_ns()
        self._null_exchange_internal(deadline)
        t4 = time.monotonic_ns()
        mid_s = (t1 + t4) / 2 / _NS_PER_S
        return t1, mid_s, mid_s, t4

    def _null_exchange_internal(self, deadline: float) -> None:
        """One request the instrument answers at once (raise on failure)."""
        raise NotImplementedError

    def _check_info(self, info: TrackerInfo) -> None:
        if info.units != self.units:
            raise ProtocolError(f"{self}: instrument reports units {info.units!r}, expected {self.units}")


# -- factory -------------------------------------------------------------------------------------

#: Backend name -> ``"module:Class"``, imported on first use
#: (:func:`cellcal.drivers.base.load_backend`).
BACKENDS: dict[str, str] = {
    "serial": "cellcal.drivers.tracker:SerialTrackerDriver",
    "emscon": "cellcal.drivers.emscon:EmsconTrackerDriver",
    "geocom": "cellcal.drivers.geocom:GeocomTrackerDriver",
}

#: URL schemes that name a protocol, -> backend name (ADR 0008). ``geocom+<transport>://``
#: names the protocol and a pyserial transport (``geocom+socket://host:port``). Any other
#: URL (a device path, ``socket://``, ``spy://``, a pty) is pyserial's and runs the
#: ``backend=`` given, by default the cellcal protocol (``"serial"``).
URL_SCHEMES: dict[str, str] = {"emscon": "emscon", "geocom": "geocom"}


def backend_for_url(url: str) -> str | None:
    """The backend a protocol URL names (``emscon://``, ``geocom://``, ``geocom+socket://``),
    or ``None`` for a pyserial URL or device path."""
    head, sep, _ = str(url).partition("://")
    if not sep or "/" in head:
        return None
    return URL_SCHEMES.get(head.lower().split("+", 1)[0])


def connect_tracker(url: str, *, backend: str | None = None, **options: Any) -> TrackerDriver:
    """A tracker driver for ``url``, not yet connected (no I/O until ``open()``/``with``).

    Parameters
    ----------
    url : str
        A protocol URL -- ``emscon://host[:port]`` (a Leica emScon tracker, TPI over TCP,
        ``docs/protocols/emscon.md``), ``geocom:///dev/ttyUSB0[?baud=9600]`` or
        ``geocom+socket://host:port`` (a Leica GeoCOM total station, ``docs/protocols/geocom.md``)
        -- or, for the cellcal tracker protocol, a serial device path, ``socket://host:port``,
        a pty path or any pyserial URL.
    backend : str, optional
        Name in :data:`BACKENDS`. A protocol URL selects its own; giving another is an error.
        Any other URL defaults to ``"serial"`` (the cellcal protocol).
    **options
        Backend and :class:`TrackerDriver` options (``timeout_s``, ``retries``,
        ``baudrate``, ``clock_sync_count``, ...).

    Raises
    ------
    ValueError
        An unknown backend, a backend that contradicts the URL's scheme, a malformed URL or
        option.

    Examples
    --------
    >>> with connect_tracker("socket://127.0.0.1:4000") as tracker:  # doctest: +SKIP
    ...     m = tracker.measure("pose", average_s=0.5)
    >>> with connect_tracker("emscon://192.0.2.10") as tracker:  # doctest: +SKIP
    ...     m = tracker.measure("point", average_s=0.5)
    """
    named = backend_for_url(url)
    if backend is None:
        backend = named or "serial"
    elif named is not None and backend != named:
        raise ValueError(f"tracker URL {url!r} names the {named!r} backend, not {backend!r}")
    cls: type[TrackerDriver] = load_backend(BACKENDS, backend, "tracker backend")
    return cls.from_url(url, **options)


def connect_configured_tracker(url: str, options: Mapping[str, object]) -> TrackerDriver:
    """:func:`connect_tracker` of a ``[tracker.options]`` table (the daemon's configuration):
    its ``backend`` key is the backend's name, the others are ``**options``.

    Raises
    ------
    ValueError
        As :func:`connect_tracker`; a ``backend`` that is no string is an unknown backend.
    """
    rest = dict(options)
    backend = rest.pop("backend", None)
    return connect_tracker(url, backend=None if backend is None else str(backend), **rest)
