"""The run kinds: one module per kind of calibration run, registered here by name (ADR 0018).

A kind is a :class:`~cellcal.daemon.runs.base.RunKind` subclass in its own module; the
service, the jobs, the report, the exports and the command line ask this registry for the
kind of a run or a result and call its methods, and never branch on a kind's name.

=================  ======================================  ==========================================
name               module                                  what it calibrates
=================  ======================================  ==========================================
``base_frame``     ``base_frame`` (poses), ``points``      ``cell_T_base`` and the target on the flange
                   (3-DoF points, ``[tracker] measure``)
``tool_point``     ``tool_point``                          ``flange_p_tip`` (pivot, robot alone)
``hand_eye``       ``hand_eye`` (+ ``hand_eye_camera``,     ``flange_T_camera``: the cell's camera
                   ``hand_eye_report``,                    (``[camera]``), or given stations
                   ``camera_dynamic``)
``eye_to_hand``    ``eye_to_hand`` (+ ``hand_eye_camera``)  ``base_T_camera`` (``[camera]``)
``kinematics``     ``kinematics`` (+ ``iso9283``,          the arm's DH parameters
                   ``kinematics_report``)
``intrinsics``     ``intrinsics`` (+ ``camera_plan``,      a camera's intrinsics (``[camera]``)
                   ``intrinsics_report``)
=================  ======================================  ==========================================

Adding a kind is one module plus one line in :data:`KINDS` (and its name in
``protocol.RunKind``): kinds are imported lazily, by name, as the drivers' backends are
(``cellcal.drivers.base.load_backend``), so this registry imports none of them.

A kind may register a **variant** per station measurement, under ``"<name>:<measure>"``: a
run started with ``[tracker] measure = "point"`` is a ``base_frame`` run on the wire, solved
by ``"base_frame:point"`` (:func:`for_run`, :func:`for_new_run`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from cellcal.daemon.runs.base import Finished, Measure, ReportParts, RunContext, RunKind
from cellcal.daemon.store import RunRecord
from cellcal.drivers.base import load_backend

__all__ = ["KINDS", "get", "for_run", "for_new_run", "for_body", "names", "RunKind", "RunContext", "Finished",
           "Measure", "ReportParts"]

#: Every kind, name -> ``"module:Class"`` (imported on first use).
KINDS: dict[str, str] = {
    "base_frame": "cellcal.daemon.runs.base_frame:BaseFrame",
    "base_frame:point": "cellcal.daemon.runs.points:PointBaseFrame",
    "tool_point": "cellcal.daemon.runs.tool_point:ToolPoint",
    "hand_eye": "cellcal.daemon.runs.hand_eye:HandEye",
    "kinematics": "cellcal.daemon.runs.kinematics:Kinematics",
    "intrinsics": "cellcal.daemon.runs.intrinsics:Intrinsics",
    "eye_to_hand": "cellcal.daemon.runs.eye_to_hand:EyeToHand",
}


def names() -> tuple[str, ...]:
    """The kinds a run may be started as (variants are chosen, not named)."""
    return tuple(k for k in KINDS if ":" not in k)


@functools.cache
def get(name: str) -> RunKind:
    """The kind registered as ``name`` (one instance per process: kinds hold no state).

    Raises
    ------
    ValueError
        ``name`` is no registered kind (the message lists the known ones).
    """
    if ":" not in name and name not in KINDS:
        raise ValueError(f"run kind {name!r} unknown; known: {', '.join(names())}")
    cls = load_backend(KINDS, name, "run kind")
    kind = cls()
    if not isinstance(kind, RunKind):
        raise TypeError(f"{KINDS[name]} is no RunKind")
    return kind


def _of(name: str, measure: str | None) -> RunKind:
    variant = f"{name}:{measure}"
    return get(variant if measure and variant in KINDS else name)


def for_new_run(name: str, measure: str) -> RunKind:
    """The kind of a run about to start, measuring ``measure`` (``[tracker] measure``)."""
    return _of(name, measure)


def for_run(run: RunRecord, default_measure: str) -> RunKind:
    """The kind of a stored run: its name and what its stations measure (the ``measure`` of
    its start record; ``default_measure`` for runs stored before it was recorded)."""
    started = run.plan.get("started") or {}
    measure = started.get("measure", default_measure) if isinstance(started, Mapping) else default_measure
    return _of(run.kind, str(measure))


def for_body(body: Mapping[str, object]) -> RunKind:
    """The kind of a stored result (its ``kind``): what its outputs are drawn by. Results
    of a kind this build does not know (a newer store) are shown as base-frame results,
    whose outputs need nothing beyond the keys every result has."""
    name = str(body.get("kind") or "")
    return get(name) if name in KINDS else get("base_frame")
