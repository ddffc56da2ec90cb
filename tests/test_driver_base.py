"""One convention for the robot and tracker driver bases (ADR 0008): deadlines handed to the
hooks, ``open()`` returning the driver, one lazy backend registry, ``from_url`` on the base.

The real backends run against the simulators; a minimal backend defined here checks what the
base hands its hooks, which no real device can observe.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import time

import numpy as np
import pytest

from cellcal.drivers import connect_robot, connect_tracker
from cellcal.drivers import robot as rob
from cellcal.drivers import tracker as trk
from cellcal.drivers.base import DeviceDriver, deadline_after, load_backend, remaining_s
from cellcal.drivers.errors import DriverTimeoutError
from cellcal.drivers.kinematics import dh_model
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.scenario import parse_scenario
from cellcal.sim.tracker_sim import SimTracker
from cellcal.sim.world import World

SCENARIO = """
seed = 1
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [2.0, 0.0, 0.0]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.05]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = 0.01
noise_deg = 0.001
"""
UR5E = dh_model("ur5e")
HOME = UR5E.forward(np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0]))


class ProbeRobot(rob.RobotDriver):
    """Records the deadline every hook gets; has a sample only when told to."""

    backend = "probe"

    def __init__(self, target: str, **options) -> None:
        super().__init__(model=UR5E, **options)
        self.target = target
        self.deadlines: list[tuple[str, object]] = []
        self.state: rob.RobotState | None = None

    @classmethod
    def _from_url_internal(cls, url, options):
        return cls(url.target, **dict(url.query, **options))

    def _open_internal(self) -> None:
        pass

    def _close_internal(self) -> None:
        pass

    def _read_state_internal(self, deadline):
        self.deadlines.append(("read", deadline))
        return self.state

    def _move_internal(self, q_rad, base_T_flange, speed, wait, deadline) -> None:
        self.deadlines.append(("move", deadline))

    def _stop_internal(self) -> None:
        pass


def _state() -> rob.RobotState:
    return rob.RobotState(q_rad=np.zeros(6), qd_rad_s=np.zeros(6), base_T_flange=np.eye(4), t_device_s=0.0,
                          t_host_ns=time.monotonic_ns(), moving=False, mode=rob.RobotMode.IDLE)


def test_both_bases_share_one_base_declaring_from_url_and_open():
    for base in (rob.RobotDriver, trk.TrackerDriver):
        assert issubclass(base, DeviceDriver)
        assert inspect.ismethod(base.from_url)  # a classmethod on the base itself
    assert getattr(DeviceDriver.from_url, "__isabstractmethod__", False)
    assert {"from_url", "open", "close"} <= DeviceDriver.__abstractmethods__


@pytest.mark.parametrize("registry, base", [(rob.BACKENDS, rob.RobotDriver), (trk.BACKENDS, trk.TrackerDriver)])
def test_every_registered_backend_loads_and_names_itself(registry, base):
    assert registry
    for name, spec in registry.items():
        assert isinstance(spec, str) and ":" in spec  # "module:Class", imported only when asked for
        cls = load_backend(registry, name, "backend")
        assert issubclass(cls, base) and cls.backend == name


def test_registry_is_lazy_and_unknown_names_are_listed():
    code = (
        "import sys, cellcal.drivers.robot, cellcal.drivers.tracker;"
        "assert not {'canopen', 'can', 'cellcal.drivers.ur_rtde', 'cellcal.drivers.canopen402', 'serial',"
        " 'cellcal.drivers.emscon', 'cellcal.drivers.geocom'}"
        " & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with pytest.raises(ValueError, match=r"robot URL scheme 'modbus' unknown; known: canopen, rtde"):
        connect_robot("modbus://10.0.0.1")
    with pytest.raises(ValueError, match=r"tracker backend 'faro' unknown; known: emscon, geocom, serial"):
        connect_tracker("socket://127.0.0.1:1", backend="faro")


def test_a_backend_is_one_registry_entry(monkeypatch):
    monkeypatch.setitem(rob.BACKENDS, "probe", f"{__name__}:ProbeRobot")
    r = connect_robot("probe://arm-1?timeout_s=0.25")
    assert isinstance(r, ProbeRobot) and r.target == "arm-1" and r.timeout_s == 0.25
    with pytest.raises(ValueError, match="'rtde' is not ProbeRobot's 'probe'"):
        ProbeRobot.from_url("rtde://10.0.0.1")
    # the older spelling, a parsed URL and an options mapping, still builds the same driver
    from cellcal.drivers.ur_rtde import UrRtdeDriver

    old = UrRtdeDriver.from_url(rob.parse_robot_url("rtde://127.0.0.1:1"), {"timeout_s": 0.5})
    new = UrRtdeDriver.from_url("rtde://127.0.0.1:1?timeout_s=0.5")
    assert (old.host, old.port, old.timeout_s) == (new.host, new.port, new.timeout_s) == ("127.0.0.1", 1, 0.5)


def test_hooks_get_absolute_monotonic_deadlines_in_seconds():
    with ProbeRobot("x", timeout_s=0.3, move_timeout_s=7.0).open() as r:
        t0 = time.monotonic()
        with pytest.raises(DriverTimeoutError):
            r.read_state()
        r.state = _state()
        r.read_state(timeout_s=2.0)
        r.move_to(q_rad=np.zeros(6), wait=True)
        t1 = time.monotonic()
    (k1, d1), (k2, d2), (k3, d3) = r.deadlines
    assert (k1, k2, k3) == ("read", "read", "move")
    for d, timeout in ((d1, 0.3), (d2, 2.0), (d3, 7.0)):
        assert isinstance(d, float)
        assert t0 + timeout <= d <= t1 + timeout  # absolute, on time.monotonic(), in seconds
    assert 0 < remaining_s(deadline_after(5.0)) <= 5.0


def test_open_returns_the_driver_for_both_kinds():
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=HOME, time_scale=10.0)
    with start_sim_robot(world, {}) as h:
        robot = connect_robot(h.url)
        try:
            assert robot.open() is robot and robot.open() is robot
            assert robot.read_state(timeout_s=5.0).q_rad.shape == (6,)
        finally:
            robot.close()
    sc = parse_scenario(SCENARIO)
    with SimTracker(sc.make_world(), sc.tracker, transport="tcp", seed=sc.seed) as sim:
        tracker = connect_tracker(sim.url, timeout_s=2.0)
        try:
            assert tracker.open() is tracker and tracker.open() is tracker
            assert tracker.identify().protocol_version.startswith("1.")
        finally:
            tracker.close()
        with connect_tracker(sim.url, timeout_s=2.0).open() as t2:
            assert t2.is_open
        assert not t2.is_open
