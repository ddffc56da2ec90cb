"""The simulated camera as a GigE Vision device: the rendered camera behind the device model.

:class:`~cellcal.sim.camera.SimCamera` renders what a camera in the simulated cell sees
(the calibration target through the true camera pose, blur, noise, exposure, its own clock);
:class:`~cellcal.sim.gige_device.GigeDevice` answers GVCP and streams GVSP like a camera on
the network. This module joins them:

* :class:`RenderedSource` is the device's frame source: the device's exposure, gain and
  pixel format registers set the camera's (auto-exposure, when the scenario turns it on,
  decides the exposure itself: the chunk data of each frame carry what was applied), and
  each frame is rendered for the instant the device starts its exposure.
* :class:`CameraClock` is the device's timestamp counter: the rendered camera's own clock
  (offset and drift, ``[camera] clock_offset_s``, ``clock_drift_ppm``) in ticks of the
  device's frequency, so a frame's GVSP timestamp is what that camera would stamp.
* :func:`default_camera` places a camera in a scenario that has no ``[camera]`` table, for
  ``cellcal sim --camera eye_in_hand|eye_to_hand``: a 1280 x 1024 camera with a 9.6 mm lens
  class focal length and mild barrel distortion, looking at the 7 x 5 ChArUco board of
  ``config/charuco-7x5.toml`` about half a metre away at the robot's initial pose (on the
  flange looking at a board fixed in the cell, or fixed in the cell looking at a board on
  the flange).
* :func:`start_sim_camera` serves it on one loopback address (``gige://<address>``).

The exposure of a frame starts ``[camera] trigger_delay_s`` after the device's stamp, as on
a real camera; the daemon's temporal calibration sees that delay as latency. The device counts
an exposure in wall seconds and the rendered camera in simulated ones: on a world faster than
the wall clock the simulated exposure is centred where the stamp puts the wall-clock one's
middle, so the stamps stay true (the delay is then simulated seconds, ADR 0031).
"""

from __future__ import annotations

import threading
from importlib import resources

import numpy as np

from cellcal.drivers import gige_codec as gc
from cellcal.sim.camera import CameraConfig, SimCamera
from cellcal.sim.errors import SimError
from cellcal.sim.gige_device import FrameRequest, GigeDevice, RenderedFrame
from cellcal.sim.scenario import Scenario
from cellcal.sim.world import World
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.se3 import make_transform, se3_inverse
from cellcal.solver.target import CalibrationTarget, target_from_toml

__all__ = ["RenderedSource", "CameraClock", "SimCameraDevice", "default_camera", "start_sim_camera",
           "DEFAULT_TARGET_FILE", "TICK_FREQUENCY_HZ"]

#: The counter frequency of the simulated camera's timestamps (GigE Vision cameras commonly
#: count at 125 MHz or 1 GHz).
TICK_FREQUENCY_HZ = 125_000_000
#: The default board (config/charuco-7x5.toml, installed as cellcal.examples).
DEFAULT_TARGET_FILE = "charuco-7x5.toml"
#: How far the default camera is from its board at the robot's initial pose (m).
_STANDOFF_M = 0.5


class RenderedSource:
    """The GigE Vision device's frame source: a rendered camera (module docstring)."""

    def __init__(self, camera: SimCamera) -> None:
        self.camera = camera
        self._lock = threading.Lock()

    def frame(self, request: FrameRequest) -> RenderedFrame:
        cam = self.camera
        with self._lock:
            if request.pixel_format != cam.pixel_format:
                cam.set_pixel_format(request.pixel_format)
            if not cam.auto_exposure and abs(request.exposure_s - cam.exposure_s) > 1e-9:
                cam.set_exposure_s(request.exposure_s)
            if abs(request.gain_db - cam.gain_db) > 1e-9:
                cam.set_gain_db(request.gain_db)
            if (request.width, request.height) != (cam.width, cam.height):
                raise SimError(f"the device asks for {request.width} x {request.height} px, the simulated sensor is "
                               f"{cam.width} x {cam.height}")
            # The device counts the exposure in wall seconds (its stamp at the start, the frame
            # sent at the end), the rendered camera in simulated ones: on a world faster than
            # the wall clock the simulated exposure is centred where the stamp puts the
            # middle of the wall-clock one, so a frame's mid-exposure stamp is where the
            # image was taken (the trigger delay then reads as itself in simulated time).
            shift_s = 0.5 * cam.exposure_s * (1.0 - 1.0 / cam.world.time_scale)
            got = cam.frame(request.t_start_ns + round(shift_s * 1e9))
        return RenderedFrame(got.image, got.exposure_s, got.gain_db)


class CameraClock:
    """The rendered camera's clock as the device's timestamp counter (module docstring)."""

    def __init__(self, camera: SimCamera, tick_frequency_hz: int = TICK_FREQUENCY_HZ) -> None:
        self.camera = camera
        self.tick_frequency_hz = int(tick_frequency_hz)
        self._zero_ns = 0  # the timestamp-reset bit: the camera's reading when the count restarted

    def _camera_ns(self, host_ns: int) -> int:
        world = self.camera.world
        return self.camera.device_ns(world.sim_s_at(host_ns * 1e-9))

    def ticks(self, host_ns: int) -> int:
        return max(0, (self._camera_ns(host_ns) - self._zero_ns) * self.tick_frequency_hz // 1_000_000_000)

    def reset(self, host_ns: int) -> None:
        self._zero_ns = self._camera_ns(host_ns)


class SimCameraDevice:
    """A running simulated camera: the rendered camera, its GigE Vision device and its URL."""

    def __init__(self, camera: SimCamera, device: GigeDevice) -> None:
        self.camera = camera
        self.device = device

    @property
    def url(self) -> str:
        """What the daemon's ``[camera] url`` names (opened by address, never discovered)."""
        return f"gige://{self.device.address}"

    def close(self) -> None:
        self.device.stop()


def _default_target() -> CalibrationTarget:
    data = resources.files("cellcal.examples").joinpath(DEFAULT_TARGET_FILE).read_bytes()
    return target_from_toml(data, source=DEFAULT_TARGET_FILE)


def default_camera(scenario: Scenario, mounting: str) -> CameraConfig:
    """A camera for a scenario without a ``[camera]`` table (module docstring).

    Parameters
    ----------
    scenario : Scenario
        Its truth places the camera: ``cell_T_base`` and the robot's initial flange pose.
    mounting : {"eye_in_hand", "eye_to_hand"}
    """
    target = _default_target()
    w, h = target.size_m
    model = CameraModel(np.array([[2600.0, 0.0, 641.3], [0.0, 2600.0, 509.7], [0.0, 0.0, 1.0]]),
                        np.array([-0.08, 0.04, 2e-4, -1e-4, 0.0]), (1280, 1024))
    truth = scenario.truth
    cell_T_flange0 = truth.cell_T_base @ truth.base_T_flange
    # The board centred on the optical axis, facing the camera, at the standoff.
    camera_T_target0 = make_transform(np.eye(3), np.array([-w / 2, -h / 2, _STANDOFF_M]))
    if mounting == "eye_in_hand":
        # 60 mm off the flange axis, looking along the flange's z (a camera beside the tool).
        flange_T_camera = make_transform(np.eye(3), np.array([0.06, 0.0, 0.04]))
        cell_T_target = cell_T_flange0 @ flange_T_camera @ camera_T_target0
        return CameraConfig(camera=model, target=target, mounting=mounting, flange_T_camera=flange_T_camera,
                            cell_T_target=cell_T_target)
    if mounting == "eye_to_hand":
        # The board 50 mm in front of the flange, its face along the flange's z (turned half a
        # turn about x, so the camera that looks back at the flange sees it face on).
        flip = np.diag([1.0, -1.0, -1.0])
        flange_T_target = make_transform(flip, flip @ np.array([-w / 2, -h / 2, 0.0]) + np.array([0.0, 0.0, 0.05]))
        cell_T_camera = cell_T_flange0 @ flange_T_target @ se3_inverse(camera_T_target0)
        return CameraConfig(camera=model, target=target, mounting=mounting, cell_T_camera=cell_T_camera,
                            flange_T_target=flange_T_target)
    raise SimError(f"camera mounting must be eye_in_hand or eye_to_hand, got {mounting!r}")


def start_sim_camera(world: World, config: CameraConfig, address: str, *, seed: int = 0,
                     port: int | None = None) -> SimCameraDevice:
    """Serve a rendered camera as a GigE Vision device on ``address`` (a loopback address).

    ``port``: the GVCP port (3956, what every client expects, unless a test of our own driver
    gives another).
    """
    camera = SimCamera(world, config, seed=seed)
    width, height = config.camera.image_size
    device = GigeDevice(address, source=RenderedSource(camera), clock=CameraClock(camera),
                        serial=config.serial, model=config.model, vendor=config.vendor,
                        sensor=(int(width), int(height)), exposure_s=config.exposure_s, gain_db=config.gain_db,
                        port=gc.GVCP_PORT if port is None else port)
    return SimCameraDevice(camera, device.start())

