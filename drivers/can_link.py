"""The CAN link under the CiA 402 driver: a receive path that survives the line, rate-limited
warnings, and the typed error a failed link becomes.

python-can's ``slcan`` interface parses what the adapter sends with ``int(..., 16)`` and
``bytes.decode()``: one line damaged on the serial line (a dropped byte, noise, a non-ASCII
byte) raises inside its receive call, which ends python-can's receive thread (the
``Notifier``). Every later send then re-raises that error through ``canopen``'s
``Network.check()``, so the SYNC producer fails every period while nothing is received any
more, until the bus is reopened. :class:`SlcanLinkBus` is that interface with its receive
path replaced by :mod:`cellcal.drivers.slcan_codec`'s strict decoder: a garbled or unknown
line is counted (:class:`LinkStats`) and dropped, and reception goes on with the next line.
Only a failure of the port itself (pyserial raising) still ends the receive thread, and the
driver then reports the link as failed (:class:`CanLinkLost`) instead of waiting for
heartbeats to go quiet.

:class:`RateLimitedLog` keeps a repeating warning (a SYNC that cannot be sent every 10 ms, a
stream of garbled lines) to a few records per interval, counting the rest.

Importing this module imports python-can (as :mod:`cellcal.drivers.canopen402`, its only
user, does anyway). :class:`SlcanLinkBus` opens its port in its constructor, as python-can's
buses do; the driver builds it in ``open()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from can.interfaces.slcan import slcanBus

from cellcal.drivers.errors import DeviceGoneError
from cellcal.drivers.slcan_codec import AdapterLineSplitter, decode_adapter_line

__all__ = ["CanLinkLost", "LinkStats", "RateLimitedLog", "SlcanLinkBus", "make_bus"]

log = logging.getLogger(__name__)


class CanLinkLost(DeviceGoneError):
    """The CAN link failed: the adapter's port failed (python-can's receive thread ended
    with ``cause``), or SYNC frames could not be sent ``failures`` times in a row. The
    driver must be reopened; the daemon treats it as the robot link failing (backs off and
    reopens)."""

    def __init__(self, message: str, *, failures: int = 0, cause: str = "") -> None:
        super().__init__(message)
        self.failures = failures
        self.cause = cause


class RateLimitedLog:
    """At most ``burst`` records per ``interval_s`` for one kind of event.

    Calls beyond that are counted, not logged; the first record of the next interval says
    how many were left out. ``clock`` (default ``time.monotonic``) is injectable so the limit
    can be tested without waiting. Thread-safe.

    Parameters
    ----------
    logger : logging.Logger
    level : int
        Level of the records.
    interval_s : float
        Length of one interval (s).
    burst : int
        Records allowed per interval (>= 1).
    """

    def __init__(self, logger: logging.Logger, level: int = logging.WARNING, *, interval_s: float = 10.0,
                 burst: int = 3, clock: Callable[[], float] = time.monotonic) -> None:
        if not interval_s > 0 or burst < 1:
            raise ValueError(f"RateLimitedLog: interval_s must be > 0 and burst >= 1, got {interval_s!r}, {burst!r}")
        self.logger = logger
        self.level = level
        self.interval_s = float(interval_s)
        self.burst = int(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._start = -float("inf")
        self._logged = 0
        self._suppressed = 0
        #: every event, logged or not
        self.total = 0

    def __call__(self, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` unless this interval's burst is used up; ``True`` if logged."""
        with self._lock:
            self.total += 1
            now = self._clock()
            left_out = 0
            if now - self._start >= self.interval_s:
                left_out, self._suppressed = self._suppressed, 0
                self._start, self._logged = now, 0
            if self._logged >= self.burst:
                self._suppressed += 1
                return False
            self._logged += 1
        if left_out:
            msg += " (%d more like it left out of the log in the %.3g s before)"
            args = (*args, left_out, self.interval_s)
        self.logger.log(self.level, msg, *args)
        return True


@dataclass
class LinkStats:
    """What the receive path of one CAN link saw (counters only grow).

    Attributes
    ----------
    frames : int
        CAN frames received.
    garbled : int
        Lines dropped as damaged (a frame line breaking the grammar, a non-ASCII byte, a line
        too long).
    unknown : int
        Well-formed lines this side does not use (CAN FD frames, vendor extensions), dropped.
    errors : int
        BEL answers (the adapter refused a command).
    last_dropped : bytes
        The last dropped line (at most 64 bytes), for the log and the bus report.
    port_error : str
        Why the port itself failed (empty while it works): the link is down until reopened.
    """

    frames: int = 0
    garbled: int = 0
    unknown: int = 0
    errors: int = 0
    last_dropped: bytes = b""
    port_error: str = ""
    _log: RateLimitedLog = field(default_factory=lambda: RateLimitedLog(log), repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "garbled": self.garbled, "unknown": self.unknown, "errors": self.errors,
                "last_dropped": self.last_dropped.decode("latin-1"), "port_error": self.port_error}


def make_bus(interface: str, channel: str, stats: LinkStats, **kwargs: Any) -> Any:
    """The python-can bus for ``interface`` and ``channel``: :class:`SlcanLinkBus` for
    ``slcan``, python-can's own for every other interface (their frames arrive as binary
    records from the kernel or the process, not as text a line can garble)."""
    import can

    if interface == "slcan":
        return SlcanLinkBus(channel, stats=stats, **kwargs)
    return can.Bus(channel=channel, interface=interface, **kwargs)


class SlcanLinkBus(slcanBus):
    """python-can's ``slcan`` bus whose receive path counts and drops what it cannot decode.

    Sending, opening and closing are python-can's. Receiving reads whatever the port has,
    splits it into lines at CR or BEL (:class:`~cellcal.drivers.slcan_codec.AdapterLineSplitter`)
    and decodes each with :func:`~cellcal.drivers.slcan_codec.decode_adapter_line`: frames are
    returned; acknowledges and answers are skipped; ``garbled`` and ``unknown`` lines are
    counted in :attr:`stats` and logged (rate-limited). A pyserial error while reading is the
    port failing (a link fault, not a bad line): it is recorded once in ``stats.port_error``,
    logged, and from then on nothing is received; the receive thread is not ended with a
    traceback, the driver reports the link (:class:`CanLinkLost`).

    Parameters
    ----------
    channel : str
        What pyserial opens: a device path, ``socket://127.0.0.1:PORT``, a pty.
    stats : LinkStats, optional
        Counters to fill (a fresh one if not given).
    **kwargs
        python-can's ``slcan`` options (``bitrate``, ``sleep_after_open``, ``tty_baudrate``, ...).
    """

    def __init__(self, channel: str, *, stats: LinkStats | None = None, **kwargs: Any) -> None:
        self.stats = stats if stats is not None else LinkStats()
        self._link_name = str(channel)
        self._splitter = AdapterLineSplitter()
        self._lines: deque[bytes | None] = deque()
        super().__init__(channel, **kwargs)

    def _take(self, line: bytes | None) -> Any:
        import can

        got = decode_adapter_line(line)
        st = self.stats
        if got.kind == "frame":
            f = got.frame
            assert f is not None
            st.frames += 1
            return can.Message(arbitration_id=f.can_id, is_extended_id=f.extended, is_remote_frame=f.remote,
                               dlc=f.dlc, data=f.data, timestamp=time.time(), channel=self._link_name)
        if got.kind == "error":
            st.errors += 1
        elif got.kind in ("garbled", "unknown"):
            raw = b"" if line is None else line[:64]
            st.last_dropped = raw
            if got.kind == "garbled":
                st.garbled += 1
            else:
                st.unknown += 1
            st._log("SLCAN link %s: dropped a %s line %r (%s); %d garbled and %d unknown so far",
                    self._link_name, got.kind, raw, got.reason, st.garbled, st.unknown)
        return None

    def _recv_internal(self, timeout: float | None) -> tuple[Any, bool]:
        import serial

        end = None if timeout is None else time.monotonic() + timeout
        port = self.serialPortOrig
        while True:
            while self._lines:
                msg = self._take(self._lines.popleft())
                if msg is not None:
                    return msg, False
            if self.stats.port_error:
                time.sleep(0.05 if timeout is None else min(max(timeout, 0.0), 0.05))
                return None, False
            try:
                data = port.read(max(1, port.in_waiting))
            except (serial.SerialException, OSError, AttributeError, TypeError) as exc:
                # AttributeError / TypeError: pyserial's socket:// after its socket was closed
                self.stats.port_error = f"read failed: {exc}"
                log.error("SLCAN link %s: %s; nothing more is received until the link is reopened",
                          self._link_name, self.stats.port_error)
                continue
            if data:
                self._lines.extend(self._splitter.feed(data))
            elif end is not None and time.monotonic() >= end:
                return None, False
