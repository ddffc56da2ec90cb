"""The run-kind protocol: everything the service asks of one kind of calibration run.

The service (``cellcal.daemon.service``) is a state machine with a job queue; what a run
*does* is its kind's: which stations it plans, how a station is captured and judged, how the
stations are solved, which gates the result must pass, what the store keeps of it, what the
report, ``cellcal show`` and the exports say about it, and what may stop an interrupted run
from resuming. A kind is one module in ``cellcal.daemon.runs`` with one :class:`RunKind`
subclass, registered by name in ``cellcal.daemon.runs`` (ADR 0018). The service, the worker's
jobs (``cellcal.daemon.jobs``), the report and the command line never branch on a kind's
name: they call these methods.

The methods, in the order of a run:

* :meth:`RunKind.refuse_start` (a run that cannot start in this cell, e.g. a camera kind
  without a camera), :meth:`RunKind.plan` (the stations and what else the run stores with
  its plan), :meth:`RunKind.check_plan` (refuse, before the first move, a plan that cannot
  determine the calibration whatever it measures);
* :meth:`RunKind.capture` (one station: the capture policy and what the station records),
  :meth:`RunKind.estimate` (the run's rough current fit a new station must agree with: the
  gross-error test), :meth:`RunKind.screen` (the robust test of a captured station against
  the run's consensus: stations dropped, the new one rejected), :meth:`RunKind.visit` (the
  stations to visit, to a target or as planned);
* :meth:`RunKind.solve` (may raise ``DegenerateGeometry``), :meth:`RunKind.extra_station`
  (the station that fixes a degenerate direction, measured instead of failing),
  :meth:`RunKind.solve_given` (stations a client supplied);
* :meth:`RunKind.finish` (gates and the stored record; it may measure more, as the
  kinematics run's ISO 9283 pose test does, through :class:`Measure`);
* :meth:`RunKind.resume_refusal` (why an interrupted run of this kind must not resume);
* the outputs, pure functions of a stored result: :meth:`RunKind.show_lines`,
  :meth:`RunKind.report_sections`, :meth:`RunKind.write_exports`, :meth:`RunKind.drift_station`,
  :meth:`RunKind.fit_stations`, :meth:`RunKind.stations_refusal`.

Every method but :meth:`plan`, :meth:`capture`, :meth:`solve` and :meth:`finish` has a
default that suits a kind with nothing to say there.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.camera_capture import MovingFrame
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.config import Config, Export
from cellcal.daemon.consensus import Screened
from cellcal.daemon.gates import GateReport
from cellcal.daemon.runs.plan import PlannedStation, plan_from_dict
from cellcal.daemon.store import RunRecord, StationRecord, Store
from cellcal.drivers.kinematics import DHModel
from cellcal.solver import CalibrationError, CalibrationResult, DegenerateGeometry, IntrinsicsResult, KinematicResult
from cellcal.solver.errors import CellcalError

log = logging.getLogger(__name__)

__all__ = ["RunKind", "RunContext", "PlanRefused", "planned_poses", "Screened", "Finished", "Measure", "ReportParts",
           "SolverResult", "ResultBody", "as_calibration", "as_kinematic", "as_intrinsics"]

#: A solver result (``cellcal.solver.CalibrationResult``, ``KinematicResult`` or
#: ``IntrinsicsResult``): what :meth:`RunKind.solve` returns and :meth:`RunKind.finish` turns
#: into the stored record.
SolverResult: TypeAlias = CalibrationResult | KinematicResult | IntrinsicsResult
#: The stored record of a result (``ResultRecord.result``) and the wire body built from it: a
#: JSON object whose shape ``protocol.ResultBody`` checks, read here as what it is to a reader
#: (a map of JSON values, narrowed where they are used).
ResultBody: TypeAlias = Mapping[str, object]


def as_calibration(result: SolverResult) -> CalibrationResult:
    """The ``CalibrationResult`` that a ``calibrate_*`` kind's own :meth:`RunKind.solve` (or
    :meth:`RunKind.solve_given`) returned, handed back to its :meth:`RunKind.finish`."""
    if not isinstance(result, CalibrationResult):
        raise TypeError(f"a calibration result was expected, got {type(result).__name__}")
    return result


def as_kinematic(result: SolverResult) -> KinematicResult:
    """The ``KinematicResult`` that the kinematics kind's :meth:`RunKind.solve` returned."""
    if not isinstance(result, KinematicResult):
        raise TypeError(f"a kinematic result was expected, got {type(result).__name__}")
    return result


def as_intrinsics(result: SolverResult) -> IntrinsicsResult:
    """The ``IntrinsicsResult`` that the intrinsics kind's :meth:`RunKind.solve` returned."""
    if not isinstance(result, IntrinsicsResult):
        raise TypeError(f"an intrinsics result was expected, got {type(result).__name__}")
    return result


class Measure(Protocol):
    """Measure one more station for a kind's :meth:`RunKind.finish` (the ISO 9283 pose test):
    move to ``planned``, capture it as the run's stations are captured, store it with the run
    with ``raw`` merged into its ``raw`` dict (the kind's tag), and return it; ``what`` names
    the measurement in the service's state detail. Raises ``StationRejected`` after the
    configured attempts, ``DeviceFault`` when the job must end; an abort propagates."""

    def __call__(self, planned: PlannedStation, raw: P.JsonObject, what: str, /) -> StationRecord: ...

    def sweep(self, start: PlannedStation, path: Sequence[npt.NDArray[np.float64]], speed: float, what: str, /
              ) -> list[MovingFrame]:
        """Move (at ``[capture] move_speed``) to ``start``, then through each pose of ``path``
        at ``speed`` (a fraction of the robot's nominal speed), the camera taking frames on
        the way (``camera_capture.MovingFrame``: the target's corners, the flange pose and
        velocity at mid-exposure); nothing is stored. Raises ``StationRejected`` (a move
        that failed) and ``DeviceFault``; an abort propagates."""
        ...


@dataclass
class RunContext:
    """What a run kind may use of the daemon: the configuration, the store, the robot's
    kinematic model and the motion mode. The kind never touches the devices or the state
    machine; the jobs do (``cellcal.daemon.jobs``)."""

    cfg: Config
    store: Store
    model_fn: Callable[[], DHModel]
    motion_mode: P.MotionMode
    abort: threading.Event = field(default_factory=threading.Event)

    @property
    def model(self) -> DHModel:
        """The robot's kinematics now (the open driver's, else the configured model)."""
        return self.model_fn()

    def model_or_none(self) -> DHModel | None:
        """The robot's kinematics, or None when they cannot be had (a gate that needs them
        then says it does not apply instead of failing the run)."""
        try:
            return self.model_fn()
        except (CellcalError, ValueError, KeyError, AttributeError) as exc:
            log.warning("no robot model: %s", exc)
            return None

    @property
    def commands_robot(self) -> bool:
        """Whether the daemon moves the robot (``command`` mode)."""
        return self.motion_mode == P.MOTION_COMMAND


@dataclass(frozen=True)
class Finished:
    """What :meth:`RunKind.finish` gives the service to store: the gate report and the
    record (``ResultRecord.result``: the result's wire form, its gates and check stations)."""

    report: GateReport
    record: P.JsonObject


@dataclass(frozen=True)
class ReportParts:
    """A kind's part of the HTML report (``cellcal.daemon.report.html``): its sections (HTML
    ``<section>`` elements) placed after the summary, and the stations the report's residual
    figures draw when they are not the run's as measured (a kinematics result's, through the
    arm it identified; None: the run's)."""

    after_summary: str = ""
    stations: Sequence[StationRecord | Mapping[str, object]] | None = None


class PlanRefused(CalibrationError):
    """A run's plan cannot determine its kind whatever the stations measure (a tool point
    whose planned poses hold no point fixed, ...): refused before the first move
    (:meth:`RunKind.check_plan`), the message naming why."""


def planned_poses(ctx: RunContext, run: RunRecord) -> npt.NDArray[np.float64] | None:
    """The flange poses ``base_T_flange`` (N, 4, 4), m, the daemon will move the robot to for
    ``run``'s plan (a station's pose, else forward kinematics of its joints), or None when
    it moves nothing (observe mode, a run of given stations) or a station has neither."""
    if not ctx.commands_robot or "stations" not in run.plan:
        return None
    poses = []
    for i, ps in enumerate(plan_from_dict(run.plan)):
        if ps.base_T_flange is not None:
            poses.append(np.asarray(ps.base_T_flange, dtype=float))
        elif ps.q_rad is not None:
            model = ctx.model_or_none()
            if model is None:
                return None
            try:
                poses.append(np.asarray(model.forward(ps.q_rad), dtype=float))
            except ValueError as exc:
                # A plan written for another arm (12 joints for a 6-joint robot): the
                # robot would refuse the first move; say so before any move, naming where.
                raise PlanRefused(f"plan station {i}: {exc}") from None
        else:
            return None
    return np.array(poses).reshape(-1, 4, 4) if poses else None


class RunKind(abc.ABC):
    """One kind of calibration run (module docstring). Subclasses set :attr:`name` and
    implement :meth:`plan`, :meth:`capture`, :meth:`solve` and :meth:`finish`."""

    #: The wire name (``protocol.RunKind``): ``start_run kind=...``, results' ``kind``.
    name: ClassVar[P.RunKind]
    #: Whether its stations need the tracker (a tool-point run measures the robot alone).
    needs_tracker: ClassVar[bool] = True
    #: Whether its stations need the camera (``[camera]``, ADR 0030): the jobs open it with
    #: the robot, and the engine's ``capture_camera`` takes its stations.
    needs_camera: ClassVar[bool] = False

    def wants_tracker(self, cfg: Config) -> bool:
        """Whether its stations use the tracker when it can be opened, without needing it
        (an eye-to-hand run's tracker check): the jobs try to open it, and reopen it after
        a fault, but go on without it. False by default."""
        return False

    # ---- starting ----------------------------------------------------------------------------
    def refuse_start(self, ctx: RunContext) -> str | None:
        """Why a run of this kind cannot be started in this cell without given stations
        (``E_STATE`` with this sentence), or None."""
        return None

    @abc.abstractmethod
    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        """The plan a new run stores (``plan.plan_to_dict`` of its stations, plus what else
        the kind keeps with it): ``stations`` when a client named them, else the kind's own.
        Raises ``PlanError`` when no plan can be made."""

    def check_plan(self, ctx: RunContext, run: RunRecord) -> None:
        """Refuse, before the first station, a plan that cannot determine this kind whatever
        it measures: raise ``CalibrationError`` naming why (the run fails with it)."""
        return None

    # ---- capturing ---------------------------------------------------------------------------
    @abc.abstractmethod
    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        """One station at ``planned`` (the robot already moved there in command mode): wait
        for rest, measure, judge; return the record the store commits. Raises
        ``StationRejected`` (named reason) or ``DeviceFault``."""

    def estimate(self, ctx: RunContext, records: Sequence[StationRecord]) -> Expected | None:
        """The run's rough current fit the next station must agree with (None: none yet)."""
        return None

    def screen(self, ctx: RunContext, records: Sequence[StationRecord], new: StationRecord) -> Screened | None:
        """The robust gross-error test of a captured station ``new`` with the run's accepted
        ``records`` (``cellcal.daemon.consensus``, ADR 0032): the accepted stations to drop
        and the new one's rejection, or None (nothing judged: the default, and before the
        run has a consensus)."""
        return None

    def visit(self, ctx: RunContext, todo: list[PlannedStation], records: list[StationRecord]) -> Iterator[PlannedStation]:
        """The stations to visit after ``records``: by default the plan's ``todo`` as it is."""
        yield from todo

    def planned_count(self, ctx: RunContext, n_plan: int) -> int:
        """How many stations the run announces (``planned`` of its station events)."""
        return n_plan

    # ---- solving -------------------------------------------------------------------------------
    @abc.abstractmethod
    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> SolverResult:
        """The calibration of a run's stored stations. Raises ``CalibrationError``
        (``DegenerateGeometry``: :meth:`extra_station` may add a station) or ``ValueError``."""

    def extra_station(self, ctx: RunContext, stations: Sequence[StationRecord],
                      exc: DegenerateGeometry) -> PlannedStation | None:
        """A station that fixes the direction ``exc`` names, measured instead of failing (in
        command mode, up to ``[plan] max_extra_stations``); None: the run fails."""
        return None

    def solve_given(self, ctx: RunContext, given: Sequence[Mapping[str, object]]) -> SolverResult:
        """The calibration of stations a client supplied (``start_run stations=...``)."""
        raise CalibrationError(f"a {self.name} run cannot be solved from given stations")

    @abc.abstractmethod
    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        """Gate ``result`` and build its stored record. ``stations`` are the run's (empty
        for given stations: ``run.plan["given"]`` has them); ``measure``: more stations, or
        None when the daemon cannot measure (given stations)."""

    # ---- resuming ------------------------------------------------------------------------------
    def resume_refusal(self, ctx: RunContext, run: RunRecord) -> str | None:
        """Why an interrupted run of this kind must be closed instead of resumed (beyond the
        rules every run has, ADR 0012), or None."""
        return None

    # ---- outputs (pure: a stored result) ---------------------------------------------------------
    def show_lines(self, body: ResultBody) -> list[str]:
        """Lines ``cellcal show`` prints for this kind after the common ones."""
        return []

    def warnings(self, body: ResultBody) -> list[Mapping[str, object]]:
        """Every warning a stored result carries (``{"code", "message", "value"}``): what
        ``cellcal show`` and the report list. By default the result's ``warnings``."""
        listed = body.get("warnings") or []
        return [w for w in listed if isinstance(w, Mapping)] if isinstance(listed, (list, tuple)) else []

    def report_sections(self, body: ResultBody, stations: Sequence[StationRecord] | None) -> ReportParts:
        """This kind's HTML report sections (module docstring of ``report_html``)."""
        return ReportParts()

    def fit_stations(self, stations: Sequence[StationRecord]) -> list[StationRecord]:
        """The run's stations that its fit used: what the report draws, the drift check
        stations are chosen from and ``cellcal stations`` writes (by default all)."""
        return list(stations)

    def write_exports(self, directory: Path, result_id: int, body: ResultBody, export: Export) -> dict[str, Path]:
        """The kind's own export files beside the common ones (name -> path)."""
        return {}

    def drift_station(self, body: ResultBody, station: StationRecord) -> StationRecord:
        """A drift check station as this result predicts it (by default as measured)."""
        return station

    def stations_refusal(self, run: RunRecord) -> str | None:
        """Why ``cellcal stations`` cannot write this run's stations for ``cellcal solve``."""
        return None
