"""Serve one simulated instrument on a pty or a loopback TCP port, with the link faults.

:class:`LinkServer` is the I/O half every simulated instrument shares (the cellcal tracker,
emScon TPI, GeoCOM): a pty in raw mode (its URL names the slave path) or a TCP listener on
loopback (one client at a time; the newest connection wins), one thread with ``select``, the
device latency before each reply, and the scenario's link faults -- ``disconnect`` (silence
on a pty, the connection closed on TCP), ``garbage`` (random bytes before replies, some
replies corrupted) and ``trickle`` (replies sent one byte at a time). A protocol subclass
implements the ``_on_*`` hooks and :meth:`_encode`; it never touches a descriptor.

Times: the fault schedule is in simulated seconds (``world.now_s()``); latency and trickle
intervals are device time, turned into wall seconds by the device clock's rate.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import threading
import time
import tty
from collections import deque
from typing import Any, ClassVar

import numpy as np

from cellcal.sim.scenario import FaultConfig, FaultKind, TrackerConfig
from cellcal.sim.world import World

__all__ = ["LinkServer", "Transport"]

log = logging.getLogger(__name__)

#: Longest the server thread sleeps without calling :meth:`LinkServer._on_tick`.
TICK_S = 0.005
_READ_CHUNK = 4096
_JOIN_TIMEOUT_S = 5.0


class Transport:
    """Transports a :class:`LinkServer` can serve on."""

    PTY = "pty"
    TCP = "tcp"
    ALL = (PTY, TCP)


class LinkServer:
    """One instrument served on a pty or loopback TCP, in its own thread.

    Parameters
    ----------
    world : World
    config : TrackerConfig
        Latency, clock rate and the link faults of the schedule.
    transport : {"pty", "tcp"}
        Restricted by the subclass's :attr:`TRANSPORTS`.
    seed : int
        Seeds the garbage generator (independently of the device noise).
    host, port : str, int
        TCP listening address (port 0: any free port). Loopback only.

    Notes
    -----
    The constructor does no I/O; :meth:`start` (or ``with``) opens the pty or socket and
    starts the thread, :meth:`close` stops and joins it and closes every descriptor.
    """

    #: Transports this protocol is served on.
    TRANSPORTS: ClassVar[tuple[str, ...]] = Transport.ALL
    #: Link faults of the schedule this protocol's link shows.
    LINK_FAULTS: ClassVar[frozenset[FaultKind]] = frozenset(
        {FaultKind.DISCONNECT, FaultKind.GARBAGE, FaultKind.TRICKLE}
    )
    #: Name in log lines and the thread name.
    NAME: ClassVar[str] = "instrument"

    def __init__(
        self,
        world: World,
        config: TrackerConfig,
        *,
        transport: str = Transport.PTY,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if transport not in self.TRANSPORTS:
            raise ValueError(f"{self.NAME}: transport must be one of {self.TRANSPORTS}, got {transport!r}")
        self.world = world
        self.config = config
        self.transport = transport
        self._rng = np.random.default_rng([seed, 1])  # garbage: independent of the noise
        self._host, self._port = host, int(port)
        self._url: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r = self._wake_w = -1
        self._master = self._slave = -1
        self._listen: socket.socket | None = None
        self._conn: socket.socket | None = None
        # outgoing: (wall time to send at, bytes); trickle splits frames into bytes
        self._out: deque[tuple[float, bytes]] = deque()
        self._pending: deque[tuple[float, Any]] = deque()  # (send at, record)
        self._was_disconnected = False
        self._rate = 1.0 + config.clock_skew_ppm * 1e-6
        self.frames_in = 0
        self.frames_out = 0

    # -- protocol hooks ------------------------------------------------------------------------
    def _on_connect(self) -> None:
        """A new client (or a link that came back): forget any session state."""

    def _on_bytes(self, data: bytes) -> list[Any]:
        """Records to send in reply to ``data`` from the client."""
        raise NotImplementedError

    def _on_tick(self) -> list[Any]:
        """Records due now without a request (a measurement completing, an event)."""
        return []

    def _next_event_wall_s(self) -> float | None:
        """Wall seconds until :meth:`_on_tick` has something to send (None: nothing planned)."""
        return None

    def _on_link_drop(self) -> None:
        """The link went down (scheduled disconnect): what is in progress dies with it."""

    def _encode(self, record: Any) -> bytes:
        """The bytes of ``record``, made when it is sent."""
        raise NotImplementedError

    def _transport_delay_s(self) -> float:
        """Wall seconds a stamped frame waits before it is written (latency jitter); 0 here."""
        return 0.0

    def _make_url(self, transport: str, where: str | int) -> str:
        """The URL a driver connects with: ``where`` is the pty path or the TCP port."""
        raise NotImplementedError

    @property
    def _latency_s(self) -> float:
        return self.config.latency_ms / 1000 / self._rate

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """What :func:`cellcal.drivers.connect_tracker` takes for this instrument."""
        if self._url is None:
            raise RuntimeError(f"{type(self).__name__} not started")
        return self._url

    def start(self) -> Any:
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
            self._url = self._make_url(Transport.PTY, os.ttyname(self._slave))
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self._host, self._port))
            s.listen(1)
            s.setblocking(False)
            self._listen = s
            self._url = self._make_url(Transport.TCP, s.getsockname()[1])
        self._thread = threading.Thread(target=self._run, name=f"sim-{self.NAME} {self._url}", daemon=True)
        self._thread.start()
        log.info("sim %s serving on %s", self.NAME, self._url)
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
                log.error("sim %s thread did not stop", self.NAME)
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

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the server thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step(self._wait_s())
        except Exception:  # pragma: no cover - keep the reason; the driver sees silence
            log.exception("sim %s thread failed", self.NAME)

    def _wait_s(self) -> float:
        wait = TICK_S
        nxt = self._next_event_wall_s()
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
            log.info("sim %s: link down (scheduled) at t=%.3f s", self.NAME, t_sim)
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
        if data and not down:
            self._reply(self._on_bytes(data))
        if not down:
            self._reply(self._on_tick())
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
        self._out.clear()
        self._pending.clear()
        self._on_connect()

    def _drop_link(self) -> None:
        self._out.clear()
        self._pending.clear()
        self._on_link_drop()
        self._on_connect()
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
                    self._on_link_drop()
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
        if kind not in self.LINK_FAULTS:
            return None
        for f in self.config.faults:
            if f.kind is kind and f.active(t_s):
                return f
        return None

    def _reply(self, records: list) -> None:
        send_at = time.monotonic() + self._latency_s
        for rec in records:
            self._pending.append((send_at, rec))

    def _send_due(self, t_sim: float) -> None:
        now = time.monotonic()
        while self._pending and self._pending[0][0] <= now:
            _, rec = self._pending.popleft()
            frame = self._encode(rec)
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
            # the frame is stamped; the wire (a busy UART, a loaded host) may still hold it
            at = max(now + self._transport_delay_s(), self._out[-1][0] if self._out else now)
            self._out.append((at, frame))
            return
        step = trickle.byte_interval_ms / 1000 / self._rate
        at = max(now, self._out[-1][0] if self._out else now)
        for i in range(len(frame)):
            self._out.append((at + i * step, frame[i : i + 1]))

    def _write(self, data: bytes) -> None:
        try:
            if self._master >= 0:
                os.write(self._master, data)
            elif self._conn is not None:
                # whole packets in one write: some clients (cesapi) expect each packet to
                # arrive in one piece
                self._conn.setblocking(True)
                self._conn.settimeout(1.0)
                try:
                    self._conn.sendall(data)
                finally:
                    if self._conn is not None:
                        self._conn.setblocking(False)
        except (BlockingIOError, InterruptedError):
            # A full buffer with nobody reading: a real UART drops bytes too.
            log.debug("sim %s: output buffer full, %d byte(s) dropped", self.NAME, len(data))
        except OSError:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
