"""The one exception tree every cellcal package shares, documented here in full.

The root lives in the solver (the lowest floor), so drivers, sim and daemon all derive from
it without importing upwards; each branch is defined in the module named beside it. Catch
``CellcalError`` for "anything cellcal raised on purpose"; a builtin in parentheses is a
second base, so callers that catch it keep working (every timeout is also a
``TimeoutError``; bad input that is the caller's mistake is also a ``ValueError``).

::

    CellcalError
    +-- CalibrationError                 cellcal.solver.errors: the data cannot determine
    |   |                                the calibration asked for (ADR 0002)
    |   +-- NotEnoughSamples             fewer stations than the problem needs
    |   +-- DegenerateGeometry           the motions leave degrees of freedom undetermined
    |   |                                (parallel rotation axes, no rotation, collinear points)
    |   +-- PriorMismatch                the answer is far from the one the cell drawing gives
    |   |                                (``expected_cell_T_base``; ADR 0014)
    |   +-- UnreachableStations (ValueError)  robot poses the arm cannot reach (``max_reach_m``:
    |   |                                swapped arguments or millimetres; ADR 0014)
    |   +-- ImplausibleGeometry          the fit puts the target metres from the flange
    |   |                                (``max_target_offset_m``: inverted inputs; ADR 0014)
    |   +-- InsufficientTilt             intrinsics: the target views are (nearly) parallel to
    |   |                                the image or all tilted about one axis (ADR 0022)
    |   +-- InsufficientCoverage         intrinsics: the corners cover too little of the image
    |   |                                to determine the distortion (ADR 0022)
    |   +-- PlanRefused                  daemon.runs.base: a run's plan cannot determine its
    |                                    kind (no pivot motion ...): refused before the first move
    +-- TargetFileError (ValueError)     a calibration-target file that cannot be read (the key
    |                                    named: ``target.square_mm``; ADR 0021)
    +-- DriverError                      cellcal.drivers.errors: talking to a device failed
    |   +-- DriverInitError              the device could not be opened, identified, configured
    |   |   +-- RecipeFieldNotFound      drivers.ur_rtde: the controller lacks an RTDE field
    |   +-- DriverTimeoutError (TimeoutError)   no (complete) answer in time
    |   |   +-- TrackerTimeoutError      drivers.tracker
    |   |   +-- CameraTimeoutError       drivers.camera: no (complete) frame or GVCP answer in time
    |   +-- ProtocolError                bytes that do not form a valid message
    |   |   +-- TrackerProtocolError     drivers.tracker_codec: one bad frame, with its fault
    |   |   +-- TpiProtocolError         drivers.emscon_codec: one bad emScon packet or skipped run
    |   |   +-- GeocomProtocolError      drivers.geocom_codec: one bad GeoCOM line
    |   |   +-- GigeProtocolError        drivers.gige_codec: one bad GVCP or GVSP packet
    |   +-- DeviceGoneError              the link dropped (port closed, socket reset, bus silent)
    |   |   +-- TrackerGoneError         drivers.tracker
    |   |   +-- HeartbeatLost            drivers.canopen402: a drive stopped beating
    |   |   +-- NodeRebooted             drivers.canopen402: a drive rebooted after set-up
    |   |   +-- CanLinkLost              drivers.can_link: the CAN adapter's port failed, or
    |   |                                SYNC could not be sent ``sync_fail_limit`` times in a row
    |   +-- DeviceError                  the device answered with an error; ``code`` names it
    |   |   +-- ProtectiveStop           drivers.robot: safety stop, needs an operator
    |   |   +-- SdoAbortError            drivers.canopen402: SDO abort, ``abort_code``
    |   |   +-- MoveVerificationError    drivers.cia402_motion: a drive's account of a move
    |   |   |   |                        disagrees with its actual position (node, joint)
    |   |   |   +-- TargetMismatch       target reached reported outside the position window
    |   |   |   +-- JointNotMoving       a commanded joint whose actual position stays
    |   |   +-- DriveFaultDuringMove     drivers.cia402_motion: FAULT in a statusword during a
    |   |   |                            move (node, 0x603F, EMCY)
    |   |   +-- TrackerDeviceError       drivers.tracker: a NAK, ``code`` the protocol's
    |   |       +-- NoTargetError, BeamBrokenError, NotStableError, NotWarmedUpError,
    |   |           OutOfRangeError, TrackerBusyError, MeasurementAbortedError,
    |   |           RequestRejectedError, NotInitializedError,
    |   |           ImplausibleMeasurementError (a value no instrument can report: ``field``)
    |   |           (NoStationaryResultError is a NotStableError: emScon's stationary fail)
    |   |   +-- CameraDeviceError        drivers.camera: a GVCP refusal, ``code`` its status
    |   +-- FeatureUnavailableError      drivers.camera: no such feature, or it cannot change
    |   +-- GenicamError                 drivers.genicam: the node map cannot be read
    |   |   +-- FeatureNotFoundError (KeyError)  no feature of that name
    |   |   +-- FeatureUnsupportedError  a node this reader does not interpret (named)
    |   |   +-- FeatureAccessError       writing a read-only or reading a write-only feature
    |   +-- RecordingExhausted           drivers.camera_dir: every recorded frame replayed
    |   +-- ClockNotReady (RuntimeError) drivers.clock: a clock mapping asked of a model
    |                                    that has no sample yet
    +-- UnreachablePose (ValueError)     drivers.kinematics: no joint vector reaches the pose
    +-- OpenCVUnavailable (ImportError)  drivers.detect: OpenCV (``cv2``) missing or without the
    |                                    ChArUco detector (the pip line named; ADR 0021)
    +-- SimError                         cellcal.sim.errors: the simulator
    |   +-- ScenarioError (ValueError)   sim.scenario: a scenario file is invalid (dotted path)
    |   +-- SimRefused                   sim.robot_sim: the simulated controller said no
    +-- ConfigError (ValueError)         cellcal.daemon.config: invalid configuration (dotted path)
    |   +-- SecurityError                daemon.wire.security: ``[zmq]`` would expose the daemon
    |                                    (a network endpoint without CURVE, bad keys)
    +-- StationFileError (ValueError)    daemon.cli.stations_io: a station file that cannot be read
    +-- DatasetError (ValueError)        daemon.cli.dataset: a camera dataset folder that cannot
    |                                    be read or written (file, line and column named)
    +-- OutputRefused                    daemon.cli.output: ``-o`` would overwrite a file or
    |                                    write through a symlink (``--force`` overrides)
    +-- PlanError (ValueError)           daemon.runs.plan: no station plan from the settings given
    +-- UsageError                       daemon.cli.ctl: bad command line (exit status 2)
    +-- NotCommandable                   daemon.cli.check_config: ``--probe`` found a robot
    |                                    that cannot be moved now (mode, enable, dashboard)
    +-- ServiceError                     daemon.service: a request the service cannot honour
    |                                    now (``code``: its E_* code)
    +-- StateDirLocked                   daemon.store.lock: another daemon holds the state
    |                                    directory's lock file (its pid named)
    +-- ActivationRefused                daemon.jobs.results: a result that failed its gates
    |                                    cannot be activated
    +-- Abort                            daemon.jobs.control: the current job was aborted or the
    |                                    service stops (control flow inside the worker only)
    +-- GiveUp                           daemon.jobs.control: a fault outlasted resume_within_s
    |                                    (control flow inside the worker only)
    +-- StationRejected                  daemon.consistency: a station not accepted (``reason``)
    +-- DeviceFault                      daemon.consistency: a device link failed (``device``)
    +-- DeviceOpenError                  daemon.devices: a device could not be opened
    |                                    (``device`` names which one)
    +-- StoreError                       daemon.store: the SQLite store
    |   +-- StoreFullError, StoreReadOnlyError, StoreCorruptError, DuplicateStation,
    |       UnknownRecord (LookupError), RunClosed
    +-- CommandError                     daemon.wire.commands: a command failed, ``code`` is its
    |   |                                E_* error code on the wire
    |   +-- BadRequest                   a malformed request (E_BAD_REQUEST)
    +-- ClientError                      daemon.wire.client: the ZeroMQ client
    |   +-- CommandFailed                the daemon answered ``ok: false`` (``code``)
    |   +-- ClientTimeout (TimeoutError) no reply in time
    +-- BindError (OSError)              daemon.wire.security: an endpoint could not be bound
    +-- HarnessError (AssertionError)    cellcal.testing.harness: the simulated test cell misbehaved
        +-- SoakError                    the daemon broke a promise during the kill -9 soak

Errors from a dependency (pyserial, python-can, canopen, pyzmq, sqlite3) are re-raised as
the matching cellcal error ``from`` the original, so the cause stays in the traceback.

Bad arguments (wrong shapes, NaN, non-orthonormal rotations) raise the builtin
``ValueError`` naming the argument and station: they are the caller's bug, not a property
of the cell.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "CellcalError",
    "CalibrationError",
    "NotEnoughSamples",
    "DegenerateGeometry",
    "PriorMismatch",
    "UnreachableStations",
    "InsufficientTilt",
    "InsufficientCoverage",
    "TargetFileError",
    "ImplausibleGeometry",
]


class CellcalError(Exception):
    """Root of every error cellcal raises on purpose."""


class CalibrationError(CellcalError):
    """The data cannot determine the calibration asked for."""


class NotEnoughSamples(CalibrationError):
    """Fewer stations than the calibration needs.

    Attributes
    ----------
    n_given : int
        Stations supplied.
    n_required : int
        Minimum stations the problem needs.
    """

    def __init__(self, n_given: int, n_required: int, problem: str, *,
                 hint: str = "two motions with non-parallel rotation axes") -> None:
        self.n_given = int(n_given)
        self.n_required = int(n_required)
        self.problem = problem
        super().__init__(f"{problem}: {self.n_given} station(s) given, at least {self.n_required} needed ({hint})")


class DegenerateGeometry(CalibrationError):
    """The station motions leave some degrees of freedom undetermined.

    Attributes
    ----------
    axis : numpy.ndarray, shape (3,)
        Unit vector of the weakest (or common) rotation axis, expressed in ``frame``.
    frame : str
        Frame ``axis`` is expressed in (``"cell"`` for the base frame, ``"flange"`` for
        hand-eye and tool point).
    axis_spread : float
        The observability figure (0 for parallel axes, 1 for an isotropic spread).
    unrecoverable : tuple of str
        What cannot be recovered, in words (e.g. ``"rotation about axis"``).
    max_rotation_rad : float
        Largest relative rotation among the motions used.
    parameters : tuple of str
        Kinematic identification: the parameters the stations cannot determine, by name
        (``joint5.zero_offset``); empty for the frame solves.
    """

    def __init__(
        self,
        message: str,
        *,
        axis: np.ndarray,
        frame: str,
        axis_spread: float,
        unrecoverable: tuple[str, ...],
        max_rotation_rad: float,
        parameters: tuple[str, ...] = (),
    ) -> None:
        self.parameters = tuple(parameters)
        self.axis = np.array(axis, dtype=float)
        self.frame = frame
        self.axis_spread = float(axis_spread)
        self.unrecoverable = tuple(unrecoverable)
        self.max_rotation_rad = float(max_rotation_rad)
        super().__init__(message)


class PriorMismatch(CalibrationError):
    """The answer differs from the expected one by more than the tolerance given.

    Robot and tracker inputs that are swapped, or both inverted, fit *exactly* (the model
    is symmetric under those changes, ADR 0014), so only a prior such as the cell drawing's
    ``cell_T_base`` can catch them.

    Attributes
    ----------
    translation_m : float
        Distance between the answer's and the expected translation, metres.
    rotation_rad : float
        Angle of ``R_expected^T R_answer``, radians.
    tolerance_m, tolerance_rad : float
        The tolerances that were exceeded (either or both).
    name : str
        The transform compared (``"cell_T_base"``, ``"flange_T_camera"``, ...).
    """

    def __init__(self, message: str, *, translation_m: float, rotation_rad: float,
                 tolerance_m: float, tolerance_rad: float, name: str) -> None:
        self.translation_m = float(translation_m)
        self.rotation_rad = float(rotation_rad)
        self.tolerance_m = float(tolerance_m)
        self.tolerance_rad = float(tolerance_rad)
        self.name = name
        super().__init__(message)


class UnreachableStations(CalibrationError, ValueError):
    """Robot poses farther from the base than the arm reaches (``max_reach_m``).

    Also a ``ValueError``: such poses are not a robot's, so the input is wrong (typically
    the robot and tracker arrays swapped, or poses in millimetres).

    Attributes
    ----------
    stations : tuple of int
        The offending station indices (all of them).
    distances_m : tuple of float
        Their flange distances from the base origin, metres.
    max_reach_m : float
        The reach they were checked against.
    """

    def __init__(self, message: str, *, stations: tuple[int, ...], distances_m: tuple[float, ...],
                 max_reach_m: float) -> None:
        self.stations = tuple(int(i) for i in stations)
        self.distances_m = tuple(float(d) for d in distances_m)
        self.max_reach_m = float(max_reach_m)
        super().__init__(message)


class ImplausibleGeometry(CalibrationError):
    """The fit puts something where no cell has it: the flange-mounted target (or camera,
    reflector, tool tip) farther from the flange than ``max_target_offset_m``, or a pivot
    farther from the base than the arm reaches.

    Inverted inputs (``flange_T_base`` and ``target_T_cell`` given for ``base_T_flange`` and
    ``cell_T_target``) and swapped ones fit *exactly* (ADR 0014): the "target" the fit finds
    is then the cell's origin seen from the base, metres from the flange.

    Attributes
    ----------
    name : str
        The estimate that is implausible (``"flange_T_target"``, ``"flange_p_tip"`` ...).
    distance_m : float
        Its distance (from the flange, or for a pivot from the base), metres.
    limit_m : float
        The limit it exceeds.
    """

    def __init__(self, message: str, *, name: str, distance_m: float, limit_m: float) -> None:
        self.name = name
        self.distance_m = float(distance_m)
        self.limit_m = float(limit_m)
        super().__init__(message)


class InsufficientTilt(CalibrationError):
    """Intrinsics: the views do not tilt the target enough, about every image axis.

    A fronto-parallel target cannot separate the focal length from the target's distance,
    and views all tilted about one axis leave the focal length along the other axis (and the
    aspect ratio) to the noise (ADR 0022).

    Attributes
    ----------
    tilt_deg : float
        The figure refused: RMS over the views of the target normal's tilt component along
        ``axis`` (degrees).
    required_deg : float
        The least accepted (``min_tilt_deg``).
    axis : numpy.ndarray, shape (2,)
        Image-plane unit direction (x right, y down) of the weakest tilt.
    view_tilt_deg : tuple of float
        Each view's tilt: the angle between the target normal and the optical axis.
    """

    def __init__(self, message: str, *, tilt_deg: float, required_deg: float, axis: np.ndarray,
                 view_tilt_deg: tuple[float, ...]) -> None:
        self.tilt_deg = float(tilt_deg)
        self.required_deg = float(required_deg)
        self.axis = np.array(axis, dtype=float)
        self.view_tilt_deg = tuple(float(t) for t in view_tilt_deg)
        super().__init__(message)


class InsufficientCoverage(CalibrationError):
    """Intrinsics: the detected corners cover too little of the image.

    Distortion is a polynomial in the radius: fitted on corners near the centre, it is
    extrapolated everywhere else (ADR 0022).

    Attributes
    ----------
    coverage : float
        Fraction of the cells of a ``grid`` over the image holding at least one corner.
    required : float
        The least accepted (``min_coverage``).
    grid : tuple of int
        ``(columns, rows)`` of the grid.
    """

    def __init__(self, message: str, *, coverage: float, required: float, grid: tuple[int, int]) -> None:
        self.coverage = float(coverage)
        self.required = float(required)
        self.grid = (int(grid[0]), int(grid[1]))
        super().__init__(message)


class TargetFileError(CellcalError, ValueError):
    """A calibration-target file (or ``[target]`` table) that cannot be used.

    The message starts with the dotted key at fault (``target.marker_mm: must be below
    target.square_mm``), as every configuration error does.

    Attributes
    ----------
    key : str
        The dotted key (``""`` for the file as a whole).
    """

    def __init__(self, message: str, *, key: str = "") -> None:
        self.key = key
        super().__init__(message)
