"""The two halves of a GigE Vision link, below the driver: GVCP requests and GVSP reassembly.

:class:`GvcpClient` sends one control command at a time to one device and waits for its
acknowledge (repeats, stale ids, PENDING_ACK, error statuses; ``docs/protocols/gige.md``,
section GVCP). :class:`FrameAssembler` turns stream packets into complete frames and counts
what it gives up (pure: packets in, frames out). :mod:`cellcal.drivers.gige` builds the
camera driver on both.
"""

from __future__ import annotations

import collections
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.drivers import gige_codec as gc
from cellcal.drivers.base import remaining_s
from cellcal.drivers.camera import CameraDeviceError, CameraTimeoutError
from cellcal.drivers.errors import DeviceGoneError, DriverError

__all__ = ["GvcpClient", "GvcpPort", "FrameAssembler", "CompleteFrame", "image_from_payload", "local_address_for"]

log = logging.getLogger(__name__)

_NS_PER_S = 1_000_000_000
#: A block with no packet for this long is given up (counted incomplete).
_STALE_BLOCK_S = 1.0
#: Blocks reassembled at once; an older one still open when a newer starts is given up.
_OPEN_BLOCKS = 3


def local_address_for(host: str, port: int) -> str:
    """The host's own IPv4 address the kernel would send from to reach ``host``.

    A UDP ``connect`` sends nothing; it only chooses the route. For a device on loopback
    this is a loopback address.
    """
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, port))
        return str(probe.getsockname()[0])
    finally:
        probe.close()


# -- control channel -----------------------------------------------------------------------


class GvcpClient:
    """GVCP requests to one device, one at a time (a lock serialises the heartbeat and the
    caller), each repeated after ``ack_timeout_s`` up to ``retries`` times within a deadline.

    Parameters
    ----------
    host, port : str, int
        The device's address and GVCP port.
    ack_timeout_s, retries : float, int
        See :data:`OPTIONS`.
    """

    def __init__(self, host: str, port: int, *, ack_timeout_s: float = 0.2, retries: int = 3) -> None:
        self.host, self.port = host, int(port)
        self.ack_timeout_s = float(ack_timeout_s)
        self.retries = int(retries)
        self.local_ip = ""
        self._sock: socket.socket | None = None
        self._req_id = 0
        self._lock = threading.Lock()
        #: datagrams that were not the acknowledge awaited (late answers, garbage)
        self.stray = 0

    def open(self) -> None:
        self.local_ip = local_address_for(self.host, self.port)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((self.local_ip, 0))
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self._sock = sock

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _next_id(self) -> int:
        self._req_id = self._req_id % 0xFFFF + 1  # 0 is reserved
        return self._req_id

    def transact(self, make: Callable[[int], gc.GvcpCmd], expect: type, deadline: float,
                 ) -> tuple[Any, int, int]:
        """Send ``make(req_id)``; return ``(ack, t_sent_ns, t_acked_ns)`` of the try answered.

        Raises
        ------
        CameraDeviceError
            The device answered with an error status (``code`` is its name).
        CameraTimeoutError
            No acknowledge after every try, or the deadline passed.
        DeviceGoneError
            The socket failed (an ICMP port-unreachable on loopback: nothing listens).
        """
        with self._lock:
            sock = self._sock
            if sock is None:
                raise DeviceGoneError(f"GVCP {self.host}: not open")
            req_id = self._next_id()
            cmd = make(req_id)
            data = gc.encode_cmd(cmd)
            for attempt in range(self.retries + 1):
                left = remaining_s(deadline)
                if left <= 0:
                    break
                t_sent = time.monotonic_ns()
                try:
                    sock.send(data)
                except OSError as exc:
                    raise DeviceGoneError(f"GVCP {self.host}: send failed: {exc}") from exc
                try_end = time.monotonic() + min(self.ack_timeout_s, left)
                while True:
                    wait = try_end - time.monotonic()
                    if wait <= 0:
                        break
                    sock.settimeout(wait)
                    try:
                        reply = sock.recv(2048)
                    except TimeoutError:
                        break
                    except ConnectionRefusedError as exc:
                        raise DeviceGoneError(f"GVCP {self.host}:{self.port}: nothing listens ({exc})") from exc
                    except OSError as exc:
                        raise DeviceGoneError(f"GVCP {self.host}: receive failed: {exc}") from exc
                    t_ack = time.monotonic_ns()
                    try:
                        ack = gc.decode_ack(reply)
                    except gc.GigeProtocolError as exc:
                        self.stray += 1
                        log.debug("GVCP %s: discarded datagram: %s", self.host, exc)
                        continue
                    if ack.ack_id != req_id:
                        self.stray += 1
                        continue
                    if isinstance(ack, gc.PendingAck):
                        # the device asks for more time: extend this try, within the deadline
                        try_end = min(time.monotonic() + ack.time_ms / 1000 + self.ack_timeout_s, deadline)
                        continue
                    if isinstance(ack, gc.StatusAck):
                        name = gc.Status.name_of(ack.status)
                        raise CameraDeviceError(f"GVCP {self.host}: {type(cmd).__name__} refused: {name}", name)
                    if not isinstance(ack, expect):
                        self.stray += 1
                        continue
                    return ack, t_sent, t_ack
                if attempt < self.retries:
                    log.debug("GVCP %s: no acknowledge to req %d (try %d)", self.host, req_id, attempt + 1)
            raise CameraTimeoutError(f"GVCP {self.host}: no acknowledge to {type(cmd).__name__} in time")

    # convenience -------------------------------------------------------------------------
    def read_regs(self, addresses: tuple[int, ...], deadline: float) -> tuple[int, ...]:
        """Registers one READREG each: a device need not take several in one command
        (GVCP's concatenation is a capability; Aravis's fake camera answers the first only)."""
        out = []
        for address in addresses:
            ack, _, _ = self.transact(_read_reg_cmd(address), gc.ReadRegAck, deadline)
            if len(ack.values) != 1:
                raise DriverError(f"GVCP {self.host}: READREG of 0x{address:X} answered {len(ack.values)} values")
            out.append(ack.values[0])
        return tuple(out)

    def read_reg(self, address: int, deadline: float) -> int:
        return self.read_regs((address,), deadline)[0]

    def write_reg(self, address: int, value: int, deadline: float) -> tuple[int, int]:
        """Write one register; returns the exchange's ``(t_sent_ns, t_acked_ns)``."""
        _, t1, t4 = self.transact(lambda i: gc.WriteRegCmd(i, ((address, value),)), gc.WriteRegAck, deadline)
        return t1, t4

    def read_mem(self, address: int, length: int, deadline: float) -> bytes:
        """``length`` bytes from ``address`` (any alignment; split into 512-byte reads)."""
        start = address - address % 4
        end = address + length
        out = bytearray()
        pos = start
        while pos < end:
            n = min(gc.MAX_READMEM_BYTES, -(-(end - pos) // 4) * 4)
            ack, _, _ = self.transact(_read_mem_cmd(pos, n), gc.ReadMemAck, deadline)
            if ack.address != pos or len(ack.data) < n:
                raise DriverError(f"GVCP {self.host}: READMEM at 0x{pos:X} answered {len(ack.data)} bytes "
                                  f"at 0x{ack.address:X}")
            out += ack.data[:n]
            pos += n
        return bytes(out[address - start:address - start + length])

    def write_mem(self, address: int, data: bytes, deadline: float) -> None:
        """Write ``data`` at ``address``; unaligned edges are read, merged and written back."""
        start = address - address % 4
        end = address + len(data)
        end4 = -(-end // 4) * 4
        if start != address or end4 != end:
            block = bytearray(self.read_mem(start, end4 - start, deadline))
            block[address - start:address - start + len(data)] = data
            data, address = bytes(block), start
        pos = 0
        while pos < len(data):
            chunk = data[pos:pos + gc.MAX_READMEM_BYTES]
            self.transact(_write_mem_cmd(address + pos, chunk), gc.WriteMemAck, deadline)
            pos += len(chunk)


def _read_reg_cmd(address: int) -> Callable[[int], gc.GvcpCmd]:
    return lambda req_id: gc.ReadRegCmd(req_id, (address,))


def _read_mem_cmd(address: int, count: int) -> Callable[[int], gc.GvcpCmd]:
    return lambda req_id: gc.ReadMemCmd(req_id, address, count)


def _write_mem_cmd(address: int, data: bytes) -> Callable[[int], gc.GvcpCmd]:
    return lambda req_id: gc.WriteMemCmd(req_id, address, data)


class GvcpPort:
    """The device's register space for the node map: 4-byte aligned accesses go as
    READREG/WRITEREG (some devices accept only those on registers), others as memory."""

    def __init__(self, client: GvcpClient) -> None:
        self.client = client
        self.deadline = 0.0  # set by the driver before each node-map call

    def read(self, address: int, length: int) -> bytes:
        if length == 4 and address % 4 == 0:
            return struct.pack(">I", self.client.read_reg(address, self.deadline))
        return self.client.read_mem(address, length, self.deadline)

    def write(self, address: int, data: bytes) -> None:
        if len(data) == 4 and address % 4 == 0:
            self.client.write_reg(address, struct.unpack(">I", data)[0], self.deadline)
        else:
            self.client.write_mem(address, data, self.deadline)


# -- stream --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CompleteFrame:
    leader: gc.GvspLeader
    data: bytes
    t_leader_ns: int
    t_done_ns: int
    chunks: Mapping[int, bytes] | None = None


class FrameAssembler:
    """Leader, payload and trailer packets in; complete frames out (pure, no I/O).

    Payload is joined in packet-id order; a frame is complete when its trailer has come,
    its leader and every packet id before the trailer's have come, and the bytes add up to
    what the leader declares (width x height x bits per pixel). Anything else is counted
    in :attr:`incomplete` and dropped.
    """

    def __init__(self, on_frame: Callable[[CompleteFrame], None]) -> None:
        self.on_frame = on_frame
        self._blocks: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self.incomplete = 0
        self.unsupported = 0
        self.completed = 0
        self._done_recent: collections.deque[int] = collections.deque(maxlen=8)

    def feed(self, pkt: gc.GvspPacket, t_ns: int) -> None:
        block = self._blocks.get(pkt.block_id)
        if block is None:
            if not isinstance(pkt, gc.GvspLeader) and pkt.block_id in self._done_recent:
                return  # a duplicate of a block already handed on
            block = {"leader": None, "parts": {}, "t_leader": 0, "t_last": t_ns}
            self._blocks[pkt.block_id] = block
            while len(self._blocks) > _OPEN_BLOCKS:
                self._blocks.popitem(last=False)
                self.incomplete += 1
        block["t_last"] = t_ns
        if isinstance(pkt, gc.GvspLeader):
            block["leader"], block["t_leader"] = pkt, t_ns
        elif isinstance(pkt, gc.GvspPayload):
            block["parts"][pkt.packet_id] = pkt.data
        else:
            del self._blocks[pkt.block_id]
            self._finish(pkt, block, t_ns)

    def expire(self, now_ns: int) -> None:
        """Give up blocks that have had no packet for a while."""
        for bid in [b for b, blk in self._blocks.items() if now_ns - blk["t_last"] > _STALE_BLOCK_S * _NS_PER_S]:
            del self._blocks[bid]
            self.incomplete += 1

    def _finish(self, trailer: gc.GvspTrailer, block: dict[str, Any], t_ns: int) -> None:
        leader: gc.GvspLeader | None = block["leader"]
        parts: dict[int, bytes] = block["parts"]
        if leader is None:
            self.incomplete += 1
            return
        chunked = leader.payload_type == gc.PAYLOAD_TYPE_IMAGE_CHUNKS
        if not (chunked or leader.payload_type == gc.PAYLOAD_TYPE_IMAGE) or leader.padding_x or leader.padding_y:
            self.unsupported += 1
            return
        first = leader.packet_id + 1
        if len(parts) != trailer.packet_id - first or any(p not in parts for p in range(first, trailer.packet_id)):
            self.incomplete += 1
            return
        data = b"".join(parts[p] for p in range(first, trailer.packet_id))
        expected = leader.width * leader.height * gc.bits_per_pixel(leader.pixel_format) // 8
        chunks = None
        if chunked and expected:
            try:
                data, chunks = gc.parse_chunks(data, expected)
            except gc.GigeProtocolError:
                self.incomplete += 1
                return
        if len(data) != expected or expected == 0:
            self.incomplete += 1
            return
        self._done_recent.append(trailer.block_id)
        self.completed += 1
        self.on_frame(CompleteFrame(leader, data, block["t_leader"], t_ns, chunks))


def image_from_payload(leader: gc.GvspLeader, data: bytes) -> tuple[np.ndarray, str]:
    name = gc.pixel_format_name(leader.pixel_format)
    if name is None:
        raise DriverError(f"pixel format 0x{leader.pixel_format:08X} is not one we turn into an image")
    h, w = leader.height, leader.width
    bpp = gc.bits_per_pixel(leader.pixel_format)
    img: np.ndarray
    # Views of the joined bytes, no copy: the frame's image is read-only anyway.
    if bpp == 8:
        img = np.frombuffer(data, np.uint8).reshape(h, w)
    elif bpp == 16:
        img = np.frombuffer(data, "<u2").reshape(h, w).astype(np.uint16, copy=False)
    elif bpp == 24:
        img = np.frombuffer(data, np.uint8).reshape(h, w, 3)
    else:  # pragma: no cover - PIXEL_FORMATS holds 8, 16 and 24-bit formats only
        raise DriverError(f"{name}: {bpp} bits per pixel")
    return img, name
