"""The simulated cell's devices in this process: the world, the robot, the instrument, a camera.

:func:`simulated_devices` starts the simulated robot (a UR controller over RTDE on loopback,
or six CiA 402 drives on a python-can virtual bus of its own) and the simulated instrument
(the cellcal tracker protocol, a Leica emScon tracker or a GeoCOM total station, on a pty or
loopback TCP: ``cellcal.daemon.cli.instruments``), all reading one world's truth, and closes
them on exit; with ``camera=`` also a rendered camera served as a GigE Vision device
(``cellcal.sim.camera_device``, the scenario's ``[camera]`` or a default one of that
mounting) on a loopback address of its own (``cellcal.sim.camera_cell``, shared with
``cellcal demo --camera``: GVCP's port 3956 is fixed, so cameras side by side need addresses
of their own). The in-process cell (``harness.inprocess_cell``) and the pytest plugin's
in-process ``sim_cell`` are built on it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cellcal.daemon.cli.instruments import start_simulated
from cellcal.sim.camera_cell import camera_addresses, start_camera
from cellcal.sim.camera_device import SimCameraDevice
from cellcal.sim.link import LinkServer
from cellcal.sim.robot_sim import SimRobotHandle, start_sim_robot
from cellcal.sim.scenario import Scenario, load_scenario
from cellcal.sim.world import World

__all__ = ["SimulatedDevices", "simulated_devices", "camera_addresses", "start_camera"]


@dataclass
class SimulatedDevices:
    """The running simulators of one cell (each with its ``url``) and the world they share;
    ``camera`` None unless one was asked for."""

    scenario: Scenario
    world: World
    robot: SimRobotHandle
    tracker: LinkServer
    camera: SimCameraDevice | None = None


@contextlib.contextmanager
def simulated_devices(scenario: Scenario | Path, *, instrument: str = "cellcal", robot_transport: str = "rtde",
                      tracker_transport: str | None = None, camera: str | None = None) -> Iterator[SimulatedDevices]:
    """Start a scenario's robot and instrument (and camera) in this process (module docstring).

    Parameters
    ----------
    scenario : Scenario or Path
        The cell (a scenario TOML's path, or one loaded).
    instrument : {"cellcal", "emscon", "geocom"}
    robot_transport : {"rtde", "canopen"}
    tracker_transport : {"pty", "tcp"}, optional
        Default: the instrument's first (a pty; emScon: TCP).
    camera : {"eye_in_hand", "eye_to_hand"}, optional
        Also serve a rendered camera so mounted (:func:`start_camera`).
    """
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(Path(scenario))
    world = sc.make_world()
    with contextlib.ExitStack() as stack:
        if robot_transport == "canopen":
            # A channel of its own: the virtual bus is process-wide, and tests run in one process.
            robot = start_sim_robot(world, sc.robot, transport="canopen", can_interface="virtual",
                                    can_channel=f"cellcal-harness-{os.getpid()}-{time.monotonic_ns()}")
        else:
            robot = start_sim_robot(world, sc.robot, transport="rtde")
        stack.callback(robot.close)
        tracker = start_simulated(instrument, world, sc.tracker, seed=sc.seed, transport=tracker_transport)
        stack.callback(tracker.close)
        cam = None
        if camera is not None:
            cam = start_camera(world, sc, camera)
            stack.callback(cam.close)
        yield SimulatedDevices(sc, world, robot, tracker, cam)
