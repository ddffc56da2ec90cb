"""A simulated Leica emScon laser tracker: TPI on a loopback TCP port.

Two layers, as for the cellcal tracker:

* :class:`EmsconDevice` -- the tracker's behaviour with no I/O: it takes decoded command
  packets and returns answers, events and results. What it measures and when it refuses are
  the shared :class:`~cellcal.sim.instrument.InstrumentModel`'s (the same world, noise and
  fault schedule as every simulated instrument); the device maps them to TPI statuses.
* :class:`SimEmscon` -- serves a device on ``emscon://127.0.0.1:PORT`` (a
  :class:`~cellcal.sim.link.LinkServer`, TCP only).

The subset served, the statuses and events sent and what is refused are in
``docs/protocols/emscon.md``. Every packet goes out in one write: cesapi reads a packet's
header, sleeps, then reads the rest in one ``recv`` sized from the header, so a packet split
over two segments would make it read into the next one.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cellcal.drivers import emscon_codec as tpi
from cellcal.drivers.emscon_codec import Command, Status, StatusChange
from cellcal.drivers.tracker_codec import NakCode
from cellcal.sim.instrument import InstrumentModel
from cellcal.sim.link import LinkServer, Transport
from cellcal.sim.scenario import FaultKind, TrackerConfig
from cellcal.sim.world import World

__all__ = ["EmsconDevice", "SimEmscon", "LENGTH_PER_M", "MAX_MEAS_TIME_MS"]

#: Longest stationary measuring time the simulated tracker accepts.
MAX_MEAS_TIME_MS = 60_000
#: Units per metre for each ``ES_LengthUnit``.
LENGTH_PER_M = {
    tpi.LengthUnit.METER: 1.0,
    tpi.LengthUnit.MILLIMETER: 1e3,
    tpi.LengthUnit.MICRON: 1e6,
    tpi.LengthUnit.FOOT: 1 / 0.3048,
    tpi.LengthUnit.YARD: 1 / 0.9144,
    tpi.LengthUnit.INCH: 1 / 0.0254,
}
#: Units per mbar for each ``ES_PressureUnit``.
_PRESSURE_PER_MBAR = {
    tpi.PressureUnit.MBAR: 1.0,
    tpi.PressureUnit.HPASCAL: 1.0,
    tpi.PressureUnit.KPASCAL: 0.1,
    tpi.PressureUnit.MM_HG: 0.750062,
    tpi.PressureUnit.PSI: 0.0145038,
    tpi.PressureUnit.IN_H2O: 0.401463,
    tpi.PressureUnit.IN_HG: 0.0295300,
}
#: The air the simulated tracker reports (it compensates nothing: the world has no air).
AIR_TEMPERATURE_C = 20.0
AIR_PRESSURE_MBAR = 1013.25
AIR_HUMIDITY_RH = 50.0
#: Refusals at StartMeasurement -> TPI status (a target not steady fails the window instead).
_START_REFUSALS = {
    NakCode.NOT_WARMED_UP: Status.SENSOR_NOT_WARMED_UP,
    NakCode.BEAM_BROKEN: Status.MEASUREMENT_STATUS_NOT_READY,
    NakCode.NO_TARGET: Status.MEASUREMENT_STATUS_NOT_READY,
    NakCode.OUT_OF_RANGE: Status.MEASUREMENT_STATUS_NOT_READY,
}
_SET_EVENTS: dict[int, int] = {
    Command.SET_UNITS: StatusChange.UNITS_CHANGED,
    Command.SET_COORDINATE_SYSTEM_TYPE: StatusChange.COORDINATE_SYSTEM_TYPE_CHANGED,
    Command.SET_MEASUREMENT_MODE: StatusChange.MEASUREMENT_MODE_CHANGED,
    Command.SET_STATIONARY_MODE_PARAMS: StatusChange.STATIONARY_MODE_PARAMS_CHANGED,
    Command.SET_STATISTIC_MODE: StatusChange.STATISTIC_MODE_CHANGED,
}


def _version(text: str) -> tuple[int, int, int]:
    nums = [int(x) for x in re.findall(r"\d+", text)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


def _serial_number(text: str) -> int:
    digits = "".join(re.findall(r"\d", text))
    return int(digits[-9:]) if digits else 0


@dataclass
class _Window:
    end_wall_s: float
    start_sim_s: float
    n: int
    unstable: bool


class EmsconDevice:
    """TPI behaviour of a simulated tracker, without I/O.

    Parameters
    ----------
    world : World
    config : TrackerConfig
        Noise, limits, identity (``serial`` digits become the serial number, ``firmware`` the
        emScon version), warm-up and faults.
    seed : int
        Seeds the noise.
    clock : callable returning seconds
        Wall clock the measuring time runs on.

    Notes
    -----
    The tracker's state (initialised, units, modes) belongs to the tracker, not to the
    connection: it survives a reconnect, as the emScon server's does. A measurement in
    progress dies with the connection.
    """

    def __init__(
        self,
        world: World,
        config: TrackerConfig,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.world = world
        self.config = config
        self.model = InstrumentModel(world, config, seed=seed)
        self._clock = clock
        self._rate = 1.0 + config.clock_skew_ppm * 1e-6
        self.initialized = False
        self.units = (tpi.LengthUnit.METER, tpi.AngleUnit.RADIAN, tpi.TemperatureUnit.CELSIUS,
                      tpi.PressureUnit.MBAR, tpi.HumidityUnit.RELATIVE_HUMIDITY)
        self.coordinate_system = tpi.CoordinateSystem.RHR
        self.meas_mode = tpi.MeasMode.STATIONARY
        self.meas_time_ms = 1000
        self.use_adm = 0
        self.statistic = (tpi.StatisticMode.STANDARD, tpi.StatisticMode.STANDARD)  # stationary, continuous
        self.last_result_status: int = Status.ALL_OK
        self.es_version = _version(config.firmware)
        self.serial = _serial_number(config.serial)
        self._meas: _Window | None = None
        self._locked_reported: bool | None = None

    # -- session -----------------------------------------------------------------------------
    def on_disconnect(self) -> None:
        """The client went away: the measurement in progress dies with the connection."""
        self._meas = None

    @property
    def measuring(self) -> bool:
        return self._meas is not None

    # -- requests ----------------------------------------------------------------------------
    def handle(self, item: tpi.Packet | tpi.TpiProtocolError) -> list[tpi.Packet]:
        """Answers (and events) to one decoded command packet or rejected packet."""
        if isinstance(item, tpi.TpiProtocolError):
            if item.command is not None and item.fault is not tpi.PacketFault.GARBAGE:
                refused = Status.NOT_IMPLEMENTED if item.fault is tpi.PacketFault.UNSUPPORTED else Status.WRONG_PARAMETER
                return [tpi.Reply(item.command, refused)]
            return []  # nothing to answer: no command id
        if isinstance(item, tpi.SimpleCommand):
            return self._simple(item.command)
        status = self._set(item)
        cmd = item.COMMAND
        assert cmd is not None
        out: list[tpi.Packet] = [tpi.Reply(cmd, status)]
        if tpi.is_ok(status):
            out.append(tpi.SystemStatusChange(_SET_EVENTS[cmd]))
        return out

    def _set(self, item: Any) -> int:
        if self._meas is not None:
            return Status.SERVER_BUSY
        if isinstance(item, tpi.SetUnits):
            enums = (tpi.LengthUnit, tpi.AngleUnit, tpi.TemperatureUnit, tpi.PressureUnit, tpi.HumidityUnit)
            values = (item.length_unit, item.angle_unit, item.temperature_unit, item.pressure_unit, item.humidity_unit)
            for i, (cls, v) in enumerate(zip(enums, values, strict=True)):
                if v not in cls._value2member_map_:
                    return Status.WRONG_PARAMETER_1 + i
            self.units = tuple(cls(v) for cls, v in zip(enums, values, strict=True))  # type: ignore[assignment]
            return Status.ALL_OK
        if isinstance(item, tpi.SetCoordinateSystemType):
            if item.coordinate_system not in tpi.CoordinateSystem._value2member_map_:
                return Status.WRONG_PARAMETER_1
            if item.coordinate_system != tpi.CoordinateSystem.RHR:
                return Status.NOT_IMPLEMENTED  # the simulator serves rectangular right-handed only
            self.coordinate_system = tpi.CoordinateSystem.RHR
            return Status.ALL_OK
        if isinstance(item, tpi.SetMeasurementMode):
            if item.meas_mode != tpi.MeasMode.STATIONARY:
                return Status.NOT_IMPLEMENTED if item.meas_mode <= 23 else Status.WRONG_PARAMETER_1
            self.meas_mode = tpi.MeasMode.STATIONARY
            return Status.ALL_OK
        if isinstance(item, tpi.SetStationaryModeParams):
            if not 0 <= item.meas_time_ms <= MAX_MEAS_TIME_MS:
                return Status.PARAMETER_1_OUT_OF_RANGE_NOK
            if item.use_adm not in (0, 1):
                return Status.WRONG_PARAMETER_2
            self.meas_time_ms, self.use_adm = item.meas_time_ms, item.use_adm
            return Status.ALL_OK
        if isinstance(item, tpi.SetStatisticMode):
            for i, v in enumerate((item.stationary, item.continuous)):
                if v not in tpi.StatisticMode._value2member_map_:
                    return Status.WRONG_PARAMETER_1 + i
            self.statistic = (tpi.StatisticMode(item.stationary), tpi.StatisticMode(item.continuous))
            return Status.ALL_OK
        return Status.NOT_IMPLEMENTED  # pragma: no cover - the decoder yields nothing else

    def _simple(self, command: int) -> list[tpi.Packet]:
        t = self.world.now_s()
        ok = Status.ALL_OK
        if command == Command.GET_SYSTEM_STATUS:
            tps = tpi.TrackerProcessorStatus.INITIALIZED if self.initialized else tpi.TrackerProcessorStatus.BOOTED
            laser = tpi.LaserStatus.LASER_READY if self.model.warmed_up(t) else tpi.LaserStatus.LASER_HEATING_UP
            return [tpi.SystemStatusReply(ok, self.last_result_status, tps, laser, tpi.AdmStatus.ADM_READY,
                                          *self.es_version, tpi.WeatherMonitorStatus.READ_ONLY, 0, self.serial)]
        if command == Command.GET_TRACKER_STATUS:
            state = (tpi.TrackerState.BUSY if self._meas is not None
                     else tpi.TrackerState.READY if self.initialized else tpi.TrackerState.NOT_READY)
            return [tpi.TrackerStatusReply(ok, state)]
        if command == Command.GET_UNITS:
            return [tpi.UnitsReply(ok, *self.units)]
        if command == Command.GET_COORDINATE_SYSTEM_TYPE:
            return [tpi.CoordinateSystemTypeReply(ok, self.coordinate_system)]
        if command == Command.GET_MEASUREMENT_MODE:
            return [tpi.MeasurementModeReply(ok, self.meas_mode)]
        if command == Command.GET_STATIONARY_MODE_PARAMS:
            return [tpi.StationaryModeParamsReply(ok, self.meas_time_ms, self.use_adm)]
        if command == Command.GET_STATISTIC_MODE:
            return [tpi.StatisticModeReply(ok, *self.statistic)]
        if command == Command.GET_MEASUREMENT_STATUS_INFO:
            info = (tpi.MeasurementStatusInfo.TRACKER_FOUND | tpi.MeasurementStatusInfo.TRACKER_COMPENSATION_FOUND
                    | tpi.MeasurementStatusInfo.ADM_FOUND | tpi.MeasurementStatusInfo.ADM_COMPENSATION_FOUND
                    | tpi.MeasurementStatusInfo.IN_FACE_1)
            if self.initialized:
                info |= tpi.MeasurementStatusInfo.INITIALIZED
            if self.model.target_locked(t):
                info |= tpi.MeasurementStatusInfo.REFLECTOR_FOUND
            return [tpi.MeasurementStatusInfoReply(ok, self.last_result_status, int(info))]
        if command == Command.INITIALIZE:
            if self._meas is not None:
                return [tpi.Reply(command, Status.SERVER_BUSY)]
            self.initialized = True
            self._locked_reported = None  # the next tick reports the measurement status
            return [tpi.Reply(command, ok), tpi.SystemStatusChange(StatusChange.INITIALIZATION_STATUS_CHANGED)]
        if command == Command.START_MEASUREMENT:
            return self._start(t)
        if command == Command.STOP_MEASUREMENT:
            self._meas = None
            return [tpi.Reply(command, ok)]
        return [tpi.Reply(command, Status.NOT_IMPLEMENTED)]  # ExitApplication: the server stays up

    def _start(self, t: float) -> list[tpi.Packet]:
        cmd = Command.START_MEASUREMENT
        if self._meas is not None:
            return [tpi.Reply(cmd, Status.SERVER_BUSY)]
        if not self.initialized:
            return [tpi.Reply(cmd, Status.TRACKER_NOT_INITIALIZED)]
        why = self.model.refusal(t)
        if why in _START_REFUSALS:
            self.last_result_status = _START_REFUSALS[why]
            return [tpi.Reply(cmd, _START_REFUSALS[why])]
        n = self.model.sample_count(self.meas_time_ms / 1000)
        self._meas = _Window(self._clock() + self.meas_time_ms / 1000 / self._rate, t, n,
                             unstable=why is NakCode.NOT_STABLE)
        return [tpi.Reply(cmd, Status.ALL_OK)]

    # -- time ---------------------------------------------------------------------------------
    def next_event_wall_s(self) -> float | None:
        """Wall seconds until the measurement in progress completes (None if idle)."""
        return None if self._meas is None else self._meas.end_wall_s - self._clock()

    def poll(self) -> list[tpi.Packet]:
        """Events and results due now: measurement-status changes, a finished or failed
        measurement."""
        t = self.world.now_s()
        out: list[tpi.Packet] = []
        locked = self.model.target_locked(t)
        if self.initialized and locked != self._locked_reported:
            self._locked_reported = locked
            out.append(tpi.SystemStatusChange(StatusChange.MEAS_STATUS_READY if locked
                                              else StatusChange.MEAS_STATUS_NOT_READY))
        m = self._meas
        if m is None:
            return out
        if not locked:  # the beam broke: the tracker gives up at once
            self._meas = None
            return out + [self._failed()]
        if not self.model.stable(t):
            m.unstable = True
        if self._clock() < m.end_wall_s:
            return out
        self._meas = None
        why = self.model.failure(m.start_sim_s, t, m.unstable)
        if why is NakCode.BEAM_BROKEN or why is NakCode.NO_TARGET:
            if self._locked_reported is not False:
                # the lock was lost and found again between two ticks: say so all the same
                out.append(tpi.SystemStatusChange(StatusChange.MEAS_STATUS_NOT_READY))
                self._locked_reported = False
            return out + [self._failed()]
        if why is not None:
            return out + [self._failed()]
        return out + [self._result(t, m.n)]

    def _failed(self) -> tpi.ErrorPacket:
        self.last_result_status = Status.NO_STATIONARY_RESULT
        return tpi.ErrorPacket(Command.START_MEASUREMENT, Status.NO_STATIONARY_RESULT)

    def _result(self, t: float, n: int) -> tpi.SingleMeasResult | tpi.SingleMeasResult2:
        s = self.model.measure(t, n)
        k = LENGTH_PER_M[self.units[0]]
        x, y, z = (float(v) * k for v in s.xyz_m)
        sx, sy, sz = (float(v) * k for v in s.std_m)
        ax, ay, az = (float(v) * k for v in self.config.noise_m)
        temp = AIR_TEMPERATURE_C if self.units[2] == tpi.TemperatureUnit.CELSIUS else AIR_TEMPERATURE_C * 9 / 5 + 32
        press = AIR_PRESSURE_MBAR * _PRESSURE_PER_MBAR[self.units[3]]
        self.last_result_status = Status.ALL_OK
        common = (Status.ALL_OK, tpi.MeasMode.STATIONARY, 0, x, y, z, sx, sy, sz, math.sqrt(sx * sx + sy * sy + sz * sz))
        apriori = (ax, ay, az, math.sqrt(ax * ax + ay * ay + az * az))
        if self.statistic[0] == tpi.StatisticMode.EXTENDED:
            # the simulated noise is independent per axis: no covariance
            return tpi.SingleMeasResult2(*common, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, *apriori, 0.0, 0.0, 0.0,
                                         temp, press, AIR_HUMIDITY_RH)
        return tpi.SingleMeasResult(*common, 0.0, 0.0, 0.0, *apriori, temp, press, AIR_HUMIDITY_RH)


class SimEmscon(LinkServer):
    """An :class:`EmsconDevice` on loopback TCP (``emscon://127.0.0.1:PORT``), in its own thread.

    Parameters
    ----------
    world : World
    config : TrackerConfig
    seed : int
        Seeds the device noise.
    host, port : str, int
        TCP listening address (port 0: any free port; a real tracker listens on 700).
    clock : callable returning seconds
        Wall clock of the measuring time.

    Notes
    -----
    The schedule's ``disconnect`` and ``trickle`` faults apply; ``garbage`` does not (TCP
    delivers bytes intact or not at all). A new connection replaces the old one, where a
    real emScon server refuses a second client: a reconnecting driver then never waits for a
    dead connection to time out.
    """

    TRANSPORTS = (Transport.TCP,)
    LINK_FAULTS = frozenset({FaultKind.DISCONNECT, FaultKind.TRICKLE})
    NAME = "emscon"

    def __init__(
        self,
        world: World,
        config: TrackerConfig,
        *,
        transport: str = Transport.TCP,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(world, config, transport=transport, seed=seed, host=host, port=port)
        self.device = EmsconDevice(world, config, seed=seed, clock=clock)
        self._decoder = tpi.Decoder("commands")

    def start(self) -> SimEmscon:
        return super().start()

    def __enter__(self) -> SimEmscon:
        return self.start()

    def _make_url(self, transport: str, where: str | int) -> str:
        return f"emscon://{self._host}:{where}"

    def _on_connect(self) -> None:
        self._decoder.reset()
        self.device.on_disconnect()

    def _on_link_drop(self) -> None:
        self.device.on_disconnect()

    def _on_bytes(self, data: bytes) -> list[Any]:
        self._decoder.feed(data)
        out: list[Any] = []
        for item in self._decoder.decode():
            if not isinstance(item, tpi.TpiProtocolError):
                self.frames_in += 1
            out += self.device.handle(item)
        return out

    def _on_tick(self) -> list[Any]:
        return self.device.poll()

    def _next_event_wall_s(self) -> float | None:
        return self.device.next_event_wall_s()

    def _encode(self, record: Any) -> bytes:
        return tpi.encode(record)
