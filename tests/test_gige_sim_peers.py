"""Aravis's own tools against our simulated camera, and where every datagram goes.

``arv-tool-0.8 -a <address>`` reads and writes features through our GenICam XML (zipped and
plain), ``arv-camera-test-0.8 -n <address>`` acquires frames and reads their chunk data, and
Aravis's GObject binding (through the system Python) reads our leader timestamps with our
tick frequency: the check the other way round from our driver against Aravis's fake camera. Both run under ``strace``, as
does our own driver in a subprocess: every ``connect``/``sendto``/``sendmsg`` destination of
every process must be in 127.0.0.0/8 (no broadcast discovery, no other address), and the
simulated camera's own sends are checked the same way.
"""

from __future__ import annotations

import ipaddress
import os
import re
import struct
import subprocess
import sys
import textwrap

import pytest
from _gige import find_tool, sim_process, start_sim

from cellcal.sim.gige_device import DEVICE_REGS

pytestmark = pytest.mark.slow

_INET = re.compile(r'inet_addr\("([0-9.]+)"\)|inet_pton\(AF_INET6?, "([^"]+)"')


def run(cmd: list[str], timeout: float = 60.0) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}: {out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def traced(cmd: list[str], tmp_path, timeout: float = 60.0) -> tuple[str, set[str]]:
    """Run ``cmd`` under strace; its output and every network destination it used."""
    log = tmp_path / f"strace-{len(list(tmp_path.iterdir()))}.txt"
    out = run([find_tool("strace"), "-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-o", str(log),
               *cmd], timeout)
    dests = set()
    for line in log.read_text().splitlines():
        if "AF_INET" not in line:
            continue
        for m in _INET.finditer(line):
            dests.add(m.group(1) or m.group(2))
    return out, dests


def assert_loopback_only(dests: set[str], device: str) -> None:
    assert device in dests, f"the trace saw no datagram to the device ({dests})"
    outside = [d for d in dests if not ipaddress.ip_address(d).is_loopback]
    assert not outside, f"datagrams left the loopback: {outside}"


def controls(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^(\w+) = (.*)$", text, re.M)}


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "plain"])
def test_arv_tool_reads_and_writes_our_features(zipped, tmp_path):
    arv_tool = find_tool("arv-tool-0.8")
    dev = start_sim(sensor=(320, 240), zip_xml=zipped, serial="SIMPEER1")
    try:
        out, dests = traced([arv_tool, "-a", dev.address, "control", "DeviceVendorName", "DeviceModelName",
                             "DeviceSerialNumber", "Width", "Height", "PixelFormat", "PayloadSize",
                             "GevTimestampTickFrequency"], tmp_path)
        values = controls(out)
        assert values["DeviceVendorName"] == "cellcal" and values["DeviceModelName"] == "SimCam"
        assert values["DeviceSerialNumber"] == "SIMPEER1"
        assert values["Width"].startswith("320") and values["Height"].startswith("240")
        assert values["PixelFormat"] == "Mono8" and values["PayloadSize"] == str(320 * 240)
        assert values["GevTimestampTickFrequency"].startswith("125000000")
        assert_loopback_only(dests, dev.address)
        run([arv_tool, "-a", dev.address, "control", "ExposureTime=1234", "Gain=2.5", "Width=200"])
        # the device holds what Aravis wrote, in our registers' encodings
        assert struct.unpack_from(">d", dev._mem, DEVICE_REGS["ExposureTime"])[0] == 1234.0
        assert struct.unpack_from(">I", dev._mem, DEVICE_REGS["GainRaw"])[0] == 25
        assert struct.unpack_from(">I", dev._mem, DEVICE_REGS["Width"])[0] == 200
        values = controls(run([arv_tool, "-a", dev.address, "control", "ExposureTime", "Gain", "GainRaw"]))
        assert values["ExposureTime"].startswith("1234") and values["Gain"].startswith("2.5")
        assert values["GainRaw"].startswith("25")
        assert dev.controller is None  # Aravis released control on exit
    finally:
        dev.stop()
    assert all(ipaddress.ip_address(a).is_loopback for a, _ in dev.destinations)


def test_arv_camera_test_acquires_our_frames(tmp_path):
    exe = find_tool("arv-camera-test-0.8")
    dev = start_sim(sensor=(320, 240), frame_rate_hz=20.0)
    try:
        out, dests = traced([exe, "-n", dev.address, "--duration=2"], tmp_path)
        stats = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(n_\w+)\s+= (\d+)$", out, re.M)}
        assert stats["n_completed_buffers"] >= 10, out
        assert stats["n_size_mismatch_errors"] == 0  # our leader, payload and trailer add up for Aravis
        # a loaded machine may delay a frame past Aravis's packet timeout; most must come whole
        assert stats["n_failures"] <= stats["n_completed_buffers"] // 5, out
        assert re.search(r"payload\s+= 76800 bytes", out)
        assert dev.frames_sent >= stats["n_completed_buffers"]
        assert_loopback_only(dests, dev.address)
    finally:
        dev.stop()
    sent_to = {a for a, _ in dev.destinations}
    assert sent_to and all(ipaddress.ip_address(a).is_loopback for a in sent_to)


def test_arv_camera_test_reads_our_chunk_data():
    exe = find_tool("arv-camera-test-0.8")
    dev = start_sim(sensor=(64, 48), frame_rate_hz=20.0, exposure_s=0.0025, gain_db=1.5)
    try:
        out = run([exe, "-n", dev.address, "-u", "ExposureTime,Gain", "--duration=1"])
    finally:
        dev.stop()
    exposures = re.findall(r"^ChunkExposureTime = (\S+)$", out, re.M)
    gains = re.findall(r"^ChunkGain = (\S+)$", out, re.M)
    assert len(exposures) >= 5 and len(gains) == len(exposures), out
    assert {float(x) for x in exposures} == {2500.0} and {float(g) for g in gains} == {1.5}
    assert re.search(r"n_size_mismatch_errors = 0", out)  # PayloadSize counts the chunks


def test_the_simulated_camera_as_a_process_of_its_own():
    from cellcal.drivers.camera import connect_camera

    with sim_process("--serial", "SIMPROC1", "--sensor", "80x60", "--clock-drift-ppm", "150") as address:
        with connect_camera(f"gige://{address}") as cam:
            assert cam.info().serial == "SIMPROC1" and cam.clock_source == "latch"
            f = cam.grab(timeout_s=5.0)
            assert (f.width, f.height) == (80, 60) and f.tick_frequency_hz == 125e6
        values = controls(run([find_tool("arv-tool-0.8"), "-a", address, "control", "DeviceSerialNumber"]))
        assert values["DeviceSerialNumber"] == "SIMPROC1"


ARAVIS_GI = textwrap.dedent("""
    import json, sys
    import gi
    gi.require_version("Aravis", "0.8")
    from gi.repository import Aravis
    cam = Aravis.Camera.new(sys.argv[1])  # an address: opened without discovery
    stream = cam.create_stream(None, None)
    for _ in range(4):
        stream.push_buffer(Aravis.Buffer.new_allocate(cam.get_payload()))
    cam.start_acquisition()
    frames = []
    for _ in range(4):
        buf = stream.timeout_pop_buffer(5_000_000)
        if buf is not None and buf.get_status() == Aravis.BufferStatus.SUCCESS:
            frames.append([buf.get_frame_id(), buf.get_timestamp(), buf.get_image_width(), bytes(buf.get_data()[:8]).hex()])
        if buf is not None:
            stream.push_buffer(buf)
    cam.stop_acquisition()
    print(json.dumps({"tick": cam.get_device().get_integer_feature_value("GevTimestampTickFrequency"),
                      "frames": frames}))
""")


def system_python_with_aravis() -> str:
    """Debian's own Python, which has Aravis's binding (the project's venv Python has no ``gi``)."""
    exe = "/usr/bin/python3"
    probe = subprocess.run([exe, "-c", "import gi; gi.require_version('Aravis', '0.8'); from gi.repository import Aravis"],
                           capture_output=True, text=True, timeout=60) if os.path.exists(exe) else None
    if probe is None or probe.returncode != 0:
        pytest.fail("Aravis's GObject binding is not importable by the system Python (Debian packages python3-gi, "
                    f"gir1.2-aravis-0.8): run `make os-deps`\n{probe.stderr if probe else exe + ' is missing'}")
    return exe


def test_aravis_binding_reads_our_timestamps_at_exposure_start(tmp_path):
    import json

    from cellcal.sim.gige_device import DeviceClock, FrameRequest, RenderedFrame, TestPatternSource

    exe = system_python_with_aravis()
    starts: dict[int, int] = {}

    class Recording(TestPatternSource):
        def frame(self, request: FrameRequest) -> RenderedFrame:
            starts[request.index] = request.t_start_ns
            return super().frame(request)

    clock = DeviceClock(125_000_000, offset_s=5000.0, drift_ppm=80.0)
    dev = start_sim(source=Recording(), clock=clock, sensor=(64, 48), frame_rate_hz=20.0)
    try:
        text, dests = traced([exe, "-c", ARAVIS_GI, dev.address], tmp_path)
        out = json.loads(next(line for line in text.splitlines() if line.startswith("{")))
        assert_loopback_only(dests, dev.address)
    finally:
        dev.stop()
    assert out["tick"] == 125_000_000 and len(out["frames"]) >= 3
    for frame_id, ts_ns, width, head in out["frames"]:
        # Aravis turns our leader's ticks into ns with our tick frequency: the device clock
        # at the start of that frame's exposure, to the tick (8 ns)
        assert abs(ts_ns - clock.seconds(starts[frame_id - 1]) * 1e9) <= 8
        assert width == 64 and head == bytes((x + frame_id - 1) % 256 for x in range(8)).hex()


def test_our_driver_sends_to_the_device_only(tmp_path):
    dev = start_sim(sensor=(64, 48))
    script = textwrap.dedent(f"""
        from cellcal.drivers.camera import connect_camera
        with connect_camera("gige://{dev.address}") as cam:
            f = cam.grab(timeout_s=5.0)
            assert f.width == 64
        print("grabbed", f.frame_id)
    """)
    try:
        out, dests = traced([sys.executable, "-c", script], tmp_path)
        assert "grabbed" in out
        assert dests == {dev.address}  # no discovery, no broadcast, nothing but the device
    finally:
        dev.stop()
