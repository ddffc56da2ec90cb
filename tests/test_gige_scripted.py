"""The GVCP client against scripted device answers on a loopback socket (no simulator).

Each script step is the command the client must send and what the "device" does with it:
answer, stay silent (the client repeats), answer late with a stale id first, ask for more
time (PENDING_ACK), or refuse. The script must be consumed exactly.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from cellcal.drivers import gige_codec as gc
from cellcal.drivers.camera import CameraDeviceError, CameraTimeoutError, connect_camera, parse_camera_url
from cellcal.drivers.errors import DeviceGoneError, DriverInitError
from cellcal.drivers.gige_link import GvcpClient


class ScriptedDevice:
    """Answers GVCP commands from a script of ``(expected command type, replies)``; each reply
    is a function of the received command returning datagrams to send back (maybe none)."""

    def __init__(self, script):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(5.0)
        self.port = self.sock.getsockname()[1]
        self.script = list(script)
        self.received: list[gc.GvcpCmd] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for expect, reply in self.script:
                data, sender = self.sock.recvfrom(2048)
                cmd = gc.decode_cmd(data)
                self.received.append(cmd)
                assert isinstance(cmd, expect), f"expected {expect.__name__}, got {cmd!r}"
                for out in reply(cmd):
                    self.sock.sendto(out, sender)
        except BaseException as exc:  # reported by done()
            self.error = exc

    def done(self):
        self.thread.join(timeout=10)
        self.sock.close()
        if self.error:
            raise self.error
        assert not self.thread.is_alive(), "the script was not consumed"


def ack_value(value):
    return lambda cmd: [gc.encode_ack(gc.ReadRegAck(cmd.req_id, 0, (value,)))]


def silent(cmd):
    return []


@pytest.fixture
def client_for():
    made = []

    def make(dev, **kw):
        c = GvcpClient("127.0.0.1", dev.port, **{"ack_timeout_s": 0.05, "retries": 2, **kw})
        c.open()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_a_lost_acknowledge_is_repeated_with_the_same_request_id(client_for):
    dev = ScriptedDevice([(gc.ReadRegCmd, silent), (gc.ReadRegCmd, ack_value(0x2))])
    client = client_for(dev)
    assert client.read_reg(gc.Reg.CCP, time.monotonic() + 5) == 2
    dev.done()
    assert dev.received[0].req_id == dev.received[1].req_id != 0


def test_stale_and_foreign_answers_are_skipped(client_for):
    def stale_then_right(cmd):
        return [b"garbage", gc.encode_ack(gc.ReadRegAck(cmd.req_id - 1 or 0xFFFF, 0, (99,))),
                gc.encode_ack(gc.WriteRegAck(cmd.req_id, 0, 1)),  # right id, wrong answer
                gc.encode_ack(gc.ReadRegAck(cmd.req_id, 0, (7,)))]

    dev = ScriptedDevice([(gc.ReadRegCmd, stale_then_right)])
    client = client_for(dev)
    assert client.read_reg(0x938, time.monotonic() + 5) == 7
    dev.done()
    assert client.stray == 3


def test_pending_ack_extends_the_wait(client_for):
    def pending_then_late(cmd):
        yield gc.encode_ack(gc.PendingAck(cmd.req_id, 0, 300))
        time.sleep(0.15)  # three times the ack timeout, inside the pending time
        yield gc.encode_ack(gc.WriteRegAck(cmd.req_id, 0, 1))

    dev = ScriptedDevice([(gc.WriteRegCmd, pending_then_late)])
    client = client_for(dev, retries=0)
    client.write_reg(gc.Reg.CCP, gc.CCP_CONTROL, time.monotonic() + 5)
    dev.done()
    assert len(dev.received) == 1


def test_refusals_are_typed_and_silence_times_out(client_for):
    def denied(cmd):
        return [gc.encode_ack(gc.StatusAck(cmd.req_id, gc.Status.ACCESS_DENIED, gc.Command.WRITEREG_ACK))]

    dev = ScriptedDevice([(gc.WriteRegCmd, denied), (gc.ReadRegCmd, silent), (gc.ReadRegCmd, silent),
                          (gc.ReadRegCmd, silent)])
    client = client_for(dev)
    with pytest.raises(CameraDeviceError) as refused:
        client.write_reg(gc.Reg.CCP, 2, time.monotonic() + 5)
    assert refused.value.code == "ACCESS_DENIED"
    with pytest.raises(CameraTimeoutError):
        client.read_reg(0, time.monotonic() + 5)
    dev.done()
    assert isinstance(refused.value, CameraDeviceError)


def test_memory_reads_split_into_512_byte_commands(client_for):
    blob = bytes(range(256)) * 5  # 1280 bytes

    def mem(cmd):
        return [gc.encode_ack(gc.ReadMemAck(cmd.req_id, 0, cmd.address, blob[cmd.address - 0x1000:][:cmd.count]))]

    dev = ScriptedDevice([(gc.ReadMemCmd, mem)] * 3)
    client = client_for(dev)
    assert client.read_mem(0x1002, 1270, time.monotonic() + 5) == blob[2:1272]
    dev.done()
    assert [(c.address, c.count) for c in dev.received] == [(0x1000, 512), (0x1200, 512), (0x1400, 248)]


def test_nothing_listening_is_device_gone_and_open_fails_typed():
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a port nobody listens on: loopback answers ICMP port-unreachable
    client = GvcpClient("127.0.0.1", port, ack_timeout_s=0.2, retries=1)
    client.open()
    try:
        with pytest.raises((DeviceGoneError, CameraTimeoutError)):
            client.read_reg(0, time.monotonic() + 2)
    finally:
        client.close()
    cam = connect_camera(f"gige://127.0.0.1:{port}?ack_timeout_s=0.05&retries=0")
    with pytest.raises(DriverInitError):
        cam.open()
    assert not cam.is_open
    cam.close()  # idempotent, never raises


def test_a_subnet_broadcast_address_is_refused_at_open_and_nothing_is_sent():
    # 127.255.255.255 is loopback's broadcast address (the kernel's local routing table):
    # the URL check cannot tell it from a host (a /23's .255 is one), the kernel's UDP
    # connect refuses it without SO_BROADCAST, before any datagram; the error says why
    cam = connect_camera("gige://127.255.255.255?ack_timeout_s=0.05&retries=0")
    with pytest.raises(DriverInitError, match="broadcast address of a local network"):
        cam.open()
    assert not cam.is_open
    cam.close()


# -- URLs and options -------------------------------------------------------------------------


@pytest.mark.parametrize("url, part", [
    ("gige://", "host"),
    ("gige://camera.local", "IPv4"),
    ("gige://0.0.0.0", "not one device"),
    ("gige://255.255.255.255", "not one device"),
    ("gige://239.1.1.1", "not one device"),
    ("gige://127.0.0.1:99999", "port"),
    ("gige://127.0.0.1:x", "port"),
    ("usb3://1", "scheme"),
    ("dir://", "path"),
    ("127.0.0.1", "scheme://"),
    ("gige://127.0.0.1?a=1&a=2", "twice"),
])
def test_bad_urls_name_the_part(url, part):
    with pytest.raises(ValueError, match=part):
        parse_camera_url(url)


def test_urls_and_options():
    u = parse_camera_url("gige://127.0.0.5?heartbeat_timeout_s=1.5")
    assert (u.scheme, u.host, u.port, dict(u.query)) == ("gige", "127.0.0.5", 3956, {"heartbeat_timeout_s": "1.5"})
    assert parse_camera_url("dir:///data/run%201").path == "/data/run 1"
    cam = connect_camera("gige://127.0.0.5:4000?heartbeat_timeout_s=1.5", retries=1)
    assert (cam.host, cam.port, cam.options["heartbeat_timeout_s"], cam.options["retries"]) == ("127.0.0.5", 4000, 1.5, 1)
    assert not cam.is_open  # constructing did no I/O
    with pytest.raises(ValueError, match="heartbeat"):
        connect_camera("gige://127.0.0.5?heartbeat=1")
    with pytest.raises(ValueError, match="clock"):
        connect_camera("gige://127.0.0.5", clock="ntp")


def test_camera_backends_are_lazy_and_name_themselves():
    import subprocess
    import sys

    from cellcal.drivers.base import load_backend
    from cellcal.drivers.camera import BACKENDS, CameraDriver

    code = ("import sys, cellcal.drivers.camera;"
            "assert not {'cv2', 'cellcal.drivers.gige', 'cellcal.drivers.gige_link', 'cellcal.drivers.genicam',"
            " 'cellcal.drivers.camera_dir'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    for name, spec in BACKENDS.items():
        assert isinstance(spec, str) and ":" in spec
        cls = load_backend(BACKENDS, name, "camera URL scheme")
        assert issubclass(cls, CameraDriver) and cls.backend == name
    with pytest.raises(ValueError, match="gige"):
        load_backend(BACKENDS, "usb3", "camera URL scheme")
