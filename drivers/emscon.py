"""Leica emScon laser trackers over TPI (TCP): the ``emscon`` tracker backend.

``connect_tracker("emscon://192.0.2.10")`` (port 700 unless the URL names another) gives an
:class:`EmsconTrackerDriver`, a :class:`~cellcal.drivers.tracker.TrackerDriver` that takes
3-DoF point measurements in stationary mode. The packets are
:mod:`cellcal.drivers.emscon_codec`'s; what is sent, when and why is in
``docs/protocols/emscon.md``.

Open: GetSystemStatus; Initialize when the tracker is not initialised yet (``initialize``
option); SetUnits (metre, radian, Celsius, mbar, relative humidity); SetCoordinateSystemType
(right-handed rectangular); SetMeasurementMode (stationary). Measure: SetStationaryModeParams
when the averaging time differs from the one last set, then StartMeasurement; the answer, then
a single-measurement result (type 2, or 9 with covariances) or an error packet. The tracker's
own frame is the cell frame, as for every tracker backend.

TPI carries no sequence numbers: an answer is matched to its command by command id, one
command at a time. A command that times out leaves answers in flight that could be taken for
the next command's, so the driver drops the connection and the next call reconnects (the
tracker keeps its initialisation, so a reconnect costs a few round trips).
"""

from __future__ import annotations

import logging
import select
import socket
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from cellcal.drivers import emscon_codec as tpi
from cellcal.drivers.base import remaining_s
from cellcal.drivers.emscon_codec import Command, Status, StatusChange
from cellcal.drivers.errors import DriverInitError, ProtocolError
from cellcal.drivers.tracker import (
    BeamBrokenError,
    HostClockTrackerDriver,
    ImplausibleMeasurementError,
    MeasKind,
    MeasurementFlags,
    NoStationaryResultError,
    NoTargetError,
    NotInitializedError,
    NotStableError,
    NotWarmedUpError,
    RawMeasurement,
    RequestRejectedError,
    StatusFlags,
    TrackerBusyError,
    TrackerDeviceError,
    TrackerGoneError,
    TrackerInfo,
    TrackerStatus,
    TrackerTimeoutError,
)

__all__ = ["EmsconTrackerDriver", "status_error"]

log = logging.getLogger(__name__)

_READ_CHUNK = 65536
#: A wait for a reply polls this often for close() from another thread (_check_interrupt).
_POLL_S = 0.05
#: What a real tracker may take to initialise (it moves the head and checks its sensors).
DEFAULT_INITIALIZE_TIMEOUT_S = 120.0
_INITIALIZE_MODES = ("auto", "always", "never")

#: emScon status -> the typed error it raises (any other non-OK status: TrackerDeviceError).
_STATUS_ERRORS: dict[int, type[TrackerDeviceError]] = {
    Status.SERVER_BUSY: TrackerBusyError,
    Status.TRACKER_NOT_INITIALIZED: NotInitializedError,
    Status.MEASUREMENT_STATUS_NOT_READY: NoTargetError,
    Status.NO_STATIONARY_RESULT: NoStationaryResultError,
    Status.SENSOR_NOT_WARMED_UP: NotWarmedUpError,
    Status.SENSOR_NOT_STABLE: NotStableError,
    Status.NOT_IMPLEMENTED: RequestRejectedError,
    Status.INVALID_INPUT_DATA: RequestRejectedError,
    **{s: RequestRejectedError for s in range(Status.WRONG_PARAMETER, Status.WRONG_PARAMETER_7 + 1)},
    **{s: RequestRejectedError for s in range(12, 23, 2)},  # parameter n out of range, refused
}


def status_error(status: int, what: str, *, lock_lost: bool = False) -> TrackerDeviceError:
    """The typed error for a non-OK emScon ``status`` of ``what`` (a command or a result).

    ``NoStationaryResult`` after the tracker reported losing the reflector
    (``MeasStatus_NotReady`` during the measurement) is a :class:`BeamBrokenError`; without
    that it is a :class:`NoStationaryResultError` (the reflector was locked but not still).
    ``code`` is the :class:`~cellcal.drivers.emscon_codec.Status` name (``"STATUS_<n>"`` for
    a number cellcal does not name).
    """
    name = tpi.status_name(status)
    if status == Status.NO_STATIONARY_RESULT and lock_lost:
        return BeamBrokenError(f"{what}: the tracker lost the reflector during the measurement ({name})", name)
    cls = _STATUS_ERRORS.get(status, TrackerDeviceError)
    return cls(f"{what} failed: {name} ({status})", name)


class EmsconTrackerDriver(HostClockTrackerDriver):
    """A Leica emScon tracker (TPI over TCP), point measurements in stationary mode.

    Parameters
    ----------
    host : str
        The emScon server's address.
    port : int
        Its TCP port (700 on a real tracker).
    initialize : {"auto", "always", "never"}
        Run Initialize on open when the tracker is not initialised (``"auto"``), on every
        open, or never (a measurement on an uninitialised tracker then raises
        :class:`~cellcal.drivers.tracker.NotInitializedError`).
    initialize_timeout_s : float
        Added to the open deadline when Initialize may run: a real tracker takes tens of
        seconds.
    use_adm : bool
        ``bUseADM`` of the stationary mode (measure the distance with the absolute distance
        meter; trackers with an ADM only ignore it).
    **options
        Passed to :class:`~cellcal.drivers.tracker.TrackerDriver` (``timeout_s`` is the
        deadline of each command and the margin added to the averaging time).
    """

    backend = "emscon"
    measure_kinds: ClassVar[frozenset[str]] = frozenset({"point"})

    def __init__(
        self,
        host: str,
        port: int = tpi.DEFAULT_PORT,
        *,
        initialize: str = "auto",
        initialize_timeout_s: float = DEFAULT_INITIALIZE_TIMEOUT_S,
        use_adm: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        if not host:
            raise ValueError("emscon: host must not be empty")
        if not 0 < int(port) < 65536:
            raise ValueError(f"emscon: port must be in 1..65535, got {port!r}")
        if initialize not in _INITIALIZE_MODES:
            raise ValueError(f"emscon: initialize must be one of {_INITIALIZE_MODES}, got {initialize!r}")
        if not initialize_timeout_s > 0:
            raise ValueError(f"emscon: initialize_timeout_s must be > 0, got {initialize_timeout_s!r}")
        self.host = str(host)
        self.port = int(port)
        self.initialize = initialize
        self.initialize_timeout_s = float(initialize_timeout_s)
        self.use_adm = bool(use_adm)
        self._sock: socket.socket | None = None
        self._decoder = tpi.Decoder("answers")
        self._meas_time_ms: int | None = None  # stationary measuring time last set
        self._lock_lost = False  # MeasStatus_NotReady seen since the measurement started
        self.discarded = 0  # packets read but not asked for (events, stale answers; diagnostics)

    @classmethod
    def _from_url_internal(cls, url: str, options: Mapping[str, Any]) -> Self:
        parts = urlsplit(url)
        if parts.scheme.lower() != "emscon":
            raise ValueError(f"emscon URL must start with emscon://, got {url!r}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"emscon URL takes only a host and a port: emscon://host[:port], got {url!r}")
        try:
            port = parts.port or tpi.DEFAULT_PORT
        except ValueError:
            raise ValueError(f"emscon URL has a bad port: {url!r}") from None
        if not parts.hostname:
            raise ValueError(f"emscon URL has no host: {url!r}")
        return cls(parts.hostname, port, **options)

    def __repr__(self) -> str:
        return f"EmsconTrackerDriver('emscon://{self.host}:{self.port}')"

    def _open_budget_s(self) -> float:
        extra = self.initialize_timeout_s if self.initialize != "never" else 0.0
        return super()._open_budget_s() + extra

    # -- hooks ---------------------------------------------------------------------------------
    def _open_internal(self, deadline: float) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=max(0.01, remaining_s(deadline)))
        except OSError as exc:
            raise DriverInitError(f"{self}: cannot connect: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout_s)  # bounds a send; reads wait in select() first
        self._sock = sock
        self._decoder.reset()
        self._meas_time_ms = None
        self._lock_lost = False
        try:
            status = self._command(tpi.SimpleCommand(Command.GET_SYSTEM_STATUS), tpi.SystemStatusReply, deadline)
            initialized = status.tracker_processor_status == tpi.TrackerProcessorStatus.INITIALIZED
            if self.initialize == "always" or (self.initialize == "auto" and not initialized):
                log.info("%s: initialising the tracker", self)
                self._command(tpi.SimpleCommand(Command.INITIALIZE), tpi.Reply, deadline)
            self._command(tpi.SetUnits(tpi.LengthUnit.METER, tpi.AngleUnit.RADIAN, tpi.TemperatureUnit.CELSIUS,
                                       tpi.PressureUnit.MBAR, tpi.HumidityUnit.RELATIVE_HUMIDITY), tpi.Reply, deadline)
            self._command(tpi.SetCoordinateSystemType(tpi.CoordinateSystem.RHR), tpi.Reply, deadline)
            self._command(tpi.SetMeasurementMode(tpi.MeasMode.STATIONARY), tpi.Reply, deadline)
        except (TrackerDeviceError, TrackerTimeoutError, TrackerGoneError, ProtocolError) as exc:
            self._close_internal()
            raise DriverInitError(f"{self}: set-up failed: {exc}") from exc

    def _close_internal(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _identify_internal(self, deadline: float) -> TrackerInfo:
        st = self._command(tpi.SimpleCommand(Command.GET_SYSTEM_STATUS), tpi.SystemStatusReply, deadline)
        return TrackerInfo(
            model="Leica emScon tracker",
            serial=str(st.tracker_serial),
            firmware=f"emScon {st.es_major}.{st.es_minor}.{st.es_build}",
            protocol_version=f"TPI {st.es_major}.{st.es_minor}",
            units=self.units,
        )

    def _null_exchange_internal(self, deadline: float) -> None:
        self._command(tpi.SimpleCommand(Command.GET_TRACKER_STATUS), tpi.TrackerStatusReply, deadline)

    def _status_internal(self, deadline: float) -> TrackerStatus:
        sysst = self._command(tpi.SimpleCommand(Command.GET_SYSTEM_STATUS), tpi.SystemStatusReply, deadline)
        trk = self._command(tpi.SimpleCommand(Command.GET_TRACKER_STATUS), tpi.TrackerStatusReply, deadline)
        info = self._command(tpi.SimpleCommand(Command.GET_MEASUREMENT_STATUS_INFO),
                             tpi.MeasurementStatusInfoReply, deadline)
        flags = StatusFlags.NONE
        if sysst.laser_status == tpi.LaserStatus.LASER_READY:
            flags |= StatusFlags.WARMED_UP
        if info.info & tpi.MeasurementStatusInfo.REFLECTOR_FOUND:
            flags |= StatusFlags.TARGET_LOCKED
        if trk.tracker_status == tpi.TrackerState.BUSY:
            flags |= StatusFlags.MEASURING
        # TPI reports no target stability: STABLE is never set.
        return TrackerStatus(flags, time.monotonic())

    def _stop_internal(self, deadline: float) -> None:
        self._command(tpi.SimpleCommand(Command.STOP_MEASUREMENT), tpi.Reply, deadline)

    def _measure_internal(self, kind: MeasKind, average_ms: int, deadline: float) -> RawMeasurement:
        if kind is not MeasKind.POINT:  # pragma: no cover - measure() refuses it first
            raise ValueError(f"{self}: point measurements only")
        if average_ms != self._meas_time_ms:
            self._command(tpi.SetStationaryModeParams(average_ms, int(self.use_adm)), tpi.Reply, deadline)
            self._meas_time_ms = average_ms
        self._lock_lost = False
        start = tpi.SimpleCommand(Command.START_MEASUREMENT)
        self._command(start, tpi.Reply, deadline)
        try:
            rec = self._wait(lambda r: self._measurement_outcome(r), deadline, "StartMeasurement result")
        except TrackerTimeoutError:
            self._send_quietly(tpi.SimpleCommand(Command.STOP_MEASUREMENT))
            raise
        t_rx = time.monotonic()
        if not tpi.is_ok(rec.status):
            raise status_error(rec.status, f"{self}: measurement", lock_lost=self._lock_lost)
        if rec.meas_mode != tpi.MeasMode.STATIONARY:
            raise ProtocolError(f"{self}: result in measurement mode {rec.meas_mode}, expected stationary")
        problem = tpi.result_problem(rec)
        if problem is not None:
            raise ImplausibleMeasurementError(f"{self}: measurement result refused: {problem[1]}", problem[0])
        return RawMeasurement(
            MeasKind.POINT,
            (rec.x, rec.y, rec.z),
            None,
            (rec.std_x, rec.std_y, rec.std_z),
            None,
            t_rx - average_ms / 2000.0,  # the window ended as the result left; its centre
            1,  # TPI does not report how many samples the tracker averaged
            MeasurementFlags.NONE,
        )

    # -- internals -----------------------------------------------------------------------------
    def _measurement_outcome(self, rec: tpi.Packet) -> tpi.SingleMeasResult | tpi.SingleMeasResult2 | None:
        if isinstance(rec, (tpi.SingleMeasResult, tpi.SingleMeasResult2)):
            return rec
        if isinstance(rec, tpi.ErrorPacket) and rec.command in (Command.START_MEASUREMENT, Command.STOP_MEASUREMENT):
            raise status_error(rec.status, f"{self}: measurement", lock_lost=self._lock_lost)
        return None

    def _command(self, request: tpi.Packet, expect: type, deadline: float) -> Any:
        """Send ``request``; return its answer (an ``expect``) or raise its typed error."""
        command = request.COMMAND if request.COMMAND is not None else request.command  # type: ignore[union-attr]
        name = tpi.Command(command).name if command in tpi.Command._value2member_map_ else str(command)

        def match(rec: tpi.Packet) -> Any:
            if isinstance(rec, tpi.ErrorPacket) and rec.command == command:
                raise status_error(rec.status, f"{self}: {name}")
            if rec.TYPE != tpi.DataType.COMMAND:
                return None
            got = rec.COMMAND if rec.COMMAND is not None else rec.command  # type: ignore[union-attr]
            if got != command:
                return None
            if isinstance(rec, tpi.Reply) and not tpi.is_ok(rec.status):
                raise status_error(rec.status, f"{self}: {name}")
            if not isinstance(rec, expect):
                raise ProtocolError(f"{self}: {name} answered with {type(rec).__name__}")
            if not tpi.is_ok(rec.status):  # type: ignore[union-attr]
                raise status_error(rec.status, f"{self}: {name}")  # type: ignore[union-attr]
            return rec

        self._send(request)
        return self._wait(match, deadline, name)

    def _send(self, request: tpi.Packet) -> None:
        sock = self._sock
        if sock is None:
            raise TrackerGoneError(f"{self}: not connected")
        try:
            sock.sendall(tpi.encode(request))
        except TimeoutError as exc:
            raise TrackerTimeoutError(f"{self}: send timed out") from exc
        except OSError as exc:
            raise TrackerGoneError(f"{self}: send failed: {exc}") from exc

    def _send_quietly(self, request: tpi.Packet) -> None:
        try:
            self._send(request)
        except (TrackerGoneError, TrackerTimeoutError):
            pass

    def _wait(self, match, deadline: float, what: str) -> Any:
        """Read until ``match(record)`` returns something (or raises); events are noted."""
        sock = self._sock
        if sock is None:
            raise TrackerGoneError(f"{self}: not connected")
        while True:
            while True:
                try:
                    item = self._decoder.read()  # one at a time: what follows stays queued
                except tpi.TpiProtocolError as exc:
                    log.warning("%s: %s", self, exc)
                    continue
                if item is None:
                    break
                if isinstance(item, tpi.SystemStatusChange):
                    self._on_event(item.change)
                    continue
                out = match(item)
                if out is not None:
                    return out
                self.discarded += 1
                log.debug("%s: discarded %s while waiting for %s", self, item, what)
            self._check_interrupt()
            left = remaining_s(deadline)
            if left <= 0:
                # no sequence numbers: a late answer would be taken for the next command's
                self._close_internal()
                if self._open:
                    self._gone = True  # the next call reconnects (auto_reconnect)
                raise TrackerTimeoutError(f"{self}: no {what} in time")
            try:
                readable, _, _ = select.select([sock], [], [], min(left, _POLL_S))
                if not readable:
                    continue
                data = sock.recv(_READ_CHUNK)
            except OSError as exc:
                raise TrackerGoneError(f"{self}: read failed: {exc}") from exc
            if not data:
                raise TrackerGoneError(f"{self}: the tracker closed the connection")
            self._decoder.feed(data)

    def _on_event(self, change: int) -> None:
        if change == StatusChange.MEAS_STATUS_NOT_READY:
            self._lock_lost = True
        log.debug("%s: system status change %s", self, change)
