"""What a station is judged by and what a job remembers to judge it: rejections, device
faults, the consistency checks' memory, and the run's rough estimate.

* :class:`RejectReason` / :class:`StationRejected`: a station not accepted, with the reason
  and its figures (stored and published by name); :class:`DeviceFault`: a link that failed,
  naming the device at fault (the service rides it out), or a change that ends the job;
* :class:`Session`: what the checks remember across reconnections within a job (the
  controller's TCP offset and payload at its start, the robot's identity, the last tracker
  value, so a frozen instrument is seen);
* :func:`fk_deviation`: the robot's reported pose against forward kinematics of its joints;
* :class:`Expected`: the run's rough current estimate a new measurement must agree with.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.drivers.errors import DeviceError
from cellcal.drivers.kinematics import DHModel
from cellcal.drivers.robot import RobotState
from cellcal.drivers.tracker import TrackerMeasurement
from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import rotation_angle

log = logging.getLogger(__name__)

#: A gross disagreement is at least this many times the rough estimate's RMS closure (and
#: at least the configured floor): a good station sits within a few RMS of the fit.
GROSS_RMS_FACTOR = 20.0
#: ``tcp_offset`` (m, rad) and ``payload`` (kg) changes smaller than this are float noise.
_TCP_CHANGE_TOL = 1e-6
_PAYLOAD_CHANGE_TOL_KG = 1e-6


class RejectReason(str, enum.Enum):
    """Why a station was not accepted (stored and published by name)."""

    NOT_SETTLED = "not_settled"
    TRACKER_STD = "tracker_std_too_high"
    TRACKER_DISAGREE = "tracker_averages_disagree"
    BEAM_BROKEN = "beam_broken"
    TRACKER_REFUSED = "tracker_refused"
    SYNC_WINDOW = "outside_sync_window"
    DUPLICATE_POSE = "duplicate_pose"
    PROTECTIVE_STOP = "protective_stop"
    MOVE_FAILED = "move_failed"
    FK_MISMATCH = "fk_mismatch"
    TRACKER_OUT_OF_RANGE = "tracker_out_of_range"
    TRACKER_FROZEN = "tracker_frozen"
    GROSS_DISAGREEMENT = "gross_disagreement"
    # A lying device (issue 24): a drive whose account of a move disagrees with its actual
    # position, a drive that faulted during the move (the robot link is then reopened), a
    # value the instrument cannot physically report, an instrument position repeated bit
    # for bit at another robot pose, a station far beyond the run's consensus fit.
    DRIVE_TARGET_MISMATCH = "drive_target_mismatch"
    JOINT_NOT_MOVING = "joint_not_moving"
    DRIVE_FAULT = "drive_fault"
    TRACKER_IMPLAUSIBLE = "tracker_value_implausible"
    TRACKER_POSITION_REPEATED = "tracker_position_repeated"
    CONSENSUS_OUTLIER = "consensus_outlier"
    CONSENSUS_SPLIT = "consensus_split"
    # A camera station's (cellcal.daemon.camera_capture, ADR 0030):
    NO_TARGET = "no_target_in_view"
    TOO_FEW_CORNERS = "too_few_corners"
    BLURRED = "image_blurred"
    MOVED_DURING_EXPOSURE = "moved_during_exposure"
    EXPOSURE_NOT_SETTLED = "exposure_not_settled"
    IMAGE_REPEATED = "camera_image_repeated"


class StationRejected(CellcalError):
    """A station that was not accepted; ``reason`` and ``detail`` say why."""

    def __init__(self, reason: RejectReason, message: str, detail: dict[str, object] | None = None) -> None:
        self.reason = reason
        self.detail = detail or {}
        super().__init__(f"{reason.value}: {message}")


def refuse_repeated(repeated: tuple[int, float] | None, reason: RejectReason, reported: str, stuck: str,
                    figures: dict[str, object]) -> None:
    """Raise ``StationRejected(reason)`` for what :meth:`Session.repeated_position` /
    :meth:`Session.repeated_image` found (``(stations back, robot moved m)``; None: nothing).
    ``reported`` says what came back, bit for bit ("the camera sent, to the last bit, the
    image it sent"), ``stuck`` what that means; the figures get both numbers."""
    if repeated is None:
        return
    back, moved = repeated
    figures.update(repeated_stations_back=back, robot_moved_m=moved)
    raise StationRejected(reason, f"{reported} {back} station(s) ago while the robot is {moved * 1e3:.1f} mm away "
                                  f"from that pose: {stuck}", figures)


class DeviceFault(CellcalError):
    """A device link failed (gone, timed out, unreadable); ``device`` is ``protocol.DEVICE_ROBOT``,
    ``protocol.DEVICE_TRACKER`` or ``protocol.DEVICE_CAMERA``, ``cause`` the driver's error.

    ``ends_job`` is True when what the job's stations rest on changed (the controller's TCP
    offset or payload, :func:`settings_changed`): reconnecting does not help, the job ends.
    ``rejection``, when set, is the station's rejection as well (a drive that faulted during
    the move: the station is rejected with its reason, and the link is reopened).
    """

    def __init__(self, device: P.DeviceName, cause: BaseException, *, ends_job: bool = False,
                 rejection: StationRejected | None = None) -> None:
        self.device = device
        self.cause = cause
        self.ends_job = ends_job
        self.rejection = rejection
        super().__init__(f"{device}: {cause}")


#: ``DeviceError.code`` of a setting the controller reported differently during a job.
TCP_OFFSET_CHANGED = "TCP_OFFSET_CHANGED"
PAYLOAD_CHANGED = "PAYLOAD_CHANGED"
#: ``DeviceError.code`` of a robot that reopened during a job as another one (serial or
#: kinematics): reopened again with backoff, its stations never combined with the job's.
ROBOT_CHANGED = "ROBOT_CHANGED"
#: ``DeviceError.code`` of the UR driver's refusal to move without its dashboard.
DASHBOARD_UNAVAILABLE = "DASHBOARD_UNAVAILABLE"


def settings_changed(setting: str, before: npt.NDArray[np.float64] | float | None,
                     after: npt.NDArray[np.float64] | float | None) -> DeviceError:
    """The error of a controller setting (``"tcp_offset"``, ``"payload"``) that changed
    during a session; its ``code`` is :data:`TCP_OFFSET_CHANGED` or :data:`PAYLOAD_CHANGED`."""
    code = TCP_OFFSET_CHANGED if setting == "tcp_offset" else PAYLOAD_CHANGED
    return DeviceError(f"the controller's {setting} changed during the session from {_fmt(before)} to "
                       f"{_fmt(after)}: stations taken before and after the change cannot be combined", code)


def _fmt(v: npt.NDArray[np.float64] | float | None) -> str:
    if v is None:
        return "nothing"
    if isinstance(v, float):
        return f"{v:g} kg"
    return "p[" + ", ".join(f"{float(x):.6g}" for x in v) + "]"


class RobotKey(NamedTuple):
    """What makes an open robot the job's (:meth:`Session.check_robot`): the controller's
    serial number (None where none was read), where its forward kinematics comes from
    (``factory``, ``nominal``, ...) and that table's digest (None if unknown)."""

    serial: str | None
    source: str
    digest: str | None


class Session:
    """What the consistency checks remember across a job, kept across device reconnects.

    * The controller's TCP offset and payload at the start of the job (the first sample
      that reports them); a later sample with other values records the error of
      :func:`settings_changed` in :attr:`changed` (the robot monitor calls
      :meth:`check_settings` for every sample). :meth:`new_job` starts over.
    * The robot the job started with (serial number and the kinematics its forward
      kinematics uses, ``devices.robot_identity``): a reopen during the job that finds
      another one is refused by :meth:`check_robot`. A UR opened while its primary
      interface is still down (after a controller restart) falls back to the data-sheet
      model, millimetres from its factory table: the job's stations would mix the two.
    * The newest tracker measurement taken, to tell a frozen instrument
      (:meth:`is_frozen`); kept across jobs, as a frozen tracker stays frozen.

    Thread-safe: the robot monitor's thread and the worker share it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tcp: npt.NDArray[np.float64] | None = None
        self._payload: float | None = None
        self.changed: DeviceError | None = None
        self._last: tuple[tuple[bytes | int | None, ...], float] | None = None
        self._in_job = False
        self._robot: RobotKey | None = None
        # The last stations' instrument positions (each half's bytes) and robot poses.
        self._positions: list[tuple[list[bytes], npt.NDArray[np.float64]]] = []
        # The same for camera stations: a digest of each frame's pixels.
        self._images: list[tuple[list[bytes], npt.NDArray[np.float64]]] = []

    def new_job(self, robot: RobotKey | None = None) -> None:
        """Forget the job's settings baseline (and a change seen before the job began);
        ``robot``: the robot already open (else the job's first open sets it)."""
        with self._lock:
            self._tcp, self._payload, self.changed = None, None, None
            self._in_job, self._robot = True, robot

    def end_job(self) -> None:
        """The job is over: reopens compare with nothing until the next one starts."""
        with self._lock:
            self._in_job, self._robot = False, None

    def robot_replaced(self) -> None:
        """The robot is reopened with another model on purpose (a CiA 402 arm taking an
        identified model, ``kinematics_run.sync_devices_model``): its next open is the baseline."""
        with self._lock:
            self._robot = None

    def check_robot(self, robot: RobotKey) -> str | None:
        """None when a robot just opened is the job's (or opened outside a job, or is the
        job's first); else why not, for a ``ROBOT_CHANGED`` refusal. What is not known on
        either side (a serial not read) is no evidence either way."""
        with self._lock:
            if not self._in_job:
                return None
            if self._robot is None:
                self._robot = robot
                return None
            before = self._robot
        if before.serial is not None and robot.serial is not None and before.serial != robot.serial:
            return (f"the robot reopened with another serial number ({robot.serial}) than the job started with "
                    f"({before.serial}): its stations cannot be combined with the job's; reopening")
        if before.digest is not None and robot.digest is not None and before.digest != robot.digest:
            return (f"the robot reopened with another kinematics table ({robot.source} {robot.digest}) than the job "
                    f"started with ({before.source} {before.digest}): its stations cannot be combined with the "
                    "job's; reopening")
        return None

    def check_settings(self, state: RobotState) -> None:
        """Compare one robot sample's reported TCP offset and payload with the baseline."""
        tcp, payload = getattr(state, "tcp_offset", None), getattr(state, "payload_kg", None)
        with self._lock:
            if self.changed is not None:
                return
            if tcp is not None:
                if self._tcp is None:
                    self._tcp = np.array(tcp, dtype=float)
                elif float(np.max(np.abs(np.asarray(tcp) - self._tcp))) > _TCP_CHANGE_TOL:
                    self.changed = settings_changed("tcp_offset", self._tcp.copy(), np.array(tcp, dtype=float))
            if payload is not None and self.changed is None:
                if self._payload is None:
                    self._payload = float(payload)
                elif abs(float(payload) - self._payload) > _PAYLOAD_CHANGE_TOL_KG:
                    self.changed = settings_changed("payload", self._payload, float(payload))

    def is_frozen(self, m: TrackerMeasurement) -> bool:
        """Whether measurement ``m`` repeats the previous one bit for bit with another
        timestamp; ``m`` becomes the previous one either way."""
        sig = _signature(m)
        with self._lock:
            prev, self._last = self._last, (sig, float(m.t_device_s))
        return prev is not None and prev[0] == sig and prev[1] != float(m.t_device_s)


    def repeated_position(self, positions: list[npt.NDArray[np.float64]], base_T_flange: npt.NDArray[np.float64],
                          min_change_m: float,
                          min_change_rad: float) -> tuple[int, float] | None:
        """Whether one of a station's instrument positions (its averaging halves',
        ``cell_p_target``, m) repeats, bit for bit, one of the last
        :data:`RECENT_POSITIONS` stations' measured at another robot pose (farther than
        ``min_change_m`` or ``min_change_rad`` from ``base_T_flange``): ``(stations back,
        distance between the two robot poses in m)``, else None. The station is then
        remembered either way.

        An instrument that keeps its position while it freshens its standard deviations
        and timestamps escapes :meth:`is_frozen`; a live one cannot give one position to
        the last bit at two poses (its noise, and the poses differ by the pose-change
        minimum at least)."""
        keys = [np.asarray(p, dtype=np.float64).tobytes() for p in positions]
        return self._repeated(self._positions, keys, base_T_flange, min_change_m, min_change_rad)

    def repeated_image(self, key: bytes, base_T_flange: npt.NDArray[np.float64], min_change_m: float,
                       min_change_rad: float) -> tuple[int, float] | None:
        """:meth:`repeated_position` for a camera station's image: ``key`` is a digest of the
        frame's pixels. A live camera's sensor noise never repeats an image to the last bit,
        and between two robot poses the pose-change minimum apart its view changes; a camera
        that resends a stale buffer with fresh stamps and frame ids does."""
        return self._repeated(self._images, [key], base_T_flange, min_change_m, min_change_rad)

    def _repeated(self, memory: list[tuple[list[bytes], npt.NDArray[np.float64]]], keys: list[bytes],
                  base_T_flange: npt.NDArray[np.float64], min_change_m: float,
                  min_change_rad: float) -> tuple[int, float] | None:
        G = np.asarray(base_T_flange, dtype=float)
        found: tuple[int, float] | None = None
        with self._lock:
            for back, (old_keys, G_old) in enumerate(reversed(memory), start=1):
                if not set(keys) & set(old_keys):
                    continue
                dt = float(np.linalg.norm(G_old[:3, 3] - G[:3, 3]))
                if dt > min_change_m or rotation_angle(G_old[:3, :3].T @ G[:3, :3]) > min_change_rad:
                    found = (back, dt)
                    break
            memory.append((keys, G.copy()))
            del memory[:-RECENT_POSITIONS]
        return found


#: How many stations' instrument positions :meth:`Session.repeated_position` compares with.
RECENT_POSITIONS = 16


def _signature(m: TrackerMeasurement) -> tuple[bytes | int | None, ...]:
    """Every value bit of a tracker measurement (not its timestamps)."""
    def b(a: npt.NDArray[np.float64] | None) -> bytes | None:
        return None if a is None else np.asarray(a, dtype=np.float64).tobytes()

    return (b(m.cell_p_target), b(m.cell_T_target), b(m.std_translation_m), b(m.std_rotation_rad),
            int(m.sample_count))


def fk_deviation(model: DHModel, q_rad: npt.NDArray[np.float64], base_T_flange: npt.NDArray[np.float64]) -> tuple[float, float]:
    """``(translation_m, rotation_rad)`` between a reported flange pose and the forward
    kinematics of the reported joints under ``model``.

    Parameters
    ----------
    model : DHModel
        The robot's kinematics: the driver's nominal model (``RobotDriver.model``) or a
        better one (a controller's factory calibration) where available.
    q_rad : (n,) array
        Joint angles, rad.
    base_T_flange : (4, 4) array
        The flange pose the robot reported (RTDE: ``actual_TCP_pose`` with the configured
        TCP removed), metres.
    """
    fk = model.forward(np.asarray(q_rad, dtype=float))
    dt = float(np.linalg.norm(fk[:3, 3] - base_T_flange[:3, 3]))
    dr = rotation_angle(fk[:3, :3].T @ base_T_flange[:3, :3])
    return dt, dr


class Expected:
    """A rough current estimate of the cell, to predict each station's tracker pose.

    ``cell_T_target = cell_T_base @ base_T_flange @ flange_T_target``; a measurement
    farther than ``max_translation_m`` / ``max_rotation_rad`` from the prediction is a gross
    disagreement (:meth:`bounds` says how those are chosen).

    A point estimate (:meth:`of_point`, from a point base-frame fit) knows the reflector's
    position on the flange but no target orientation (``is_point``): only positions are
    compared (:meth:`position_deviation`).
    """

    def __init__(self, cell_T_base: npt.NDArray[np.float64], flange_T_target: npt.NDArray[np.float64], max_translation_m: float,
                 max_rotation_rad: float, n_stations: int, *, is_point: bool = False) -> None:
        self.cell_T_base = np.asarray(cell_T_base, dtype=float)
        self.flange_T_target = np.asarray(flange_T_target, dtype=float)
        self.max_translation_m = float(max_translation_m)
        self.max_rotation_rad = float(max_rotation_rad)
        self.n_stations = int(n_stations)
        self.is_point = bool(is_point)

    @classmethod
    def of_point(cls, cell_T_base: npt.NDArray[np.float64], flange_p_target: npt.NDArray[np.float64], max_translation_m: float,
                 n_stations: int) -> Expected:
        """The estimate of a point fit: ``cell_p_target = cell_T_base @ base_T_flange @ flange_p_target``."""
        Y = np.eye(4)
        Y[:3, 3] = np.asarray(flange_p_target, dtype=float).reshape(3)
        return cls(cell_T_base, Y, max_translation_m, math.inf, n_stations, is_point=True)

    def position_deviation(self, base_T_flange: npt.NDArray[np.float64], cell_p_target: npt.NDArray[np.float64]) -> float:
        """Distance (m) of a measured target position from the predicted one."""
        pred = self.cell_T_base @ base_T_flange @ self.flange_T_target
        return float(np.linalg.norm(pred[:3, 3] - np.asarray(cell_p_target, dtype=float)))

    @staticmethod
    def bounds(rms_translation_m: float, rms_rotation_rad: float, floor_m: float, floor_rad: float) -> tuple[float, float]:
        """``max(floor, GROSS_RMS_FACTOR x the fit's RMS closure)``, per component."""
        return (max(float(floor_m), GROSS_RMS_FACTOR * float(rms_translation_m)),
                max(float(floor_rad), GROSS_RMS_FACTOR * float(rms_rotation_rad)))

    def deviation(self, base_T_flange: npt.NDArray[np.float64], cell_T_target: npt.NDArray[np.float64]) -> tuple[float, float]:
        """``(translation_m, rotation_rad)`` of a measured target pose from the prediction."""
        pred = self.cell_T_base @ base_T_flange @ self.flange_T_target
        return (float(np.linalg.norm(pred[:3, 3] - cell_T_target[:3, 3])),
                rotation_angle(pred[:3, :3].T @ cell_T_target[:3, :3]))
