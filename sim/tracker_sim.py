"""The simulated laser tracker: protocol 1.0 on a pty or a TCP socket.

Two layers:

* :class:`TrackerDevice` -- the device's behaviour with no I/O: it takes decoded requests
  and returns replies. What it measures, its noise and when it refuses (beam broken, no
  target, not stable, out of range, not warmed up) are the shared
  :class:`~cellcal.sim.instrument.InstrumentModel`'s, so every simulated protocol measures
  the same world the same way; busy and the protocol's own errors are the device's.
* :class:`SimTracker` -- serves a device on a pty (``os.openpty`` in raw mode; its URL is
  the slave path) or on loopback TCP (``socket://127.0.0.1:PORT``), in one thread, with the
  link faults of the schedule (disconnect, garbage, trickle): a
  :class:`~cellcal.sim.link.LinkServer`.

Value faults (``frozen``, ``wild_value``, ``future_timestamp``) are applied by the device
to the replies it builds: they are well-formed frames with wrong content, which only the
consumer's consistency checks can catch. Faults can also be injected at run time
(:meth:`SimTracker.inject`).

Times: the scenario's fault schedule is in *simulated* seconds (``world.now_s()``). The
device clock is a real oscillator: ``clock_offset_s + (1 + skew) * wall seconds`` since the
device started, and averaging times and latency run on it, as they do on hardware.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.drivers import tracker_codec as codec
from cellcal.drivers.tracker_codec import (
    FrameFault,
    MeasKind,
    MeasurementFlags,
    NakCode,
    StatusFlags,
)
from cellcal.sim.instrument import InstrumentModel
from cellcal.sim.link import LinkServer, Transport
from cellcal.sim.scenario import FaultConfig, FaultKind, TrackerConfig
from cellcal.sim.world import World
from cellcal.solver.se3 import xyz_quat_from_transform

__all__ = ["TrackerDevice", "SimTracker", "Transport"]

log = logging.getLogger(__name__)

_M_TO_MM = 1e3
_US_PER_S = 1_000_000


@dataclass
class _Measurement:
    seq: int
    kind: MeasKind
    n: int
    start_us: int
    end_us: int
    start_sim_s: float
    unstable: bool = False


class TrackerDevice:
    """Protocol behaviour of a simulated tracker, without I/O.

    Parameters
    ----------
    world : World
        The truth the device measures.
    config : TrackerConfig
        Noise, clock, limits, identity, faults.
    seed : int
        Seeds the noise generator.
    clock : callable returning seconds
        Wall clock the device oscillator is derived from.
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
        self.model = InstrumentModel(world, config, seed=seed)
        self.rng = self.model.rng
        self._clock = clock
        self._t0 = clock()
        self._rate = 1.0 + config.clock_skew_ppm * 1e-6
        self._meas: _Measurement | None = None
        self._last_reply: dict[MeasKind, Any] = {}  # the newest good reply of each kind
        self._frozen: dict[MeasKind, Any] = {}  # what a frozen tracker repeats

    @property
    def config(self) -> TrackerConfig:
        """Noise, clock, limits, identity and faults (the shared model's, injected ones included)."""
        return self.model.config

    def inject(self, kind: str | FaultKind, duration_s: float = math.inf, **params: Any) -> FaultConfig:
        """Start a fault of ``kind`` now (simulated time) for ``duration_s`` simulated
        seconds; ``params`` are the kind's keys (``value_mm``, ``offset_s``, ...)."""
        fault = FaultConfig(kind=FaultKind(kind), start_s=self.world.now_s(), duration_s=float(duration_s), **params)
        # One attribute swap in the shared model: the server thread sees the old schedule
        # or the new one, and every check (refusals included) sees the same one.
        self.model.config = dataclasses.replace(self.model.config, faults=(*self.model.config.faults, fault))
        return fault

    # -- clock --------------------------------------------------------------------------
    def device_s(self, wall_s: float) -> float:
        """Device clock (s) ``wall_s`` wall seconds after the device started: offset, a rate
        ``1 + skew`` whose skew drifts linearly (``clock_skew_drift_ppm_per_h``), and the
        scenario's clock step once the world passes ``clock_step_at_s``."""
        c = self.config
        drift = c.clock_skew_drift_ppm_per_h * 1e-6 / 3600.0
        dev = c.clock_offset_s + (1.0 + c.clock_skew_ppm * 1e-6) * wall_s + 0.5 * drift * wall_s * wall_s
        if c.clock_step_s and self.world.now_s() >= c.clock_step_at_s:
            dev += c.clock_step_s
        return dev

    def rate_now(self) -> float:
        """Device seconds per wall second now (skew and its drift)."""
        c = self.config
        wall = self._clock() - self._t0
        return 1.0 + c.clock_skew_ppm * 1e-6 + c.clock_skew_drift_ppm_per_h * 1e-6 / 3600.0 * wall

    def now_us(self) -> int:
        """Device clock, integer microseconds."""
        return int(self.device_s(self._clock() - self._t0) * _US_PER_S)

    def wall_s_until(self, t_us: int) -> float:
        """Wall seconds until the device clock reads ``t_us`` (<= 0 if already past)."""
        return (t_us - self.now_us()) / _US_PER_S / self.rate_now()

    @property
    def latency_us(self) -> int:
        return int(self.config.latency_ms * 1000)

    # -- conditions -------------------------------------------------------------------------
    def status_flags(self) -> StatusFlags:
        t = self.world.now_s()
        m = self.model
        flags = StatusFlags.NONE
        if m.warmed_up(t):
            flags |= StatusFlags.WARMED_UP
        if m.target_locked(t):
            flags |= StatusFlags.TARGET_LOCKED
        if m.stable(t):
            flags |= StatusFlags.STABLE
        if self._meas is not None:
            flags |= StatusFlags.MEASURING
        return flags

    # -- requests ---------------------------------------------------------------------------
    def handle(self, item: codec.Record | codec.TrackerProtocolError, rx_us: int) -> list:
        """Replies (ts_us left 0, stamped when sent) to one decoded request or bad frame."""
        if isinstance(item, codec.TrackerProtocolError):
            return self._handle_bad(item)
        seq = item.seq
        if isinstance(item, codec.Ping):
            return [codec.Pong(seq, 0, rx_us)]
        if isinstance(item, codec.Hello):
            major, minor = (int(x) for x in item.version.split("."))
            dev_major, dev_minor = codec.PROTOCOL_VERSION
            if major != dev_major:
                return [codec.Nak(seq, 0, NakCode.UNSUPPORTED_VERSION.value)]
            c = self.config
            agreed = f"{dev_major}.{min(minor, dev_minor)}"
            return [codec.Ident(seq, 0, agreed, c.model, c.serial, c.firmware, codec.UNITS_MM_DEG)]
        if isinstance(item, codec.Stat):
            return [codec.Status(seq, 0, self.status_flags())]
        if isinstance(item, codec.Stop):
            out = []
            if self._meas is not None:
                out.append(codec.Nak(self._meas.seq, 0, NakCode.ABORTED.value))
                self._meas = None
            return out + [codec.Ack(seq, 0)]
        if isinstance(item, codec.Meas):
            return self._start_measurement(item, rx_us)
        # a reply type sent to the device
        return [codec.Nak(seq, 0, NakCode.UNKNOWN_COMMAND.value)]

    def _handle_bad(self, err: codec.TrackerProtocolError) -> list:
        if err.fault in (FrameFault.BAD_CRC, FrameFault.MALFORMED):
            # A whole frame arrived damaged: its seq cannot be trusted.
            return [codec.Nak(codec.SEQ_UNKNOWN, 0, NakCode.BAD_CRC.value)]
        if err.fault is FrameFault.UNKNOWN_TYPE:
            return [codec.Nak(err.seq or codec.SEQ_UNKNOWN, 0, NakCode.UNKNOWN_COMMAND.value)]
        if err.fault is FrameFault.BAD_FIELDS:
            return [codec.Nak(err.seq or codec.SEQ_UNKNOWN, 0, NakCode.BAD_REQUEST.value)]
        return []  # garbage, unterminated, overlong: nothing to answer

    def _start_measurement(self, req: codec.Meas, rx_us: int) -> list:
        if self._meas is not None:
            return [codec.Nak(req.seq, 0, NakCode.BUSY.value)]
        t_s = self.world.now_s()
        why = self.model.refusal(t_s)
        if why is not None:
            return [codec.Nak(req.seq, 0, why.value)]
        n = self.model.sample_count(req.average_ms / 1000)
        self._meas = _Measurement(
            req.seq, req.kind, n, rx_us, rx_us + req.average_ms * 1000, t_s
        )
        return []

    def next_event_wall_s(self) -> float | None:
        """Wall seconds until the measurement in progress completes (None if idle)."""
        return None if self._meas is None else self.wall_s_until(self._meas.end_us)

    def poll(self) -> list:
        """Advance the measurement in progress; returns its reply when it completes."""
        m = self._meas
        if m is None:
            return []
        t_s = self.world.now_s()
        if not self.model.stable(t_s):
            m.unstable = True  # the target moved at some time during the window
        if self.now_us() < m.end_us:
            return []
        self._meas = None
        why = self.model.failure(m.start_sim_s, t_s, m.unstable)
        if why is not None:
            return [codec.Nak(m.seq, 0, why.value)]
        return [self._faulty(self._measure(m, t_s), m, t_s)]

    def _faulty(self, reply: Any, m: _Measurement, t_s: float) -> Any:
        """The reply as the value faults active at ``t_s`` make it (legal on the wire,
        wrong in substance: the driver cannot tell, the daemon's checks must)."""
        if self.model.active(FaultKind.FROZEN, t_s):
            # Frozen: the last value before the fault (or the first one in it) again and
            # again, bit for bit, with a fresh window stamp.
            frozen = self._frozen.setdefault(m.kind, self._last_reply.get(m.kind, reply))
            reply = dataclasses.replace(frozen, seq=m.seq, t_us=reply.t_us)
        else:
            self._frozen.pop(m.kind, None)
            self._last_reply[m.kind] = reply
        for f in self.config.faults:
            if not f.active(t_s):
                continue
            if f.kind is FaultKind.WILD_VALUE:
                reply = dataclasses.replace(reply, x_mm=f.value_mm)
            elif f.kind is FaultKind.FUTURE_TIMESTAMP:
                t_us = min(max(reply.t_us + int(f.offset_s * _US_PER_S), 0), codec.MAX_TS_US)
                reply = dataclasses.replace(reply, t_us=t_us)
        return reply

    def _measure(self, m: _Measurement, t_s: float):
        """Average of ``m.n`` samples from the shared model, in protocol units (mm, deg)."""
        sample = self.model.measure(t_s, m.n, pose=m.kind is MeasKind.POSE)
        flags = MeasurementFlags.NEAR_RANGE_LIMIT if sample.near_range_limit else MeasurementFlags.NONE
        # the protocol stamps the middle of the window; a scenario may make the firmware wrong
        t_mid_us = {"start": m.start_us, "end": m.end_us}.get(self.config.timestamp_at, (m.start_us + m.end_us) // 2)
        x, y, z = sample.xyz_m * _M_TO_MM
        sx, sy, sz = sample.std_m * _M_TO_MM
        if m.kind is MeasKind.POINT:
            return codec.PointReply(m.seq, 0, t_mid_us, m.n, x, y, z, sx, sy, sz, flags)
        assert sample.cell_T_target is not None and sample.std_rad is not None
        _, q = xyz_quat_from_transform(sample.cell_T_target)
        srx, sry, srz = np.degrees(sample.std_rad)
        qw, qx, qy, qz = (float(v) for v in q)
        return codec.PoseReply(
            m.seq, 0, t_mid_us, m.n, x, y, z, qw, qx, qy, qz, sx, sy, sz, srx, sry, srz, flags
        )


class SimTracker(LinkServer):
    """A :class:`TrackerDevice` served on a pty or loopback TCP, in its own thread.

    Parameters
    ----------
    world : World
    config : TrackerConfig
    transport : {"pty", "tcp"}
    seed : int
        Seeds the device noise and the garbage generator.
    host, port : str, int
        TCP listening address (port 0: any free port).
    clock : callable returning seconds
        Wall clock of the device oscillator.

    Notes
    -----
    The constructor does no I/O; :meth:`start` (or ``with``) opens the pty or socket and
    starts the thread, :meth:`close` stops and joins it and closes every descriptor. The URL
    is the pty path or ``socket://127.0.0.1:PORT``.
    """

    NAME = "tracker"

    def __init__(
        self,
        world: World,
        config: TrackerConfig,
        *,
        transport: str = Transport.PTY,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(world, config, transport=transport, seed=seed, host=host, port=port)
        self.device = TrackerDevice(world, config, seed=seed, clock=clock)
        self._jitter_rng = np.random.default_rng([seed, 3])
        self._decoder = codec.Decoder(accept=codec.REQUEST_TYPES)

    def inject(self, kind: str | FaultKind, duration_s: float = math.inf, **params: Any) -> FaultConfig:
        """Start a fault now for ``duration_s`` simulated seconds (:meth:`TrackerDevice.inject`);
        link faults (disconnect, garbage, trickle) reach the link too."""
        fault = self.device.inject(kind, duration_s, **params)
        self.config = self.device.config  # one attribute swap, as in the device
        return fault

    def start(self) -> SimTracker:
        return super().start()

    def __enter__(self) -> SimTracker:
        return self.start()

    def _make_url(self, transport: str, where: str | int) -> str:
        return str(where) if transport == Transport.PTY else f"socket://{self._host}:{where}"

    @property
    def _latency_s(self) -> float:
        return self.device.latency_us / _US_PER_S / self.device._rate

    def _transport_delay_s(self) -> float:
        jitter_ms = self.device.config.latency_jitter_ms
        return float(self._jitter_rng.exponential(jitter_ms)) / 1000.0 if jitter_ms > 0 else 0.0

    def _on_connect(self) -> None:
        self._decoder.reset()

    def _on_link_drop(self) -> None:
        self.device._meas = None  # the measurement dies with the link

    def _on_bytes(self, data: bytes) -> list[Any]:
        rx_us = self.device.now_us()
        self._decoder.feed(data)
        out: list[Any] = []
        for item in self._decoder.decode():
            if not isinstance(item, codec.TrackerProtocolError):
                self.frames_in += 1
            out += self.device.handle(item, rx_us)
        return out

    def _on_tick(self) -> list[Any]:
        return self.device.poll()

    def _next_event_wall_s(self) -> float | None:
        return self.device.next_event_wall_s()

    def _encode(self, record: Any) -> bytes:
        # ts_us is when the frame leaves the device
        return codec.encode(dataclasses.replace(record, ts_us=self.device.now_us()))
