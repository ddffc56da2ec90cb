"""A simulated Leica total station: GeoCOM on a pty or a loopback TCP port.

Two layers, as for the other simulated instruments:

* :class:`GeocomDevice` -- the instrument's behaviour with no I/O: it takes decoded request
  lines and returns replies (a reply waiting for a distance measurement is sent when the
  EDM finishes). What it measures and when it fails are the shared
  :class:`~cellcal.sim.instrument.InstrumentModel`'s; the device maps them to GeoCOM return
  codes and reports the point as Hz, V and slope distance with cellcal's polar convention
  (:func:`~cellcal.drivers.geocom_codec.polar_from_cartesian`): the station stands at the cell
  origin, Hz zero along cell +y, V from cell +z.
* :class:`SimGeocom` -- serves a device on a pty (``geocom:///dev/pts/N``) or on loopback TCP
  (``geocom+socket://127.0.0.1:PORT``), a :class:`~cellcal.sim.link.LinkServer` with every
  link fault of the schedule (a serial line can lose and garble bytes).

The RPCs served, the codes returned and what is refused are in ``docs/protocols/geocom.md``.
Blank lines are ignored, never answered: clients send them to clear the instrument's
receiver (geocompy sends one on connect, and its socket ``is_open()`` sends another).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cellcal.drivers import geocom_codec as gc
from cellcal.drivers.geocom_codec import RC, MeasureProgram, Rpc
from cellcal.drivers.tracker_codec import NakCode
from cellcal.sim.instrument import InstrumentModel
from cellcal.sim.link import LinkServer, Transport
from cellcal.sim.scenario import FaultKind, TrackerConfig
from cellcal.sim.world import World

__all__ = ["GeocomDevice", "SimGeocom", "DEFAULT_EDM_TIME_S", "GEOCOM_VERSION"]

#: How long the simulated EDM measures one distance (it averages samples over that time).
DEFAULT_EDM_TIME_S = 0.3
#: The GeoCOM version the simulated instrument reports (COM_GetSWVersion).
GEOCOM_VERSION = (1, 50, 0)
#: Refusal when a distance measurement starts or fails -> the rc TMC_GetSimpleMea returns.
_MEASURE_FAILURES = {
    NakCode.BEAM_BROKEN: RC.TMC_DIST_ERROR,
    NakCode.NO_TARGET: RC.TMC_DIST_ERROR,
    NakCode.OUT_OF_RANGE: RC.TMC_DIST_ERROR,
    NakCode.NOT_STABLE: RC.TMC_ANGLE_ERROR,
    NakCode.NOT_WARMED_UP: RC.NOTINIT,
}
#: Parameters each served RPC takes, as parsers (a mismatch answers IVPARAM).
_PARAMS: dict[int, tuple[Callable[[str], Any], ...]] = {
    Rpc.COM_NULL_PROC: (),
    Rpc.COM_SET_DOUBLE_PRECISION: (gc.parse_int,),
    Rpc.COM_GET_DOUBLE_PRECISION: (),
    Rpc.COM_GET_SW_VERSION: (),
    Rpc.CSV_GET_INSTRUMENT_NO: (),
    Rpc.CSV_GET_INSTRUMENT_NAME: (),
    Rpc.CSV_GET_SW_VERSION: (),
    Rpc.AUS_SET_USER_ATR_STATE: (gc.parse_bool,),
    Rpc.AUS_GET_USER_ATR_STATE: (),
    Rpc.AUT_FINE_ADJUST: (gc.parse_double, gc.parse_double, gc.parse_int),
    Rpc.TMC_DO_MEASURE: (gc.parse_int, gc.parse_int),
    Rpc.TMC_GET_SIMPLE_MEA: (gc.parse_int, gc.parse_int),
    Rpc.TMC_GET_COORDINATE: (gc.parse_int, gc.parse_int),
    Rpc.TMC_GET_SIMPLE_COORD: (gc.parse_int, gc.parse_int),
    Rpc.TMC_GET_ANGLE5: (gc.parse_int,),
}
_WAITING_RPCS = (Rpc.TMC_GET_SIMPLE_MEA, Rpc.TMC_GET_COORDINATE, Rpc.TMC_GET_SIMPLE_COORD)


def _ints(text: str, n: int) -> tuple[int, ...]:
    nums = [int(x) for x in re.findall(r"\d+", text)[:n]]
    return tuple(nums + [0] * (n - len(nums)))


@dataclass
class _Edm:
    """A distance measurement in progress, or its outcome."""

    start_sim_s: float
    end_wall_s: float
    n: int
    unstable: bool
    refused: NakCode | None
    # outcome, set when done
    done: bool = False
    rc: int = RC.OK
    hz: float = 0.0
    v: float = 0.0
    d: float = 0.0
    xyz: tuple[float, float, float] = (0.0, 0.0, 0.0)
    t_ms: int = 0


@dataclass
class _Waiting:
    request: gc.Request
    deadline_wall_s: float


class GeocomDevice:
    """GeoCOM behaviour of a simulated total station, without I/O.

    Parameters
    ----------
    world : World
    config : TrackerConfig
        Noise, sample rate, limits, identity (``model`` is the instrument name, the digits of
        ``serial`` its number, ``firmware`` its software version) and the fault schedule.
    seed : int
        Seeds the noise.
    edm_time_s : float
        How long one distance measurement takes (and averages over).
    clock : callable returning seconds
        Wall clock the EDM time runs on.
    """

    def __init__(
        self,
        world: World,
        config: TrackerConfig,
        *,
        seed: int = 0,
        edm_time_s: float = DEFAULT_EDM_TIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not edm_time_s >= 0:
            raise ValueError(f"edm_time_s must be >= 0, got {edm_time_s!r}")
        self.world = world
        self.config = config
        self.model = InstrumentModel(world, config, seed=seed)
        self.edm_time_s = float(edm_time_s)
        self._clock = clock
        self._t0 = clock()
        self._rate = 1.0 + config.clock_skew_ppm * 1e-6
        self.atr = False
        self.precision = 15
        self.serial = int("".join(re.findall(r"\d", config.serial))[-9:] or 0)
        self.firmware = _ints(config.firmware, 3)
        self._edm: _Edm | None = None
        self._waiting: list[_Waiting] = []

    def on_disconnect(self) -> None:
        """The line went quiet: replies being waited for die with it."""
        self._waiting.clear()

    # -- requests ----------------------------------------------------------------------------
    def handle(self, item: gc.Request | gc.Reply | gc.GeocomProtocolError) -> list[gc.Reply]:
        """Replies to one decoded line (a waiting reply comes later, from :meth:`poll`)."""
        if isinstance(item, gc.GeocomProtocolError):
            if item.fault is gc.LineFault.BAD_CRC:
                return [gc.Reply(RC.COM_SRVR_RX_CHECKSUM_ERROR, RC.OK, (), item.trid if item.trid is not None else 0,
                                 item.trid is not None)]
            return []  # not a request: nothing to answer
        if not isinstance(item, gc.Request):
            return []
        parsers = _PARAMS.get(item.rpc)
        if parsers is None:
            return [self._reply(item, RC.COM_PROC_UNAVAIL)]
        try:
            if len(item.params) != len(parsers):
                raise ValueError(f"{len(item.params)} parameters, expected {len(parsers)}")
            args = [p(tok) for p, tok in zip(parsers, item.params, strict=True)]
        except ValueError:
            return [self._reply(item, RC.IVPARAM)]
        return self._call(item, args)

    def _reply(self, req: gc.Request, rc: int, *values: Any) -> gc.Reply:
        # An instrument answers transaction id 0 to a request that sent none.
        return gc.Reply.of(rc, *values, trid=req.trid if req.trid is not None else 0, crc=req.crc,
                           precision=self.precision)

    def _call(self, req: gc.Request, args: list[Any]) -> list[gc.Reply]:
        rpc = req.rpc
        t = self.world.now_s()
        if rpc == Rpc.COM_NULL_PROC:
            return [self._reply(req, RC.OK)]
        if rpc == Rpc.COM_SET_DOUBLE_PRECISION:
            if not 0 <= args[0] <= 15:
                return [self._reply(req, RC.IVPARAM)]
            self.precision = args[0]
            return [self._reply(req, RC.OK)]
        if rpc == Rpc.COM_GET_DOUBLE_PRECISION:
            return [self._reply(req, RC.OK, self.precision)]
        if rpc == Rpc.COM_GET_SW_VERSION:
            return [self._reply(req, RC.OK, *GEOCOM_VERSION)]
        if rpc == Rpc.CSV_GET_INSTRUMENT_NO:
            return [self._reply(req, RC.OK, self.serial)]
        if rpc == Rpc.CSV_GET_INSTRUMENT_NAME:
            return [self._reply(req, RC.OK, self.config.model)]
        if rpc == Rpc.CSV_GET_SW_VERSION:
            return [self._reply(req, RC.OK, *self.firmware)]
        if rpc == Rpc.AUS_SET_USER_ATR_STATE:
            self.atr = bool(args[0])
            return [self._reply(req, RC.OK)]
        if rpc == Rpc.AUS_GET_USER_ATR_STATE:
            return [self._reply(req, RC.OK, self.atr)]
        if rpc == Rpc.AUT_FINE_ADJUST:
            if not (args[0] > 0 and args[1] > 0):
                return [self._reply(req, RC.IVPARAM)]
            if not self.atr:
                return [self._reply(req, RC.AUT_NOT_ENABLED)]
            why = self.model.refusal(t)
            if why in (NakCode.BEAM_BROKEN, NakCode.NO_TARGET, NakCode.OUT_OF_RANGE):
                return [self._reply(req, RC.AUT_NO_TARGET)]
            return [self._reply(req, RC.OK)]  # the telescope now points at the prism
        if rpc == Rpc.TMC_DO_MEASURE:
            return [self._do_measure(req, args[0], t)]
        if rpc == Rpc.TMC_GET_ANGLE5:
            hz, v, _ = gc.polar_from_cartesian(self.model.measure(t, 1).xyz_m)
            return [self._reply(req, RC.OK, hz, v)]
        # TMC_GetSimpleMea, TMC_GetCoordinate, TMC_GetSimpleCoord: wait for the EDM if it runs
        edm = self._edm
        if edm is not None and not edm.done:
            wait_s = max(0, args[0]) / 1000 / self._rate
            self._waiting.append(_Waiting(req, self._clock() + wait_s))
            return []
        return [self._result_reply(req)]

    def _do_measure(self, req: gc.Request, program: int, t: float) -> gc.Reply:
        if program == MeasureProgram.STOP:
            if self._edm is not None and not self._edm.done:
                self._edm = None
            return self._reply(req, RC.OK)
        if program == MeasureProgram.CLEAR:
            self._edm = None
            return self._reply(req, RC.OK)
        if program not in (MeasureProgram.DEF_DIST, MeasureProgram.DO_MEASURE):
            return self._reply(req, RC.NOT_IMPL)  # tracking and signal programs: not simulated
        why = self.model.refusal(t)
        self._edm = _Edm(
            start_sim_s=t,
            end_wall_s=self._clock() + self.edm_time_s / self._rate,
            n=self.model.sample_count(self.edm_time_s),
            unstable=why is NakCode.NOT_STABLE,
            refused=why if why is not NakCode.NOT_STABLE else None,
        )
        return self._reply(req, RC.OK)

    def _result_reply(self, req: gc.Request) -> gc.Reply:
        edm = self._edm
        rc: int
        if edm is None:
            # no distance measured: the angles alone, as an instrument answers
            hz, v, _ = gc.polar_from_cartesian(self.world.cell_T_target()[:3, 3])
            rc, d, xyz, t_ms = RC.TMC_ANGLE_OK, 0.0, (0.0, 0.0, 0.0), self._now_ms()
        else:
            rc, hz, v, d, xyz, t_ms = edm.rc, edm.hz, edm.v, edm.d, edm.xyz, edm.t_ms
        if req.rpc == Rpc.TMC_GET_SIMPLE_MEA:
            return self._reply(req, rc, hz, v, d)
        if rc != RC.OK:
            xyz = (0.0, 0.0, 0.0)
        if req.rpc == Rpc.TMC_GET_SIMPLE_COORD:
            return self._reply(req, rc, *xyz)
        # TMC_GetCoordinate: the coordinate, its time, and the "continuous" one (the same here)
        return self._reply(req, rc, *xyz, t_ms, *xyz, t_ms)

    def _now_ms(self) -> int:
        return int((self._clock() - self._t0) * self._rate * 1000)

    # -- time ---------------------------------------------------------------------------------
    def next_event_wall_s(self) -> float | None:
        """Wall seconds until the EDM finishes or a waiting reply is due (None: nothing)."""
        times = [w.deadline_wall_s for w in self._waiting]
        if self._edm is not None and not self._edm.done:
            times.append(self._edm.end_wall_s)
        return min(times) - self._clock() if times else None

    def poll(self) -> list[gc.Reply]:
        """Advance the EDM; the replies that were waiting for it (or whose wait ran out)."""
        edm = self._edm
        now = self._clock()
        if edm is not None and not edm.done:
            t = self.world.now_s()
            if not self.model.stable(t):
                edm.unstable = True
            if now >= edm.end_wall_s:
                self._finish(edm, t)
        out = []
        keep = []
        for w in self._waiting:
            if self._edm is None or self._edm.done or now >= w.deadline_wall_s:
                out.append(self._result_reply(w.request) if self._edm is None or self._edm.done
                           else self._reply(w.request, RC.TMC_BUSY, *self._busy_values(w.request)))
            else:
                keep.append(w)
        self._waiting = keep
        return out

    @staticmethod
    def _busy_values(req: gc.Request) -> tuple:
        return (0.0, 0.0, 0.0) if req.rpc != Rpc.TMC_GET_COORDINATE else (0.0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 0)

    def _finish(self, edm: _Edm, t: float) -> None:
        edm.done = True
        edm.t_ms = self._now_ms()
        why = edm.refused or self.model.failure(edm.start_sim_s, t, edm.unstable)
        if why is not None:
            edm.rc = _MEASURE_FAILURES.get(why, RC.TMC_DIST_ERROR)
            edm.hz, edm.v, _ = gc.polar_from_cartesian(self.world.cell_T_target(t)[:3, 3])
            edm.d = 0.0
            return
        s = self.model.measure(t, edm.n)
        edm.xyz = (float(s.xyz_m[0]), float(s.xyz_m[1]), float(s.xyz_m[2]))
        edm.hz, edm.v, edm.d = gc.polar_from_cartesian(s.xyz_m)
        for f in self.model.config.faults:
            if f.kind is FaultKind.WILD_ANGLE and f.active(t):
                edm.hz += f.value_rad  # legal as a double on the wire, beyond any circle
        edm.rc = RC.OK


class SimGeocom(LinkServer):
    """A :class:`GeocomDevice` on a pty or loopback TCP, in its own thread.

    The URL is ``geocom:///dev/pts/N`` (pty) or ``geocom+socket://127.0.0.1:PORT`` (TCP);
    geocompy and pygeocom open the pty path itself (``open_serial(path)``) or the socket.

    Parameters
    ----------
    world : World
    config : TrackerConfig
    transport : {"pty", "tcp"}
    seed : int
        Seeds the device noise and the garbage generator.
    host, port : str, int
        TCP listening address (port 0: any free port).
    edm_time_s : float
        How long one distance measurement takes.
    clock : callable returning seconds
    """

    NAME = "geocom"

    def __init__(
        self,
        world: World,
        config: TrackerConfig,
        *,
        transport: str = Transport.PTY,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        edm_time_s: float = DEFAULT_EDM_TIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(world, config, transport=transport, seed=seed, host=host, port=port)
        self.device = GeocomDevice(world, config, seed=seed, edm_time_s=edm_time_s, clock=clock)
        self._decoder = gc.Decoder("requests")
        self.lines_ignored = 0  # lines that were not requests (diagnostics)

    def start(self) -> SimGeocom:
        return super().start()

    def __enter__(self) -> SimGeocom:
        return self.start()

    @property
    def path(self) -> str:
        """The pty path (what a client opening a serial port by name uses)."""
        return self.url.split("://", 1)[1] if self.transport == Transport.PTY else ""

    def _make_url(self, transport: str, where: str | int) -> str:
        return f"geocom://{where}" if transport == Transport.PTY else f"geocom+socket://{self._host}:{where}"

    def _on_connect(self) -> None:
        self._decoder.reset()
        self.device.on_disconnect()

    def _on_link_drop(self) -> None:
        self.device.on_disconnect()

    def _on_bytes(self, data: bytes) -> list[Any]:
        self._decoder.feed(data)
        out: list[Any] = []
        for item in self._decoder.decode():
            if isinstance(item, gc.GeocomProtocolError):
                self.lines_ignored += 1
            else:
                self.frames_in += 1
            out += self.device.handle(item)
        return out

    def _on_tick(self) -> list[Any]:
        return self.device.poll()

    def _next_event_wall_s(self) -> float | None:
        return self.device.next_event_wall_s()

    def _encode(self, record: Any) -> bytes:
        return gc.encode(record)
