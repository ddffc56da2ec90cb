"""Acceptance gates: what a calibration must satisfy before it may become the active one.

Each gate is one function in :data:`GATES`: it takes the solver's result and the ``[solve]``
configuration and returns a :class:`GateCheck` (its name, the value measured, the limit,
whether it passed and a sentence for people), or None when it does not apply to that
result. :func:`check_gates` runs them all; the :class:`GateReport` is stored in the result
record (``result["gates"]``, :meth:`GateReport.to_wire`), and the failed gates, each by
name and sentence, are the run's failure reason (the run's ``status_reason`` and the
``state`` message saying the result was not activated). A new gate is one function
appended to :data:`GATES`.

A gate that does not apply to a result is still recorded, never passed silently: the
rotation closure gate on a fit with no rotation residuals (a point base frame from a 3-DoF
tracker, a tool point pivot: their measurements have no orientation, so ``rms_rotation_rad``
is 0 by construction) is a check with ``applies`` false, no value, and a sentence saying
why. It does not stop activation (its ``passed`` is true) and is not in ``failed``.

Wire form of ``result["gates"]`` (the ``passed`` and ``failed`` keys are what clients and
older stores have; ``checks`` names every gate)::

    {"passed": bool, "failed": [sentence, ...],
     "checks": [{"name": str, "value": float, "limit": float, "unit": str, "passed": bool,
                 "message": str}, ...]}

with ``"value": null, "applies": false`` in the check of a gate that does not apply
(``applies`` is present only then).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GateCheck", "GateReport", "Gate", "GATES", "check_gates", "gates_passed", "gates_failed",
           "rms_translation", "rms_rotation"]


@dataclass(frozen=True)
class GateCheck:
    """The outcome of one gate.

    Attributes
    ----------
    name : str
        The gate (``"rms_translation"``), stable: clients and logs may match on it.
    value, limit : float
        What was measured and the most (or least) the gate allows, SI units (``unit``);
        ``value`` is None when the gate does not apply.
    unit : str
        ``"m"``, ``"rad"``, ``"sigma"`` ...
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

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "value": None if self.value is None else float(self.value),
                               "limit": float(self.limit), "unit": self.unit, "passed": bool(self.passed),
                               "message": self.message}
        if not self.applies:
            out["applies"] = False
        return out


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

    def to_wire(self) -> dict[str, Any]:
        return {"passed": self.passed, "failed": [c.message for c in self.failed],
                "checks": [c.to_wire() for c in self.checks]}


#: A gate: ``(result, solve_config) -> GateCheck`` or None when it does not apply.
Gate = Callable[[Any, Any], "GateCheck | None"]


def rms_translation(result: Any, solve: Any) -> GateCheck:
    """RMS per-station translation closure at most ``[solve] max_rms_mm``."""
    v, lim = float(result.rms_translation_m), float(solve.max_rms_translation_m)
    ok = v <= lim
    return GateCheck("rms_translation", v, lim, "m", ok,
                     f"rms translation {v * 1e3:.3f} mm {'<=' if ok else '>'} {lim * 1e3:.3f} mm")


def _without_rotation(result: Any) -> str | None:
    """Why ``result`` has no rotation residuals to judge (None when it has them)."""
    from cellcal.solver import PointBaseFrameResult, ToolPointResult

    if isinstance(result, PointBaseFrameResult):
        return ("a point base-frame fit (3-DoF tracker) has no rotation residuals: the reflector's "
                "positions carry no orientation")
    if isinstance(result, ToolPointResult):
        return "a tool point (pivot) fit has no rotation residuals: only the tip's positions are fitted"
    return None


def rms_rotation(result: Any, solve: Any) -> GateCheck:
    """RMS per-station rotation closure at most ``[solve] max_rms_deg``; recorded as not
    applying to a fit without rotation residuals (point base frame, tool point)."""
    lim = float(solve.max_rms_rotation_rad)
    why = _without_rotation(result)
    if why is not None:
        return GateCheck.not_applicable("rms_rotation", lim, "rad", why)
    v = float(result.rms_rotation_rad)
    ok = v <= lim
    return GateCheck("rms_rotation", v, lim, "rad", ok,
                     f"rms rotation {math.degrees(v):.4f} deg {'<=' if ok else '>'} {math.degrees(lim):.4f} deg")


#: The gates every result goes through, in order.
GATES: tuple[Gate, ...] = (rms_translation, rms_rotation)


def check_gates(result: Any, solve: Any, gates: Sequence[Gate] = GATES) -> GateReport:
    """Run every gate on a solver result (``solve``: the ``[solve]`` configuration)."""
    checks = tuple(c for c in (g(result, solve) for g in gates) if c is not None)
    return GateReport(checks)


def gates_passed(wire_result: Mapping[str, Any]) -> bool:
    """Whether a stored result passed its gates (a result stored without gates counts as passed)."""
    return bool(wire_result.get("gates", {}).get("passed", True))


def gates_failed(wire_result: Mapping[str, Any]) -> list[str]:
    """The failed gates of a stored result, each ``"name: sentence"`` (a result stored
    before gates had names: the sentence alone)."""
    g = wire_result.get("gates", {})
    if "checks" in g:
        return [f"{c['name']}: {c['message']}" for c in g["checks"] if not c["passed"]]
    return [str(m) for m in g.get("failed", [])]
