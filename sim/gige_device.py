"""A simulated GigE Vision camera: GVCP on ``<address>:3956``, a GVSP stream, our own GenICam.

It speaks the protocol of :mod:`cellcal.drivers.gige_codec` as a device does, so our
driver and Aravis's own tools (``arv-tool-0.8 -a <address>``, ``arv-camera-test-0.8``)
both read it (``tests/test_gige_sim_peers.py``): the independent check the other way round
from our driver against Aravis's fake camera. ``docs/protocols/gige.md`` has the register
map.

What it does as a device:

* serves the bootstrap registers, the GenICam XML ``sim/gige_camera.xml`` (zipped, or plain
  with ``zip_xml=False``) from its memory at :data:`XML_ADDRESS`, and the registers the XML
  names;
* grants control privilege to one application at a time (writes from anyone else are
  refused with ``ACCESS_DENIED``) and takes it back, stopping the stream, when no command
  came from it within the heartbeat timeout;
* keeps a clock of its own (:class:`DeviceClock`: tick frequency, offset, drift), latched
  by the timestamp control register and stamped into each leader at the **start of the
  exposure**; the packets of a frame leave after the exposure has ended;
* streams free-running at ``AcquisitionFrameRate`` or one frame per ``TriggerSoftware``;
* with ``ChunkModeActive`` on, appends the exposure and gain its frame source applied to each
  frame as chunk data (payload type 0x4001);
* answers a DISCOVERY command by unicast to its sender only; it never sends a broadcast.

``python -m cellcal.sim.gige_device --address 127.0.0.2`` serves one in a process of its own.

**Frame source protocol.** What the camera sees comes from a :class:`FrameSource`: one
method, ``frame(request: FrameRequest) -> RenderedFrame``, called in the stream thread once
per frame after its exposure has ended. ``request`` says which frame (``index`` from 0 at
acquisition start), when its exposure began (``t_start_ns``, host ``time.monotonic_ns()``),
and the settings the registers hold (size, pixel format, exposure, gain). The source returns
the image (``(height, width)`` uint8 for Mono8, uint16 for Mono16) and the exposure and gain
it applied. :class:`TestPatternSource` is the one shipped here; the rendering camera of
``sim/camera.py`` plugs in through the same method.
"""

from __future__ import annotations

import io
import ipaddress
import logging
import math
import socket
import struct
import threading
import time
import zipfile
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

import numpy as np

from cellcal.drivers import gige_codec as gc
from cellcal.sim.errors import SimError

__all__ = [
    "GigeDevice",
    "DeviceClock",
    "FrameSource",
    "FrameRequest",
    "RenderedFrame",
    "TestPatternSource",
    "XML_ADDRESS",
    "DEVICE_REGS",
]

log = logging.getLogger(__name__)

#: Where the (zipped) GenICam XML lives in the device's memory.
XML_ADDRESS = 0x0010_0000
#: The device's own registers (the XML's), byte addresses.
DEVICE_REGS = {
    "SensorWidth": 0x10000, "SensorHeight": 0x10004, "Width": 0x10008, "Height": 0x1000C,
    "PixelFormat": 0x10010, "AcquisitionMode": 0x10018, "AcquisitionStart": 0x1001C,
    "AcquisitionStop": 0x10020, "TriggerMode": 0x10024, "TriggerSource": 0x10028,
    "TriggerSoftware": 0x1002C, "ExposureTime": 0x10030, "GainRaw": 0x10038,
    "AcquisitionFrameRate": 0x1003C, "ReverseX": 0x10040, "ChunkModeActive": 0x10044,
    "ChunkSelector": 0x10048, "ChunkEnable": 0x1004C,  # ChunkEnable[selector] at 0x1004C + 4 * selector
}
#: Chunk ids of the exposure (us, 8-byte float) and gain (dB, 8-byte float) chunks (the XML's).
CHUNK_EXPOSURE_ID = 0x0A000001
CHUNK_GAIN_ID = 0x0A000002
_MEMORY_BYTES = 0x20000
_MONO = {gc.PIXEL_FORMATS["Mono8"]: np.uint8, gc.PIXEL_FORMATS["Mono16"]: np.uint16}
_NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class FrameRequest:
    """What the device asks its :class:`FrameSource` for (see the module docstring)."""

    index: int
    t_start_ns: int
    width: int
    height: int
    pixel_format: str
    exposure_s: float
    gain_db: float


@dataclass(frozen=True, eq=False)
class RenderedFrame:
    """A source's answer: the image, and the exposure (s) and gain (dB) it applied."""

    image: np.ndarray
    exposure_s: float
    gain_db: float


class FrameSource(Protocol):
    def frame(self, request: FrameRequest) -> RenderedFrame: ...


class TimestampClock(Protocol):
    """The device's timestamp counter (:class:`DeviceClock`, or a rendered camera's own clock)."""

    tick_frequency_hz: int

    def ticks(self, host_ns: int) -> int: ...

    def reset(self, host_ns: int) -> None: ...


class TestPatternSource:
    """A deterministic pattern: pixel ``(x, y)`` of frame ``index`` is ``(x + y + index) % 256``
    (Mono8) or that times 256 (Mono16). :meth:`expected` gives it back, so a test can check
    every pixel of a frame it received, which no torn or mixed frame passes."""

    __test__ = False  # not a pytest class, whatever its name

    @staticmethod
    def expected(index: int, width: int, height: int, pixel_format: str = "Mono8") -> np.ndarray:
        y, x = np.mgrid[0:height, 0:width]
        base = (x + y + index) % 256
        if pixel_format == "Mono16":
            return (base * 256).astype(np.uint16)
        return base.astype(np.uint8)

    def frame(self, request: FrameRequest) -> RenderedFrame:
        img = self.expected(request.index, request.width, request.height, request.pixel_format)
        return RenderedFrame(img, request.exposure_s, request.gain_db)


class DeviceClock:
    """The camera's own clock: ``ticks = round((offset_s + (t - t0) * (1 + drift)) * f)``.

    Parameters
    ----------
    tick_frequency_hz : int
        Ticks per second (GigE Vision cameras commonly count at 125 MHz or 1 GHz).
    offset_s : float
        Device time at construction (how long it has "been on").
    drift_ppm : float
        How much faster than the host's monotonic clock it runs (parts per million).
    """

    def __init__(self, tick_frequency_hz: int = 125_000_000, *, offset_s: float = 1000.0,
                 drift_ppm: float = 0.0) -> None:
        if not tick_frequency_hz > 0:
            raise SimError(f"tick_frequency_hz must be > 0, got {tick_frequency_hz}")
        self.tick_frequency_hz = int(tick_frequency_hz)
        self.offset_s = float(offset_s)
        self.drift = float(drift_ppm) * 1e-6
        self._t0_ns = time.monotonic_ns()

    def seconds(self, host_ns: int) -> float:
        """Device time (s) at host ``time.monotonic_ns()`` ``host_ns``."""
        return self.offset_s + (host_ns - self._t0_ns) / _NS_PER_S * (1.0 + self.drift)

    def ticks(self, host_ns: int) -> int:
        return max(0, round(self.seconds(host_ns) * self.tick_frequency_hz))

    def reset(self, host_ns: int) -> None:
        """Timestamp control's reset bit: the count restarts from 0 now."""
        self.offset_s -= self.seconds(host_ns)


class GigeDevice:
    """A simulated GigE Vision camera on one loopback address.

    Parameters
    ----------
    address : str
        IPv4 address to serve on (a loopback address in tests: ``127.0.0.2`` ...). Never
        ``0.0.0.0``.
    port : int
        GVCP port (3956, what every client expects; another for our own driver only).
    source : FrameSource, optional
        What the camera sees; :class:`TestPatternSource` by default.
    clock : DeviceClock, optional
        The camera's clock; any object with ``tick_frequency_hz`` (int), ``ticks(host_ns)``
        and ``reset(host_ns)`` will do (a renderer with a clock of its own passes that).
    serial, model, vendor, firmware : str
        The bootstrap identity.
    sensor : (int, int)
        Sensor width and height (px); the image is the full sensor by default.
    frame_rate_hz, exposure_s, gain_db : float
        Initial settings.
    packet_size : int
        Initial GVSP packet size (bytes, IP and UDP headers included).
    zip_xml : bool
        Serve the XML zipped (the URL ends in ``.zip``) or plain.
    lost_packet_ratio : float
        Share of stream packets not sent (seeded), to show torn frames are dropped.
    seed : int
        Seed of the packet loss.
    """

    def __init__(self, address: str, port: int = gc.GVCP_PORT, *, source: FrameSource | None = None,
                 clock: TimestampClock | None = None, serial: str = "SIM0001", model: str = "SimCam",
                 vendor: str = "cellcal", firmware: str = "1.0.0", sensor: tuple[int, int] = (640, 480),
                 frame_rate_hz: float = 20.0, exposure_s: float = 0.005, gain_db: float = 0.0,
                 packet_size: int = 1400, zip_xml: bool = True, lost_packet_ratio: float = 0.0,
                 seed: int = 0) -> None:
        addr = ipaddress.IPv4Address(address)
        if addr.is_unspecified or addr.is_multicast or str(addr) == "255.255.255.255":
            raise SimError(f"the simulated camera serves on one address, not {address}")
        self.address, self.port = str(addr), int(port)
        self.source: FrameSource = source or TestPatternSource()
        self.clock: TimestampClock = clock or DeviceClock()
        self.lost_packet_ratio = float(lost_packet_ratio)
        self._rng = np.random.default_rng(seed)
        self._mem = bytearray(_MEMORY_BYTES)
        xml = resources.files("cellcal.sim").joinpath("gige_camera.xml").read_bytes()
        if zip_xml:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
                zf.writestr("cellcal-simcam.xml", xml)
            blob, name = buf.getvalue(), "cellcal-simcam.zip"
        else:
            blob, name = xml, "cellcal-simcam.xml"
        self._xml = blob + b"\0" * (-len(blob) % 4)
        self._init_registers(serial, model, vendor, firmware, sensor, frame_rate_hz, exposure_s, gain_db,
                             packet_size, f"Local:{name};{XML_ADDRESS:X};{len(blob):X}")
        self._lock = threading.RLock()
        self._controller: tuple[str, int] | None = None
        self._controller_seen = 0.0
        self._acquiring = False
        self._trigger = threading.Event()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._gvcp: socket.socket | None = None
        self._gvsp: socket.socket | None = None
        self.block_id = 0
        self._index = 0
        #: frames sent (complete or with packets left out), GVCP commands answered
        self.frames_sent = 0
        self.commands = 0
        #: every (address, port) a datagram was sent to (a test checks none leaves loopback)
        self.destinations: set[tuple[str, int]] = set()

    # -- registers -----------------------------------------------------------------------------
    def _w32(self, address: int, value: int) -> None:
        struct.pack_into(">I", self._mem, address, value & 0xFFFFFFFF)

    def _r32(self, address: int) -> int:
        return int(struct.unpack_from(">I", self._mem, address)[0])

    def _init_registers(self, serial: str, model: str, vendor: str, firmware: str, sensor: tuple[int, int],
                        fps: float, exposure_s: float, gain_db: float, packet_size: int, url: str) -> None:
        for reg, text in ((gc.Reg.MANUFACTURER_NAME, vendor), (gc.Reg.MODEL_NAME, model),
                          (gc.Reg.DEVICE_VERSION, firmware), (gc.Reg.MANUFACTURER_INFO, "cellcal simulator"),
                          (gc.Reg.SERIAL_NUMBER, serial), (gc.Reg.FIRST_URL, url)):
            raw = text.encode("ascii")
            if len(raw) >= gc.STRING_LENGTHS[reg]:
                raise SimError(f"{text!r} does not fit bootstrap register 0x{reg:X}")
            self._mem[reg:reg + len(raw)] = raw
        self._w32(gc.Reg.VERSION, (2 << 16) | 0)
        self._w32(gc.Reg.DEVICE_MODE, 1 << 31)  # big-endian registers
        self._w32(gc.Reg.MAC_HIGH, 0x0000_02CE)  # a locally administered MAC
        self._w32(gc.Reg.MAC_LOW, 0x1CA1_0001)
        self._mem[gc.Reg.CURRENT_IP:gc.Reg.CURRENT_IP + 4] = ipaddress.IPv4Address(self.address).packed
        self._w32(gc.Reg.CURRENT_SUBNET, 0xFF00_0000)
        self._w32(gc.Reg.N_NETWORK_INTERFACES, 1)
        self._w32(gc.Reg.N_STREAM_CHANNELS, 1)
        self._w32(gc.Reg.GVCP_CAPABILITY, (1 << 31) | (1 << 30) | (1 << 1) | (1 << 0))  # names, serial, WRITEMEM, concat.
        self._w32(gc.Reg.HEARTBEAT_TIMEOUT, 3000)
        f = self.clock.tick_frequency_hz
        self._w32(gc.Reg.TIMESTAMP_FREQ_HIGH, f >> 32)
        self._w32(gc.Reg.TIMESTAMP_FREQ_LOW, f & 0xFFFFFFFF)
        self._w32(gc.Reg.SCPS0, packet_size)
        d = DEVICE_REGS
        w, h = sensor
        for name, v in (("SensorWidth", w), ("SensorHeight", h), ("Width", w), ("Height", h),
                        ("PixelFormat", gc.PIXEL_FORMATS["Mono8"]), ("GainRaw", round(gain_db * 10))):
            self._w32(d[name], v)
        struct.pack_into(">d", self._mem, d["ExposureTime"], exposure_s * 1e6)
        struct.pack_into(">f", self._mem, d["AcquisitionFrameRate"], fps)

    def _read(self, address: int, count: int) -> bytes | None:
        if 0 <= address and address + count <= _MEMORY_BYTES:
            return bytes(self._mem[address:address + count])
        off = address - XML_ADDRESS
        if 0 <= off and off + count <= len(self._xml) + 512:
            return (self._xml[off:off + count]).ljust(count, b"\0")
        return None

    _READ_ONLY = (range(0, 0x604), range(0x900, 0x938), range(0x93C, 0x944), range(0x948, 0x950),
                  range(0x10000, 0x10008))

    def _write(self, address: int, value: int, sender: tuple[str, int]) -> int:
        """One 32-bit register write; returns a GVCP status."""
        if address % 4:
            return gc.Status.BAD_ALIGNMENT
        if not 0 <= address < _MEMORY_BYTES:
            return gc.Status.INVALID_ADDRESS
        if any(address in r for r in self._READ_ONLY):
            return gc.Status.WRITE_PROTECT
        d = DEVICE_REGS
        now = time.monotonic_ns()
        if address == gc.Reg.CCP:
            if value & (gc.CCP_CONTROL | gc.CCP_EXCLUSIVE):
                self._controller = sender
            else:
                self._controller = None
                self._stop_acquisition()
            self._w32(address, value & 0x3)
            return gc.Status.SUCCESS
        if address == gc.Reg.TIMESTAMP_CONTROL:
            if value & gc.TIMESTAMP_RESET:
                self.clock.reset(now)
            if value & gc.TIMESTAMP_LATCH:
                ticks = self.clock.ticks(now)
                self._w32(gc.Reg.TIMESTAMP_VALUE_HIGH, ticks >> 32)
                self._w32(gc.Reg.TIMESTAMP_VALUE_LOW, ticks & 0xFFFFFFFF)
            return gc.Status.SUCCESS
        if address in (d["Width"], d["Height"]):
            limit = self._r32(d["SensorWidth"] if address == d["Width"] else d["SensorHeight"])
            if not 16 <= value <= limit or self._acquiring:
                return gc.Status.INVALID_PARAMETER
        if address == d["PixelFormat"] and (value not in _MONO or self._acquiring):
            return gc.Status.INVALID_PARAMETER
        if address == d["GainRaw"] and value > 240:
            return gc.Status.INVALID_PARAMETER
        if address == d["ChunkSelector"] and value > 1:
            return gc.Status.INVALID_PARAMETER
        if address == d["AcquisitionStart"]:
            self._acquiring, self._index = True, 0
            self._wake.set()
            return gc.Status.SUCCESS
        if address == d["AcquisitionStop"]:
            self._stop_acquisition()
            return gc.Status.SUCCESS
        if address == d["TriggerSoftware"]:
            self._trigger.set()
            self._wake.set()
            return gc.Status.SUCCESS
        if address == gc.Reg.SCPS0 and value & gc.SCPS_FIRE_TEST:
            self._w32(address, value & ~gc.SCPS_FIRE_TEST)
            self._send_test_packet(value & gc.SCPS_SIZE_MASK)
            return gc.Status.SUCCESS
        self._w32(address, value)
        return gc.Status.SUCCESS

    def _stop_acquisition(self) -> None:
        self._acquiring = False
        self._wake.set()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> GigeDevice:
        """Bind and serve (raises ``OSError`` if the address and port are taken)."""
        gvcp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            gvcp.bind((self.address, self.port))
        except OSError:
            gvcp.close()
            raise
        gvcp.settimeout(0.05)
        gvsp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        gvsp.bind((self.address, 0))
        try:
            gvsp.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
        except OSError:
            pass
        self._gvcp, self._gvsp = gvcp, gvsp
        self._stop.clear()
        self._threads = [threading.Thread(target=self._serve, name=f"simcam-gvcp-{self.address}", daemon=True),
                         threading.Thread(target=self._stream, name=f"simcam-gvsp-{self.address}", daemon=True)]
        for t in self._threads:
            t.start()
        log.info("simulated GigE Vision camera on %s:%d", self.address, self.port)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=2.0)
        self._threads = []
        for s in (self._gvcp, self._gvsp):
            if s is not None:
                s.close()
        self._gvcp = self._gvsp = None

    def __enter__(self) -> GigeDevice:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def controller(self) -> tuple[str, int] | None:
        return self._controller

    @property
    def acquiring(self) -> bool:
        return self._acquiring

    # -- GVCP -----------------------------------------------------------------------------------
    def _sendto(self, sock: socket.socket, data: bytes, dest: tuple[str, int]) -> None:
        self.destinations.add(dest)
        try:
            sock.sendto(data, dest)
        except OSError as exc:
            log.debug("simulated camera: send to %s failed: %s", dest, exc)

    def _serve(self) -> None:
        sock = self._gvcp
        assert sock is not None
        while not self._stop.is_set():
            self._check_heartbeat()
            try:
                data, sender = sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = self.answer(data, sender)
            if reply is not None:
                self._sendto(sock, reply, sender)

    def answer(self, data: bytes, sender: tuple[str, int]) -> bytes | None:
        """The device's answer to one GVCP datagram from ``sender`` (None: no answer). Pure
        of sockets, so garbage can be thrown at it directly: it never raises."""
        try:
            cmd = gc.decode_cmd(data)
        except gc.GigeProtocolError as exc:
            log.debug("simulated camera: bad GVCP datagram from %s: %s", sender, exc)
            if len(data) >= 8 and data[0] == gc.GVCP_KEY and data[1] & gc.FLAG_ACK_REQUIRED:
                # a command we do not decode (PACKETRESEND, FORCEIP...): say so, to its id
                req_id = struct.unpack_from(">H", data, 6)[0] or 1
                answer_code = (struct.unpack_from(">H", data, 2)[0] + 1) & 0xFFFF
                return gc.encode_ack(gc.StatusAck(req_id, gc.Status.NOT_IMPLEMENTED, answer_code))
            return None
        with self._lock:
            reply = self._handle(cmd, sender)
        return reply if cmd.flags & gc.FLAG_ACK_REQUIRED else None

    def _check_heartbeat(self) -> None:
        with self._lock:
            if self._controller is None:
                return
            timeout_s = self._r32(gc.Reg.HEARTBEAT_TIMEOUT) / 1000
            if time.monotonic() - self._controller_seen > timeout_s:
                log.info("simulated camera: heartbeat timeout; control released")
                self._controller = None
                self._w32(gc.Reg.CCP, 0)
                self._stop_acquisition()

    def _handle(self, cmd: gc.GvcpCmd, sender: tuple[str, int]) -> bytes | None:
        self.commands += 1
        is_controller = self._controller == sender
        if is_controller:
            self._controller_seen = time.monotonic()
        if isinstance(cmd, gc.DiscoveryCmd):
            # unicast to the sender, never a broadcast
            payload = bytes(self._mem[0:0xF8])
            return struct.pack(">HHHH", 0, gc.Command.DISCOVERY_ACK, len(payload), cmd.req_id) + payload
        if isinstance(cmd, gc.ReadRegCmd):
            values = []
            for a in cmd.addresses:
                raw = self._read(a, 4) if a % 4 == 0 else None
                if raw is None:
                    return gc.encode_ack(gc.StatusAck(cmd.req_id, gc.Status.INVALID_ADDRESS, gc.Command.READREG_ACK))
                values.append(struct.unpack(">I", raw)[0])
            return gc.encode_ack(gc.ReadRegAck(cmd.req_id, gc.Status.SUCCESS, tuple(values)))
        if isinstance(cmd, gc.ReadMemCmd):
            raw = self._read(cmd.address, cmd.count) if cmd.count <= gc.MAX_READMEM_BYTES else None
            if raw is None:
                return gc.encode_ack(gc.StatusAck(cmd.req_id, gc.Status.INVALID_ADDRESS, gc.Command.READMEM_ACK))
            return gc.encode_ack(gc.ReadMemAck(cmd.req_id, gc.Status.SUCCESS, cmd.address, raw))
        taking = (isinstance(cmd, gc.WriteRegCmd) and self._controller is None
                  and cmd.writes[0][0] == gc.Reg.CCP)
        if not (is_controller or taking):
            answer = gc.Command.WRITEREG_ACK if isinstance(cmd, gc.WriteRegCmd) else gc.Command.WRITEMEM_ACK
            return gc.encode_ack(gc.StatusAck(cmd.req_id, gc.Status.ACCESS_DENIED, answer))
        if taking:
            self._controller_seen = time.monotonic()
        if isinstance(cmd, gc.WriteRegCmd):
            for a, v in cmd.writes:
                status = self._write(a, v, sender)
                if status != gc.Status.SUCCESS:
                    return gc.encode_ack(gc.StatusAck(cmd.req_id, status, gc.Command.WRITEREG_ACK))
            return gc.encode_ack(gc.WriteRegAck(cmd.req_id, gc.Status.SUCCESS, len(cmd.writes)))
        assert isinstance(cmd, gc.WriteMemCmd)
        for i in range(0, len(cmd.data), 4):
            status = self._write(cmd.address + i, struct.unpack_from(">I", cmd.data, i)[0], sender)
            if status != gc.Status.SUCCESS:
                return gc.encode_ack(gc.StatusAck(cmd.req_id, status, gc.Command.WRITEMEM_ACK))
        return gc.encode_ack(gc.WriteMemAck(cmd.req_id, gc.Status.SUCCESS, len(cmd.data)))

    # -- GVSP ------------------------------------------------------------------------------------
    def _destination(self) -> tuple[str, int] | None:
        port = self._r32(gc.Reg.SCP0) & 0xFFFF
        ip = str(ipaddress.IPv4Address(bytes(self._mem[gc.Reg.SCDA0:gc.Reg.SCDA0 + 4])))
        if port == 0 or ip in ("0.0.0.0", "255.255.255.255"):
            return None
        return ip, port

    def _send_test_packet(self, size: int) -> None:
        dest = self._destination()
        if dest is None or self._gvsp is None or size < gc.IP_UDP_OVERHEAD + gc.GVSP_HEADER_BYTES:
            return
        # a test packet is a GVSP-headed datagram of exactly the packet size asked for
        body = gc.encode_payload(gc.GvspPayload(0, 0, b"\0" * (size - gc.IP_UDP_OVERHEAD - gc.GVSP_HEADER_BYTES)))
        self._sendto(self._gvsp, body, dest)

    def _settings(self) -> tuple[int, int, int, float, float, float, int]:
        d = DEVICE_REGS
        with self._lock:
            w, h, pf = self._r32(d["Width"]), self._r32(d["Height"]), self._r32(d["PixelFormat"])
            exposure_s = struct.unpack_from(">d", self._mem, d["ExposureTime"])[0] * 1e-6
            gain_db = self._r32(d["GainRaw"]) / 10
            fps = struct.unpack_from(">f", self._mem, d["AcquisitionFrameRate"])[0]
            psize = self._r32(gc.Reg.SCPS0) & gc.SCPS_SIZE_MASK
        return w, h, pf, exposure_s, gain_db, fps, psize

    def _stream(self) -> None:
        next_start = 0
        while not self._stop.is_set():
            if not self._acquiring or self._destination() is None:
                self._wake.wait(0.05)
                self._wake.clear()
                next_start = 0
                continue
            triggered = self._r32(DEVICE_REGS["TriggerMode"]) == 1
            w, h, pf, exposure_s, gain_db, fps, psize = self._settings()
            if triggered:
                if not self._trigger.wait(0.05):
                    continue
                self._trigger.clear()
                t_start = time.monotonic_ns()
            else:
                period_ns = round(_NS_PER_S / fps) if math.isfinite(fps) and fps > 0 else _NS_PER_S
                now = time.monotonic_ns()
                t_start = max(now, next_start)
                next_start = t_start + period_ns
                if t_start > now and self._stop.wait((t_start - now) / _NS_PER_S):
                    return
            # the sensor integrates; the frame leaves once the exposure is over
            end = t_start + round(exposure_s * _NS_PER_S)
            wait = (end - time.monotonic_ns()) / _NS_PER_S
            if wait > 0 and self._stop.wait(wait):
                return
            if not self._acquiring:
                continue
            self._send_frame(t_start, w, h, pf, exposure_s, gain_db, psize)

    def _send_frame(self, t_start: int, w: int, h: int, pf: int, exposure_s: float, gain_db: float,
                    psize: int) -> None:
        name = gc.pixel_format_name(pf) or "Mono8"
        index = self._index
        self._index += 1
        rendered = self.source.frame(FrameRequest(index, t_start, w, h, name, exposure_s, gain_db))
        img = np.ascontiguousarray(rendered.image, dtype=_MONO.get(pf, np.uint8))
        if img.shape != (h, w):
            raise SimError(f"frame source gave an image of shape {img.shape}, the camera is {(h, w)}")
        data = img.astype("<u2").tobytes() if img.dtype == np.uint16 else img.tobytes()
        ptype = gc.PAYLOAD_TYPE_IMAGE
        d = DEVICE_REGS
        if self._r32(d["ChunkModeActive"]):
            # what the source applied to this frame, as chunk data after the image
            chunks = []
            if self._r32(d["ChunkEnable"]):
                chunks.append((CHUNK_EXPOSURE_ID, struct.pack(">d", rendered.exposure_s * 1e6)))
            if self._r32(d["ChunkEnable"] + 4):
                chunks.append((CHUNK_GAIN_ID, struct.pack(">d", rendered.gain_db)))
            data, ptype = gc.encode_chunks(data, chunks), gc.PAYLOAD_TYPE_IMAGE_CHUNKS
        self.block_id = self.block_id % 0xFFFF + 1
        bid = self.block_id
        dest = self._destination()
        sock = self._gvsp
        if dest is None or sock is None:
            return
        chunk = max(4, psize - gc.IP_UDP_OVERHEAD - gc.GVSP_HEADER_BYTES)
        packets = [gc.encode_leader(gc.GvspLeader(bid, 0, ptype, self.clock.ticks(t_start), pf, w, h))]
        pid = 1
        for off in range(0, len(data), chunk):
            packets.append(gc.encode_payload(gc.GvspPayload(bid, pid, data[off:off + chunk])))
            pid += 1
        packets.append(gc.encode_trailer(gc.GvspTrailer(bid, pid, ptype, h)))
        lose = self._rng.random(len(packets)) < self.lost_packet_ratio if self.lost_packet_ratio > 0 else None
        for i, pkt in enumerate(packets):
            if lose is not None and lose[i]:
                continue
            self._sendto(sock, pkt, dest)
        self.frames_sent += 1


def main(argv: list[str] | None = None) -> int:
    """Serve one simulated camera until SIGINT or SIGTERM: ``python -m cellcal.sim.gige_device
    --address 127.0.0.2`` (a process of its own, reached through GigE Vision like a camera)."""
    import argparse
    import signal
    import sys

    p = argparse.ArgumentParser(prog="python -m cellcal.sim.gige_device", description=main.__doc__)
    p.add_argument("--address", required=True, help="IPv4 address to serve on (a loopback address in tests)")
    p.add_argument("--port", type=int, default=gc.GVCP_PORT, help="GVCP port (default 3956)")
    p.add_argument("--serial", default="SIM0001")
    p.add_argument("--sensor", default="640x480", help="WIDTHxHEIGHT in pixels")
    p.add_argument("--fps", type=float, default=20.0, help="free-running frame rate (Hz)")
    p.add_argument("--exposure-s", type=float, default=0.005)
    p.add_argument("--gain-db", type=float, default=0.0)
    p.add_argument("--packet-size", type=int, default=1400, help="GVSP packet size (bytes, with IP and UDP)")
    p.add_argument("--tick-hz", type=int, default=125_000_000, help="device timestamp ticks per second")
    p.add_argument("--clock-offset-s", type=float, default=1000.0)
    p.add_argument("--clock-drift-ppm", type=float, default=0.0)
    p.add_argument("--plain-xml", action="store_true", help="serve the GenICam XML unzipped")
    args = p.parse_args(argv)
    try:
        w, h = (int(v) for v in args.sensor.lower().split("x"))
    except ValueError:
        p.error(f"--sensor {args.sensor!r}: expected WIDTHxHEIGHT")
    try:
        clock = DeviceClock(args.tick_hz, offset_s=args.clock_offset_s, drift_ppm=args.clock_drift_ppm)
        dev = GigeDevice(args.address, args.port, clock=clock, serial=args.serial, sensor=(w, h),
                         frame_rate_hz=args.fps, exposure_s=args.exposure_s, gain_db=args.gain_db,
                         packet_size=args.packet_size, zip_xml=not args.plain_xml)
    except (SimError, ValueError) as exc:
        p.error(str(exc))
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        dev.start()
    except OSError as exc:
        print(f"cannot serve on {args.address}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"serving {args.address}:{args.port}", flush=True)
    try:
        while not done.wait(0.5):
            pass
    finally:
        dev.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
