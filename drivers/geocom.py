"""Leica GeoCOM total stations over a serial line: the ``geocom`` tracker backend.

``connect_tracker("geocom:///dev/ttyUSB0?baud=9600")`` (a serial port, 8N1) or
``connect_tracker("geocom+socket://127.0.0.1:5000")`` (any pyserial transport after the
``+``: a serial-to-Ethernet bridge, the simulator's loopback port, ``spy://`` for field
debugging) gives a :class:`GeocomTrackerDriver`, a
:class:`~cellcal.drivers.tracker.TrackerDriver` that takes 3-DoF point measurements of a
prism with the instrument's automatic target recognition (ATR). The lines are
:mod:`cellcal.drivers.geocom_codec`'s; what is sent, when and why is in
``docs/protocols/geocom.md``.

Open: a blank line (clears the instrument's receiver), COM_NullProc, then
AUS_SetUserAtrState(on) unless ``atr=False``. Identify: CSV_GetInstrumentName,
CSV_GetInstrumentNo, CSV_GetSWVersion, COM_GetSWVersion. Measure: AUT_FineAdjust (ATR onto
the prism within the search window), TMC_DoMeasure(default distance), TMC_GetSimpleMea (Hz,
V, slope distance), converted to Cartesian with
:func:`~cellcal.drivers.geocom_codec.cartesian_from_polar` (x east, y north, z up; Hz
clockwise from +y, V from +z). The instrument's frame is the cell frame.

GeoCOM reports no measurement uncertainty with TMC_GetSimpleMea, so the std is the a-priori
one of the options (``angle_std_rad``, ``distance_std_m`` + ``distance_ppm``), propagated
through the polar-to-Cartesian Jacobian. A total station takes one EDM distance per
measurement: ``average_s`` asks the instrument for nothing (it chooses its own EDM time) and
only lengthens the deadline.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Self
from urllib.parse import parse_qsl, urlencode, urlsplit

import numpy as np

from cellcal.drivers import geocom_codec as gc
from cellcal.drivers.base import remaining_s
from cellcal.drivers.errors import DriverInitError, ProtocolError
from cellcal.drivers.geocom_codec import RC, Rpc
from cellcal.drivers.tracker import (
    BeamBrokenError,
    HostClockTrackerDriver,
    ImplausibleMeasurementError,
    MeasKind,
    MeasurementAbortedError,
    MeasurementFlags,
    NoTargetError,
    NotInitializedError,
    NotStableError,
    RawMeasurement,
    RequestRejectedError,
    StatusFlags,
    TrackerBusyError,
    TrackerDeviceError,
    TrackerGoneError,
    TrackerInfo,
    TrackerStatus,
    TrackerTimeoutError,
    _CorruptedExchange,
    close_serial_port,
)

__all__ = ["GeocomTrackerDriver", "rc_error", "serial_url"]

log = logging.getLogger(__name__)

_READ_POLL_S = 0.05
_WRITE_TIMEOUT_S = 2.0
_ARCSEC_RAD = math.pi / (180 * 3600)

#: Return code -> typed error (any other non-OK code: TrackerDeviceError).
_RC_ERRORS: dict[int, type[TrackerDeviceError]] = {
    RC.TMC_ANGLE_OK: BeamBrokenError,  # angles measured, no valid distance
    RC.TMC_ANGLE_NO_FULL_CORRECTION: BeamBrokenError,
    RC.TMC_ANGLE_NO_ACC_GUARANTY: BeamBrokenError,
    RC.TMC_DIST_ERROR: BeamBrokenError,  # the EDM found no prism
    RC.TMC_SIGNAL_ERROR: BeamBrokenError,
    RC.TMC_ANGLE_ERROR: NotStableError,  # angle/inclination error: instrument or prism moving
    RC.TMC_BUSY: TrackerBusyError,
    RC.SYSBUSY: TrackerBusyError,
    RC.ABORT: MeasurementAbortedError,
    RC.AUT_NO_TARGET: NoTargetError,
    RC.AUT_MULTIPLE_TARGETS: NoTargetError,
    RC.AUT_NOT_ENABLED: NotInitializedError,
    RC.NOTINIT: NotInitializedError,
    RC.NOT_IMPL: RequestRejectedError,
    RC.IVPARAM: RequestRejectedError,
    RC.COM_PROC_UNAVAIL: RequestRejectedError,
    RC.COM_CANT_DECODE_REQ: RequestRejectedError,
}
#: Warnings: the values are there and valid, with a caveat (flagged UNCOMPENSATED).
_RC_WARNINGS = frozenset({RC.TMC_NO_FULL_CORRECTION, RC.TMC_ACCURACY_GUARANTEE})


def rc_error(rc: int, what: str) -> TrackerDeviceError:
    """The typed error for GeoCOM return code ``rc`` of ``what``; ``code`` is its name."""
    name = gc.rc_name(rc)
    return _RC_ERRORS.get(rc, TrackerDeviceError)(f"{what} failed: {name} ({rc})", name)


def serial_url(url: str) -> tuple[str, dict[str, Any]]:
    """Split a GeoCOM URL into the pyserial URL and the driver options it carries.

    ``geocom:///dev/ttyUSB0?baud=9600`` -> ``("/dev/ttyUSB0", {"baudrate": 9600})``;
    ``geocom+socket://127.0.0.1:5000`` -> ``("socket://127.0.0.1:5000", {})``. ``baud`` is the
    only option a URL carries; after ``geocom+<transport>://`` any other query item is the
    transport's (pyserial's).

    Raises
    ------
    ValueError
        Not a GeoCOM URL, no device, a bad ``baud``, or an unknown query item of a plain
        ``geocom://`` URL.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    base, _, transport = scheme.partition("+")
    if base != "geocom":
        raise ValueError(f"GeoCOM URL must start with geocom:// or geocom+<transport>://, got {url!r}")
    items = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, Any] = {}
    rest = []
    for key, value in items:
        if key == "baud":
            try:
                options["baudrate"] = int(value)
            except ValueError:
                raise ValueError(f"GeoCOM URL: baud must be an integer, got {value!r}") from None
        else:
            rest.append((key, value))
    if transport:
        query = "?" + urlencode(rest) if rest else ""
        tail = url.split("://", 1)[1].split("?", 1)[0]
        if not tail:
            raise ValueError(f"GeoCOM URL names no {transport} address: {url!r}")
        return f"{transport}://{tail}{query}", options
    if rest:
        raise ValueError(f"GeoCOM URL: unknown option {rest[0][0]!r} (only baud)")
    device = parts.netloc + parts.path if parts.netloc else parts.path
    if not device:
        raise ValueError(f"GeoCOM URL names no serial device: {url!r}")
    return device, options


class GeocomTrackerDriver(HostClockTrackerDriver):
    """A Leica total station over GeoCOM (serial, or any pyserial URL), prism points by ATR.

    Parameters
    ----------
    port_url : str
        What ``serial.serial_for_url`` opens: a device path, ``socket://host:port``, ...
    baudrate : int
        Line speed of a real serial port (8N1; GeoCOM's default 9600).
    atr : bool
        Switch ATR on at open and fine-adjust onto the prism before each measurement
        (``False``: the telescope is aimed by other means and only the distance and angles
        are measured).
    search_hz_rad, search_v_rad : float
        AUT_FineAdjust's search window around the current direction, radians.
    fine_adjust_timeout_s : float
        Added to a measurement's deadline for the fine adjust (a real instrument moves).
    edm_wait_s : float
        TMC_GetSimpleMea's wait for the distance, seconds; also added to the deadline.
    inclination : int
        ``TMC_INCLINE_PRG`` for the measurements (default automatic).
    angle_std_rad, distance_std_m, distance_ppm : float
        The a-priori uncertainty of one measurement (Hz and V; distance as constant plus
        parts per million), propagated to the std of x, y, z.
    checksum : bool
        Send and verify the CRC-16 extension on every line (the instrument must support it).
    **options
        Passed to :class:`~cellcal.drivers.tracker.TrackerDriver`.
    """

    backend = "geocom"
    measure_kinds: ClassVar[frozenset[str]] = frozenset({"point"})

    def __init__(
        self,
        port_url: str,
        *,
        baudrate: int = gc.DEFAULT_BAUDRATE,
        atr: bool = True,
        search_hz_rad: float = 0.0175,
        search_v_rad: float = 0.0175,
        fine_adjust_timeout_s: float = 10.0,
        edm_wait_s: float = 5.0,
        inclination: int = gc.Inclination.AUTO,
        angle_std_rad: float = 1.0 * _ARCSEC_RAD,
        distance_std_m: float = 1e-3,
        distance_ppm: float = 1.5,
        checksum: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        for name, v in (("search_hz_rad", search_hz_rad), ("search_v_rad", search_v_rad),
                        ("fine_adjust_timeout_s", fine_adjust_timeout_s), ("edm_wait_s", edm_wait_s)):
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"geocom: {name} must be > 0, got {v!r}")
        for name, v in (("angle_std_rad", angle_std_rad), ("distance_std_m", distance_std_m),
                        ("distance_ppm", distance_ppm)):
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"geocom: {name} must be >= 0, got {v!r}")
        if int(inclination) not in tuple(gc.Inclination):
            raise ValueError(f"geocom: inclination must be 0, 1 or 2, got {inclination!r}")
        if int(baudrate) <= 0:
            raise ValueError(f"geocom: baudrate must be > 0, got {baudrate!r}")
        self.url = str(port_url)
        self.baudrate = int(baudrate)
        self.atr = bool(atr)
        self.search_rad = (float(search_hz_rad), float(search_v_rad))
        self.fine_adjust_timeout_s = float(fine_adjust_timeout_s)
        self.edm_wait_s = float(edm_wait_s)
        self.inclination = int(inclination)
        self.angle_std_rad = float(angle_std_rad)
        self.distance_std_m = float(distance_std_m)
        self.distance_ppm = float(distance_ppm)
        self.checksum = bool(checksum)
        self._port: Any = None
        self._decoder = gc.Decoder("replies")
        self._trid = 0
        self.discarded = 0  # replies to other transactions, bad lines (diagnostics)

    @classmethod
    def _from_url_internal(cls, url: str, options: Mapping[str, Any]) -> Self:
        port_url, from_url = serial_url(url)
        merged = dict(options)
        for key, value in from_url.items():
            if key in merged and merged[key] != value:
                raise ValueError(f"geocom: {key}={merged[key]!r} contradicts the URL's {value!r}")
            merged[key] = value
        return cls(port_url, **merged)

    def __repr__(self) -> str:
        return f"GeocomTrackerDriver({self.url!r})"

    def _measure_budget_s(self, average_s: float) -> float:
        return average_s + self.edm_wait_s + (self.fine_adjust_timeout_s if self.atr else 0.0)

    # -- hooks ---------------------------------------------------------------------------------
    def _open_internal(self, deadline: float) -> None:
        import serial

        try:
            port = serial.serial_for_url(
                self.url, baudrate=self.baudrate, bytesize=8, parity="N", stopbits=1,
                timeout=_READ_POLL_S, write_timeout=_WRITE_TIMEOUT_S,
            )
        except (serial.SerialException, OSError, ValueError) as exc:
            raise DriverInitError(f"{self}: cannot open {self.url}: {exc}") from exc
        try:
            port.reset_input_buffer()
        except (serial.SerialException, OSError):
            pass
        self._port = port
        self._decoder.reset()
        try:
            self._write(b"\r\n")  # a blank line: the instrument drops any partial request
            self._rpc(Rpc.COM_NULL_PROC, (), deadline)
            if self.atr:
                self._rpc(Rpc.AUS_SET_USER_ATR_STATE, (True,), deadline)
        except TrackerDeviceError as exc:
            self._close_internal()
            hint = " (no ATR? open with atr=False)" if self.atr and exc.code == "NOT_IMPL" else ""
            raise DriverInitError(f"{self}: set-up failed: {exc}{hint}") from exc
        except (TrackerTimeoutError, TrackerGoneError, ProtocolError) as exc:
            self._close_internal()
            raise DriverInitError(f"{self}: set-up failed: {exc}") from exc

    def _close_internal(self) -> None:
        port, self._port = self._port, None
        if port is not None:
            close_serial_port(port)

    def _identify_internal(self, deadline: float) -> TrackerInfo:
        name = gc.parse_string(self._rpc(Rpc.CSV_GET_INSTRUMENT_NAME, (), deadline, n_values=1)[0])
        serial_no = gc.parse_int(self._rpc(Rpc.CSV_GET_INSTRUMENT_NO, (), deadline, n_values=1)[0])
        fw = [gc.parse_int(v) for v in self._rpc(Rpc.CSV_GET_SW_VERSION, (), deadline, n_values=3)]
        gv = [gc.parse_int(v) for v in self._rpc(Rpc.COM_GET_SW_VERSION, (), deadline, n_values=3)]
        return TrackerInfo(
            model=name or "Leica GeoCOM instrument",
            serial=str(serial_no),
            firmware="{}.{}.{}".format(*fw),
            protocol_version="GeoCOM {}.{}.{}".format(*gv),
            units=self.units,
        )

    def _null_exchange_internal(self, deadline: float) -> None:
        self._rpc(Rpc.COM_NULL_PROC, (), deadline)

    def _status_internal(self, deadline: float) -> TrackerStatus:
        self._rpc(Rpc.COM_NULL_PROC, (), deadline)
        # GeoCOM has no warm-up state and cellcal queries no lock state: an answering
        # instrument is reported warmed up, nothing else.
        return TrackerStatus(StatusFlags.WARMED_UP, time.monotonic())

    def _stop_internal(self, deadline: float) -> None:
        self._rpc(Rpc.TMC_DO_MEASURE, (gc.MeasureProgram.STOP, self.inclination), deadline)

    def _measure_internal(self, kind: MeasKind, average_ms: int, deadline: float) -> RawMeasurement:
        if kind is not MeasKind.POINT:  # pragma: no cover - measure() refuses it first
            raise ValueError(f"{self}: point measurements only")
        if self.atr:
            self._rpc(Rpc.AUT_FINE_ADJUST, (self.search_rad[0], self.search_rad[1], 0), deadline)
        t0 = time.monotonic()
        self._rpc(Rpc.TMC_DO_MEASURE, (gc.MeasureProgram.DEF_DIST, self.inclination), deadline)
        values, rc = self._rpc(Rpc.TMC_GET_SIMPLE_MEA, (round(self.edm_wait_s * 1000), self.inclination),
                               deadline, n_values=3, with_rc=True)
        t1 = time.monotonic()
        try:
            hz, v, d = (gc.parse_double(x) for x in values)
        except ValueError as exc:
            raise ProtocolError(f"{self}: TMC_GetSimpleMea values {values}: {exc}") from exc
        if not d > 0:
            raise BeamBrokenError(f"{self}: TMC_GetSimpleMea returned no distance ({d} m)", "NO_DISTANCE")
        problem = gc.simple_measurement_problem(hz, v, d)
        if problem is not None:
            raise ImplausibleMeasurementError(f"{self}: TMC_GetSimpleMea answer refused: {problem[1]}", problem[0])
        xyz = gc.cartesian_from_polar(hz, v, d)
        J = gc.polar_jacobian(hz, v, d)
        sd = self.distance_std_m + self.distance_ppm * 1e-6 * d
        cov = J @ np.diag([self.angle_std_rad**2, self.angle_std_rad**2, sd**2]) @ J.T
        std = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        flags = MeasurementFlags.UNCOMPENSATED if rc in _RC_WARNINGS else MeasurementFlags.NONE
        return RawMeasurement(
            MeasKind.POINT,
            (float(xyz[0]), float(xyz[1]), float(xyz[2])),
            None,
            (float(std[0]), float(std[1]), float(std[2])),
            None,
            (t0 + t1) / 2,  # the EDM ran between the two calls
            1,  # one EDM distance
            flags,
        )

    # -- internals -----------------------------------------------------------------------------
    def _next_trid(self) -> int:
        self._trid = self._trid % gc.MAX_TRID + 1
        return self._trid

    def _write(self, data: bytes) -> None:
        import serial

        port = self._port
        if port is None:
            raise TrackerGoneError(f"{self}: port is closed")
        try:
            port.write(data)
        except serial.SerialTimeoutException as exc:
            raise TrackerTimeoutError(f"{self}: write timed out") from exc
        except (serial.SerialException, OSError) as exc:
            raise TrackerGoneError(f"{self}: write failed: {exc}") from exc

    def _rpc(self, rpc: int, params: tuple, deadline: float, *, n_values: int = 0, with_rc: bool = False) -> Any:
        """Call ``rpc``; return its ``n_values`` value tokens (and the rc when ``with_rc``).

        A reply to another transaction id is a late one (to a call that timed out) and is
        dropped. A line that is no reply at all (garbled on the line: noise before it, a
        damaged byte) while the reply is awaited is taken for the damaged reply and the call
        is repeated at once, as for a bad checksum: waiting out the deadline would gain
        nothing, and the repeat has a new transaction id, so a late intact reply to this one
        is dropped. A non-OK return code raises its typed error; a warning code is returned
        with the values when ``with_rc``.
        """
        import serial

        name = Rpc(rpc).name if rpc in Rpc._value2member_map_ else str(rpc)
        trid = self._next_trid()
        self._write(gc.encode(gc.Request.of(rpc, *params, trid=trid, crc=self.checksum)))
        while True:
            while True:
                try:
                    item = self._decoder.read()  # one at a time: what follows stays queued
                except gc.GeocomProtocolError as exc:
                    self.discarded += 1
                    if exc.fault is not gc.LineFault.BAD_CRC or exc.trid in (trid, None):
                        raise _CorruptedExchange(f"reply to {name} damaged: {exc}") from exc
                    log.debug("%s: discarded a damaged reply to transaction %s: %s", self, exc.trid, exc)
                    continue
                if item is None:
                    break
                assert isinstance(item, gc.Reply)
                if item.trid is not None and item.trid != trid:
                    self.discarded += 1
                    log.debug("%s: discarding a reply to transaction %s", self, item.trid)
                    continue
                return self._check_reply(item, name, n_values, with_rc)
            self._check_interrupt()
            if remaining_s(deadline) <= 0:
                raise TrackerTimeoutError(f"{self}: no reply to {name} in time")
            try:
                data = self._port.read(max(1, self._port.in_waiting))
            except (serial.SerialException, OSError, AttributeError) as exc:
                raise TrackerGoneError(f"{self}: read failed: {exc}") from exc
            if data:
                self._decoder.feed(data)

    def _check_reply(self, rep: gc.Reply, name: str, n_values: int, with_rc: bool) -> Any:
        if rep.com_rc == RC.COM_SRVR_RX_CHECKSUM_ERROR:
            raise _CorruptedExchange(f"the instrument received {name} damaged")
        if rep.com_rc != RC.OK:
            raise rc_error(rep.com_rc, f"{self}: {name} (communication)")
        if rep.rc != RC.OK and not (with_rc and rep.rc in _RC_WARNINGS):
            raise rc_error(rep.rc, f"{self}: {name}")
        if self.checksum and not rep.crc:
            raise ProtocolError(f"{self}: {name} answered without the checksum asked for")
        if len(rep.values) != n_values:
            raise ProtocolError(f"{self}: {name} answered {len(rep.values)} value(s), expected {n_values}")
        return (rep.values, rep.rc) if with_rc else rep.values
