"""What a result recommends its reader do next (``cellcal show``, the HTML report).

One rule today: when a rigid calibration's uncertainty is dominated by the arm's kinematic
error (a ``model_error`` warning whose widening makes the reported sigma at least
:data:`DOMINANT_INFLATION` times what the instrument's noise alone gives), say so with the
figures and name the run that removes it: a kinematics identification (``docs/kinematics.md``
says who then uses the identified model: cellcal itself on CiA 402 drives with ``[kinematics]
use_identified = true``, the controller's own calibration on a UR).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from cellcal.daemon.report.reading import as_list, as_map

__all__ = ["recommendations", "DOMINANT_INFLATION"]

#: A reported sigma this many times the noise-only one: the model error dominates it.
DOMINANT_INFLATION = 1.5


def _number(v: object) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def recommendations(body: Mapping[str, object]) -> list[str]:
    """Sentences for a person, each naming a command that exists; ``[]`` when none applies.

    Parameters
    ----------
    body : mapping
        A result as published (``get_result``) or stored.
    """
    if "kinematics" in body:
        # An identification's own residuals are what it removes; it recommends no second one.
        return []
    warnings = [as_map(w, "warnings") for w in as_list(body.get("warnings") or [], "warnings")]
    model = next((w for w in warnings if w.get("code") == "model_error"), None)
    if model is None:
        return []
    tests = as_map(body.get("residual_tests") or {}, "residual_tests")
    inflation = _number(tests.get("inflation_translation"))
    structured_mm = _number(model.get("value"))
    if math.isfinite(inflation) and inflation < DOMINANT_INFLATION:
        return []
    size = f"a structured residual of {structured_mm:.3f} mm RMS" if math.isfinite(structured_mm) else "residuals"
    widened = (f"; the reported sigma is {inflation:.1f}x what the instrument's noise alone gives"
               if math.isfinite(inflation) else "")
    return [f"the arm's kinematic error dominates this result ({size} that follow the robot pose{widened}): "
            "identify the arm's kinematics (`cellcal ctl start_run kind=kinematics`; docs/kinematics.md says "
            "who then uses the identified model) and calibrate again"]
