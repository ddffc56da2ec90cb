"""The options record on the image solves (``calibrate_hand_eye_camera``, ``calibrate_eye_to_hand_camera``,
``calibrate_intrinsics``; ADR 0004, amendment of 2026-12-06).

The camera solves keep their own keywords, with their own defaults; ``options=`` fills every
keyword the caller did not give (the keyword still overrides the record). A keyword whose
default is :data:`UNSET` was not given. The record's fields fall in three groups per solve:

* **used**: the field means what the keyword means (units converted where the conventions
  differ); a field at its :class:`SolverOptions` default leaves the solve's own default.
* **ignored**: the field has nothing to act on in this problem (no robot in an intrinsics
  solve, no prior transform to test a tolerance against, points only, the tracker's noise): one
  record serves a cell.
* **refused**: the field asks for something the solve cannot do (no refinement, outlier
  rejection, a robust loss the solve lacks): a non-default value is a
  ``ValueError`` naming the field and the function, never a setting silently not applied.
"""

from __future__ import annotations

from collections.abc import Mapping

from cellcal.solver.options import SolverOptions

__all__ = ["UNSET", "Unset", "record", "refuse", "REFUSAL_REASONS"]

_DEFAULT = SolverOptions()


class Unset:
    """The default of a camera keyword that takes its value from ``options=`` when not given."""

    def __repr__(self) -> str:
        return "<from options>"


#: A keyword not given (its value comes from the record, or the solve's own default).
UNSET = Unset()

#: Why an image solve cannot honour a field, and what to do instead (the refusal's message).
REFUSAL_REASONS: Mapping[str, str] = {
    "refine": "the image solves always refine on the corners (there is no linear answer to return)",
    "reject_k": "the image solves do not drop stations; screen views by their view_rms_px and solve again",
    "huber": "the intrinsics solve is plain least squares on the corners (no robust loss)",
}


def record(fn: str, options: SolverOptions | None) -> SolverOptions:
    """``options`` or the defaults (``TypeError`` for anything but a :class:`SolverOptions`)."""
    if options is None:
        return _DEFAULT
    if not isinstance(options, SolverOptions):
        raise TypeError(f"{fn}() options must be a SolverOptions, got {type(options).__name__}")
    return options


def refuse(fn: str, options: SolverOptions, fields: tuple[str, ...]) -> None:
    """``ValueError`` for the first of ``fields`` set away from its default in ``options``."""
    for name in fields:
        value = getattr(options, name)
        if value != getattr(_DEFAULT, name):
            raise ValueError(
                f"{fn}() cannot honour options.{name}={value!r}: {REFUSAL_REASONS[name]}; "
                f"pass options.replace({name}={getattr(_DEFAULT, name)!r}) to solve without it")
