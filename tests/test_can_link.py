"""The CAN link under the CiA 402 driver (``cellcal.drivers.can_link``): the SLCAN receive
path against a raw adapter on loopback TCP (garbled lines counted and dropped, frames kept),
and the rate-limited log on an injected clock."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

import can
import pytest
from conftest import wait_until

from cellcal.drivers.can_link import LinkStats, RateLimitedLog, SlcanLinkBus


class _RawAdapter:
    """A loopback TCP peer that sends whatever the test gives it to the one host."""

    def __init__(self) -> None:
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        self.conn: socket.socket | None = None
        self._accepted = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.conn, _ = self.srv.accept()
        self._accepted.set()

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.srv.getsockname()[1]}"

    def send(self, data: bytes) -> None:
        assert self._accepted.wait(5.0)
        assert self.conn is not None
        self.conn.sendall(data)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.srv.close()


#: One line of each kind of damage a serial line does (non-hex id, non-ASCII byte, length
#: above 8, data shorter than its length, a frame cut by its CR) and a line no adapter sends.
GARBLED_LINES = b"t1G30\rt18\xff\xfe01\rt1819AA\rt18140011\rQ?\rt70\r"


def _recv_n(bus, n: int, timeout_s: float = 5.0) -> list[can.Message]:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        m = bus.recv(0.05)
        if m is not None:
            got.append(m)
    return got


def test_garbled_lines_are_counted_and_dropped_and_the_frames_around_them_arrive():
    peer = _RawAdapter()
    stats = LinkStats()
    bus = SlcanLinkBus(peer.url, stats=stats, sleep_after_open=0)
    try:
        peer.send(b"t1812AABB\r" + GARBLED_LINES + b"\r\x07z\rt701100\r" + b"t2" + b"0" * 100 + b"\rT123456781FF\r")
        got = _recv_n(bus, 3)
        assert [(m.arbitration_id, bytes(m.data), m.is_extended_id) for m in got] == [
            (0x181, b"\xaa\xbb", False), (0x701, b"\x00", False), (0x12345678, b"\xff", True)]
        # 5 damaged lines and one no adapter sends, plus the overlong one
        assert (stats.frames, stats.garbled, stats.unknown, stats.errors) == (3, 6, 1, 1)
        assert bus.recv(0.05) is None  # nothing else turned into a frame
    finally:
        bus.shutdown()
        peer.close()


def test_a_port_that_fails_is_recorded_not_raised_into_the_receive_thread():
    peer = _RawAdapter()
    stats = LinkStats()
    bus = SlcanLinkBus(peer.url, stats=stats, sleep_after_open=0)
    try:
        peer.send(b"t1811AA\r")
        assert len(_recv_n(bus, 1)) == 1
        peer.close()
        wait_until(lambda: bus.recv(0.05) is None and stats.port_error, 5.0, "the port failure")
        assert "read failed" in stats.port_error and bus.recv(0.01) is None
    finally:
        with contextlib.suppress(can.CanError):  # closing writes "C" to the dead port
            bus.shutdown()


def test_rate_limited_log_keeps_a_burst_per_interval_and_counts_the_rest(caplog):
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("cellcal.test.ratelimit"), interval_s=10.0, burst=3,
                             clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="cellcal.test.ratelimit"):
        for i in range(1000):  # 1000 failures within one interval
            now[0] = i * 0.005
            limited("SYNC send failed (%d)", i)
        assert len(caplog.records) == 3 and limited.total == 1000
        now[0] = 10.0
        assert limited("SYNC send failed (%d)", 1000)
    assert len(caplog.records) == 4
    assert "997 more like it" in caplog.records[-1].getMessage()
    with pytest.raises(ValueError):
        RateLimitedLog(logging.getLogger("x"), burst=0)
