"""The cell's devices as the service's worker holds them: opening, identities, closing, backoff.

The worker opens them at start and keeps them open while idle (:meth:`CellDevices.open_available`
retries each one that is down on its own); a job opens what is missing
(:meth:`CellDevices.open`).

:class:`CellDevices` opens the robot, the tracker and (in a cell with a ``[camera]``
section, ADR 0030) the camera *separately*, so a failure is attributed by which one raised
(:class:`DeviceOpenError` carries ``device``), never by reading an error message. Opening the
robot also starts its :class:`~cellcal.daemon.capture.RobotMonitor`; with it open,
:attr:`CellDevices.engine` is the :class:`~cellcal.daemon.capture.CaptureEngine` that takes
stations (with the open camera's :class:`~cellcal.daemon.camera_capture.CameraCapture`: the
camera identified, its settings applied, its target's detector built). A cell without a
``[camera]`` never opens, names or waits for a camera.

Only the worker thread opens, uses and closes the devices. The one exception is
:meth:`CellDevices.stop_robot`, which an abort calls from the command thread: a stop must
not wait for the worker.

:class:`Backoff` is the reconnection schedule of a fault: ``fault_retry_min_s``, doubling up
to ``fault_retry_max_s``. The service keeps one per job and resets it only after real
progress (an accepted station), so a device that reopens at once and fails again does not
flap the state at the rate it can reconnect.

:attr:`CellDevices.session` (:class:`~cellcal.daemon.capture.Session`) outlives the devices:
what the consistency checks remember (the controller's TCP offset and payload at the start of
the job, the last tracker value) survives a reconnection, so a change made while a link was
down is still seen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TypedDict

from cellcal.daemon import capture as cap
from cellcal.daemon import protocol as P
from cellcal.daemon.camera_capture import CameraCapture, camera_identity
from cellcal.daemon.config import Config
from cellcal.drivers.camera import CameraDriver, connect_camera
from cellcal.drivers.errors import DeviceError
from cellcal.drivers.kinematics import DHModel, dh_model, kinematics_digest
from cellcal.drivers.robot import RobotDriver, connect_robot
from cellcal.drivers.tracker import TrackerDriver, connect_configured_tracker
from cellcal.solver.errors import CellcalError

log = logging.getLogger(__name__)

__all__ = ["DeviceOpenError", "CellDevices", "Backoff", "OPEN_ERRORS", "robot_identity", "DeviceState"]

#: What opening a device may raise that is the device's (or its URL's) fault, not a bug.
OPEN_ERRORS: tuple[type[BaseException], ...] = (CellcalError, OSError, ValueError)


class DeviceState(TypedDict):
    """What the daemon knows of one device now (:attr:`CellDevices.status`)."""

    connected: bool
    url: str                      # as configured
    identity: P.JsonObject        # driver, model, serial, firmware ... ({} until it opened)
    identity_text: str | None     # for people; None until it opened


def _str_or_none(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _robot_key(robot: RobotDriver, ident: Mapping[str, object]) -> cap.RobotKey:
    """The robot as the job's consistency check compares it (``capture.RobotKey``)."""
    return cap.RobotKey(serial=_str_or_none(ident.get("serial")),
                        source=str(getattr(robot, "kinematics_source", "nominal")),
                        digest=_str_or_none(ident.get("kinematics_digest")))


def robot_identity(robot: RobotDriver) -> P.JsonObject:
    """What a result's provenance records of an open robot: ``driver``, ``model``, ``serial``
    (the controller's serial number where it tells one, e.g. a UR's dashboard), and the
    ``kinematics`` its forward kinematics uses (``factory``: the controller's own
    calibration table; ``nominal``: a data-sheet model) with that table's
    ``kinematics_digest`` (:func:`cellcal.drivers.kinematics.kinematics_digest`)."""
    model = robot.model
    digest = getattr(robot, "kinematics_digest", None)
    if digest is None and isinstance(model, DHModel):
        digest = kinematics_digest(model)
    # Keyword form: this "kinematics" (the table's source) is a field name, not the run kind.
    ident: P.JsonObject = dict(driver=type(robot).__name__, model=model.name,
                                 kinematics=getattr(robot, "kinematics_source", "nominal"), kinematics_digest=digest)
    serial = getattr(robot, "serial_number", None)
    if not serial:
        # A CiA 402 arm has no controller serial: the drives' serial numbers name it.
        try:
            identity = getattr(robot, "identity", None)  # Cia402Driver.identity: a property
            drives = identity() if callable(identity) else identity
        except Exception:  # noqa: BLE001 - an identity that cannot be read is left out
            drives = None
        if not isinstance(drives, dict):
            drives = None
        serials = [str(x) for x in (drives or {}).get("serials", []) if x is not None]
        if serials:
            serial = ",".join(serials)
            ident["drive_serials"] = list(serials)
    if serial:
        ident["serial"] = str(serial)
    return ident


class DeviceOpenError(CellcalError):
    """A device could not be opened.

    Attributes
    ----------
    device : str
        ``protocol.DEVICE_ROBOT`` or ``protocol.DEVICE_TRACKER``: the one that raised.
    cause : BaseException
        The driver's error (also ``__cause__``).
    """

    def __init__(self, device: P.DeviceName, cause: BaseException) -> None:
        self.device = device
        self.cause = cause
        super().__init__(f"{device}: {cause}")


class Backoff:
    """Reconnection delays: ``min_s``, then doubling, at most ``max_s`` (seconds)."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s = float(min_s)
        self.max_s = float(max_s)
        self._next = self.min_s

    def next_delay(self) -> float:
        """The delay to wait now; the one after it is twice as long (up to ``max_s``)."""
        delay = self._next
        self._next = min(delay * 2.0, self.max_s)
        return delay

    def reset(self) -> None:
        self._next = self.min_s


class CellDevices:
    """The robot, its monitor, the tracker and the capture engine, opened on demand.

    Parameters
    ----------
    cfg : Config
        The daemon configuration (``robot``, ``tracker``, ``capture`` sections).

    Attributes
    ----------
    status : dict
        Per device (``robot``, ``tracker``): ``connected``, ``url``, ``identity`` (a dict:
        driver, model, serial, firmware ...) and ``identity_text`` (for people); the
        heartbeat's ``devices`` are built from it.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.robot: RobotDriver | None = None
        self.tracker: TrackerDriver | None = None
        #: The camera (a cell with a ``[camera]`` section) and its station path, once open.
        self.camera: CameraDriver | None = None
        self.camera_capture: CameraCapture | None = None
        self.monitor: cap.RobotMonitor | None = None
        self.engine: cap.CaptureEngine | None = None
        #: The consistency checks' memory, kept across close() and open().
        self.session = cap.Session()
        #: A kinematic model the robot is opened with instead of the configured one (a CiA 402
        #: arm with ``[kinematics] use_identified``: ``cellcal.daemon.kinematics_run``), and
        #: the id of the result it comes from.
        self.model_override: DHModel | None = None
        self.model_override_result: int | None = None
        #: The results of other kinematics were checked for the model in use (once per daemon
        #: start and at every change of it: ``runs.kinematics.sync_devices_model``).
        self.kinematics_checked = False
        self._configured_model: DHModel | None = None
        self._stop_lock = threading.Lock()
        # The idle loop's connection attempts (:meth:`connect_idle`).
        self._idle_backoff = Backoff(cfg.service.fault_retry_min_s, cfg.service.fault_retry_max_s)
        self._idle_next_try = 0.0
        self._idle_failures: dict[str, str] = {}
        self.status: dict[str, DeviceState] = {
            P.DEVICE_ROBOT: {"connected": False, "url": cfg.robot.url, "identity": {}, "identity_text": None},
            P.DEVICE_TRACKER: {"connected": False, "url": cfg.tracker.url, "identity": {}, "identity_text": None},
        }
        if cfg.camera is not None:
            self.status[P.DEVICE_CAMERA] = {"connected": False, "url": cfg.camera.url, "identity": {},
                                            "identity_text": None}

    @property
    def model(self) -> DHModel:
        """The robot's kinematic model (the configured one while the robot is not open)."""
        if self.robot is not None:
            return self.robot.model
        if self.model_override is not None:
            return self.model_override
        return self.configured_model()

    def configured_model(self) -> DHModel:
        """The model the configured robot computes its poses with when no identified one
        overrides it: the driver's own reading of the ``[robot]`` options (a model name or a
        DH table), from a driver constructed without I/O."""
        if self._configured_model is None:
            try:
                self._configured_model = connect_robot(self.cfg.robot.url, **dict(self.cfg.robot.options)).model
            except OPEN_ERRORS:
                name = self.cfg.robot.options.get("model", "ur5e")  # the open will say what is wrong
                return dh_model(name if isinstance(name, str) else "ur5e")
        return self._configured_model

    def identities(self) -> dict[str, P.JsonObject]:
        """Device identities as known now (stored with each run)."""
        return {k: dict(v.get("identity") or {}) for k, v in self.status.items()}

    def open(self, need_tracker: bool, need_camera: bool = False, want_tracker: bool = False) -> None:
        """Open what is not open yet: the robot (and its monitor), the tracker if needed,
        and the camera if needed. ``want_tracker``: the job uses the tracker when it can have
        it (an eye-to-hand run's tracker check): tried, and a failure only logged (the job's
        stations then say there was no tracker), never raised.

        Raises
        ------
        DeviceOpenError
            Naming the device that failed (the camera when one is needed and the cell has
            none). What was opened before stays open; the caller decides (the service closes
            everything and retries with :class:`Backoff`).
        """
        if self.robot is None:
            self._open_robot()
        if need_tracker and self.tracker is None:
            self._open_tracker()
        elif want_tracker and self.tracker is None:
            try:
                self._open_tracker()
            except DeviceOpenError as exc:
                log.warning("the tracker could not be opened for this job (it goes on without it): %s", exc.cause)
        if need_camera and self.camera is None:
            self._open_camera()
        self._make_engine()

    def open_available(self) -> dict[str, BaseException]:
        """Open every device that is not open yet, each on its own (the idle loop: a tracker
        that is down does not keep the robot closed). Returns the failures by device name
        (empty: everything is open)."""
        failed: dict[str, BaseException] = {}
        for name, is_open, opener in ((P.DEVICE_ROBOT, self.robot is not None, self._open_idle_robot),
                                      (P.DEVICE_TRACKER, self.tracker is not None, self._open_tracker),
                                      (P.DEVICE_CAMERA, self.camera is not None, self._open_camera)):
            if is_open or name not in self.status:  # no [camera]: no camera to open
                continue
            try:
                opener()
            except DeviceOpenError as exc:
                failed[name] = exc.cause
        self._make_engine()
        return failed

    def begin_job(self) -> None:
        """A job starts: the consistency checks' baselines start over, the robot's identity
        from the robot already open (else from the job's first open)."""
        robot = self.robot
        self.session.new_job(_robot_key(robot, robot_identity(robot)) if robot is not None else None)

    def end_job(self) -> None:
        self.session.end_job()

    def _make_engine(self) -> None:
        """The engine of the open devices; kept while they stay the same (it remembers an
        aborted measurement still in flight)."""
        if self.monitor is None:
            self.engine = None
        elif self.engine is None or self.engine.monitor is not self.monitor or self.engine.tracker is not self.tracker:
            self.engine = cap.CaptureEngine(self.monitor, self.tracker, self.cfg, session=self.session,
                                            camera=self.camera_capture)
        else:
            self.engine.camera = self.camera_capture  # opened (or closed) since the engine was made

    def connect_idle(self, stop: threading.Event) -> None:
        """While idle, keep the devices open: connect at start and retry with backoff
        (``fault_retry_min_s`` .. ``fault_retry_max_s``), so the heartbeat says what is
        connected and a run's record names its devices from its start. Idle devices that
        are down are not a FAULT (nothing waits for them); a job that needs them is. Each
        distinct failure is said once, not at every retry."""
        if stop.is_set() or self.all_open or time.monotonic() < self._idle_next_try:
            return
        failed = self.open_available()
        if not failed:
            self._idle_backoff.reset()
            self._idle_failures.clear()
            log.info("devices connected: %s", "; ".join(
                f"{name} {d.get('identity_text') or '?'}" for name, d in self.status.items()))
            return
        delay = self._idle_backoff.next_delay()
        self._idle_next_try = time.monotonic() + delay
        for name, exc in failed.items():
            text = f"{type(exc).__name__}: {exc}"
            if self._idle_failures.get(name) != text:
                log.warning("%s (%s) not connected: %s; retrying with backoff (next in %.1f s)",
                            name, self.status[name]["url"], text, delay)
                self._idle_failures[name] = text

    @property
    def all_open(self) -> bool:
        camera_ok = self.camera is not None or P.DEVICE_CAMERA not in self.status
        return self.robot is not None and self.tracker is not None and camera_ok

    def _open_idle_robot(self) -> None:
        self._open_robot(in_use=False)  # nobody waits for its samples: its monitor starts asleep

    def _open_robot(self, in_use: bool = True) -> None:
        try:
            options = dict(self.cfg.robot.options)
            if self.model_override is not None:
                options["model"] = self.model_override
            robot = connect_robot(self.cfg.robot.url, **options)
        except OPEN_ERRORS as exc:
            raise DeviceOpenError(P.DEVICE_ROBOT, exc) from exc
        try:
            robot.open()
            monitor = cap.RobotMonitor(robot, cap.settle_config(self.cfg.robot.settle), session=self.session,
                                       in_use=in_use).start()
        except BaseException as exc:
            robot.close()
            if isinstance(exc, OPEN_ERRORS):
                raise DeviceOpenError(P.DEVICE_ROBOT, exc) from exc
            raise
        ident = robot_identity(robot)
        changed = self.session.check_robot(_robot_key(robot, ident))
        if changed is not None:
            # Another robot, or the same one without its factory table (its primary interface
            # still down): not this job's; the service retries with backoff.
            monitor.close()
            robot.close()
            raise DeviceOpenError(P.DEVICE_ROBOT, DeviceError(changed, cap.ROBOT_CHANGED))
        self.robot, self.monitor = robot, monitor
        text = f"{ident['driver']} {ident['model']}" + (f" serial {ident['serial']}" if ident.get("serial") else "")
        self.status[P.DEVICE_ROBOT].update({"connected": True, "identity": ident, "identity_text": text})

    def _open_tracker(self) -> None:
        try:
            tracker = connect_configured_tracker(self.cfg.tracker.url, self.cfg.tracker.options)
        except OPEN_ERRORS as exc:
            raise DeviceOpenError(P.DEVICE_TRACKER, exc) from exc
        try:
            tracker.open()
            info = tracker.identify()
        except BaseException as exc:
            tracker.close()
            if isinstance(exc, OPEN_ERRORS):
                raise DeviceOpenError(P.DEVICE_TRACKER, exc) from exc
            raise
        self.tracker = tracker
        self.status[P.DEVICE_TRACKER].update({"connected": True, "identity": {
            "model": info.model, "serial": info.serial, "firmware": info.firmware,
            "protocol": str(info.protocol_version),
        }, "identity_text": f"{info.model} {info.serial} fw {info.firmware}"})

    def _open_camera(self) -> None:
        cc = self.cfg.camera
        if cc is None:
            raise DeviceOpenError(P.DEVICE_CAMERA, DeviceError("this cell has no camera ([camera] is not configured)"))
        try:
            camera = connect_camera(cc.url, **cc.options)
        except OPEN_ERRORS as exc:
            raise DeviceOpenError(P.DEVICE_CAMERA, exc) from exc
        try:
            camera.open()
            capture = CameraCapture(camera, self.cfg)  # identified, its settings applied, its detector built
        except BaseException as exc:
            camera.close()
            if isinstance(exc, OPEN_ERRORS):
                raise DeviceOpenError(P.DEVICE_CAMERA, exc) from exc
            raise
        self.camera, self.camera_capture = camera, capture
        ident = camera_identity(capture.info)
        self.status[P.DEVICE_CAMERA].update({"connected": True, "identity": ident, "identity_text": (
            f"{capture.info.vendor} {capture.info.model} serial {capture.info.serial}".strip())})

    def close(self) -> None:
        """Close everything (idempotent; a device that fails to close is logged, not raised)."""
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None
        with self._stop_lock:
            devices = ((P.DEVICE_ROBOT, self.robot), (P.DEVICE_TRACKER, self.tracker), (P.DEVICE_CAMERA, self.camera))
            self.robot, self.tracker, self.camera, self.camera_capture = None, None, None, None
        for name, dev in devices:
            if dev is not None:
                try:
                    dev.close()
                except Exception:  # noqa: BLE001 - closing a broken device must not raise
                    log.warning("closing the %s failed", name, exc_info=True)
        for d in self.status.values():
            d["connected"] = False
        self.engine = None

    def stop_robot(self) -> bool:
        """Stop the robot now (an abort; any thread). False when no robot is open or it refused."""
        with self._stop_lock:
            robot = self.robot
            if robot is None:
                return False
            try:
                robot.stop()
            except Exception:  # noqa: BLE001 - an abort stands even if the stop command fails
                log.warning("stopping the robot after an abort failed", exc_info=True)
                return False
        return True
