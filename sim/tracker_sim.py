"""The simulated laser tracker: protocol 1.0 on a pty or a TCP socket.

Two layers:

* :class:`TrackerDevice` -- the device's behaviour with no I/O: it takes decoded requests
  and returns replies, measures the target where the :class:`~cellcal.sim.world.World`
  says it is, adds the scenario's noise and refuses measurements the way a tracker does
  (beam broken, no target, not stable, out of range, not warmed up, busy).
* :class:`SimTracker` -- serves a device on a pty (``os.openpty`` in raw mode; its URL is
  the slave path) or on loopback TCP (``socket://127.0.0.1:PORT``), in one thread, and
  applies the link faults of the schedule (disconnect, garbage, trickle).

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
import errno
import logging
import math
import os
import select
import socket
import threading
import time
import tty
from collections import deque
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
from cellcal.sim.scenario import FaultConfig, FaultKind, TrackerConfig
from cellcal.sim.world import World
from cellcal.solver.se3 import so3_exp, xyz_quat_from_transform

__all__ = ["TrackerDevice", "SimTracker", "Transport"]

log = logging.getLogger(__name__)

_M_TO_MM = 1e3
_US_PER_S = 1_000_000
#: Longest the server thread sleeps without looking at the world (stability sampling).
_TICK_S = 0.005
#: Fraction of max range beyond which measurements carry NEAR_RANGE_LIMIT.
_NEAR_RANGE_FRACTION = 0.98
_READ_CHUNK = 4096
_JOIN_TIMEOUT_S = 5.0


class Transport:
    """Transports :class:`SimTracker` serves on."""

    PTY = "pty"
    TCP = "tcp"
    ALL = (PTY, TCP)


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
        self.config = config
        self.rng = np.random.default_rng(seed)
        self._clock = clock
        self._t0 = clock()
        self._rate = 1.0 + config.clock_skew_ppm * 1e-6
        self._meas: _Measurement | None = None
        self._last_reply: dict[MeasKind, Any] = {}  # the newest good reply of each kind
        self._frozen: dict[MeasKind, Any] = {}  # what a frozen tracker repeats

    def inject(self, kind: str | FaultKind, duration_s: float = math.inf, **params: Any) -> FaultConfig:
        """Start a fault of ``kind`` now (simulated time) for ``duration_s`` simulated
        seconds; ``params`` are the kind's keys (``value_mm``, ``offset_s``, ...)."""
        fault = FaultConfig(kind=FaultKind(kind), start_s=self.world.now_s(), duration_s=float(duration_s), **params)
        # One attribute swap: the server thread sees the old schedule or the new one.
        self.config = dataclasses.replace(self.config, faults=(*self.config.faults, fault))
        return fault

    # -- clock --------------------------------------------------------------------------
    def now_us(self) -> int:
        """Device clock, integer microseconds."""
        dev_s = self.config.clock_offset_s + self._rate * (self._clock() - self._t0)
        return int(dev_s * _US_PER_S)

    def wall_s_until(self, t_us: int) -> float:
        """Wall seconds until the device clock reads ``t_us`` (<= 0 if already past)."""
        return (t_us - self.now_us()) / _US_PER_S / self._rate

    @property
    def latency_us(self) -> int:
        return int(self.config.latency_ms * 1000)

    # -- conditions -------------------------------------------------------------------------
    def _active(self, kind: FaultKind, t_s: float) -> bool:
        return any(f.kind is kind and f.active(t_s) for f in self.config.faults)

    def _overlapping(self, kind: FaultKind, t0_s: float, t1_s: float) -> bool:
        return any(f.kind is kind and f.overlaps(t0_s, t1_s) for f in self.config.faults)

    def _stable_now(self, t_s: float) -> bool:
        lin, ang = self.world.flange_speed()
        return (
            lin <= self.config.stable_speed_m_s
            and ang <= self.config.stable_speed_rad_s
            and not self._active(FaultKind.NOT_STABLE, t_s)
        )

    def status_flags(self) -> StatusFlags:
        t = self.world.now_s()
        flags = StatusFlags.NONE
        if t >= self.config.warmup_s:
            flags |= StatusFlags.WARMED_UP
        if not (self._active(FaultKind.BEAM_BREAK, t) or self._active(FaultKind.NO_TARGET, t)):
            flags |= StatusFlags.TARGET_LOCKED
        if self._stable_now(t):
            flags |= StatusFlags.STABLE
        if self._meas is not None:
            flags |= StatusFlags.MEASURING
        return flags

    def _refusal(self, t_s: float) -> NakCode | None:
        """Why a measurement cannot start now, if it cannot."""
        if t_s < self.config.warmup_s:
            return NakCode.NOT_WARMED_UP
        if self._active(FaultKind.BEAM_BREAK, t_s):
            return NakCode.BEAM_BROKEN
        if self._active(FaultKind.NO_TARGET, t_s):
            return NakCode.NO_TARGET
        dist = float(np.linalg.norm(self.world.cell_T_target(t_s)[:3, 3]))
        if not self.config.min_range_m <= dist <= self.config.max_range_m:
            return NakCode.OUT_OF_RANGE
        if not self._stable_now(t_s):
            return NakCode.NOT_STABLE
        return None

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
        why = self._refusal(t_s)
        if why is not None:
            return [codec.Nak(req.seq, 0, why.value)]
        avg_s = req.average_ms / 1000
        n = max(1, round(avg_s * self.config.sample_rate_hz))
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
        if not self._stable_now(t_s):
            m.unstable = True  # the target moved at some time during the window
        if self.now_us() < m.end_us:
            return []
        self._meas = None
        if self._overlapping(FaultKind.BEAM_BREAK, m.start_sim_s, t_s):
            return [codec.Nak(m.seq, 0, NakCode.BEAM_BROKEN.value)]
        if self._overlapping(FaultKind.NO_TARGET, m.start_sim_s, t_s):
            return [codec.Nak(m.seq, 0, NakCode.NO_TARGET.value)]
        if m.unstable:
            return [codec.Nak(m.seq, 0, NakCode.NOT_STABLE.value)]
        return [self._faulty(self._measure(m, t_s), m, t_s)]

    def _faulty(self, reply: Any, m: _Measurement, t_s: float) -> Any:
        """The reply as the value faults active at ``t_s`` make it (legal on the wire,
        wrong in substance: the driver cannot tell, the daemon's checks must)."""
        if self._active(FaultKind.FROZEN, t_s):
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
        """Average of ``m.n`` samples: truth plus noise whose sigma shrinks as sqrt(n)."""
        c = self.config
        T = self.world.cell_T_target(t_s)
        root_n = math.sqrt(m.n)
        std_m = c.noise_m / root_n
        xyz = T[:3, 3] + self.rng.normal(0.0, 1.0, 3) * std_m
        flags = MeasurementFlags.NONE
        if np.linalg.norm(T[:3, 3]) > _NEAR_RANGE_FRACTION * c.max_range_m:
            flags |= MeasurementFlags.NEAR_RANGE_LIMIT
        t_mid_us = (m.start_us + m.end_us) // 2
        x, y, z = xyz * _M_TO_MM
        sx, sy, sz = std_m * _M_TO_MM
        if m.kind is MeasKind.POINT:
            return codec.PointReply(m.seq, 0, t_mid_us, m.n, x, y, z, sx, sy, sz, flags)
        std_rad = c.noise_rad / root_n
        # orientation noise about the target's own axes (right perturbation)
        R = T[:3, :3] @ so3_exp(self.rng.normal(0.0, 1.0, 3) * std_rad)
        T_meas = T.copy()
        T_meas[:3, :3] = R
        _, q = xyz_quat_from_transform(T_meas)
        srx, sry, srz = np.degrees(std_rad)
        qw, qx, qy, qz = (float(v) for v in q)
        return codec.PoseReply(
            m.seq, 0, t_mid_us, m.n, x, y, z, qw, qx, qy, qz, sx, sy, sz, srx, sry, srz, flags
        )


class SimTracker:
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
    starts the thread, :meth:`close` stops and joins it and closes every descriptor.
    """

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
        if transport not in Transport.ALL:
            raise ValueError(f"transport must be one of {Transport.ALL}, got {transport!r}")
        self.world = world
        self.transport = transport
        self.device = TrackerDevice(world, config, seed=seed, clock=clock)
        self._rng = np.random.default_rng([seed, 1])  # garbage: independent of the noise
        self._host, self._port = host, int(port)
        self._url: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r = self._wake_w = -1
        self._master = self._slave = -1
        self._listen: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._decoder = codec.Decoder(accept=codec.REQUEST_TYPES)
        # outgoing: (wall time to send at, bytes); trickle splits frames into bytes
        self._out: deque[tuple[float, bytes]] = deque()
        self._pending: deque[tuple[float, Any]] = deque()  # (send at, record)
        self._was_disconnected = False
        self.frames_in = 0
        self.frames_out = 0

    @property
    def config(self) -> TrackerConfig:
        """The device's configuration, with the faults injected so far."""
        return self.device.config

    def inject(self, kind: str | FaultKind, duration_s: float = math.inf, **params: Any) -> FaultConfig:
        """Start a fault now for ``duration_s`` simulated seconds (:meth:`TrackerDevice.inject`)."""
        return self.device.inject(kind, duration_s, **params)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """What :func:`cellcal.drivers.connect_tracker` takes: a pty path or socket:// URL."""
        if self._url is None:
            raise RuntimeError("SimTracker not started")
        return self._url

    def start(self) -> SimTracker:
        if self._thread is not None:
            return self
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        if self.transport == Transport.PTY:
            self._master, self._slave = os.openpty()
            # Raw mode: no echo, no CR/LF translation, no line editing -- bytes as sent.
            tty.setraw(self._slave)
            os.set_blocking(self._master, False)
            # The sim keeps the slave open so the master never reads EIO between clients.
            self._url = os.ttyname(self._slave)
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self._host, self._port))
            s.listen(1)
            s.setblocking(False)
            self._listen = s
            self._url = f"socket://{self._host}:{s.getsockname()[1]}"
        self._thread = threading.Thread(target=self._run, name=f"sim-tracker {self._url}", daemon=True)
        self._thread.start()
        log.info("sim tracker serving on %s", self._url)
        return self

    def close(self) -> None:
        """Stop the thread and close every descriptor (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
            thread.join(_JOIN_TIMEOUT_S)
            if thread.is_alive():  # pragma: no cover - a bug; say so rather than hang
                log.error("sim tracker thread did not stop")
        for fd_name in ("_master", "_slave", "_wake_r", "_wake_w"):
            fd = getattr(self, fd_name)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, fd_name, -1)
        for sock_name in ("_conn", "_listen"):
            s = getattr(self, sock_name)
            if s is not None:
                s.close()
                setattr(self, sock_name, None)

    def __enter__(self) -> SimTracker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the server thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step(self._wait_s())
        except Exception:  # pragma: no cover - keep the reason; the driver sees silence
            log.exception("sim tracker thread failed")

    def _wait_s(self) -> float:
        wait = _TICK_S
        nxt = self.device.next_event_wall_s()
        if nxt is not None:
            wait = min(wait, max(0.0, nxt))
        if self._out:
            wait = min(wait, max(0.0, self._out[0][0] - time.monotonic()))
        if self._pending:
            wait = min(wait, max(0.0, self._pending[0][0] - time.monotonic()))
        return wait

    def _step(self, wait_s: float) -> None:
        t_sim = self.world.now_s()
        down = self._fault(FaultKind.DISCONNECT, t_sim) is not None
        if down and not self._was_disconnected:
            log.info("sim tracker: link down (scheduled) at t=%.3f s", t_sim)
            self._drop_link()
        self._was_disconnected = down
        rlist: list[Any] = [self._wake_r]
        if self._master >= 0:
            rlist.append(self._master)
        if self._listen is not None:
            rlist.append(self._listen)
        if self._conn is not None:
            rlist.append(self._conn)
        readable, _, _ = select.select(rlist, [], [], wait_s)
        if self._wake_r in readable:
            try:
                os.read(self._wake_r, 64)
            except OSError:
                pass
        if self._listen is not None and self._listen in readable:
            self._accept(down)
        data = self._read_link(readable)
        rx_us = self.device.now_us()
        if data and not down:
            self._decoder.feed(data)
            for item in self._decoder.decode():
                if not isinstance(item, codec.TrackerProtocolError):
                    self.frames_in += 1
                self._reply(self.device.handle(item, rx_us))
        self._reply(self.device.poll())
        self._send_due(t_sim)

    def _accept(self, down: bool) -> None:
        try:
            assert self._listen is not None
            conn, _ = self._listen.accept()
        except (BlockingIOError, InterruptedError):
            return
        if down:
            conn.close()  # the "device" is unplugged: the connection dies at once
            return
        if self._conn is not None:
            self._conn.close()  # one client at a time: the newest wins
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn = conn
        self._decoder.reset()
        self._out.clear()
        self._pending.clear()

    def _drop_link(self) -> None:
        self._out.clear()
        self._pending.clear()
        self.device._meas = None  # the measurement dies with the link
        self._decoder.reset()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _read_link(self, readable: list) -> bytes:
        try:
            if self._master >= 0 and self._master in readable:
                return os.read(self._master, _READ_CHUNK)
            if self._conn is not None and self._conn in readable:
                data = self._conn.recv(_READ_CHUNK)
                if not data:  # client closed
                    self._conn.close()
                    self._conn = None
                return data
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""  # no client on the pty
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        return b""

    def _fault(self, kind: FaultKind, t_s: float) -> FaultConfig | None:
        for f in self.config.faults:
            if f.kind is kind and f.active(t_s):
                return f
        return None

    def _reply(self, records: list) -> None:
        send_at = time.monotonic() + self.device.latency_us / _US_PER_S / self.device._rate
        for rec in records:
            self._pending.append((send_at, rec))

    def _send_due(self, t_sim: float) -> None:
        now = time.monotonic()
        while self._pending and self._pending[0][0] <= now:
            _, rec = self._pending.popleft()
            # ts_us is when the frame leaves the device
            frame = codec.encode(dataclasses.replace(rec, ts_us=self.device.now_us()))
            self.frames_out += 1
            self._queue_frame(frame, t_sim, now)
        while self._out and self._out[0][0] <= time.monotonic():
            _, data = self._out.popleft()
            self._write(data)

    def _queue_frame(self, frame: bytes, t_sim: float, now: float) -> None:
        garbage = self._fault(FaultKind.GARBAGE, t_sim)
        if garbage is not None:
            if self._rng.random() < garbage.corrupt_probability:
                buf = bytearray(frame)
                k = int(self._rng.integers(len(buf)))
                buf[k] = (buf[k] + int(self._rng.integers(1, 256))) % 256  # always a change
                frame = bytes(buf)
            noise = self._rng.integers(0, 256, garbage.burst_bytes, dtype=np.uint8).tobytes()
            frame = noise + frame
        trickle = self._fault(FaultKind.TRICKLE, t_sim)
        if trickle is None:
            at = self._out[-1][0] if self._out else now
            self._out.append((at, frame))
            return
        step = trickle.byte_interval_ms / 1000 / self.device._rate
        at = max(now, self._out[-1][0] if self._out else now)
        for i in range(len(frame)):
            self._out.append((at + i * step, frame[i : i + 1]))

    def _write(self, data: bytes) -> None:
        try:
            if self._master >= 0:
                os.write(self._master, data)
            elif self._conn is not None:
                self._conn.sendall(data)
        except (BlockingIOError, InterruptedError):
            # A full buffer with nobody reading: a real UART drops bytes too.
            log.debug("sim tracker: output buffer full, %d byte(s) dropped", len(data))
        except OSError:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
