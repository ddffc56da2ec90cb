"""The UR dashboard server and primary interface: codecs (fuzzed), the simulator's servers,
and the UR driver's use of them (factory kinematics, serial number, remote-control check).

Everything on loopback with the real simulator; nothing mocked.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellcal.drivers import connect_robot
from cellcal.drivers import ur_primary as up
from cellcal.drivers.errors import DeviceError, DriverInitError, ProtocolError
from cellcal.drivers.kinematics import dh_model, kinematics_digest
from cellcal.drivers.robot import ProtectiveStop
from cellcal.drivers.ur_dashboard import (
    DashboardClient,
    LineReader,
    parse_bool,
    parse_prefixed,
    parse_program_state,
    parse_serial,
    parse_version,
)
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.world import World

FACTORY = {"theta_delta_deg": [0.0, 0.12, -0.18, 0.09, -0.07, 0.05], "a_delta_mm": [0.0, 1.1, -0.8, 0.0, 0.0, 0.0],
           "d_delta_mm": [0.3, 0.0, 0.0, 0.6, -0.5, 0.4], "alpha_delta_deg": [0.04, 0.0, 0.0, -0.05, 0.06, 0.0]}
HOME = np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])


def _world() -> World:
    return World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=dh_model("ur5e").forward(HOME),
                 time_scale=10.0)


finite = st.floats(-10.0, 10.0, allow_nan=False)


# ---- primary codec ------------------------------------------------------------------------------

@given(st.lists(st.integers(0, 2**32 - 1), min_size=6, max_size=6), st.lists(finite, min_size=24, max_size=24),
       st.integers(0, 2**32 - 1))
def test_kinematics_info_round_trips(checksums, dh, status):
    k = up.KinematicsInfo(tuple(checksums), tuple(dh[0:6]), tuple(dh[6:12]), tuple(dh[12:18]), tuple(dh[18:24]), status)
    msg = up.encode_robot_state([up.encode_kinematics_info(k)])
    r = up.PrimaryReader()
    r.feed(msg)
    (got,) = list(r.messages())
    assert isinstance(got, up.RobotStateMessage) and got.find(up.KinematicsInfo) == k


def test_kinematics_info_layout_is_big_endian_and_220_bytes():
    k = up.KinematicsInfo((1, 2, 3, 4, 5, 6), (0.5,) * 6, (1.0,) * 6, (2.0,) * 6, (3.0,) * 6, 7)
    sub = up.encode_kinematics_info(k)
    assert struct.unpack(">IB", sub[:5]) == (5 + 220, 5)
    assert struct.unpack(">I", sub[5:9]) == (1,) and struct.unpack(">d", sub[29:37]) == (0.5,)
    assert struct.unpack(">I", sub[-4:]) == (7,)


def test_version_and_text_messages_round_trip():
    v = up.VersionMessage("URControl", 5, 23, 0, 1234, "Dec 1 2026", 99, 254)
    t = up.TextMessage("script rejected: x", 5, 0)
    r = up.PrimaryReader()
    r.feed(up.encode_version_message(v) + up.encode_text_message(t))
    assert list(r.messages()) == [v, t]
    assert v.version == (5, 23, 0, 1234)


def test_a_bad_sub_package_is_an_error_for_its_message_only():
    good = up.encode_robot_state([up.encode_robot_mode_data(up.RobotModeData(1, True, True, True, False, False, False,
                                                                             False, 7, 0, 1.0, 1.0, 1.0))])
    bad = up.encode_robot_state([struct.pack(">IB", 5 + 10, up.StatePackage.KINEMATICS_INFO) + b"\0" * 10])
    r = up.PrimaryReader()
    r.feed(bad + good)
    items = list(r.messages())
    assert isinstance(items[0], ProtocolError) and "kinematics info of 10 bytes" in str(items[0])
    assert isinstance(items[1], up.RobotStateMessage) and items[1].find(up.RobotModeData).robot_mode == 7


def test_a_header_no_controller_sends_loses_the_framing():
    r = up.PrimaryReader()
    r.feed(struct.pack(">iB", 2, 16))
    with pytest.raises(ProtocolError, match="framing lost"):
        list(r.messages())
    with pytest.raises(ProtocolError):
        list(r.messages())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 64))
def test_primary_reader_never_raises_anything_but_protocol_errors(data, chunk):
    r = up.PrimaryReader()
    try:
        for i in range(0, len(data), chunk):
            r.feed(data[i:i + chunk])
            for item in r.messages():
                assert isinstance(item, (up.RobotStateMessage, up.VersionMessage, up.TextMessage, up.RawPackage,
                                         ProtocolError))
    except ProtocolError:
        pass


# ---- dashboard codec ---------------------------------------------------------------------------

def test_dashboard_parsers():
    assert parse_prefixed("Robotmode: RUNNING", "Robotmode") == "RUNNING"
    with pytest.raises(ProtocolError, match="Robotmode"):
        parse_prefixed("could not understand: 'robotmode'", "Robotmode")
    with pytest.raises(ProtocolError, match="none of"):
        parse_prefixed("Robotmode: FLYING", "Robotmode", ("RUNNING",))
    assert parse_bool("true") is True and parse_bool("False") is False
    with pytest.raises(ProtocolError):
        parse_bool("yes")
    assert parse_version("URSoftware 5.23.0.1234 (Dec 01 2026)") == (5, 23, 0, 1234)
    assert parse_serial("20235500042") == "20235500042"
    with pytest.raises(ProtocolError):
        parse_serial("could not understand: 'get serial number'")
    assert parse_program_state("STOPPED <unnamed>") == ("STOPPED", "<unnamed>")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, 97))
def test_line_reader_splits_any_bytes_and_bounds_a_line(data, chunk):
    r = LineReader(max_line_bytes=512)
    lines: list[str] = []
    try:
        for i in range(0, len(data), chunk):
            r.feed(data[i:i + chunk])
            lines += r.lines()
    except ProtocolError:
        return
    assert all("\n" not in line and len(line) <= 512 for line in lines)


# ---- the simulator's servers ---------------------------------------------------------------------

def test_simulated_dashboard_answers_and_changes_state():
    world = _world()
    with start_sim_robot(world, {"serial_number": "20235500042", "initial_robot_mode": "power_off"}) as h:
        with DashboardClient("127.0.0.1", h.dashboard_port) as d:
            assert d.greeting == "Connected: Universal Robots Dashboard Server"
            assert d.robot_mode() == "POWER_OFF" and d.safety_status() == "NORMAL"
            assert d.is_in_remote_control() is True and d.serial_number() == "20235500042"
            assert d.polyscope_version() == (5, 23, 0, 0) and d.robot_model() == "UR5"
            assert d.program_state()[0] == "STOPPED"
            assert d.command("brake release").startswith("Brake release failed")
            assert d.command("power on") == "Powering on" and d.robot_mode() == "IDLE"
            assert d.command("brake release") == "Brake releasing" and d.robot_mode() == "RUNNING"
            assert d.command("frobnicate") == "could not understand: 'frobnicate'"
            h.robot.inject("protective_stop", duration_s=100.0)
            assert d.safety_status() == "PROTECTIVE_STOP"
            assert d.command("unlock protective stop") == "Protective stop releasing" and d.safety_status() == "NORMAL"
            h.robot.inject("local_control", duration_s=100.0)
            assert d.is_in_remote_control() is False


def test_simulated_primary_interface_serves_the_factory_table():
    world = _world()
    with start_sim_robot(world, {"factory": FACTORY}) as h:
        info = up.read_controller_info("127.0.0.1", h.primary_port, timeout_s=5.0)
        assert info.version.project_name == "URControl" and info.version.version == (5, 23, 0, 0)
        model = info.kinematics.model("ur5e")
        np.testing.assert_allclose(model.forward(HOME), h.robot.model.forward(HOME), atol=1e-12)
        assert info.kinematics.digest == kinematics_digest(h.robot.model) != kinematics_digest(dh_model("ur5e"))
        assert info.kinematics.checksums == up.joint_checksums(*(tuple(v) for v in h.robot.model.ur_table()))
        assert info.robot_mode is not None and info.robot_mode.robot_mode == 7
        # robot-state messages keep coming at about 10 Hz
        with socket.create_connection(("127.0.0.1", h.primary_port), timeout=3.0) as s:
            r = up.PrimaryReader()
            states = 0
            deadline = time.monotonic() + 5.0
            while states < 3 and time.monotonic() < deadline:
                r.feed(s.recv(65536))
                states += sum(isinstance(m, up.RobotStateMessage) for m in r.messages())
            assert states >= 3


def test_cellcal_sim_prints_the_dashboard_and_primary_ports(tmp_path):
    scen = tmp_path / "s.toml"
    scen.write_text('[time]\nscale = 1.0\n[truth]\ncell_T_base_xyz_m = [2, 0, 0]\ncell_T_base_quat_wxyz = [1, 0, 0, 0]\n'
                    'flange_T_target_xyz_m = [0, 0, 0]\nflange_T_target_quat_wxyz = [1, 0, 0, 0]\n'
                    '[tracker]\nnoise_mm = 0.01\nnoise_deg = 0.001\n[robot]\nserial_number = "123"\n')
    proc = subprocess.Popen([sys.executable, "-m", "cellcal.daemon.cli", "sim", "--scenario", str(scen)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        import select

        r, _, _ = select.select([proc.stdout], [], [], 20.0)
        assert r, "cellcal sim printed nothing"
        urls = json.loads(proc.stdout.readline())
        assert isinstance(urls["dashboard"], int) and isinstance(urls["primary"], int)
        assert f"dashboard_port={urls['dashboard']}" in urls["robot"] and f"primary_port={urls['primary']}" in urls["robot"]
        with DashboardClient("127.0.0.1", urls["dashboard"]) as d:
            assert d.serial_number() == "123"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---- the driver -----------------------------------------------------------------------------------

def test_driver_uses_the_factory_table_and_records_the_serial():
    world = _world()
    with start_sim_robot(world, {"factory": FACTORY, "serial_number": "20235500042"}) as h, connect_robot(h.url) as robot:
        assert robot.kinematics_source == "factory" and robot.serial_number == "20235500042"
        assert robot.kinematics_digest == kinematics_digest(h.robot.model)
        s = robot.read_state()
        # FK of the reported joints with the driver's model is the controller's own pose ...
        np.testing.assert_allclose(robot.model.forward(s.q_rad), s.base_T_flange, atol=1e-9)
        # ... which the data-sheet model misses by millimetres
        err = np.linalg.norm(dh_model("ur5e").forward(s.q_rad)[:3, 3] - s.base_T_flange[:3, 3])
        assert 1e-3 < err < 2e-2
    with start_sim_robot(world, {"factory": FACTORY}) as h, connect_robot(h.url, kinematics="nominal") as robot:
        assert robot.kinematics_source == "nominal" and robot.model.name == "ur5e"


def test_driver_without_a_primary_interface():
    world = _world()
    with start_sim_robot(world, {"factory": FACTORY}, primary_port=None) as h:
        url = h.url
        assert "primary_port=0" in url
        with connect_robot(url) as robot:  # auto: the data sheet, with a warning
            assert robot.kinematics_source == "nominal" and robot.kinematics_digest == kinematics_digest(dh_model("ur5e"))
        with pytest.raises(DriverInitError, match="kinematics=factory"):
            connect_robot(url, kinematics="factory").open()


def _moves(robot, q) -> None:
    robot.move_to(q_rad=q, speed=1.0, timeout_s=20.0)


def test_driver_refuses_to_move_out_of_remote_control_naming_the_dashboard_state():
    world = _world()
    with start_sim_robot(world, {"remote_control": False}) as h, connect_robot(h.url) as robot:
        q = robot.read_state().q_rad + np.deg2rad([5, 0, 0, 0, 0, 0])
        moves = h.robot.moves
        with pytest.raises(DeviceError, match="is in remote control: false") as ei:
            _moves(robot, q)
        assert ei.value.code == "NOT_IN_REMOTE_CONTROL" and h.robot.moves == moves
        h.robot.set_remote_control(True)
        _moves(robot, q)
        assert h.robot.moves == moves + 1
        h.robot.inject("local_control", duration_s=1000.0)
        with pytest.raises(DeviceError, match="not in remote control"):
            _moves(robot, q + 0.05)


def test_driver_refuses_to_move_when_not_running_or_stopped():
    world = _world()
    with start_sim_robot(world, {"initial_robot_mode": "idle"}) as h, connect_robot(h.url) as robot:
        q = robot.read_state().q_rad + np.deg2rad([0, 0, 0, 0, 0, 5])
        with pytest.raises(DeviceError, match="robotmode IDLE") as ei:
            _moves(robot, q)
        assert ei.value.code == "ROBOT_NOT_READY"
        h.robot.brake_release()
        _moves(robot, q)
        h.robot.inject("protective_stop", duration_s=1000.0)
        with pytest.raises(ProtectiveStop):
            _moves(robot, q + 0.05)


def test_driver_with_no_dashboard_moves_only_when_told_there_is_none():
    world = _world()
    with start_sim_robot(world, {}, dashboard_port=None) as h:
        assert "dashboard_port=0" in h.url
        with connect_robot(h.url) as robot:  # the URL says: no dashboard; moves go unchecked
            assert robot.serial_number is None
            _moves(robot, robot.read_state().q_rad + np.deg2rad([3, 0, 0, 0, 0, 0]))
        # a dashboard that should be there but is not: no move
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()
        with connect_robot(h.url.replace("dashboard_port=0", f"dashboard_port={port}"), connect_timeout_s=1.0) as robot:
            with pytest.raises(DeviceError) as ei:
                _moves(robot, robot.read_state().q_rad + np.deg2rad([3, 0, 0, 0, 0, 0]))
            assert ei.value.code == "DASHBOARD_UNAVAILABLE"


def test_digest_changes_with_any_parameter():
    m = dh_model("ur5e")
    d0 = kinematics_digest(m)
    assert d0.startswith("sha256:") and kinematics_digest(dh_model("ur5e")) == d0
    for key in ("theta_rad", "a_m", "d_m", "alpha_rad"):
        delta = np.zeros(6)
        delta[3] = 1e-12
        assert kinematics_digest(m.with_deltas(**{key: delta})) != d0
    # a model with Hayati tilts (an identified arm) has a digest of its own, tilts included
    tilted = kinematics_digest(m.with_deltas(beta_rad=[0, 1e-4, 0, 0, 0, 0]))
    assert tilted.startswith("sha256:") and tilted != d0
    assert tilted != kinematics_digest(m.with_deltas(beta_rad=[0, 2e-4, 0, 0, 0, 0]))
    assert math.isfinite(float(m.forward(HOME)[0, 3]))
