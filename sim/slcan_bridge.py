"""The simulated CAN bus seen from other processes: an SLCAN (Lawicel ASCII) adapter on loopback.

The simulated drives (:mod:`cellcal.sim.canopen_sim`) live on a python-can ``virtual`` bus,
which exists only inside the simulator's process. :class:`SlcanBridge` plugs a simulated
USB-CAN adapter into that bus and serves it the way a real adapter is reached: as a serial
line speaking the Lawicel command set (the ``slcan`` protocol of CANUSB, CANable and
friends), on ``socket://127.0.0.1:PORT`` (every accepted connection is one more adapter on
the bus) or on a pty. python-can's ``slcan`` interface opens either through pyserial's
``serial_for_url``, so another process reads the drives with::

    canopen://socket://127.0.0.1:PORT?interface=slcan&sleep_after_open_s=0&...

Nothing leaves the loopback: the bridge binds 127.0.0.0/8 only (a pty never leaves the
machine at all). ADR 0010 says why this and not python-can's ``udp_multicast``.

The Lawicel commands served (each line ends with CR, 0x0D; an answer is CR for success and
BEL, 0x07, for an error)::

    Sn        bitrate 0..8 = 10k 20k 50k 100k 125k 250k 500k 800k 1M (9 = 83.3k, as python-can
              has it); channel closed only
    sxxyy     BTR0/BTR1 of an SJA1000 (stored); channel closed only
    O / L / C open / open listen-only / close the channel (C on a closed channel: BEL)
    tiiildd.. transmit a standard frame (iii hex id, l 0..8, 2l hex data)  -> z CR
    Tiiiiiiiildd..  transmit an extended frame                              -> Z CR
    riiil / Riiiiiiiil  transmit a remote frame                             -> z CR / Z CR
    F         status flags -> Fxx CR (bit 3 data overrun, cleared by reading)
    V / N     version -> V0101 CR, serial number -> NCC01 CR
    Zn        receive timestamps off/on (4 hex digits of ms, 0..EA5F); channel closed only
    Mxxxxxxxx / mxxxxxxxx  acceptance code / mask (stored; every frame passes)
    Xn        auto-poll off/on (on by default: frames are pushed as they arrive)
    P / A     poll one / all queued frames when auto-poll is off (A ends with A CR)
    CR alone  CR

Frames received from the bus while the channel is open go out as ``tiiildd..[tttt] CR``
(``T``, ``r``, ``R`` likewise). A transmit while closed or listen-only, an unknown command
or a malformed line gets BEL. Deviations from a hardware adapter, because the bus is
simulated: there is no bit timing, so every ``S``/``s`` setting receives every frame (a
real adapter at the wrong bitrate sees only error frames); acceptance filters are stored
and reported but not applied; CAN FD and error frames are not carried.

What python-can's ``slcan`` sends at open (python-can 4.6, ``can/interfaces/slcan.py``):
with a ``bitrate``: ``C``, ``Sn``, an empty line, ``O``; then ``O`` again; without one just
``O``; at shutdown ``C``. It never waits for the answers (it skips the CR/BEL lines and the
``z`` acknowledges while receiving) and waits ``sleep_after_open`` (2 s by default) after
opening the port, which the simulator's URL sets to 0.

The codec (:class:`LineSplitter`, :func:`parse_command`, :func:`encode_frame`) is pure
bytes in, records out and lives in :mod:`cellcal.drivers.slcan_codec`, which the CAN
driver's receive path shares (re-exported here); :class:`SlcanAdapter` is the adapter's
state without I/O.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import select
import socket
import threading
import time
import tty
from collections import deque
from typing import Any

from cellcal.drivers.slcan_codec import (
    BEL,
    CR,
    MAX_LINE,
    LineSplitter,
    SlcanCommand,
    SlcanFrame,
    encode_frame,
    parse_command,
)
from cellcal.sim.errors import SimError

__all__ = [
    "BEL",
    "CR",
    "MAX_LINE",
    "SlcanFrame",
    "SlcanCommand",
    "LineSplitter",
    "parse_command",
    "encode_frame",
    "SlcanAdapter",
    "SlcanBridge",
    "LAWICEL_BITRATES",
]

log = logging.getLogger(__name__)


#: ``Sn`` code -> bit/s (Lawicel; 9 is the 83.3 kbit/s python-can adds).
LAWICEL_BITRATES = {
    0: 10_000,
    1: 20_000,
    2: 50_000,
    3: 100_000,
    4: 125_000,
    5: 250_000,
    6: 500_000,
    7: 800_000,
    8: 1_000_000,
    9: 83_300,
}

VERSION_REPLY = b"V0101"
SERIAL_REPLY = b"NCC01"
STATUS_DATA_OVERRUN = 0x08
_POLL_FIFO = 64  # frames an adapter holds when auto-poll is off (then: data overrun)


class SlcanAdapter:
    """What a Lawicel adapter does with a command, without I/O.

    :meth:`handle` takes one command and returns the bytes to answer and the frame to put on
    the bus (or ``None``); :meth:`receive` takes a frame from the bus and returns the bytes
    to push to the host (empty when the channel is closed or auto-poll is off).
    """

    def __init__(self, clock_ms: Any = None) -> None:
        self.open = False
        self.listen_only = False
        self.bitrate: int | None = None
        self.btr: int | None = None
        self.timestamps = False
        self.autopoll = True
        self.acceptance_code = 0x00000000
        self.acceptance_mask = 0xFFFFFFFF
        self.flags = 0
        self._fifo: deque[bytes] = deque()
        self._clock_ms = clock_ms or (lambda: int(time.monotonic() * 1000))

    def handle(self, cmd: SlcanCommand | None) -> tuple[bytes, SlcanFrame | None]:
        """Answer one command (``None``: an overlong line)."""
        if cmd is None or cmd.kind == "invalid":
            return BEL, None
        k = cmd.kind
        if k == "empty":
            return CR, None
        if k == "transmit":
            if not self.open or self.listen_only or cmd.frame is None:
                return BEL, None
            return (b"Z" if cmd.frame.extended else b"z") + CR, cmd.frame
        if k in ("bitrate", "btr", "timestamps", "autopoll", "acceptance_code", "acceptance_mask"):
            if self.open:
                return BEL, None  # configuration only while the channel is closed
            if k == "bitrate":
                if cmd.value not in LAWICEL_BITRATES:
                    return BEL, None
                self.bitrate, self.btr = LAWICEL_BITRATES[cmd.value], None
            elif k == "btr":
                self.bitrate, self.btr = None, cmd.value
            elif k == "timestamps":
                self.timestamps = bool(cmd.value)
            elif k == "autopoll":
                self.autopoll = bool(cmd.value)
            elif k == "acceptance_code":
                self.acceptance_code = cmd.value
            else:
                self.acceptance_mask = cmd.value
            return CR, None
        if k in ("open", "listen"):
            if self.open:
                return BEL, None
            self.open, self.listen_only = True, k == "listen"
            self._fifo.clear()
            return CR, None
        if k == "close":
            if not self.open:
                return BEL, None
            self.open = self.listen_only = False
            self._fifo.clear()
            return CR, None
        if k == "status":
            if not self.open:
                return BEL, None
            flags, self.flags = self.flags, 0
            return f"F{flags:02X}".encode("ascii") + CR, None
        if k == "version":
            return VERSION_REPLY + CR, None
        if k == "serial":
            return SERIAL_REPLY + CR, None
        if k in ("poll", "poll_all"):
            if not self.open or self.autopoll:
                return BEL, None
            if k == "poll":
                return (self._fifo.popleft() if self._fifo else CR), None
            out = b"".join(self._fifo) + b"A" + CR
            self._fifo.clear()
            return out, None
        return BEL, None  # pragma: no cover - every kind is handled above

    def receive(self, frame: SlcanFrame) -> bytes:
        """A frame seen on the bus: the bytes to push now (auto-poll) or b"" (queued/dropped)."""
        if not self.open:
            return b""
        line = encode_frame(frame, self._clock_ms() if self.timestamps else None)
        if self.autopoll:
            return line
        if len(self._fifo) >= _POLL_FIFO:
            self.flags |= STATUS_DATA_OVERRUN
        else:
            self._fifo.append(line)
        return b""

    def note_overrun(self) -> None:
        """The host did not read fast enough and frames were dropped."""
        self.flags |= STATUS_DATA_OVERRUN


# -- serving -------------------------------------------------------------------------------------
def check_loopback(host: str) -> str:
    """``host`` as an IPv4 loopback literal; anything outside 127.0.0.0/8 is refused."""
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"SLCAN bridge: host {host!r} is not an IP address; use 127.0.0.1") from None
    if addr.version != 4 or not addr.is_loopback:
        raise ValueError(f"SLCAN bridge: host {host} is outside 127.0.0.0/8; the bridge serves loopback only")
    return host


def _to_frame(msg: Any) -> SlcanFrame | None:
    if getattr(msg, "is_error_frame", False) or getattr(msg, "is_fd", False):
        return None
    try:
        return SlcanFrame(int(msg.arbitration_id), b"" if msg.is_remote_frame else bytes(msg.data),
                          bool(msg.is_extended_id), bool(msg.is_remote_frame), int(msg.dlc))
    except ValueError:
        return None


class _Link:
    """One adapter: a host connection (socket or pty master) and its own bus handle."""

    def __init__(self, bridge: SlcanBridge, name: str, *, sock: socket.socket | None = None,
                 fd: int = -1) -> None:
        import can

        self.bridge = bridge
        self.name = name
        self.sock = sock
        self.fd = fd
        self.adapter = SlcanAdapter()
        self.splitter = LineSplitter()
        self.bus = can.Bus(interface=bridge.interface, channel=bridge.channel, receive_own_messages=False)
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self.rx_lines = 0
        self.tx_frames = 0
        self._threads = [
            threading.Thread(target=self._host_to_bus, name=f"slcan {name} host->bus", daemon=True),
            threading.Thread(target=self._bus_to_host, name=f"slcan {name} bus->host", daemon=True),
        ]

    def start(self) -> _Link:
        for t in self._threads:
            t.start()
        return self

    @property
    def alive(self) -> bool:
        return not self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        try:
            self.bus.shutdown()
        except Exception:  # noqa: BLE001 - closing must go on
            log.debug("slcan %s: bus shutdown error", self.name, exc_info=True)

    # host side I/O
    def _write(self, data: bytes) -> bool:
        if not data:
            return True
        with self._send_lock:
            try:
                if self.sock is not None:
                    self.sock.sendall(data)
                else:
                    view = memoryview(data)
                    deadline = time.monotonic() + 0.5
                    while view:
                        try:
                            n = os.write(self.fd, view)
                            view = view[n:]
                        except BlockingIOError:
                            if time.monotonic() > deadline:
                                return False  # nobody reads the pty: drop, as a UART does
                            select.select([], [self.fd], [], 0.01)
                return True
            except (TimeoutError, BlockingIOError):
                return False
            except OSError:
                self._stop.set()
                return False

    def send_raw(self, data: bytes) -> bool:
        """Write ``data`` to the host as it is, between two whole lines (a fault injection:
        what a damaged serial line delivers). ``False`` if it could not be written."""
        return self._write(bytes(data))

    def _read(self) -> bytes | None:
        """Some bytes from the host, b"" on a quiet poll, None once the host is gone."""
        fileno = self.sock.fileno() if self.sock is not None else self.fd
        try:
            readable, _, _ = select.select([fileno], [], [], 0.05)
        except (OSError, ValueError):
            return None
        if not readable:
            return b""
        try:
            if self.sock is not None:
                data = self.sock.recv(4096)
                return data if data else None
            return os.read(self.fd, 4096)
        except (BlockingIOError, InterruptedError):
            return b""
        except OSError as exc:
            if self.sock is None and exc.errno == errno.EIO:
                time.sleep(0.02)  # no process has the pty open: wait for the next one
                return b""
            return None

    def _host_to_bus(self) -> None:
        import can

        try:
            while not self._stop.is_set() and not self.bridge.stopping:
                data = self._read()
                if data is None:
                    break
                for line in self.splitter.feed(data):
                    self.rx_lines += 1
                    cmd = None if line is None else parse_command(line)
                    reply, frame = self.adapter.handle(cmd)
                    if frame is not None:
                        msg = can.Message(arbitration_id=frame.can_id, data=frame.data,
                                          is_extended_id=frame.extended, is_remote_frame=frame.remote,
                                          dlc=frame.dlc)
                        try:
                            self.bus.send(msg)
                        except can.CanError:
                            reply = BEL
                    self._write(reply)
        except Exception:  # pragma: no cover - keep the reason; the host sees silence
            log.exception("slcan %s: host->bus failed", self.name)
        finally:
            self._stop.set()

    def _bus_to_host(self) -> None:
        try:
            while not self._stop.is_set():
                msg = self.bus.recv(timeout=0.05)
                if msg is None:
                    continue
                out = bytearray()
                while msg is not None and len(out) < 4096:
                    frame = _to_frame(msg)
                    if frame is not None:
                        out += self.adapter.receive(frame)
                        self.tx_frames += 1
                    msg = self.bus.recv(timeout=0)
                if not self._write(bytes(out)):
                    self.adapter.note_overrun()
                if msg is not None:  # the batch was full: this one goes into the next
                    frame = _to_frame(msg)
                    if frame is not None and not self._write(self.adapter.receive(frame)):
                        self.adapter.note_overrun()
        except Exception:  # pragma: no cover
            log.exception("slcan %s: bus->host failed", self.name)
        finally:
            self._stop.set()


class SlcanBridge:
    """A python-can bus served as SLCAN adapters on loopback TCP or a pty.

    Parameters
    ----------
    channel : str
        The python-can channel of the bus to expose (the simulated drives' ``virtual``
        channel).
    interface : str
        Its python-can interface (``virtual``).
    transport : {"tcp", "pty"}
        ``tcp``: listen on ``host:port``, each connection one adapter (several processes
        may be on the bus at once). ``pty``: one adapter on a pty; its path is the channel.
    host : str
        Loopback address to listen on (127.0.0.0/8 only; anything else raises ``ValueError``).
    port : int
        TCP port (0: the OS picks a free one).

    Notes
    -----
    The constructor does no I/O; :meth:`start` (or ``with``) binds and starts the threads;
    :meth:`close` stops them, closes every connection and the bus handles (idempotent).
    """

    TRANSPORTS = ("tcp", "pty")

    def __init__(self, channel: str, interface: str = "virtual", *, transport: str = "tcp",
                 host: str = "127.0.0.1", port: int = 0) -> None:
        if transport not in self.TRANSPORTS:
            raise ValueError(f"SLCAN bridge: transport must be one of {self.TRANSPORTS}, got {transport!r}")
        self.channel = channel
        self.interface = interface
        self.transport = transport
        self.host = check_loopback(host)
        self.port = int(port)
        self.stopping = False
        self._listen: socket.socket | None = None
        self._master = self._slave = -1
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._accept_thread: threading.Thread | None = None
        self._channel_url: str | None = None

    @property
    def channel_url(self) -> str:
        """What python-can's ``slcan`` opens: ``socket://127.0.0.1:PORT`` or the pty path."""
        if self._channel_url is None:
            raise SimError("SLCAN bridge not started")
        return self._channel_url

    @property
    def links(self) -> list[Any]:
        """The adapters currently connected (one per host connection)."""
        with self._lock:
            return [lk for lk in self._links if lk.alive]

    def send_raw_to_hosts(self, data: bytes) -> int:
        """Write ``data`` unchanged to every connected host, between whole lines (the
        simulated drives' ``garbled_can_line`` fault); returns how many hosts got it."""
        return sum(lk.send_raw(data) for lk in self.links)

    def start(self) -> SlcanBridge:
        if self._channel_url is not None:
            return self
        if self.transport == "pty":
            self._master, self._slave = os.openpty()
            tty.setraw(self._slave)
            os.set_blocking(self._master, False)
            self._channel_url = os.ttyname(self._slave)
            # keep the slave open: the master then never reads EIO between two clients
            self._links.append(_Link(self, self._channel_url, fd=self._master).start())
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self.host, self.port))
            s.listen(8)
            s.settimeout(0.1)
            self._listen = s
            self.port = s.getsockname()[1]
            self._channel_url = f"socket://{self.host}:{self.port}"
            self._accept_thread = threading.Thread(target=self._accept_loop, name="slcan accept", daemon=True)
            self._accept_thread.start()
        log.info("SLCAN bridge for %s/%s on %s", self.interface, self.channel, self._channel_url)
        return self

    def _accept_loop(self) -> None:
        assert self._listen is not None
        while not self.stopping:
            try:
                conn, peer = self._listen.accept()
            except TimeoutError:
                self._reap()
                continue
            except OSError:
                break
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(1.0)  # a host that stops reading: frames dropped, not the bridge
            link = _Link(self, f"{peer[0]}:{peer[1]}", sock=conn)
            with self._lock:
                if self.stopping:
                    conn.close()
                    break
                self._links.append(link.start())
            log.info("SLCAN bridge: adapter connected from %s:%d", *peer)

    def _reap(self) -> None:
        with self._lock:
            dead = [lk for lk in self._links if not lk.alive]
            self._links = [lk for lk in self._links if lk.alive]
        for lk in dead:
            lk.close()

    def close(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=2.0)
        with self._lock:
            links, self._links = self._links, []
        for lk in links:
            lk.close()
        if self._listen is not None:
            self._listen.close()
            self._listen = None
        for name in ("_master", "_slave"):
            fd = getattr(self, name)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, -1)

    def __enter__(self) -> SlcanBridge:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
