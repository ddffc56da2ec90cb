"""The simulator's loopback SLCAN bridge (``cellcal.sim.slcan_bridge``): the Lawicel codec
(pure, fuzzed), the adapter's answers (scripted exchanges), and python-can's own ``slcan``
interface through it on ``socket://127.0.0.1`` and on a pty."""

from __future__ import annotations

import itertools
import socket
import threading
import time

import can
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.sim.slcan_bridge import (
    BEL,
    CR,
    LineSplitter,
    SlcanAdapter,
    SlcanBridge,
    SlcanFrame,
    check_loopback,
    encode_frame,
    parse_command,
)

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

_channels = itertools.count()


def _recv(bus: can.BusABC, timeout_s: float = 2.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = bus.recv(0.05)
        if m is not None:
            return m
    return None


# -- codec -----------------------------------------------------------------------------------
def test_parse_and_encode_by_hand():
    c = parse_command(b"t18160102030405AA")
    assert c.kind == "transmit" and c.frame == SlcanFrame(0x181, bytes.fromhex("0102030405AA"))
    assert encode_frame(c.frame) == b"t18160102030405AA\r"
    e = parse_command(b"T01ABCDEF2BEEF")
    assert e.frame == SlcanFrame(0x1ABCDEF, b"\xbe\xef", extended=True)
    r = parse_command(b"r7004")
    assert r.frame == SlcanFrame(0x700, b"", remote=True, dlc=4) and encode_frame(r.frame) == b"r7004\r"
    assert encode_frame(SlcanFrame(0x80), timestamp_ms=61234) == b"t0800" + b"04D2" + b"\r"  # 61234 % 60000 = 0x04D2
    assert parse_command(b"S6").value == 6 and parse_command(b"s031C").value == 0x031C
    assert [parse_command(x).kind for x in (b"O", b"L", b"C", b"F", b"V", b"N", b"Z1", b"X0", b"", b"M00000000")] == [
        "open", "listen", "close", "status", "version", "serial", "timestamps", "autopoll", "empty",
        "acceptance_code"]
    for bad in (b"t1819AA", b"t18", b"t1812A", b"tXYZ0", b"S", b"SA", b"Z2", b"Q", b"O1", b"r7004AA", b"s12"):
        assert parse_command(bad).kind == "invalid", bad


@given(st.binary(max_size=300))
def test_garbage_never_raises_and_every_line_is_answered(data):
    splitter = LineSplitter()
    adapter = SlcanAdapter()
    lines = splitter.feed(data)
    assert len(lines) == data.count(b"\r")
    for line in lines:
        cmd = None if line is None else parse_command(line)
        reply, frame = adapter.handle(cmd)
        assert reply.endswith(CR) or reply == BEL
        assert frame is None or isinstance(frame, SlcanFrame)
        assert line is None or len(line) <= 64


@given(st.integers(0, 0x7FF), st.binary(max_size=8), st.booleans())
def test_frames_round_trip(can_id, data, extended):
    f = SlcanFrame(can_id, data, extended)
    line = encode_frame(f)
    assert line.endswith(b"\r")
    assert parse_command(line[:-1]).frame == f


def test_overlong_lines_are_dropped_up_to_their_cr():
    s = LineSplitter()
    assert s.feed(b"t" + b"0" * 100) == []
    assert s.feed(b"00\rO\r") == [None, b"O"]


# -- the adapter's answers (scripted) --------------------------------------------------------
def test_adapter_script():
    a = SlcanAdapter(clock_ms=lambda: 1234)
    script = [
        (b"C", BEL),  # closed already
        (b"S6", CR),
        (b"", CR),
        (b"t1230", BEL),  # transmit while closed
        (b"Z1", CR),
        (b"V", b"V0101\r"),
        (b"N", b"NCC01\r"),
        (b"F", BEL),  # status needs an open channel
        (b"O", CR),
        (b"O", BEL),  # open twice
        (b"S4", BEL),  # no bitrate change while open
        (b"t12321122", b"z\r"),
        (b"T000001230", b"Z\r"),
        (b"F", b"F00\r"),
        (b"C", CR),
        (b"L", CR),
        (b"t1230", BEL),  # listen only
    ]
    for cmd, want in script:
        got, _ = a.handle(parse_command(cmd))
        assert got == want, (cmd, got, want)
    assert a.bitrate == 500_000 and a.listen_only
    assert a.receive(SlcanFrame(0x181, b"\x01")) == b"t181101" + b"04D2" + b"\r"


def test_adapter_poll_mode_and_overrun():
    a = SlcanAdapter()
    for cmd in (b"X0", b"O"):
        a.handle(parse_command(cmd))
    assert a.receive(SlcanFrame(0x181, b"\x01")) == b""  # queued
    assert a.handle(parse_command(b"P"))[0] == b"t1811" + b"01\r"
    assert a.handle(parse_command(b"P"))[0] == CR  # nothing left
    for _ in range(70):
        a.receive(SlcanFrame(0x182))
    assert a.handle(parse_command(b"F"))[0] == b"F08\r"  # data overrun
    assert a.handle(parse_command(b"F"))[0] == b"F00\r"  # cleared by reading
    assert a.handle(parse_command(b"A"))[0].endswith(b"A\r")


def test_loopback_only():
    assert check_loopback("127.0.0.1") == "127.0.0.1" and check_loopback("localhost") == "127.0.0.1"
    assert check_loopback("127.3.2.1") == "127.3.2.1"
    for host in ("0.0.0.0", "192.168.1.10", "239.74.163.2", "::1", "example.org"):
        with pytest.raises(ValueError):
            SlcanBridge("x", host=host)


# -- what python-can's slcan sends at open ----------------------------------------------------
def test_python_can_slcan_open_sequence():
    """python-can's slcan with a bitrate sends C, S6, an empty line, O, O (and C at shutdown);
    it does not wait for the answers. The bridge's docstring relies on this."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = bytearray()

    def serve():
        conn, _ = srv.accept()
        conn.settimeout(2.0)
        try:
            while True:
                chunk = conn.recv(100)
                if not chunk:
                    break
                got.extend(chunk)
        except OSError:
            pass
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    bus = can.Bus(interface="slcan", channel=f"socket://127.0.0.1:{srv.getsockname()[1]}",
                  bitrate=500_000, sleep_after_open=0)
    bus.shutdown()
    t.join(3)
    srv.close()
    assert bytes(got) == b"C\rS6\r\rO\rO\rC\r"


# -- python-can through the bridge ------------------------------------------------------------
@pytest.mark.parametrize("transport", ["tcp", "pty"])
def test_python_can_slcan_through_the_bridge(transport):
    ch = f"slcan-test-{next(_channels)}"
    peer = can.Bus(interface="virtual", channel=ch)
    with SlcanBridge(ch, transport=transport) as bridge:
        url = bridge.channel_url
        assert url.startswith("socket://127.0.0.1:") if transport == "tcp" else url.startswith("/dev/")
        host = can.Bus(interface="slcan", channel=url, bitrate=500_000, sleep_after_open=0)
        try:
            assert host.get_version(2.0) == (1, 1) and host.get_serial_number(2.0) == "CC01"
            host.send(can.Message(arbitration_id=0x601, data=b"\x40\x41\x60\x00\x00\x00\x00\x00", is_extended_id=False))
            m = _recv(peer)
            assert m is not None and m.arbitration_id == 0x601 and bytes(m.data)[:4] == b"\x40\x41\x60\x00"
            peer.send(can.Message(arbitration_id=0x1ABCDE, data=b"\x07", is_extended_id=True))
            m = _recv(host)
            assert m is not None and m.arbitration_id == 0x1ABCDE and m.is_extended_id and bytes(m.data) == b"\x07"
        finally:
            host.shutdown()
    peer.shutdown()


def test_two_hosts_on_one_bridge_see_each_other_and_garbage_is_harmless():
    ch = f"slcan-test-{next(_channels)}"
    with SlcanBridge(ch) as bridge:
        a = can.Bus(interface="slcan", channel=bridge.channel_url, sleep_after_open=0)
        raw = socket.create_connection(("127.0.0.1", bridge.port), timeout=2.0)
        try:
            raw.sendall(b"\x00\xff garbage\rO\r")
            answers = b""
            while answers.count(b"\r") + answers.count(b"\x07") < 2:
                answers += raw.recv(100)
            assert answers.startswith(BEL) and CR in answers
            a.send(can.Message(arbitration_id=0x123, data=b"\x01\x02", is_extended_id=False))
            seen = b""
            deadline = time.monotonic() + 2.0
            while b"t1232" + b"0102\r" not in seen:
                assert time.monotonic() < deadline, seen
                seen += raw.recv(100)
            raw.sendall(b"t3211AB\r")
            m = _recv(a)
            assert m is not None and m.arbitration_id == 0x321 and bytes(m.data) == b"\xab"
        finally:
            raw.close()
            a.shutdown()
