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
    |                                    (``max_target_offset_m``: inverted inputs; ADR 0014)
    +-- DriverError                      cellcal.drivers.errors: talking to a device failed
    |   +-- DriverInitError              the device could not be opened, identified, configured
    |   |   +-- RecipeFieldNotFound      drivers.ur_rtde: the controller lacks an RTDE field
    |   +-- DriverTimeoutError (TimeoutError)   no (complete) answer in time
    |   |   +-- TrackerTimeoutError      drivers.tracker
    |   +-- ProtocolError                bytes that do not form a valid message
    |   |   +-- TrackerProtocolError     drivers.tracker_codec: one bad frame, with its fault
    |   |   +-- TpiProtocolError         drivers.emscon_codec: one bad emScon packet or skipped run
    |   |   +-- GeocomProtocolError      drivers.geocom_codec: one bad GeoCOM line
    |   +-- DeviceGoneError              the link dropped (port closed, socket reset, bus silent)
    |   |   +-- TrackerGoneError         drivers.tracker
    |   |   +-- HeartbeatLost            drivers.canopen402: a drive stopped beating
    |   |   +-- NodeRebooted             drivers.canopen402: a drive rebooted after set-up
    |   +-- DeviceError                  the device answered with an error; ``code`` names it
    |   |   +-- ProtectiveStop           drivers.robot: safety stop, needs an operator
    |   |   +-- SdoAbortError            drivers.canopen402: SDO abort, ``abort_code``
    |   |   +-- TrackerDeviceError       drivers.tracker: a NAK, ``code`` the protocol's
    |   |       +-- NoTargetError, BeamBrokenError, NotStableError, NotWarmedUpError,
    |   |           OutOfRangeError, TrackerBusyError, MeasurementAbortedError,
    |   |           RequestRejectedError, NotInitializedError
    |   |           (NoStationaryResultError is a NotStableError: emScon's stationary fail)
    |   +-- ClockNotReady (RuntimeError) drivers.clock: a clock mapping asked of a model
    |                                    that has no sample yet
    +-- UnreachablePose (ValueError)     drivers.kinematics: no joint vector reaches the pose
    +-- SimError                         cellcal.sim.errors: the simulator
    |   +-- ScenarioError (ValueError)   sim.scenario: a scenario file is invalid (dotted path)
    |   +-- SimRefused                   sim.robot_sim: the simulated controller said no
    +-- ConfigError (ValueError)         cellcal.daemon.config: invalid configuration (dotted path)
    |   +-- SecurityError                daemon.zmq_server: ``[zmq]`` would expose the daemon
    |                                    (a network endpoint without CURVE, bad keys)
    +-- StationFileError (ValueError)    daemon.stations_io: a station file that cannot be read
    +-- PlanError (ValueError)           daemon.plan: no station plan from the settings given
    +-- UsageError                       daemon.cmd_ctl: bad command line (exit status 2)
    +-- ServiceError                     daemon.service: a request the service cannot honour
    |                                    now (``code``: its E_* code)
    +-- StateDirLocked                   daemon.service: another daemon holds the state
    |                                    directory's lock file (its pid named)
    +-- StationRejected                  daemon.capture: a station not accepted (``reason``)
    +-- DeviceFault                      daemon.capture: a device link failed (``device``)
    +-- DeviceOpenError                  daemon.devices: a device could not be opened
    |                                    (``device`` names which one)
    +-- StoreError                       daemon.store: the SQLite store
    |   +-- StoreFullError, StoreReadOnlyError, StoreCorruptError, DuplicateStation,
    |       UnknownRecord (LookupError), RunClosed
    +-- CommandError                     daemon.protocol: a command failed, ``code`` is its
    |   |                                E_* error code on the wire
    |   +-- BadRequest                   a malformed request (E_BAD_REQUEST)
    +-- ClientError                      daemon.client: the ZeroMQ client
    |   +-- CommandFailed                the daemon answered ``ok: false`` (``code``)
    |   +-- ClientTimeout (TimeoutError) no reply in time
    +-- BindError (OSError)              daemon.zmq_server: an endpoint could not be bound
    +-- HarnessError (AssertionError)    daemon.harness: the simulated test cell misbehaved
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
