"""The Lawicel (SLCAN) ASCII line codec: pure bytes in, records out.

SLCAN adapters (CANUSB, CANable and friends, and the simulator's loopback bridge,
:mod:`cellcal.sim.slcan_bridge`) carry CAN frames over a serial line as ASCII lines ended
by CR (0x0D); an adapter answers a command with CR for success or BEL (0x07) for an error.
Both ends use this module: the bridge decodes the host's commands (:func:`parse_command`,
:class:`LineSplitter`) and encodes the frames it pushes (:func:`encode_frame`); the CAN
driver's receive path (:mod:`cellcal.drivers.can_link`) splits what the adapter sends
(:class:`AdapterLineSplitter`) and decodes it strictly (:func:`decode_adapter_line`).

SLCAN has no checksum, so a line damaged on the wire (a dropped byte, noise, a
non-ASCII byte) can only be recognised by its grammar: a frame line must be exactly
``t``/``T``/``r``/``R``, 3 or 8 hex digits of identifier, one length digit 0..8, exactly
twice that many hex digits of data (none for a remote frame) and, from an adapter, an
optional 4-digit timestamp. Anything else never becomes a frame: it is ``garbled`` (a frame
line that breaks the grammar, a non-ASCII byte, a line too long) or ``unknown`` (a line
this side has no use for: CAN FD frames, vendor extensions). Decoding never raises.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CR",
    "BEL",
    "MAX_LINE",
    "TIMESTAMP_MAX_MS",
    "SlcanFrame",
    "SlcanCommand",
    "AdapterLine",
    "LineSplitter",
    "AdapterLineSplitter",
    "parse_command",
    "encode_frame",
    "decode_adapter_line",
]

CR = b"\r"
BEL = b"\x07"
MAX_LINE = 64  # the longest valid line is 31 characters (T + 8 + 1 + 16 + timestamp)
#: Receive timestamps count milliseconds and wrap at one minute (0..0xEA5F).
TIMESTAMP_MAX_MS = 59_999
_HEX = frozenset(b"0123456789abcdefABCDEF")


@dataclass(frozen=True)
class SlcanFrame:
    """One classic CAN frame.

    Attributes
    ----------
    can_id : int
        11-bit (``extended=False``) or 29-bit identifier.
    data : bytes
        0..8 bytes (empty for a remote frame).
    extended, remote : bool
        29-bit identifier; remote transmission request.
    dlc : int
        Data length code, 0..8 (for a remote frame, the length requested).
    """

    can_id: int
    data: bytes = b""
    extended: bool = False
    remote: bool = False
    dlc: int = -1

    def __post_init__(self) -> None:
        limit = 0x1FFFFFFF if self.extended else 0x7FF
        if not 0 <= self.can_id <= limit:
            raise ValueError(f"CAN id 0x{self.can_id:X} out of range for a {'29' if self.extended else '11'}-bit id")
        if len(self.data) > 8:
            raise ValueError(f"CAN frame: {len(self.data)} data bytes (at most 8)")
        if self.dlc < 0:
            object.__setattr__(self, "dlc", len(self.data))
        if not 0 <= self.dlc <= 8 or (not self.remote and self.dlc != len(self.data)):
            raise ValueError(f"CAN frame: dlc {self.dlc} does not match {len(self.data)} data bytes")
        if self.remote and self.data:
            raise ValueError("CAN frame: a remote frame carries no data")


@dataclass(frozen=True)
class SlcanCommand:
    """One decoded Lawicel command line.

    Attributes
    ----------
    kind : str
        ``transmit``, ``bitrate``, ``btr``, ``open``, ``listen``, ``close``, ``status``,
        ``version``, ``serial``, ``timestamps``, ``acceptance_code``, ``acceptance_mask``,
        ``autopoll``, ``poll``, ``poll_all``, ``empty``, or ``invalid``.
    frame : SlcanFrame or None
        For ``transmit``.
    value : int
        The argument of ``bitrate`` (code), ``btr`` (BTR0 << 8 | BTR1), ``timestamps`` and
        ``autopoll`` (0/1), ``acceptance_code`` / ``acceptance_mask`` (32 bit).
    reason : str
        Why an ``invalid`` line is invalid.
    """

    kind: str
    frame: SlcanFrame | None = None
    value: int = 0
    reason: str = ""


def _invalid(reason: str) -> SlcanCommand:
    return SlcanCommand("invalid", reason=reason)


def _hex(text: bytes) -> int | None:
    if not text or any(c not in _HEX for c in text):
        return None
    return int(text, 16)


def _parse_frame(line: bytes, *, timestamp_ok: bool = False) -> SlcanCommand:
    kind = line[:1]
    extended = kind in (b"T", b"R")
    remote = kind in (b"r", b"R")
    n_id = 8 if extended else 3
    if len(line) < 1 + n_id + 1:
        return _invalid(f"{kind.decode()}: too short")
    can_id = _hex(line[1 : 1 + n_id])
    dlc = _hex(line[1 + n_id : 2 + n_id])
    if can_id is None or dlc is None:
        return _invalid(f"{kind.decode()}: id and length must be hex digits")
    if dlc > 8:
        return _invalid(f"{kind.decode()}: length {dlc} > 8")
    rest = line[2 + n_id :]
    want = 0 if remote else 2 * dlc
    if timestamp_ok and len(rest) == want + 4:
        stamp = _hex(rest[want:])
        if stamp is None or stamp > TIMESTAMP_MAX_MS:
            return _invalid(f"{kind.decode()}: timestamp must be 4 hex digits of ms below 0x{TIMESTAMP_MAX_MS + 1:04X}")
        rest = rest[:want]
    if remote:
        if rest:
            return _invalid(f"{kind.decode()}: a remote frame has no data")
        data = b""
    else:
        if len(rest) != 2 * dlc or (rest and _hex(rest) is None):
            return _invalid(f"{kind.decode()}: expected {2 * dlc} hex digits of data")
        data = bytes.fromhex(rest.decode("ascii"))
    try:
        frame = SlcanFrame(can_id, data, extended, remote, dlc)
    except ValueError as exc:
        return _invalid(str(exc))
    return SlcanCommand("transmit", frame=frame)


_SIMPLE = {b"O": "open", b"L": "listen", b"C": "close", b"F": "status", b"V": "version",
           b"N": "serial", b"P": "poll", b"A": "poll_all"}


def parse_command(line: bytes) -> SlcanCommand:
    """Decode one command line (without its CR). Never raises: bad input is ``invalid``."""
    if not line:
        return SlcanCommand("empty")
    head = line[:1]
    if head in (b"t", b"T", b"r", b"R"):
        return _parse_frame(line)
    if head in _SIMPLE:
        if len(line) != 1:
            return _invalid(f"{head.decode('ascii', 'replace')}: takes no argument")
        return SlcanCommand(_SIMPLE[head])
    arg = line[1:]
    if head == b"S":
        if len(arg) != 1 or not arg.isdigit():
            return _invalid("S: expected one digit 0..9")
        return SlcanCommand("bitrate", value=int(arg))
    if head == b"s":
        v = _hex(arg) if len(arg) == 4 else None
        return _invalid("s: expected 4 hex digits (BTR0 BTR1)") if v is None else SlcanCommand("btr", value=v)
    if head in (b"Z", b"X"):
        if arg not in (b"0", b"1"):
            return _invalid(f"{head.decode()}: expected 0 or 1")
        return SlcanCommand("timestamps" if head == b"Z" else "autopoll", value=int(arg))
    if head in (b"M", b"m"):
        v = _hex(arg) if len(arg) == 8 else None
        if v is None:
            return _invalid(f"{head.decode()}: expected 8 hex digits")
        return SlcanCommand("acceptance_code" if head == b"M" else "acceptance_mask", value=v)
    return _invalid(f"unknown command {head!r}")


def encode_frame(frame: SlcanFrame, timestamp_ms: int | None = None) -> bytes:
    """The line an adapter sends for a received frame, CR included (``t1816AABB...\\r``)."""
    kind = ("R" if frame.remote else "T") if frame.extended else ("r" if frame.remote else "t")
    ident = f"{frame.can_id:08X}" if frame.extended else f"{frame.can_id:03X}"
    out = f"{kind}{ident}{frame.dlc:d}{frame.data.hex().upper()}"
    if timestamp_ms is not None:
        out += f"{timestamp_ms % 60000:04X}"
    return out.encode("ascii") + CR


class LineSplitter:
    """Bytes in, command lines out (CR-terminated; LF ignored).

    A line longer than :data:`MAX_LINE` is dropped up to its CR and reported as
    ``None`` (its answer is BEL), so garbage can never grow the buffer.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._overlong = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        data = data.replace(b"\n", b"")
        while True:
            k = data.find(CR, start)
            if k < 0:
                self._append(data[start:])
                return out
            self._append(data[start:k])
            out.append(None if self._overlong else bytes(self._buf))
            self._buf.clear()
            self._overlong = False
            start = k + 1

    def _append(self, part: bytes) -> None:
        if self._overlong:
            return
        self._buf += part
        if len(self._buf) > MAX_LINE:
            self._buf.clear()
            self._overlong = True


class AdapterLineSplitter:
    """Bytes from an adapter in, lines out: a line ends at CR or at BEL.

    Each item is the line without its end, or ``BEL`` for an error answer (a BEL after
    other characters gives that text followed by BEL, which :func:`decode_adapter_line` calls
    garbled). LF is ignored. A line longer than :data:`MAX_LINE` is dropped up to its end
    and reported as ``None``, so garbage can never grow the buffer.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._overlong = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        for b in data.replace(b"\n", b""):
            if b == 0x0D or b == 0x07:
                if self._overlong:
                    out.append(None)
                else:
                    out.append(bytes(self._buf) + (BEL if b == 0x07 else b""))
                self._buf.clear()
                self._overlong = False
            elif not self._overlong:
                self._buf.append(b)
                if len(self._buf) > MAX_LINE:
                    self._buf.clear()
                    self._overlong = True
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held."""
        return len(self._buf)


@dataclass(frozen=True)
class AdapterLine:
    """One decoded line from an adapter.

    Attributes
    ----------
    kind : str
        ``frame`` (a received CAN frame), ``ok`` (CR alone: a command succeeded), ``error``
        (BEL: a command failed), ``ack`` (``z`` / ``Z``: a transmit was queued), ``reply``
        (an answer to ``F``, ``V`` or ``N``), ``unknown`` (a well-formed line this side does
        not use) or ``garbled`` (a line no adapter sends: damaged on the wire).
    frame : SlcanFrame or None
        For ``frame``.
    reason : str
        Why a line is ``garbled`` or ``unknown``.
    """

    kind: str
    frame: SlcanFrame | None = None
    reason: str = ""


_REPLY_HEADS = {b"F": 2, b"V": 4, b"N": 4}  # head -> number of characters after it


def decode_adapter_line(line: bytes | None) -> AdapterLine:
    """Decode one line an adapter sent (from :class:`AdapterLineSplitter`). Never raises.

    ``None`` (an overlong line) and any line with a byte outside printable ASCII are
    ``garbled``; frame lines are held to the grammar in the module docstring.
    """
    if line is None:
        return AdapterLine("garbled", reason=f"no line end within {MAX_LINE} bytes")
    if line == BEL:
        return AdapterLine("error")
    if any(b < 0x20 or b > 0x7E for b in line):
        return AdapterLine("garbled", reason="byte outside printable ASCII")
    if not line:
        return AdapterLine("ok")
    head = line[:1]
    if head in (b"t", b"T", b"r", b"R"):
        cmd = _parse_frame(line, timestamp_ok=True)
        if cmd.frame is None:
            return AdapterLine("garbled", reason=cmd.reason)
        return AdapterLine("frame", frame=cmd.frame)
    if line in (b"z", b"Z"):
        return AdapterLine("ack")
    if head in _REPLY_HEADS:
        if len(line) == 1 + _REPLY_HEADS[head] and line[1:].isalnum():
            return AdapterLine("reply")
        return AdapterLine("garbled", reason=f"{head.decode()} reply of {len(line) - 1} characters")
    return AdapterLine("unknown", reason=f"line starting {head!r} (CAN FD or a vendor extension)")
