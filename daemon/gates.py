"""Acceptance gates: what a calibration must satisfy before it may become the active one.

Each gate is one function in :data:`GATES`: it takes the solver's result, the ``[solve]``
configuration and a :class:`GateContext` (what the result alone does not say: the run's
kind, the robot poses it was solved from, the arm's reach) and returns a
:class:`GateCheck` (its name, the value measured, the limit, whether it passed and a
sentence for people), or None when it does not apply to that result. :func:`check_gates`
runs them all; the :class:`GateReport` is stored in the result record (``result["gates"]``,
:meth:`GateReport.to_wire`), and the failed gates, each by name and sentence, are the run's
failure reason (the run's ``status_reason`` and the ``state`` message saying the result
was not activated). A result that fails a gate is stored, never activated. A new gate is
one function appended to :data:`GATES`.

The gates, by name (keys of ``[solve]``, docs/configuration.md):

``rms_translation``, ``rms_rotation``
    RMS closure at most ``max_rms_mm`` / ``max_rms_deg``.
``converged``
    The refinement converged (``require_converged``): a fit stopped at its iteration limit
    is no minimum, and its figures describe nothing.
``model_error``
    No ``model_error`` warning (unless ``allow_model_error``): the residuals follow the
    robot pose, so the arm's kinematics, not the tracker, limit the result. The value is the
    RMS of the structured residual (m). A camera-chain result (``CameraChainResult``) is
    judged by its tests as a test (unit ``bool``): its warnings' values are pixels or
    millimetres of other quantities, never a structured residual to compare with
    ``max_model_error_mm``.
``sigma_at_task_points``
    The predicted 1-sigma position error (``predicted_error_at``, root of the covariance
    trace) at every ``task_points_mm`` at most ``max_sigma_mm_at_task_points``: an honest
    answer with a 90 mm sigma passes any RMS gate. Task points are in the frame the
    configured kind's ``predicted_error_at`` takes (the cell for a base frame, the camera
    for hand-eye; a tool point has its tip only); without them, and for a result of another
    kind than ``[solve] kind`` (client-supplied stations), the primary estimate's own
    translation sigma is gated (at the robot base origin for a base frame).
``holdout_p90_translation``, ``holdout_p90_rotation``
    Held-out closure P90 at most ``max_holdout_p90_mm`` / ``_deg`` (off unless set); a
    result without a held-out closure (fewer than 4 stations) fails it.
``expected_cell_T_base_translation``, ``expected_cell_T_base_rotation``
    A base-frame answer within ``expected_tolerance_mm_deg`` of the cell drawing's
    ``expected_cell_T_base_mm_deg`` (off unless set): swapped, inverted or millimetre inputs
    fit exactly, so no residual shows them (ADR 0014).
``reach``
    Every robot pose within the robot model's reach (``check_reach``): tracker poses passed
    as robot poses, or poses in millimetres, put the flange metres from the base.

A gate switched off by its key (``max_holdout_p90_mm`` not set, ``allow_model_error``...)
is not a check. A gate that is on but does not apply to a result is still recorded, never
passed silently: the rotation gates on a fit with no rotation residuals (a point base frame
from a 3-DoF tracker, a tool point pivot: their measurements have no orientation, so
``rms_rotation_rad`` is 0 by construction), the cell drawing's ``cell_T_base`` on a result
without one, the reach without robot poses or a robot model, are checks with ``applies``
false, no value, and a sentence saying why. They do not stop activation (their ``passed``
is true) and are not in ``failed``.

Wire form of ``result["gates"]`` (the ``passed`` and ``failed`` keys are what clients and
older stores have; ``checks`` names every gate)::

    {"passed": bool, "failed": [sentence, ...],
     "checks": [{"name": str, "value": float, "limit": float, "unit": str, "passed": bool,
                 "message": str}, ...]}

``unit`` is ``"m"``, ``"rad"`` or ``"bool"`` (value 1.0 for true, limit 1.0: required);
``"value": null`` when not computed, and ``"applies": false`` in the check of a gate that
does not apply (``applies`` is present only then).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Solve
from cellcal.drivers.kinematics import DHModel
from cellcal.solver import CalibrationResult, CameraChainResult, KinematicResult, PointBaseFrameResult, ToolPointResult
from cellcal.solver.se3 import make_transform, rotation_angle, so3_exp

__all__ = ["GateCheck", "GateReport", "GateContext", "Gate", "GATES", "check_gates", "gates_passed", "gates_failed",
           "describe_gates", "model_reach_m", "rms_translation", "rms_rotation", "converged", "model_error",
           "sigma_at_task_points", "holdout_p90", "expected_cell_T_base", "reach"]


@dataclass(frozen=True)
class GateCheck:
    """The outcome of one gate.

    Attributes
    ----------
    name : str
        The gate (``"rms_translation"``), stable: clients and logs may match on it.
    value, limit : float
        What was measured and the most (or least) the gate allows, SI units (``unit``);
        ``value`` is None when the gate does not apply (NaN: not computed).
    unit : str
        ``"m"``, ``"rad"``, ``"bool"`` (1.0 true, 0.0 false) ...
    passed : bool
        False stops the result from becoming active (True for a gate that does not apply).
    message : str
        For people, in edge units (mm, deg): ``"rms translation 0.612 mm > 0.500 mm"``,
        or why the gate does not apply.
    applies : bool
        False: the gate has nothing to judge in this result (module docstring).
    """

    name: str
    value: float | None
    limit: float
    unit: str
    passed: bool
    message: str
    applies: bool = True

    @classmethod
    def not_applicable(cls, name: str, limit: float, unit: str, why: str) -> GateCheck:
        """The record of a gate that does not apply to a result (``why``: for people)."""
        return cls(name, None, float(limit), unit, True, f"does not apply: {why}", applies=False)

    def to_wire(self) -> P.JsonObject:
        out: P.JsonObject = {"name": self.name, "value": _finite_or_none(self.value),
                               "limit": _finite_or_none(self.limit), "unit": self.unit, "passed": bool(self.passed),
                               "message": self.message}
        if not self.applies:
            out["applies"] = False
        return out


def _finite_or_none(v: float | None) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _without_rotation(result: CalibrationResult) -> str | None:
    """Why ``result`` has no rotation residuals to judge (None when it has them)."""
    if isinstance(result, PointBaseFrameResult):
        return ("a point base-frame fit (3-DoF tracker) has no rotation residuals: the reflector's "
                "positions carry no orientation")
    if isinstance(result, ToolPointResult):
        return "a tool point (pivot) fit has no rotation residuals: only the tip's positions are fitted"
    return None


@dataclass(frozen=True)
class GateReport:
    """Every gate that applied to one result, in :data:`GATES` order."""

    checks: tuple[GateCheck, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    def reason(self) -> str:
        """Each failed gate by name with its sentence, ``"; "``-joined ("" when every gate passed)."""
        return "; ".join(f"{c.name}: {c.message}" for c in self.failed)

    def to_wire(self) -> P.JsonObject:
        return {"passed": self.passed, "failed": [c.message for c in self.failed],
                "checks": [c.to_wire() for c in self.checks]}


@dataclass(frozen=True)
class GateContext:
    """What gates need beyond the result and ``[solve]``.

    Attributes
    ----------
    kind : str
        The run's kind (``base_frame``, ``tool_point``, ``hand_eye``); "" when unknown.
    base_T_flange : numpy.ndarray, shape (N, 4, 4), or None
        The robot poses the result was solved from, metres (None: the reach gate does not
        apply).
    max_reach_m : float or None
        The arm's reach from its kinematic model (:func:`model_reach_m`), metres.
    robot_model : str
        The model's name, for the reach gate's sentence.
    """

    kind: str = ""
    base_T_flange: npt.NDArray[np.float64] | None = None
    max_reach_m: float | None = None
    robot_model: str = ""


#: A gate: ``(result, solve_config, context) -> GateCheck``, a list of them, or None when it
#: does not apply.
Gate = Callable[[CalibrationResult, Solve, GateContext], "GateCheck | list[GateCheck] | None"]


def model_reach_m(model: DHModel) -> float:
    """The farthest a flange can be from the base of a DH arm: the sum of its link lengths
    and offsets (``|a| + |d|``, metres), the bound the inverse kinematics refuses beyond."""
    return float(np.sum(np.abs(model.a_m)) + np.sum(np.abs(model.d_m)))


def _cmp(ok: bool) -> str:
    return "<=" if ok else ">"


def rms_translation(result: CalibrationResult | KinematicResult, solve: Solve, ctx: GateContext) -> GateCheck:
    """RMS per-station translation closure at most ``[solve] max_rms_mm``."""
    v, lim = float(result.rms_translation_m), float(solve.max_rms_translation_m)
    ok = v <= lim
    return GateCheck("rms_translation", v, lim, "m", ok, f"rms translation {v * 1e3:.3f} mm {_cmp(ok)} {lim * 1e3:.3f} mm")


def rms_rotation(result: CalibrationResult, solve: Solve, ctx: GateContext) -> GateCheck:
    """RMS per-station rotation closure at most ``[solve] max_rms_deg``; recorded as not
    applying to a fit without rotation residuals (point base frame, tool point)."""
    lim = float(solve.max_rms_rotation_rad)
    why = _without_rotation(result)
    if why is not None:
        return GateCheck.not_applicable("rms_rotation", lim, "rad", why)
    v = float(result.rms_rotation_rad)
    ok = v <= lim
    return GateCheck("rms_rotation", v, lim, "rad", ok,
                     f"rms rotation {math.degrees(v):.4f} deg {_cmp(ok)} {math.degrees(lim):.4f} deg")


def converged(result: CalibrationResult, solve: Solve, ctx: GateContext) -> GateCheck | None:
    """The fit converged (``[solve] require_converged``)."""
    if not solve.require_converged:
        return None
    ok = bool(result.converged)
    msg = (f"converged ({int(result.iterations)} iterations)" if ok else
           f"the fit did not converge ({result.stop_reason}); its answer and figures are not a minimum")
    return GateCheck("converged", float(ok), 1.0, "bool", ok, msg)


def model_error(result: CalibrationResult, solve: Solve, ctx: GateContext) -> GateCheck | None:
    """No ``model_error`` warning with a structured residual beyond
    ``[solve] max_model_error_mm`` unless ``[solve] allow_model_error``.

    The warning's tests have a 1 % false-alarm rate on pure noise (solver/diagnostics.py),
    and with many stations they also detect a real but negligible structure; the size of
    what they found (the warning's value) decides, so an unattended cell recalibrated
    every day is not refused once in a hundred runs for a few micrometres."""
    if solve.allow_model_error:
        return None
    lim = float(solve.max_model_error_m)
    if isinstance(result, CameraChainResult):
        return _camera_model_error(result, lim)
    w = next((w for w in result.warnings if w.code == "model_error"), None)
    if w is None:
        # Too few stations to test: the solver widened the covariance by the arm's declared
        # accuracy instead, so the sigma gate at the task points judges what is left.
        u = next((w for w in result.warnings if w.code == "model_error_untested"), None)
        if u is not None:
            return GateCheck("model_error", math.nan, lim, "m", True,
                             f"untested: {u.message} (the uncertainty carries robot_accuracy_mm = "
                             f"{solve.robot_accuracy_m * 1e3:g}; the sigma gate judges it)")
        return GateCheck("model_error", 0.0, lim, "m", True, "no model_error warning: the residuals look like noise")
    v = float(w.value) * 1e-3 if w.value is not None and math.isfinite(float(w.value)) else math.nan
    ok = math.isfinite(v) and v <= lim
    return GateCheck("model_error", v, lim, "m", ok,
                     f"{w.message} (structured residual {'?' if math.isnan(v) else f'{v * 1e3:.3f}'} mm RMS, "
                     f"{'within' if ok else 'beyond'} max_model_error_mm = {lim * 1e3:g}"
                     f"{'' if ok else '; allow_model_error = false'})")


def _camera_model_error(result: CameraChainResult, lim: float) -> GateCheck:
    """The ``model_error`` gate of a camera-chain result: its tests judged as a test (unit
    ``bool``), never its warnings' values as a length. Those are millimetres for the robot's
    corrections and pixels for a field in the image residuals, and ``max_model_error_mm``
    is a length of a pose fit's structured residual: comparing either with it would read
    0.4 px as 0.4 mm (ADR 0031 item 5; the camera run kinds gate with their own
    ``camera_gates``, this keeps any other caller of :func:`check_gates` as strict)."""
    fired = bool(result.camera_tests.model_error)
    which = [w.message for w in result.warnings if w.code == "model_error"]  # each names its own unit
    msg = ("the camera chain's tests see noise only" if not fired else
           "the camera chain's model-error test fired: " + " / ".join(which or ["(no warning text)"]))
    return GateCheck("model_error", float(fired), 0.0, "bool", not fired,
                     f"{msg}; judged as a test, not against max_model_error_mm = {lim * 1e3:g} "
                     "(a camera result's figures are in px and mm of another quantity)")


def sigma_at_task_points(result: CalibrationResult, solve: Solve, ctx: GateContext) -> GateCheck:
    """Predicted 1-sigma position error at the task points at most
    ``[solve] max_sigma_mm_at_task_points`` (see the module docstring for which points)."""
    lim = float(solve.max_sigma_m_at_task_points)
    own_kind = not ctx.kind or ctx.kind == solve.kind
    points = solve.task_points_m if own_kind else []
    worst, where = math.nan, ""
    try:
        if points and hasattr(result, "predicted_error_at"):
            sig, tip = [], False
            for p in points:
                try:
                    sig.append(float(result.predicted_error_at(np.asarray(p, dtype=float)).sigma_m))
                except TypeError:  # a tool point: its tip is the only point it predicts
                    sig, tip = [float(result.predicted_error_at().sigma_m)], True
                    break
            k = int(np.argmax([s if math.isfinite(s) else math.inf for s in sig]))
            worst = sig[k]
            if not tip:
                where = (f" at task point {k} [{', '.join(f'{1e3 * x:.1f}' for x in points[k])}] mm"
                         f" (worst of {len(points)})")
            else:
                where = " at the tool tip"
        else:
            worst = float(result.sigma_translation_mm) * 1e-3
            first = next(iter(result.transforms().values()))
            why = ("no task points" if own_kind else
                   f"a {ctx.kind} result; the task points are for {solve.kind}, the configured kind")
            where = f" of {first.name} ({why})"
    except (ValueError, ArithmeticError, StopIteration) as exc:
        return GateCheck("sigma_at_task_points", math.nan, lim, "m", False, f"predicted error not computed: {exc}")
    if not math.isfinite(worst):
        return GateCheck("sigma_at_task_points", math.nan, lim, "m", False,
                         f"predicted 1-sigma error{where} not computed (no covariance)")
    ok = worst <= lim
    return GateCheck("sigma_at_task_points", worst, lim, "m", ok,
                     f"predicted 1-sigma error {worst * 1e3:.3f} mm{where} {_cmp(ok)} {lim * 1e3:.3f} mm")


def holdout_p90(result: CalibrationResult, solve: Solve, ctx: GateContext) -> list[GateCheck]:
    """Held-out closure P90 at most ``[solve] max_holdout_p90_mm`` / ``max_holdout_p90_deg``."""
    out = []
    h = result.holdout
    for name, lim, attr, unit in (("holdout_p90_translation", solve.max_holdout_p90_m, "p90_translation_m", "m"),
                                  ("holdout_p90_rotation", solve.max_holdout_p90_rad, "p90_rotation_rad", "rad")):
        if lim is None:
            continue
        lim = float(lim)
        why = _without_rotation(result) if unit == "rad" else None
        if why is not None:
            out.append(GateCheck.not_applicable(name, lim, unit, why))
            continue
        show = (lambda x: f"{x * 1e3:.3f} mm") if unit == "m" else (lambda x: f"{math.degrees(x):.4f} deg")
        v = math.nan if h is None else float(getattr(h, attr))
        if h is None:
            msg = (f"no held-out closure to check against {show(lim)} ({int(result.n_stations)} stations; "
                   "at least 4 are needed)")
        elif not math.isfinite(v):
            msg = "held-out closure P90 undetermined (a fold without the held-out station is degenerate)"
        else:
            msg = f"held-out closure P90 {show(v)} {_cmp(v <= lim)} {show(lim)}"
        out.append(GateCheck(name, v, lim, unit, math.isfinite(v) and v <= lim, msg))
    return out


def expected_cell_T_base(result: CalibrationResult, solve: Solve, ctx: GateContext) -> list[GateCheck]:
    """A base-frame answer within ``[solve] expected_tolerance_mm_deg`` of
    ``expected_cell_T_base_mm_deg`` (off unless set; other results: not applicable)."""
    e = solve.expected_cell_T_base_m_rad
    if e is None:
        return []
    tol_m, tol_rad = (float(x) for x in solve.expected_tolerance_m_rad)
    T = getattr(result, "cell_T_base", None)
    if T is None:
        why = f"a {type(result).__name__.removesuffix('Result')} result has no cell_T_base"
        return [GateCheck.not_applicable("expected_cell_T_base_translation", tol_m, "m", why),
                GateCheck.not_applicable("expected_cell_T_base_rotation", tol_rad, "rad", why)]
    E = make_transform(so3_exp(np.asarray(e[3:], dtype=float)), np.asarray(e[:3], dtype=float))
    T = np.asarray(T, dtype=float)
    dt = float(np.linalg.norm(T[:3, 3] - E[:3, 3]))
    dr = float(rotation_angle(E[:3, :3].T @ T[:3, :3]))
    hint = ""
    if dt > tol_m or dr > tol_rad:
        Ti = np.linalg.inv(T)
        if (float(np.linalg.norm(Ti[:3, 3] - E[:3, 3])) <= tol_m
                and float(rotation_angle(E[:3, :3].T @ Ti[:3, :3])) <= tol_rad):
            hint = ("; its inverse matches the expected one: are the robot and tracker poses swapped, or both "
                    "inverted?")
        else:
            hint = ("; check the cell drawing's frame, or whether the inputs are swapped, inverted or in millimetres "
                    "(these fit exactly, so the residuals cannot tell)")
    return [
        GateCheck("expected_cell_T_base_translation", dt, tol_m, "m", dt <= tol_m,
                  f"cell_T_base {dt * 1e3:.1f} mm from the expected one {_cmp(dt <= tol_m)} {tol_m * 1e3:.1f} mm"
                  + (hint if dt > tol_m else "")),
        GateCheck("expected_cell_T_base_rotation", dr, tol_rad, "rad", dr <= tol_rad,
                  f"cell_T_base {math.degrees(dr):.2f} deg from the expected one {_cmp(dr <= tol_rad)} "
                  f"{math.degrees(tol_rad):.2f} deg" + (hint if dr > tol_rad else "")),
    ]


def reach(result: CalibrationResult, solve: Solve, ctx: GateContext) -> GateCheck | None:
    """Every robot pose within the robot model's reach (``[solve] check_reach``)."""
    if not solve.check_reach:
        return None
    if ctx.max_reach_m is None:
        return GateCheck.not_applicable("reach", math.nan, "m", "no robot model to take the reach from")
    lim = float(ctx.max_reach_m)
    if ctx.base_T_flange is None or len(ctx.base_T_flange) == 0:
        return GateCheck.not_applicable("reach", lim, "m", "no robot poses with the result")
    G = np.asarray(ctx.base_T_flange, dtype=float)
    d = np.linalg.norm(G[:, :3, 3], axis=1)
    worst = float(np.max(d))
    of = f" of {ctx.robot_model}" if ctx.robot_model else ""
    if worst <= lim:
        return GateCheck("reach", worst, lim, "m", True,
                         f"farthest flange {worst:.3f} m from the base <= the {lim:.3f} m reach{of}")
    bad = np.flatnonzero(d > lim)
    shown = ", ".join(str(int(i)) for i in bad[:10]) + (", ..." if bad.size > 10 else "")
    med = float(np.median(d))
    hint = (f"the poses look like millimetres (median {med:.3g} m from the base)" if med > 100.0 * lim else
            "are the robot and tracker poses swapped? (a tracker sees the cell from metres away)")
    return GateCheck("reach", worst, lim, "m", False,
                     f"{bad.size} of {len(d)} robot poses (stations {shown}) put the flange up to {worst:.3f} m from "
                     f"the base, beyond the {lim:.3f} m reach{of}: {hint}")


#: The gates every result goes through, in order. A gate returns a GateCheck, a list of
#: them (one per figure: translation and rotation) or None (it does not apply).
GATES: tuple[Gate, ...] = (rms_translation, rms_rotation, converged, model_error, sigma_at_task_points,
                           holdout_p90, expected_cell_T_base, reach)


def check_gates(result: CalibrationResult, solve: Solve, gates: Sequence[Gate] = GATES,
                context: GateContext | None = None) -> GateReport:
    """Run every gate on a solver result (``solve``: the ``[solve]`` configuration;
    ``context``: the run's kind, robot poses and reach, default none of them)."""
    ctx = context if context is not None else GateContext()
    checks: list[GateCheck] = []
    for g in gates:
        got = g(result, solve, ctx)
        if got is None:
            continue
        checks.extend(got if isinstance(got, list) else [got])
    return GateReport(tuple(checks))


def describe_gates(solve: Solve) -> list[str]:
    """The gates a ``[solve]`` configuration sets, one sentence each in edge units (what
    ``cellcal check-config`` prints)."""
    s = solve
    out = [f"rms_translation: at most {s.max_rms_translation_m * 1e3:g} mm",
           f"rms_rotation: at most {math.degrees(s.max_rms_rotation_rad):g} deg",
           "converged: required" if s.require_converged else "converged: off (require_converged = false)",
           "model_error: allowed (allow_model_error = true)" if s.allow_model_error else
           f"model_error: a result warning model_error with a structured residual beyond "
           f"{s.max_model_error_m * 1e3:g} mm RMS is refused",
           f"sigma_at_task_points: at most {s.max_sigma_m_at_task_points * 1e3:g} mm "
           + (f"at {len(s.task_points_m)} task points" if s.task_points_m else "(no task points: the primary estimate's "
              "own translation sigma)")]
    for name, v, show in (("holdout_p90_translation", s.max_holdout_p90_m, lambda x: f"{x * 1e3:g} mm"),
                          ("holdout_p90_rotation", s.max_holdout_p90_rad, lambda x: f"{math.degrees(x):g} deg")):
        out.append(f"{name}: at most {show(v)}" if v is not None else f"{name}: off")
    e = s.expected_cell_T_base_m_rad
    if e is None:
        out.append("expected_cell_T_base: off")
    else:
        out.append(f"expected_cell_T_base: within {s.expected_tolerance_m_rad[0] * 1e3:g} mm, "
                   f"{math.degrees(s.expected_tolerance_m_rad[1]):g} deg of [{', '.join(f'{x * 1e3:g}' for x in e[:3])}"
                   f"] mm, rotation vector [{', '.join(f'{math.degrees(x):g}' for x in e[3:])}] deg")
    out.append("reach: within the robot model's reach" if s.check_reach else "reach: off (check_reach = false)")
    return out


def _map(v: object) -> Mapping[str, object]:
    """A part of a stored record that should be a JSON object (``{}`` when it is not)."""
    return v if isinstance(v, Mapping) else {}


def _items(v: object) -> list[object]:
    """A part of a stored record that should be a JSON array (``[]`` when it is not)."""
    return list(v) if isinstance(v, (list, tuple)) else []


def gates_passed(wire_result: Mapping[str, object]) -> bool:
    """Whether a stored result passed its gates (a result stored without gates counts as passed)."""
    return bool(_map(wire_result.get("gates", {})).get("passed", True))


def gates_failed(wire_result: Mapping[str, object]) -> list[str]:
    """The failed gates of a stored result, each ``"name: sentence"`` (a result stored
    before gates had names: the sentence alone)."""
    g = _map(wire_result.get("gates", {}))
    if "checks" in g:
        checks = [_map(c) for c in _items(g["checks"])]
        return [f"{c['name']}: {c['message']}" for c in checks if not c["passed"]]
    return [str(m) for m in _items(g.get("failed", []))]
