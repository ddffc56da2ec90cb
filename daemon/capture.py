"""The capture engine: settled robot + settled tracker -> one timestamped station pair.

A station is accepted only when

1. the robot is at rest: joint speeds, flange speeds (and, on CiA 402, target reached) under
   their thresholds for the dwell time (:class:`cellcal.drivers.settle.SettleDetector`, fed
   by a :class:`RobotMonitor` that reads every robot sample in a thread);
2. the tracker is at rest: the averaging window is split in two halves measured back to
   back; each half's standard uncertainty is under ``max_std`` and the two halves agree
   within ``agree`` (a target still ringing shows up as disagreement);
3. the robot's rest window covers the tracker's averaging window in host time (both clocks
   mapped onto ``time.monotonic_ns()``), within ``sync_window_s`` for the clock mapping's
   uncertainty, and the robot samples averaged over it are one pose (no joint spans more
   than its speed limit allows over their controller-time span, plus encoder noise);
4. the pose is new: no accepted station of the run is within ``min_pose_change``;
5. the data are consistent (every station, not only when a device connects):

   * the robot's reported flange pose agrees with forward kinematics of its joint angles
     within ``[robot] max_fk_error_mm`` / ``max_fk_error_deg`` (:func:`fk_deviation`, one
     function taking the model: a TCP changed on the pendant shows up here on controllers
     that do not report their TCP);
   * the tracker's position is within the instrument's range, ``[tracker] max_range_mm``;
   * the tracker's value is not frozen: bit for bit the previous measurement with a fresh
     timestamp (:class:`Session`; noise makes that impossible for a live instrument);
   * the tracker's position is not one it gave at another robot pose within the last 16
     stations, bit for bit, whatever its std says (``Session.repeated_position``:
     ``tracker_position_repeated``), nor a value the instrument cannot report (its driver's
     ``ImplausibleMeasurementError``: ``tracker_value_implausible``);
   * the tracker's pose (a point tracker's point) agrees with the one predicted from the
     robot pose and the run's rough current estimate (:class:`Expected`), within a bound
     that grows with the estimate's own residuals and never falls below ``[tracker]
     gross_error_mm`` / ``gross_error_deg`` (a point has no rotation to compare).

A point (3-DoF) station (``[tracker] measure = "point"``: a reflector, as an emScon tracker
or a GeoCOM total station measures it) goes through the same steps with what a point has:
the halves' position std and agreement (no rotation figures: ``tracker_std_rotation_rad``
is None), the range, the frozen value, the FK check of the robot, and the gross check of
the position. Its record has ``cell_p_target`` and no ``cell_T_target``.

Otherwise a :class:`StationRejected` names the reason (:class:`RejectReason`) and carries the
figures. A CiA 402 move the drive lied about (``cellcal.drivers.cia402_motion``) is
``drive_target_mismatch`` or ``joint_not_moving``; a drive that faulted during the move is
``drive_fault`` carried by a :class:`DeviceFault` (the station rejected, the link reopened;
ADR 0032). The run's consensus (``cellcal.daemon.consensus``) judges the station after it is
captured, with the run's other stations. Link failures are not rejections: they raise :class:`DeviceFault` naming the device
at fault (a tracker measurement stamped in the future is the tracker's, not the robot's) and
the service goes to FAULT, reconnects with backoff and retries the same station. A change of
the controller's TCP offset or payload during a job (RTDE ``tcp_offset``/``payload``, where
the controller reports them) raises a :class:`DeviceFault` with ``ends_job``: stations taken
before and after cannot be combined, so the job ends.

This is where a station is born: :meth:`CaptureEngine.capture` (robot + tracker) and
:meth:`CaptureEngine.capture_robot_only` (a tool-point run: the robot alone) return the
:class:`~cellcal.daemon.store.StationRecord` that ``Store.add_station`` commits as it is.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar, TypeVarTuple, cast

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config

# The checks and the monitor the engine uses, re-exported: ``capture`` is the name the
# service, the jobs and the tests know them by (``capture as cap``).
from cellcal.daemon.consistency import (
    DASHBOARD_UNAVAILABLE,
    GROSS_RMS_FACTOR,
    PAYLOAD_CHANGED,
    ROBOT_CHANGED,
    TCP_OFFSET_CHANGED,
    DeviceFault,
    Expected,
    RejectReason,
    RobotKey,
    Session,
    StationRejected,
    fk_deviation,
    refuse_repeated,
    settings_changed,
)
from cellcal.daemon.monitor import MONITOR_LINGER_S, RobotMonitor, rest_spread, settle_config
from cellcal.daemon.store import StationRecord
from cellcal.drivers.cia402_motion import DriveFaultDuringMove, JointNotMoving, MoveVerificationError, TargetMismatch
from cellcal.drivers.errors import DeviceError, DeviceGoneError, DriverError, DriverTimeoutError, ProtocolError
from cellcal.drivers.kinematics import DHModel
from cellcal.drivers.robot import RobotState
from cellcal.drivers.tracker import (
    BeamBrokenError,
    ImplausibleMeasurementError,
    NotStableError,
    TrackerBusyError,
    TrackerDriver,
    TrackerMeasurement,
)
from cellcal.solver.se3 import quat_from_matrix, rotation_angle

if TYPE_CHECKING:  # the run kinds' package imports this module (a station's capture)
    from cellcal.daemon.camera_capture import CameraCapture
    from cellcal.daemon.runs.plan import PlannedStation

log = logging.getLogger(__name__)

__all__ = ["RejectReason", "StationRejected", "DeviceFault", "RobotMonitor", "CaptureEngine", "Capture", "Session",
           "Expected", "fk_deviation", "settings_changed", "TCP_OFFSET_CHANGED", "PAYLOAD_CHANGED", "ROBOT_CHANGED",
           "DASHBOARD_UNAVAILABLE", "GROSS_RMS_FACTOR", "MONITOR_LINGER_S", "RobotKey", "jsonable", "json_object",
           "rest_spread", "settle_config"]

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

#: What the engine returns for one station is the record the store persists (one definition).
Capture = StationRecord

def _mean_pose(Ts: list[npt.NDArray[np.float64]]) -> npt.NDArray[np.float64]:
    """Mean of nearby rigid transforms: mean translation, chordal mean rotation."""
    A = np.array(Ts)
    out = np.eye(4)
    out[:3, 3] = A[:, :3, 3].mean(axis=0)
    U, _, Vt = np.linalg.svd(A[:, :3, :3].sum(axis=0))
    D = np.diag([1.0, 1.0, np.sign(np.linalg.det(U @ Vt))])
    out[:3, :3] = U @ D @ Vt
    return out


class CaptureEngine:
    """Takes station pairs with a robot monitor and a tracker driver.

    Parameters
    ----------
    monitor : RobotMonitor
        Running monitor of an open robot driver.
    tracker : TrackerDriver
        Open tracker driver.
    cfg : Config
        The daemon configuration (``robot``, ``tracker``, ``capture`` sections are used).
    model : object with ``forward(q)``, optional
        The kinematics the reported robot pose is checked against (:func:`fk_deviation`);
        default the driver's own model (``RobotDriver.model``).
    session : Session, optional
        Default: the monitor's.
    """

    def __init__(self, monitor: RobotMonitor, tracker: TrackerDriver | None, cfg: Config, *, model: DHModel | None = None,
                 session: Session | None = None, camera: CameraCapture | None = None) -> None:
        self.monitor = monitor
        self.robot = monitor.robot
        self.tracker = tracker
        #: The open camera and its station path (``cellcal.daemon.camera_capture``), in a cell
        #: with a ``[camera]`` whose camera is open; else None.
        self.camera = camera
        self.cfg = cfg
        self.model = model if model is not None else monitor.robot.model
        self.session = session if session is not None else monitor.session
        #: A helper thread still in a driver move an abort left (:meth:`_abortable`): the
        #: service closes the devices, which ends it.
        self.pending_move: threading.Thread | None = None
        #: A helper still in a tracker measurement an abort left: it ends by itself (the
        #: averaging window), and the next measurement waits for it first.
        self.pending_measure: threading.Thread | None = None
        #: What the engine is doing now, for people and tests: "moving", "settling",
        #: "measuring" or "" (between stations).
        self.phase = ""

    def _check_fk(self, q_rad: npt.NDArray[np.float64], base_T_flange: npt.NDArray[np.float64],
                  figures: dict[str, object]) -> None:
        """Reject the station if the reported pose disagrees with forward kinematics."""
        r = self.cfg.robot
        dt, dr = fk_deviation(self.model, q_rad, base_T_flange)
        figures.update(fk_error_m=dt, fk_error_rad=dr)
        if dt > r.max_fk_error_m or dr > r.max_fk_error_rad:
            raise StationRejected(
                RejectReason.FK_MISMATCH,
                f"the robot's reported pose is {dt * 1e3:.3f} mm / {math.degrees(dr):.4f} deg from forward "
                f"kinematics of its joints ({getattr(self.model, 'name', 'model')}; limit "
                f"{r.max_fk_error_m * 1e3:g} mm / {math.degrees(r.max_fk_error_rad):g} deg): a TCP changed on the "
                "controller, or the wrong model",
                figures,
            )

    def check_fk(self, q_rad: npt.NDArray[np.float64], base_T_flange: npt.NDArray[np.float64],
                 figures: dict[str, object]) -> None:
        """Reject a station whose reported pose disagrees with forward kinematics of its
        joints (``FK_MISMATCH``): the check every station makes, for other capture paths."""
        self._check_fk(q_rad, base_T_flange, figures)

    def capture_camera(self, plan_index: int, accepted_poses: list[npt.NDArray[np.float64]],
                       abort: threading.Event | None = None) -> StationRecord:
        """A camera station (``cellcal.daemon.camera_capture.CameraCapture.station``): the
        robot at rest, a settled frame exposed while it rests, the target detected."""
        if self.camera is None:  # a camera kind's engine always has one (RunKind.needs_camera)
            raise DeviceFault(P.DEVICE_CAMERA, DriverError("no camera is open"))
        return self.camera.station(self, plan_index, accepted_poses, abort)

    # -- moving ------------------------------------------------------------------------------
    def move_to(self, planned: PlannedStation, abort: threading.Event | None = None) -> None:
        """Command mode: move to a planned station (joints when known).

        With ``abort``, the wait for the move's end checks it every 50 ms: the driver's own
        blocking move (its completion logic is the backend's) runs in a helper thread, and
        an abort stops the robot and returns at once with a ``StationRejected``
        (``MOVE_FAILED``, "aborted") that the caller turns into the end of its job. A helper
        still waiting for its move then is :attr:`pending_move` (the service closes the
        devices, which ends it).
        """
        self.phase = "moving"
        if abort is None:
            self._move(planned)
            return
        self._abortable(self._move, (planned,), abort, "move", stop_robot=True)

    def sweep_to(self, base_T_flange: npt.NDArray[np.float64], speed: float, abort: threading.Event,
                 during: Callable[[], None]) -> None:
        """Command mode: move the flange to ``base_T_flange`` at ``speed`` (a fraction of the
        robot's nominal speed, as ``[capture] move_speed``) and call ``during()`` again and
        again in this thread until the move has ended (a camera's frames taken while the
        robot moves: the dynamic check). Failures and an abort as :meth:`move_to`."""
        self.phase = "moving"
        target = np.asarray(base_T_flange, dtype=float)
        # a station's move budget, stretched by how much slower than a station's move this is
        timeout_s = self.cfg.capture.station_timeout_s * max(1.0, self.cfg.capture.move_speed / float(speed))
        self._abortable(self._move_to, (None, target, float(speed), timeout_s), abort, "move", stop_robot=True,
                        during=during)

    def abortable(self, fn: Callable[[*_Ts], _T], args: tuple[*_Ts], abort: threading.Event, what: str) -> _T:
        """``fn(*args)``, a device call that blocks (a camera's frame), ended early by
        ``abort`` as a measurement is (:meth:`_abortable`): for other capture paths."""
        return self._abortable(fn, args, abort, what)

    def _abortable(self, fn: Callable[[*_Ts], _T], args: tuple[*_Ts], abort: threading.Event, what: str, *,
                   stop_robot: bool = False, during: Callable[[], None] | None = None) -> _T:
        """``fn(*args)`` (a driver call that blocks: a move, a measurement) in a helper
        thread, its end awaited in 50 ms steps that check ``abort``. Aborted: the robot is
        stopped (``stop_robot``), the helper gets 0.2 s to notice, and if it still waits it
        is left as :attr:`pending_move` (the service then closes the devices, which ends it);
        ``StationRejected`` (``MOVE_FAILED`` / ``NOT_SETTLED``, ``{"aborted": True}``) is raised.
        ``during()``, when given, is called between the checks instead of the 50 ms wait."""
        out: list[_T] = []
        failure: list[BaseException] = []

        def call() -> None:
            try:
                out.append(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                failure.append(exc)

        helper = threading.Thread(target=call, name=f"cellcal-{what}", daemon=True)
        helper.start()
        while helper.is_alive():
            if abort.is_set():
                if stop_robot:
                    try:
                        self.robot.stop()
                    except Exception:  # noqa: BLE001 - an abort stands even if the stop fails
                        log.warning("stopping the robot after an abort failed", exc_info=True)
                helper.join(0.2)  # a backend that sees the stop returns at once
                if helper.is_alive():
                    if what == "move":
                        self.pending_move = helper
                    else:
                        self.pending_measure = helper
                reason = RejectReason.MOVE_FAILED if what == "move" else RejectReason.NOT_SETTLED
                raise StationRejected(reason, f"{what} aborted", {"aborted": True})
            if during is not None:
                try:
                    during()
                except BaseException:
                    if stop_robot:  # the move must not go on unwatched
                        try:
                            self.robot.stop()
                        except Exception:  # noqa: BLE001 - the failure of during() is the one to raise
                            log.warning("stopping the robot after a failure during its move failed", exc_info=True)
                    helper.join(0.2)
                    raise
            else:
                helper.join(0.05)
        if failure:
            raise failure[0]
        return out[0]

    def _move(self, planned: PlannedStation) -> None:
        self._move_to(planned.q_rad, planned.base_T_flange, self.cfg.capture.move_speed,
                      self.cfg.capture.station_timeout_s)

    def _move_to(self, q_rad: npt.NDArray[np.float64] | None, base_T_flange: npt.NDArray[np.float64] | None,
                 speed: float, timeout_s: float) -> None:
        """A move to the joints ``q_rad`` when given, else to the flange pose, within
        ``timeout_s``; the driver's failures as the station's rejection or the robot's fault."""
        self.monitor.restart_window()
        try:
            if q_rad is not None:
                self.robot.move_to(q_rad=q_rad, speed=speed, wait=True, timeout_s=timeout_s)
            else:
                self.robot.move_to(base_T_flange=base_T_flange, speed=speed, wait=True, timeout_s=timeout_s)
        except DeviceGoneError as exc:
            raise DeviceFault(P.DEVICE_ROBOT, exc) from exc
        except (MoveVerificationError, DriveFaultDuringMove) as exc:
            raise _lying_drive(exc) from exc
        except DeviceError as exc:  # protective stop and friends: the cell said no
            if getattr(exc, "code", "") == DASHBOARD_UNAVAILABLE:
                # Not the cell's no: the link to the controller's dashboard is down (it comes
                # back after RTDE when a controller restarts). Ridden out like a lost link,
                # so the station is not given up for a fault of the connection.
                raise DeviceFault(P.DEVICE_ROBOT, exc) from exc
            raise StationRejected(RejectReason.PROTECTIVE_STOP, str(exc), {"code": getattr(exc, "code", "")}) from exc
        except DriverTimeoutError as exc:
            raise StationRejected(RejectReason.MOVE_FAILED, str(exc)) from exc
        except ValueError as exc:  # unreachable pose, bad target
            raise StationRejected(RejectReason.MOVE_FAILED, str(exc)) from exc
        self.monitor.restart_window()

    # -- measuring ------------------------------------------------------------------------------
    def _tracker(self) -> TrackerDriver:
        if self.tracker is None:  # an engine for a robot-only kind (no tracker opened) never measures
            raise DriverError("no tracker is open")
        return self.tracker

    def _measure_half(self, kind: str, average_s: float) -> TrackerMeasurement:
        pending = self.pending_measure
        if pending is not None:
            # An aborted measurement still averaging: the link is the tracker's until it ends.
            pending.join(2.0 * self.cfg.tracker.average_s + 10.0)
            if pending.is_alive():
                raise DeviceFault(P.DEVICE_TRACKER, DriverTimeoutError(
                    "the tracker's previous (aborted) measurement did not end"))
            self.pending_measure = None
        try:
            return self._tracker().measure(kind, average_s)
        except DeviceError as exc:
            if isinstance(exc, BeamBrokenError):
                raise StationRejected(RejectReason.BEAM_BROKEN, str(exc), {"code": exc.code}) from exc
            if isinstance(exc, ImplausibleMeasurementError):
                # A value the instrument cannot physically report (an angle beyond its circle):
                # never used, and named, so a lying instrument is told from a refusing one.
                raise StationRejected(RejectReason.TRACKER_IMPLAUSIBLE, str(exc),
                                      {"code": exc.code, "field": exc.field}) from exc
            if isinstance(exc, TrackerBusyError):
                raise StationRejected(RejectReason.TRACKER_REFUSED, str(exc), {"code": exc.code}) from exc
            raise StationRejected(RejectReason.TRACKER_REFUSED, str(exc), {"code": getattr(exc, "code", "")}) from exc
        except (DeviceGoneError, DriverTimeoutError, ProtocolError) as exc:
            raise DeviceFault(P.DEVICE_TRACKER, exc) from exc
        except DriverError as exc:
            raise DeviceFault(P.DEVICE_TRACKER, exc) from exc

    def capture(self, plan_index: int, accepted_poses: list[npt.NDArray[np.float64]],
                abort: threading.Event | None = None, *, expected: Expected | None = None) -> StationRecord:
        """Wait for rest, measure, check the windows and the consistency; return the station or raise.

        ``plan_index`` is the station's place in the plan (the record's ``plan_index``);
        ``accepted_poses`` are the run's accepted ``base_T_flange`` (for the duplicate test);
        ``expected``, when given, is the rough estimate a measurement (pose or point) must
        agree with (a drift check passes none: its deviation is what it measures).
        A tracker that says its target is not stable yet (the arm still settling) is asked
        again until the station's timeout, as an operator would; only then is it a rejection.
        """
        deadline = time.monotonic() + self.cfg.capture.station_timeout_s
        while True:
            try:
                return self._capture_once(plan_index, accepted_poses, abort, expected)
            except StationRejected as rej:
                unstable = isinstance(rej.__cause__, NotStableError)
                if not unstable or time.monotonic() > deadline or (abort is not None and abort.is_set()):
                    raise
                time.sleep(0.02)

    def capture_robot_only(self, plan_index: int, accepted_poses: list[npt.NDArray[np.float64]],
                           abort: threading.Event | None = None) -> StationRecord:
        """A station without the tracker (a tool-point run): the robot at rest, nothing measured.

        ``StationRejected(NOT_SETTLED)`` after the station timeout, ``DUPLICATE_POSE`` when
        the pose is one of ``accepted_poses``.
        """
        c = self.cfg.capture
        self.phase = "settling"
        state, status = self.monitor.wait_settled(c.station_timeout_s, abort)
        G = state.base_T_flange
        self._check_fk(state.q_rad, G, {"quiet_s": status.quiet_s})
        for j, Ga in enumerate(accepted_poses):
            if (np.linalg.norm(Ga[:3, 3] - G[:3, 3]) < c.min_pose_change_m
                    and rotation_angle(Ga[:3, :3].T @ G[:3, :3]) < c.min_pose_change_rad):
                raise StationRejected(RejectReason.DUPLICATE_POSE, f"same pose as accepted station {j}")
        return StationRecord(
            plan_index=plan_index, base_T_flange=G, q_rad=state.q_rad, cell_T_target=None,
            cell_p_target=None, tracker_std_translation_m=0.0, tracker_std_rotation_rad=None, sample_count=0,
            robot_t_device_s=state.t_device_s, robot_t_host_ns=state.t_host_ns, tracker_t_device_s=0.0,
            tracker_t_host_ns=0,
            settle=json_object({"quiet_s": status.quiet_s, "max_joint_speed_rad_s": status.max_joint_speed_rad_s}),
            raw={}, accepted_host_ns=time.monotonic_ns(),
        )

    def _capture_once(self, plan_index: int, accepted_poses: list[npt.NDArray[np.float64]],
                      abort: threading.Event | None, expected: Expected | None = None) -> StationRecord:
        c, tc = self.cfg.capture, self.cfg.tracker
        # Measure as soon as the robot is quiet, and confirm the dwell afterwards: the dwell
        # and the tracker's averaging then overlap instead of adding up (recalibration
        # downtime, bench/downtime_bench.py). A robot that rings is still never accepted
        # early: its rest window restarts when it moves again, and the station is refused.
        # A little quiet first (half the dwell, at most 50 ms): a ringing arm's speed crosses
        # zero briefly, and a measurement started on such a crossing would only be refused.
        self.phase = "settling"
        state, status = self.monitor.wait_quiet(
            c.station_timeout_s, abort, min(self.cfg.robot.settle.dwell_s / 2.0, 0.05)
        )
        window_start = status.window_start_ns
        kind = tc.measure
        half = tc.average_s / 2.0
        self.phase = "measuring"
        if abort is None:
            m1 = self._measure_half(kind, half)
            m2 = self._measure_half(kind, half)
        else:
            m1 = self._abortable(self._measure_half, (kind, half), abort, "measurement")
            m2 = self._abortable(self._measure_half, (kind, half), abort, "measurement")
        self.phase = "settling"
        # The tracker's averaging window in host time: each half is centred on its t_host_ns.
        half_ns = int(half * 0.5e9)
        t0 = m1.t_host_ns - half_ns
        t1 = m2.t_host_ns + half_ns
        tol_ns = int(c.sync_window_s * 1e9 + max(m1.t_host_uncertainty_ns, m2.t_host_uncertainty_ns))
        # 0. the tracker's own consistency, before anything is compared with it: its window
        # cannot have ended in the future (the reply came after it), its values must be
        # within the instrument's range and must not repeat the previous value bit for bit.
        ahead_ns = t1 - time.monotonic_ns()
        if ahead_ns > tol_ns:
            raise DeviceFault(P.DEVICE_TRACKER, ProtocolError(
                f"tracker measurement window ends {ahead_ns * 1e-9:.3f} s in the future of the host clock "
                f"(tolerance {tol_ns * 1e-9:.3f} s): the tracker's timestamps or clock are wrong"))
        far = max(float(np.linalg.norm(m.cell_p_target)) for m in (m1, m2))
        if far > tc.max_range_m:
            raise StationRejected(
                RejectReason.TRACKER_OUT_OF_RANGE,
                f"tracker reports the target {far:.6g} m away, beyond the instrument's range of "
                f"{tc.max_range_m:g} m ([tracker] max_range_mm)",
                {"distance_m": far, "max_range_m": tc.max_range_m},
            )
        frozen = [self.session.is_frozen(m) for m in (m1, m2)]
        if any(frozen):
            raise StationRejected(
                RejectReason.TRACKER_FROZEN,
                "tracker measurement identical to the previous one to the last bit with a fresh timestamp: "
                "the instrument's value is frozen",
                {"t_device_s": [float(m1.t_device_s), float(m2.t_device_s)], "halves_frozen": frozen},
            )
        self.monitor.wait_sample_after(t1, timeout_s=2.0 + c.sync_window_s)
        st_now = self.monitor.wait_window_settled(window_start, self.cfg.robot.settle.dwell_s + 2.0, abort)
        latest, st_latest = self.monitor.status()
        if st_now is None:
            st_now = st_latest
        # 1-2. tracker settle: each half precise enough, the halves agree.
        s = tc.settle
        std_t = max(float(np.max(m1.std_translation_m)), float(np.max(m2.std_translation_m)))
        std_r = None
        if kind == "pose":
            std_r = max(float(np.max(_rotation_std(m1))), float(np.max(_rotation_std(m2))))
        figures: dict[str, object] = {
            "robot_quiet_s": st_now.quiet_s if st_now else 0.0,
            "robot_max_joint_speed_rad_s": st_now.max_joint_speed_rad_s if st_now else None,
            "robot_max_flange_speed_m_s": st_now.max_flange_speed_m_s if st_now else None,
            "robot_max_flange_ang_speed_rad_s": st_now.max_flange_ang_speed_rad_s if st_now else None,
            "robot_dwell_samples": st_now.n_samples if st_now else 0,
            "tracker_std_translation_m": std_t,
            "tracker_std_rotation_rad": std_r,
            "tracker_window_s": (t1 - t0) * 1e-9,
        }
        if std_t > s.max_std_translation_m or (std_r is not None and std_r > s.max_std_rotation_rad):
            raise StationRejected(RejectReason.TRACKER_STD, f"tracker std {std_t * 1e3:.4f} mm too high", figures)
        d_t = float(np.linalg.norm(m1.cell_p_target - m2.cell_p_target))
        d_r = rotation_angle(_pose(m1)[:3, :3].T @ _pose(m2)[:3, :3]) if kind == "pose" else None
        figures.update(tracker_halves_delta_m=d_t, tracker_halves_delta_rad=d_r)
        if d_t > s.agree_translation_m or (d_r is not None and d_r > s.agree_rotation_rad):
            rot = "" if d_r is None else f" / {math.degrees(d_r):.4f} deg"
            raise StationRejected(RejectReason.TRACKER_DISAGREE, f"tracker halves differ by {d_t * 1e3:.4f} mm{rot}",
                                  figures)
        # 3. the robot's rest window covers the tracker's window (within the sync tolerance).
        if (st_now is None or not st_now.settled or st_now.window_start_ns != window_start
                or st_now.window_start_ns > t0 + tol_ns):
            figures.update(robot_window_start_ns=st_now.window_start_ns if st_now else 0, tracker_window_start_ns=t0)
            raise StationRejected(
                RejectReason.SYNC_WINDOW,
                "the robot did not rest through the tracker's averaging window",
                figures,
            )
        # The robot pose: samples of the rest window only. The sync tolerance widens the
        # tracker's window for the clock mapping's uncertainty, but reaching further back
        # than the rest window's start would average in the end of the move and the ringing
        # (whenever sync_window_s exceeds the dwell): a pose off by the ringing amplitude.
        samples = self.monitor.samples_between(max(t0 - tol_ns, st_now.window_start_ns), t1 + tol_ns) or [_sampled(latest)]
        # The samples averaged must be one pose (rest_spread): samples stamped into the
        # window that belong elsewhere (a backlog of the link mapped onto the wrong host
        # times) would average two poses into one that was never measured.
        qs = np.array([smp.q_rad for smp in samples])
        q_range, q_allowed = rest_spread(samples, self.cfg.robot.settle)
        if q_range > q_allowed:
            figures.update(robot_q_range_rad=q_range, robot_q_allowed_rad=q_allowed, robot_samples=len(samples))
            raise StationRejected(
                RejectReason.NOT_SETTLED,
                f"the robot samples of the rest window span {math.degrees(q_range):.4f} deg of a joint, more than "
                f"{math.degrees(q_allowed):.4f} deg at rest: they are not one pose",
                figures,
            )
        G = _mean_pose([smp.base_T_flange for smp in samples])
        q = qs.mean(axis=0)
        mid = samples[len(samples) // 2]
        # 5a. the robot's pose agrees with its joints.
        self._check_fk(q, G, figures)
        # 4. a new pose.
        for j, Ga in enumerate(accepted_poses):
            dt = float(np.linalg.norm(Ga[:3, 3] - G[:3, 3]))
            dr = rotation_angle(Ga[:3, :3].T @ G[:3, :3])
            if dt < c.min_pose_change_m and dr < c.min_pose_change_rad:
                figures.update(duplicate_of=j, distance_m=dt, angle_rad=dr)
                raise StationRejected(RejectReason.DUPLICATE_POSE, f"same pose as accepted station {j}", figures)
        # 5c'. the instrument's position is not one it gave at another pose, bit for bit.
        refuse_repeated(self.session.repeated_position([m1.cell_p_target, m2.cell_p_target], G, c.min_pose_change_m,
                                                       c.min_pose_change_rad),
                        RejectReason.TRACKER_POSITION_REPEATED,
                        "the instrument reports, to the last bit, the position it reported",
                        "its value is stuck (whatever its std says)", figures)
        # The station's tracker value: the two halves pooled (weighted by their samples).
        w1, w2 = m1.sample_count, m2.sample_count
        wsum = max(w1 + w2, 1)
        p = (w1 * m1.cell_p_target + w2 * m2.cell_p_target) / wsum
        M = None
        if kind == "pose":
            M = _mean_pose([_pose(m1), _pose(m2)])
            M[:3, 3] = p
        # 5d. the measurement agrees with the pose (or point) the run's estimate predicts.
        if expected is not None:
            _check_expected(expected, G, M, p, figures)
        std_pooled = float(math.sqrt(0.5 * (np.max(m1.std_translation_m) ** 2 + np.max(m2.std_translation_m) ** 2) / 2.0))
        raw: dict[str, object] = {
            "tracker_halves": [_meas_raw(m) for m in (m1, m2)],
            "robot_samples": len(samples),
            "robot_q_std_rad": [float(v) for v in np.std([smp.q_rad for smp in samples], axis=0)],
            "robot_window_ns": [int(samples[0].t_host_ns), int(samples[-1].t_host_ns)],
        }
        return StationRecord(
            plan_index=plan_index,
            base_T_flange=G,
            q_rad=q,
            cell_T_target=M,
            cell_p_target=p,
            tracker_std_translation_m=std_pooled,
            tracker_std_rotation_rad=None if std_r is None else std_r / math.sqrt(2.0),
            sample_count=int(w1 + w2),
            robot_t_device_s=float(mid.t_device_s),
            robot_t_host_ns=int(mid.t_host_ns),
            tracker_t_device_s=0.5 * (m1.t_device_s + m2.t_device_s),
            tracker_t_host_ns=(m1.t_host_ns + m2.t_host_ns) // 2,
            settle=json_object(figures),
            raw=json_object(raw),
            accepted_host_ns=time.monotonic_ns(),
        )


def _check_expected(expected: Expected, G: npt.NDArray[np.float64], M: npt.NDArray[np.float64] | None, p: npt.NDArray[np.float64],
                    figures: dict[str, object]) -> None:
    """Reject a station far from the run's estimate: the pose when both the measurement and
    the estimate have an orientation, else the position alone."""
    if M is not None and not expected.is_point:
        dt, dr = expected.deviation(G, M)
        figures.update(expected_deviation_m=dt, expected_deviation_rad=dr, expected_bound_m=expected.max_translation_m,
                       expected_bound_rad=expected.max_rotation_rad)
        if dt > expected.max_translation_m or dr > expected.max_rotation_rad:
            raise StationRejected(
                RejectReason.GROSS_DISAGREEMENT,
                f"tracker pose {dt * 1e3:.3f} mm / {math.degrees(dr):.4f} deg from the pose predicted by the "
                f"estimate of {expected.n_stations} accepted stations (bound "
                f"{expected.max_translation_m * 1e3:.3f} mm / {math.degrees(expected.max_rotation_rad):.4f} deg)",
                figures,
            )
        return
    dt = expected.position_deviation(G, p)
    figures.update(expected_deviation_m=dt, expected_deviation_rad=None, expected_bound_m=expected.max_translation_m,
                   expected_bound_rad=None)
    if dt > expected.max_translation_m:
        raise StationRejected(
            RejectReason.GROSS_DISAGREEMENT,
            f"tracker point {dt * 1e3:.3f} mm from the point predicted by the estimate of {expected.n_stations} "
            f"accepted stations (bound {expected.max_translation_m * 1e3:.3f} mm)",
            figures,
        )


def _lying_drive(exc: MoveVerificationError | DriveFaultDuringMove) -> StationRejected | DeviceFault:
    """A CiA 402 drive's account of a move that its actual position (or its statusword)
    contradicts (``cellcal.drivers.cia402_motion``): the station is rejected with the reason
    naming what the drive did; a drive that faulted also has its link reopened (a
    ``DeviceFault`` carrying the rejection: the job records it, then backs off and reopens
    the robot as for any device fault, which clears the fault through the drives' state
    machine)."""
    detail: dict[str, object] = {"code": exc.code, "node_id": exc.node_id, "joint": exc.joint}
    if isinstance(exc, DriveFaultDuringMove):
        detail.update(statusword=exc.statusword, error_code=exc.error_code, emcy_code=exc.emcy_code)
        return DeviceFault(P.DEVICE_ROBOT, exc, rejection=StationRejected(RejectReason.DRIVE_FAULT, str(exc), detail))
    if isinstance(exc, TargetMismatch):
        detail.update(error_counts=exc.error_counts, window_counts=exc.window_counts)
        return StationRejected(RejectReason.DRIVE_TARGET_MISMATCH, str(exc), detail)
    if isinstance(exc, JointNotMoving):
        return StationRejected(RejectReason.JOINT_NOT_MOVING, str(exc), detail)
    # Another verification of the move failed: a move that cannot be trusted all the same.
    return StationRejected(RejectReason.DRIVE_TARGET_MISMATCH, str(exc), detail)


def _sampled(state: RobotState | None) -> RobotState:
    """The monitor's newest sample, which the wait for a sample after the tracker window has
    just seen (None only if the monitor slept since: its link is then the robot's fault)."""
    if state is None:
        raise DeviceFault(P.DEVICE_ROBOT, DriverTimeoutError("no robot sample after the tracker window"))
    return state


def _pose(m: TrackerMeasurement) -> npt.NDArray[np.float64]:
    """A pose measurement's ``cell_T_target`` (the driver sets it for ``kind = "pose"``)."""
    if m.cell_T_target is None:
        raise ProtocolError("the tracker's pose measurement carries no pose")
    return m.cell_T_target


def _rotation_std(m: TrackerMeasurement) -> npt.NDArray[np.float64]:
    """A pose measurement's ``std_rotation_rad`` (the driver sets it for ``kind = "pose"``)."""
    if m.std_rotation_rad is None:
        raise ProtocolError("the tracker's pose measurement carries no rotation uncertainty")
    return m.std_rotation_rad


def _meas_raw(m: TrackerMeasurement) -> dict[str, object]:
    return {
        "cell_p_target_m": [float(v) for v in m.cell_p_target],
        "quat_wxyz": None if m.cell_T_target is None else _quat(m.cell_T_target),
        "std_translation_m": [float(v) for v in m.std_translation_m],
        "std_rotation_rad": None if m.std_rotation_rad is None else [float(v) for v in m.std_rotation_rad],
        "t_device_s": float(m.t_device_s),
        "t_host_ns": int(m.t_host_ns),
        "sample_count": int(m.sample_count),
    }


def _quat(T: npt.NDArray[np.float64]) -> list[float]:
    return [float(v) for v in quat_from_matrix(T[:3, :3])]


def json_object(obj: Mapping[str, object]) -> P.JsonObject:
    """:func:`jsonable` of a dict (a station's ``settle`` and ``raw``, a rejection's figures)."""
    return {str(k): jsonable(v) for k, v in obj.items()}


def jsonable(obj: object) -> P.JsonValue:
    """Plain JSON types (numpy scalars and arrays become floats and lists; NaN/inf -> None)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, enum.Enum):
        obj = obj.value
    # str, int, bool and None as they are, and an enum's value (ours are strings); anything
    # else too: the store's encoder refuses what is no JSON value, naming the record.
    return cast(P.JsonValue, obj)
