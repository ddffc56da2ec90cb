"""RTDE client against the simulated controller over loopback TCP, and against scripted peers."""

from __future__ import annotations

import logging
import math
import socket
import threading
import time

import numpy as np
import pytest
from conftest import wait_until

from cellcal.drivers import connect_robot
from cellcal.drivers import rtde_codec as rc
from cellcal.drivers.errors import DeviceGoneError, DriverInitError, DriverTimeoutError
from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.robot import ProtectiveStop, RobotMode, parse_robot_url
from cellcal.drivers.settle import SettleConfig
from cellcal.drivers.ur_rtde import OPTIONAL_RECIPE, RECIPE, RECIPE_TYPES, RecipeFieldNotFound, pose_to_transform
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.rtde_server import parse_urscript
from cellcal.sim.world import World
from cellcal.solver.se3 import se3_inverse, so3_log

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

UR5E = dh_model("ur5e")
HOME_FLANGE = UR5E.forward(np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0]))
P = rc.PacketType
Q_HOME = np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])


def make_world(scale: float = 10.0) -> World:
    return World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=HOME_FLANGE, time_scale=scale)


@pytest.fixture
def sim():
    world = make_world()
    handle = start_sim_robot(world, {"encoder_noise_deg": 0.0005, "ringing_amplitude_deg": 0.02})
    yield handle
    handle.close()


def test_v2_handshake_and_state(sim):
    with connect_robot(sim.url, timeout_s=1.0) as robot:
        assert robot.protocol == 2
        assert str(robot.controller_version) == "5.23.0.0"
        s = robot.read_state()
        np.testing.assert_allclose(s.q_rad, Q_HOME, atol=1e-4)
        # TCP offset is zero, so the flange is the controller's FK of its joints
        np.testing.assert_allclose(s.base_T_flange, UR5E.forward(s.q_rad), atol=1e-9)
        assert s.mode is RobotMode.RUNNING and s.target_reached is None
        assert 1000.0 < s.t_device_s < 1100.0  # the sim controller clock starts at 1000 s
        s2 = robot.wait_for_sample_after(s.seq, 1.0)
        assert s2.t_device_s > s.t_device_s and s2.t_host_ns >= s.t_host_ns


def test_controller_clock_maps_to_host_time():
    world = make_world(scale=1.0)
    with start_sim_robot(world, {"clock_skew_ppm": 300.0, "clock_offset_s": 5000.0}) as h:
        with connect_robot(h.url, frequency_hz=250) as robot:
            # fed at clock_feed_hz = 50: wait for the samples, however long the machine takes
            wait_until(lambda: robot.clock.ready and robot.clock.n_samples > 30, 30.0, "31 clock samples")
            states = [robot.read_state()]
            while len(states) < 50:
                states.append(robot.wait_for_sample_after(states[-1].seq, 5.0))
            t_host = np.array([s.t_host_ns for s in states])
            t_recv = np.array([s.t_recv_host_ns for s in states])
            assert np.all(np.diff([s.t_device_s for s in states]) > 0)
            # mapped sample time: for the typical sample at or before arrival (up to the
            # model's error), and not far before it: how far is the machine's load (tens of ms
            # under two CPU burners), not the mapping's; an unmapped offset or skew is seconds
            assert -1e6 < np.median(t_recv - t_host) < 0.25e9
            # the mapping inverts: back from host time to the controller's own stamp
            s = states[-1]
            assert robot.clock.to_device_s(s.t_host_ns) == pytest.approx(s.t_device_s, abs=0.02)
            assert s.t_device_s > 5000.0


def test_v1_fallback_against_sim():
    world = make_world()
    with start_sim_robot(world, {"rtde_max_protocol": 1}) as h, connect_robot(h.url) as robot:
        assert robot.protocol == 1
        np.testing.assert_allclose(robot.read_state().q_rad, Q_HOME, atol=1e-9)


def test_text_messages_interleaved_are_logged_never_data(sim, caplog):
    caplog.set_level(logging.INFO, logger="cellcal.drivers.ur_rtde")
    with connect_robot(sim.url) as robot:
        seq = robot.read_state().seq
        for i in range(20):
            sim.server.send_text(f"note {i}", rc.TextLevel.WARNING)
            s = robot.wait_for_sample_after(seq, 1.0)
            seq = s.seq
            np.testing.assert_allclose(s.q_rad, Q_HOME, atol=1e-4)
        wait_until(lambda: "note 19" in caplog.text, 10.0, "the last text message in the log")
        assert robot.bad_packets == 0
        assert any(r.levelno == logging.WARNING and "note 3" in r.getMessage() for r in caplog.records)


def test_dropped_connection_gives_typed_error_then_reconnects(sim):
    with connect_robot(sim.url, reconnect_max_s=0.2) as robot:
        robot.read_state()
        sim.server.disconnect_all()

        def gone():
            try:
                robot.read_state(timeout_s=0.2)
            except DeviceGoneError:
                return True
            return False

        wait_until(gone, 10.0, "DeviceGoneError after the drop")
        s = wait_until(lambda: _try_read(robot), 10.0, "a state after reconnecting")
        assert robot.reconnects >= 1
        np.testing.assert_allclose(s.q_rad, Q_HOME, atol=1e-4)


def _try_read(robot):
    try:
        return robot.read_state(timeout_s=0.2)
    except (DeviceGoneError, DriverTimeoutError):
        return None


def test_disconnect_fault_refuses_then_recovers():
    world = make_world(scale=1.0)
    with start_sim_robot(world, {}) as h, connect_robot(h.url, reconnect_max_s=0.1) as robot:
        robot.read_state()
        h.robot.inject("disconnect")  # until cleared below
        with pytest.raises(DeviceGoneError):
            wait_until(lambda: robot.read_state(timeout_s=0.2) and False, 10.0, "the drop")
        # refused while the fault lasts (the backoff loop keeps trying)
        assert _try_read(robot) is None
        reconnects = robot.reconnects
        h.robot.clear("disconnect")
        # then the backoff loop gets back in
        s = wait_until(lambda: _try_read(robot), 10.0, "reconnection after the fault")
        assert robot.reconnects > reconnects
        assert s.mode is RobotMode.RUNNING


def test_movej_and_movel_reach_targets_and_settle(sim):
    q_target = np.deg2rad([20.0, -80.0, 100.0, -110.0, -90.0, 15.0])
    cfg = SettleConfig(max_joint_speed_rad_s=math.radians(0.05), dwell_s=0.15)
    with connect_robot(sim.url) as robot:
        robot.move_to(q_rad=q_target, speed=1.0, timeout_s=10)
        s, status = robot.wait_settled(cfg, timeout_s=10)
        np.testing.assert_allclose(s.q_rad, q_target, atol=2e-4)  # noise 0.0005 deg = 9e-6 rad
        assert status.max_joint_speed_rad_s <= cfg.max_joint_speed_rad_s
        # a Cartesian target 5 cm lower, same orientation
        target = s.base_T_flange.copy()
        target[2, 3] -= 0.05
        robot.move_to(base_T_flange=target, speed=1.0, timeout_s=10)
        s, _ = robot.wait_settled(cfg, timeout_s=10)
        err = se3_inverse(target) @ s.base_T_flange
        assert np.linalg.norm(err[:3, 3]) < 2e-4
        assert np.linalg.norm(so3_log(err[:3, :3])) < 5e-4
        assert sim.server.scripts_run == 2


def test_protective_stop_blocks_moves_until_cleared(sim):
    with connect_robot(sim.url) as robot:
        sim.robot.inject("protective_stop")
        wait_until(lambda: robot.read_state().mode is RobotMode.PROTECTIVE_STOP, 10.0, "protective stop")
        with pytest.raises(ProtectiveStop):
            robot.move_to(q_rad=Q_HOME + 0.1, timeout_s=5)
        sim.robot.clear("protective_stop")
        wait_until(lambda: robot.read_state().mode is RobotMode.RUNNING, 10.0, "running again")
        robot.move_to(q_rad=Q_HOME + 0.05, speed=1.0, timeout_s=10)
        np.testing.assert_allclose(robot.read_state().q_rad, Q_HOME + 0.05, atol=2e-3)


def test_protective_stop_during_move_raises(sim):
    with connect_robot(sim.url) as robot:
        def trip():  # once the move is under way
            wait_until(lambda: sim.robot.sample().moving, 10.0, "the move to start")
            sim.robot.inject("protective_stop")

        threading.Thread(target=trip, daemon=True).start()
        with pytest.raises(ProtectiveStop):
            robot.move_to(q_rad=Q_HOME + np.deg2rad(60), speed=0.2, timeout_s=10)


def test_stop_halts_a_move_short_of_its_target(sim):
    with connect_robot(sim.url) as robot:
        target = Q_HOME + np.deg2rad([90, 0, 0, 0, 0, 0])
        robot.move_to(q_rad=target, speed=0.05, wait=False)  # ~30 deg per wall second
        wait_until(lambda: robot.read_state().moving, 10.0, "motion start")
        robot.stop()
        s, _ = robot.wait_settled(SettleConfig(dwell_s=0.1), timeout_s=10)
        assert 0.0 < s.q_rad[0] - Q_HOME[0] < math.radians(60)


def test_tcp_offset_must_be_declared():
    world = make_world()
    tcp = [0.0, 0.0, 0.1, 0.0, 0.0, 0.0]  # a 100 mm tool on the pendant
    with start_sim_robot(world, {"tcp_offset": tcp}) as h:
        assert "tcp_offset=" in h.url
        with connect_robot(h.url) as robot:
            s = robot.read_state()
            np.testing.assert_allclose(s.base_T_flange, UR5E.forward(s.q_rad), atol=1e-9)
        bare = h.url.split("&tcp_offset=")[0]
        with pytest.raises(DriverInitError, match="TCP offset"):
            connect_robot(bare).open()
        with connect_robot(bare, tcp_check_mm=0) as robot:  # check off: TCP taken for flange
            s = robot.read_state()
            np.testing.assert_allclose(
                s.base_T_flange, UR5E.forward(s.q_rad) @ pose_to_transform(tcp), atol=1e-9
            )


def test_kinematic_error_makes_fk_imperfect():
    world = make_world()
    offsets_deg = [0.05, -0.03, 0.02, 0.0, 0.04, 0.0]
    with start_sim_robot(world, {"joint_zero_offsets_deg": offsets_deg}) as h, connect_robot(h.url) as robot:
        s = robot.read_state()
        true_flange = world.base_T_flange()
        np.testing.assert_allclose(true_flange, UR5E.forward(s.q_rad + np.deg2rad(offsets_deg)), atol=1e-9)
        assert np.linalg.norm(true_flange[:3, 3] - s.base_T_flange[:3, 3]) > 2e-4


def test_never_settles_times_out():
    world = make_world()
    with start_sim_robot(world, {"faults": [{"kind": "never_settles", "start_s": 0.0}]}) as h:
        with connect_robot(h.url) as robot:
            with pytest.raises(DriverTimeoutError, match="not settled"):
                robot.wait_settled(SettleConfig(dwell_s=0.2), timeout_s=1.0)


def test_url_and_option_errors_are_named(sim):
    with pytest.raises(ValueError, match="bogus"):
        connect_robot(sim.url + "&bogus=1")
    with pytest.raises(ValueError, match="frequency_hz"):
        connect_robot(sim.url, frequency_hz=10000)
    with pytest.raises(ValueError, match="scheme"):
        connect_robot("modbus://1.2.3.4")
    with pytest.raises(DriverInitError, match="cannot connect"):
        connect_robot("rtde://127.0.0.1:1", connect_timeout_s=0.5).open()
    u = parse_robot_url("canopen://socket://127.0.0.1:4000?interface=slcan")
    assert u.target == "socket://127.0.0.1:4000" and u.query == {"interface": "slcan"}


def test_driver_lifecycle_no_io_in_constructor_and_idempotent_close(sim):
    from cellcal.drivers.ur_rtde import UrRtdeDriver

    d = UrRtdeDriver("127.0.0.1", 1)  # nothing listens there: construction must not care
    with pytest.raises(Exception, match="not open"):
        d.read_state()
    d.close()
    d.close()
    robot = connect_robot(sim.url)  # built, not connected
    with pytest.raises(Exception, match="not open"):
        robot.read_state()
    robot.open()
    robot.open()  # idempotent
    robot.read_state()
    robot.close()
    robot.close()
    with pytest.raises(Exception, match="closed"):
        robot.read_state()


# -- scripted peers (exact exchanges) ------------------------------------------------------------
class ScriptedController:
    """A one-connection peer that checks each request against an expected packet and
    answers with scripted bytes, then streams ``tail`` bytes."""

    def __init__(self, script: list[tuple[bytes, bytes]], tail: bytes = b"", tail2: bytes = b"") -> None:
        self.script = script
        self.tail = tail
        self.tail2 = tail2  # sent 0.2 s after tail
        self.received: list[bytes] = []
        self.error: str | None = None
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(5.0)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        conn.settimeout(5.0)
        reader = rc.PacketReader()
        try:
            for expected, reply in self.script:
                got = None
                while got is None:
                    for t, p in reader.packets():
                        got = rc.encode_packet(t, p)
                        break
                    if got is None:
                        data = conn.recv(4096)
                        if not data:
                            return
                        reader.feed(data)
                self.received.append(got)
                if got != expected:
                    self.error = f"expected {expected!r}, got {got!r}"
                    return
                conn.sendall(reply)
            conn.sendall(self.tail)
            if self.tail2:
                time.sleep(0.2)
                conn.sendall(self.tail2)
            conn.settimeout(3.0)
            while conn.recv(4096):  # hold the connection until the client closes it
                pass
        except OSError as exc:
            self.error = str(exc)
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=3.0)


TYPES = [t.name for t in RECIPE_TYPES]
FULL = RECIPE + OPTIONAL_RECIPE
FULL_TYPES = [rc.OUTPUT_FIELDS[n].name for n in FULL]


def old_controller_setup(rid: int, protocol: int = rc.PROTOCOL_V2) -> list[tuple[bytes, bytes]]:
    """The output setup of a controller without ``tcp_offset`` and ``payload``: the full
    recipe is refused (NOT_FOUND for those two), the driver asks again for ``RECIPE``."""
    def request(names):
        if protocol == rc.PROTOCOL_V1:  # v1: no frequency
            return rc.encode_packet(P.CONTROL_PACKAGE_SETUP_OUTPUTS, ",".join(names).encode())
        return rc.encode_setup_outputs_request(names, 125.0)

    refused = [rc.NOT_FOUND if n in OPTIONAL_RECIPE else t for n, t in zip(FULL, FULL_TYPES, strict=True)]
    return [
        (request(FULL), rc.encode_setup_reply(P.CONTROL_PACKAGE_SETUP_OUTPUTS, 0, refused, protocol)),
        (request(RECIPE), rc.encode_setup_reply(P.CONTROL_PACKAGE_SETUP_OUTPUTS, rid, TYPES, protocol)),
    ]


def test_scripted_v1_fallback_exchange_is_exact():
    recipe = rc.Recipe(RECIPE, RECIPE_TYPES, 0, rc.PROTOCOL_V1)
    vals = {"timestamp": 5.0, "actual_q": Q_HOME, "actual_qd": (0,) * 6,
            "actual_TCP_pose": np.concatenate([UR5E.forward(Q_HOME)[:3, 3], so3_log(UR5E.forward(Q_HOME)[:3, :3])]),
            "robot_mode": 7, "safety_mode": 1, "runtime_state": 1}
    peer = ScriptedController(
        [
            (b"\x00\x05V\x00\x02", rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, False)),
            (b"\x00\x05V\x00\x01", rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, True)),
            (b"\x00\x03v", rc.encode_controller_version(rc.ControllerVersion(3, 15, 7, 0))),
            *old_controller_setup(0, rc.PROTOCOL_V1),
            (b"\x00\x03S", rc.encode_accepted(P.CONTROL_PACKAGE_START, True)),
        ],
        tail=recipe.encode(vals),
    )
    try:
        with connect_robot(f"rtde://127.0.0.1:{peer.port}", stream_timeout_s=5.0) as robot:
            assert robot.protocol == 1 and str(robot.controller_version) == "3.15.7.0"
            s = robot.read_state(timeout_s=2.0)
            assert s.t_device_s == 5.0
            np.testing.assert_allclose(s.q_rad, Q_HOME)
        assert peer.error is None, peer.error
    finally:
        peer.close()


def test_scripted_not_found_names_the_field():
    types = ["NOT_FOUND" if n == "actual_qd" else t for n, t in zip(FULL, FULL_TYPES, strict=True)]
    setup = rc.encode_setup_outputs_request(FULL, 125.0)
    peer = ScriptedController(
        [
            (b"\x00\x05V\x00\x02", rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, True)),
            (b"\x00\x03v", rc.encode_controller_version(rc.ControllerVersion(5, 1, 0, 0))),
            (setup, rc.encode_setup_reply(P.CONTROL_PACKAGE_SETUP_OUTPUTS, 0, types)),
        ]
    )
    try:
        with pytest.raises(RecipeFieldNotFound, match="actual_qd") as ei:
            connect_robot(f"rtde://127.0.0.1:{peer.port}").open()
        assert ei.value.fields == ("actual_qd",)
        assert peer.error is None, peer.error
    finally:
        peer.close()


def _full_script(rid: int) -> list[tuple[bytes, bytes]]:
    return [
        (b"\x00\x05V\x00\x02", rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, True)),
        (b"\x00\x03v", rc.encode_controller_version(rc.ControllerVersion(5, 23, 0, 0))),
        (rc.encode_setup_outputs_request(FULL, 125.0), rc.encode_setup_reply(P.CONTROL_PACKAGE_SETUP_OUTPUTS, rid, FULL_TYPES)),
        (b"\x00\x03S", rc.encode_accepted(P.CONTROL_PACKAGE_START, True)),
    ]


def test_scripted_controller_reports_tcp_offset_and_payload_and_a_mismatch_refuses_to_open():
    """A controller with ``tcp_offset`` and ``payload``: one setup of the full recipe, and
    every sample carries both. A reported TCP that is not the configured ``tcp_offset`` (a
    tool set on the pendant and not told to the driver) refuses the open, naming both, even
    when it is too small for the FK check at open to see."""
    recipe = rc.Recipe(FULL, tuple(rc.OUTPUT_FIELDS[n] for n in FULL), 4)
    flange = UR5E.forward(Q_HOME)
    vals = {"timestamp": 1.0, "actual_q": Q_HOME, "actual_qd": (0,) * 6,
            "actual_TCP_pose": np.concatenate([flange[:3, 3], so3_log(flange[:3, :3])]),
            "robot_mode": 7, "safety_mode": 1, "runtime_state": 1, "tcp_offset": (0.0,) * 6, "payload": 0.8}
    peer = ScriptedController(_full_script(4), tail=recipe.encode(vals))
    try:
        with connect_robot(f"rtde://127.0.0.1:{peer.port}", stream_timeout_s=5.0) as robot:
            s = robot.read_state(timeout_s=2.0)
            assert robot.optional_outputs == OPTIONAL_RECIPE
            np.testing.assert_array_equal(s.tcp_offset, np.zeros(6))
            assert s.payload_kg == 0.8
        assert peer.error is None, peer.error
    finally:
        peer.close()
    tool = (0.0, 0.0, 0.005, 0.0, 0.0, 0.0)  # a 5 mm tool: within the 20 mm FK check at open
    tool_T = pose_to_transform(tool)
    with_tool = {**vals, "actual_TCP_pose": np.concatenate([(flange @ tool_T)[:3, 3], so3_log((flange @ tool_T)[:3, :3])]),
                 "tcp_offset": tool}
    peer = ScriptedController(_full_script(4), tail=recipe.encode(with_tool))
    try:
        with pytest.raises(DriverInitError, match=r"TCP offset is p\[0.0, 0.0, 0.005"):
            connect_robot(f"rtde://127.0.0.1:{peer.port}", stream_timeout_s=5.0).open()
    finally:
        peer.close()
    peer = ScriptedController(_full_script(4), tail=recipe.encode(with_tool))
    try:
        with connect_robot(f"rtde://127.0.0.1:{peer.port}", stream_timeout_s=5.0, tcp_offset=tool) as robot:
            np.testing.assert_allclose(robot.read_state(timeout_s=2.0).base_T_flange, flange, atol=1e-12)
    finally:
        peer.close()


def test_sim_controller_serves_tcp_offset_and_payload_and_their_changes():
    """The simulated controller reports its TCP and payload, follows ``tcp_change`` and
    ``payload_change`` faults in both the outputs and the TCP pose, and, as older software,
    answers NOT_FOUND for the outputs a scenario declares missing (the driver then opens
    without them)."""
    world = make_world()
    with start_sim_robot(world, {"payload_kg": 0.5}) as h, connect_robot(h.url) as robot:
        s = robot.read_state()
        np.testing.assert_array_equal(s.tcp_offset, np.zeros(6))
        assert s.payload_kg == 0.5
        h.robot.inject("tcp_change", tcp_offset=[0.0, 0.0, 0.02, 0.0, 0.0, 0.0])
        h.robot.inject("payload_change", payload_kg=2.0)
        s = wait_until(lambda: (x := robot.read_state()).payload_kg == 2.0 and x, 2.0, "the changed payload")
        np.testing.assert_allclose(s.tcp_offset, [0.0, 0.0, 0.02, 0.0, 0.0, 0.0])
        fk = UR5E.forward(s.q_rad)
        assert abs(np.linalg.norm(s.base_T_flange[:3, 3] - fk[:3, 3]) - 0.02) < 1e-9  # the pose follows the TCP
    with start_sim_robot(world, {"rtde_missing_outputs": ["tcp_offset", "payload"]}) as h, connect_robot(h.url) as robot:
        s = robot.read_state()
        assert robot.optional_outputs == () and s.tcp_offset is None and s.payload_kg is None


def test_scripted_stream_with_unknown_types_text_and_bad_packages():
    recipe = rc.Recipe(RECIPE, RECIPE_TYPES, 9)
    good = lambda ts: recipe.encode(  # noqa: E731
        {"timestamp": ts, "actual_q": Q_HOME, "actual_qd": (0,) * 6,
         "actual_TCP_pose": np.concatenate([UR5E.forward(Q_HOME)[:3, 3], so3_log(UR5E.forward(Q_HOME)[:3, :3])]),
         "robot_mode": 7, "safety_mode": 1, "runtime_state": 1})
    tail = (
        rc.encode_text_message(rc.TextMessage("hello", "URControl", rc.TextLevel.INFO))
        + good(1.0)
        + rc.encode_packet(ord("X"), b"\x00" * 40)  # unknown type, skipped by size
        + rc.encode_packet(P.DATA_PACKAGE, b"\x08" + good(9.0)[4:])  # wrong recipe id
        + rc.encode_packet(P.DATA_PACKAGE, b"\x09" + b"\x00" * 10)  # wrong size: framing lost
        + good(2.0)
    )
    peer = ScriptedController(
        [
            (b"\x00\x05V\x00\x02", rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, True)),
            (b"\x00\x03v", rc.encode_controller_version(rc.ControllerVersion(5, 23, 0, 0))),
            *old_controller_setup(9),
            (b"\x00\x03S", rc.encode_accepted(P.CONTROL_PACKAGE_START, True)),
        ],
        tail=tail,
    )
    try:
        with connect_robot(f"rtde://127.0.0.1:{peer.port}", stream_timeout_s=5.0) as robot:
            s = wait_until(lambda: (x := robot.read_state(timeout_s=1.0)).t_device_s == 2.0 and x, 10.0, "ts 2")
            assert s.seq == 2  # exactly the two good packages became states
            assert robot.bad_packets == 2
            assert robot.resyncs == 1 and robot.garbage_bytes == 14  # the wrong-size package
        assert peer.error is None, peer.error
    finally:
        peer.close()


def test_unframeable_bytes_after_start_cost_only_themselves():
    recipe = rc.Recipe(RECIPE, RECIPE_TYPES, 2)
    vals = {"timestamp": 1.0, "actual_q": Q_HOME, "actual_qd": (0,) * 6,
            "actual_TCP_pose": np.concatenate([UR5E.forward(Q_HOME)[:3, 3], so3_log(UR5E.forward(Q_HOME)[:3, :3])]),
            "robot_mode": 7, "safety_mode": 1, "runtime_state": 1}
    script = [
        (b"\x00\x05V\x00\x02", rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, True)),
        (b"\x00\x03v", rc.encode_controller_version(rc.ControllerVersion(5, 23, 0, 0))),
        *old_controller_setup(2),
        (b"\x00\x03S", rc.encode_accepted(P.CONTROL_PACKAGE_START, True)),
    ]
    bad = b"\x00\x01U" + recipe.encode({**vals, "timestamp": 2.0})  # size 1 < 3: unframeable
    # right behind the start reply, and later on a running link: the package behind the
    # bad header is found again and becomes a state; the link stays up
    for tail, tail2 in ((recipe.encode(vals) + bad, b""), (recipe.encode(vals), bad)):
        peer = ScriptedController(script, tail=tail, tail2=tail2)
        try:
            with connect_robot(f"rtde://127.0.0.1:{peer.port}", stream_timeout_s=5.0) as robot:
                s = wait_until(lambda: (x := robot.read_state(timeout_s=1.0)).t_device_s == 2.0 and x, 10.0, "ts 2")
                assert s.seq == 2 and robot.reconnects == 0
                assert robot.resyncs == 1 and robot.garbage_bytes == 3 and robot.bad_packets == 1
        finally:
            peer.close()


def _states_until(robot, pred, timeout_s: float, what: str):
    """read_state until ``pred(state)``; DeviceGoneError counts as "not yet"."""
    return wait_until(lambda: (x := _try_read(robot)) is not None and pred(x) and x, timeout_s, what)


def test_garbage_burst_on_a_live_stream_resyncs_on_the_next_package():
    # One burst of garbage between two packages of a good 125 Hz stream: the client finds
    # the framing again at the first intact package (garbage_bytes counts exactly the
    # burst), never declares the link lost, and keeps delivering states.
    world = make_world(scale=1.0)
    rng = np.random.default_rng(12)
    with start_sim_robot(world, {}) as h, connect_robot(h.url, stream_timeout_s=1.0) as robot:
        s0 = robot.read_state()
        for burst in range(3):
            garbage = b"\x00\x00" + rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
            h.server.inject_bytes(garbage)
            wait_until(lambda: h.server.first_good_after_garbage_s is not None, 3.0, "an intact package after it")
            first_good = h.server.first_good_after_garbage_s
            s = _states_until(robot, lambda x, t=first_good: x.t_device_s >= t, 3.0, "a state after the garbage")
            assert robot.resyncs == burst + 1
            assert robot.garbage_bytes == (burst + 1) * len(garbage)  # hunting ended at the first good package
        assert robot.reconnects == 0 and s.seq > s0.seq
        # no hole: the stream kept its 125 Hz, device time after the garbage follows on
        assert s.t_device_s - first_good < 1.0


def test_bytes_without_a_valid_package_are_a_lost_link_then_it_recovers():
    # The controller keeps sending bytes at the stream rate but not one valid package: the
    # watchdog counts packages, not bytes, so the link is lost within stream_timeout_s;
    # when the good stream resumes, states come back within a second of device time.
    world = make_world(scale=1.0)
    with start_sim_robot(world, {}) as h, connect_robot(h.url, stream_timeout_s=0.3, reconnect_max_s=0.2) as robot:
        robot.read_state()
        h.server.garble(4.0, seed=3)
        garble_end = time.monotonic() + 4.0

        def lost() -> str | None:
            try:
                robot.read_state(timeout_s=0.2)
            except DeviceGoneError as exc:
                return str(exc)
            except DriverTimeoutError:  # the last state is too old, the link not yet judged
                pass
            return None

        msg = wait_until(lost, 3.5, "the link declared lost while garbage arrives")
        assert time.monotonic() < garble_end  # while the bytes were still coming
        assert "no valid RTDE data package" in msg or "link lost" in msg
        wait_until(lambda: h.server.first_good_after_garbage_s is not None, 8.0, "the good stream resuming")
        first_good = h.server.first_good_after_garbage_s
        s = _states_until(robot, lambda x: x.t_device_s >= first_good, 5.0, "a state after the garbage")
        assert s.t_device_s - first_good < 1.0
        assert robot.reconnects >= 1 and s.mode is RobotMode.RUNNING


def test_urscript_subset_parser():
    c = parse_urscript("movej([0.1, -1.5, 1.5, -1.5, -1.5, 0.0], a=1.4, v=1.05)\n")
    assert c.name == "movej" and not c.is_pose and c.v == 1.05 and c.a == 1.4
    np.testing.assert_allclose(c.target, [0.1, -1.5, 1.5, -1.5, -1.5, 0.0])
    c = parse_urscript("def prog():\n  movel(p[0.4, -0.1, 0.3, 0, 3.14, 0], v=0.25)\nend\n")
    assert c.name == "movel" and c.is_pose and c.a is None
    assert parse_urscript("stopj(2.0)").name == "stopj"
    for bad in ["movel([0,0,0,0,0,0])", "movej([1,2,3])", "popup(\"hi\")", "movej([0,0,0,0,0,0])\nstopj(1)",
                "movej([0,0,0,0,0,0], v=-1)"]:
        with pytest.raises(ValueError):
            parse_urscript(bad)


def test_rejected_script_comes_back_as_text_message(sim, caplog):
    caplog.set_level(logging.INFO, logger="cellcal.drivers.ur_rtde")
    with connect_robot(sim.url) as robot:
        robot.send_script("popup(\"not in the subset\")")
        wait_until(lambda: "script rejected" in caplog.text, 10.0, "the rejection message")
        assert any(r.levelno == logging.ERROR for r in caplog.records if "script rejected" in r.getMessage())
        robot.read_state()


def test_unread_stream_is_taken_in_batches_and_a_read_ends_them(sim):
    # Nobody reading for a second: the driver lets the kernel wake it once per ~100 ms of
    # stream (SO_RCVLOWAT) instead of once per package; the first read asks for every
    # package again and still gets a fresh sample.
    with connect_robot(sim.url, frequency_hz=500.0, timeout_s=2.0) as robot:
        first = robot.read_state()
        wait_until(lambda: robot._lowat > 1, 30.0, "the idle driver to batch its reads")
        s = robot.read_state()
        assert robot._lowat == 1
        assert time.monotonic_ns() - s.t_recv_host_ns <= robot.max_age_s * 1e9 + 0.5e9
        assert s.seq > first.seq
        nxt = robot.wait_for_sample_after(s.seq, 2.0)
        assert nxt.seq > s.seq and nxt.t_device_s > s.t_device_s
        assert robot.clock.ready  # the clock model was fed through the batches


def test_per_sample_pose_conversion_equals_pose_to_transform():
    from cellcal.drivers.ur_rtde import _pose_to_transform_floats

    rng = np.random.default_rng(3)
    for k in range(500):
        axis = rng.normal(size=3)
        axis /= np.linalg.norm(axis)
        angle = (1e-9, 1e-5, 0.3, 3.0, math.pi - 1e-9)[k % 5] * rng.uniform(0.5, 1.0)
        pose = np.concatenate([rng.uniform(-1, 1, 3), axis * angle])
        np.testing.assert_allclose(_pose_to_transform_floats(tuple(pose)), pose_to_transform(pose), rtol=0, atol=2e-15)
