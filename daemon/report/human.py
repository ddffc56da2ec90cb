"""Sentences for people about the daemon's events: stations, results, drift checks.

One place for the words, so the daemon's log (one info line per station, per result and per
drift check; the systemd journal shows the same lines) and ``cellcal watch`` say the same
thing. Input: the protocol's bodies (``cellcal.daemon.protocol``: SI, quaternions w, x, y, z);
output: lengths in mm, angles in degrees, with the unit written out.

The pose of a transform ``a_T_b`` is given as its translation (mm) and its rotation as a
rotation vector (the axis times the angle, in degrees), the form ``cellcal show``, the report
and the UR exports use too; its 1-sigma is the root of the trace of the covariance's
translation (rotation) block, the convention of ``protocol.Uncertainty``. A fit without
rotation residuals (a 3-DoF point base frame, a tool point) has no rotation RMS to show: its
figure is left out, never printed as 0 (:func:`no_rotation_reason`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from cellcal.daemon import protocol as P
from cellcal.daemon.report.reading import as_list, as_map, to_float, to_int
from cellcal.solver.se3 import so3_log

__all__ = ["station_line", "result_line", "drift_line", "pose_text", "fit_text", "no_rotation_reason", "sigma_of",
           "main_transform", "kinematic_unit"]


def _mm(v: object, digits: int = 3) -> str:
    return f"{v * 1e3:.{digits}f} mm" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _deg(v: object, digits: int = 4) -> str:
    return f"{math.degrees(v):.{digits}f} deg" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def kinematic_unit(name: str) -> tuple[str, float, int]:
    """Edge unit, factor from SI and digits of a kinematic parameter (``link{i}.a``/``.d``:
    lengths; ``joint{i}.zero_offset``, ``.alpha``, ``.beta``: angles), for the report and
    ``cellcal show``."""
    # Digits to 10 nm and 1e-6 deg: a well-determined sigma is a few micrometres or
    # thousandths of a degree and must still show two significant digits.
    if name.endswith((".a", ".d")):
        return "mm", 1e3, 5
    return "deg", math.degrees(1.0), 6


def _rotation_vector_deg(matrix: object) -> tuple[float, float, float]:
    R = np.asarray(matrix, dtype=float).reshape(4, 4)[:3, :3]
    rx, ry, rz = (math.degrees(float(v)) for v in so3_log(R))
    return rx, ry, rz


def no_rotation_reason(body: Mapping[str, object]) -> str | None:
    """Why a result has no rotation residuals (None when it has): its ``rms_rotation`` gate
    recorded as not applying (``cellcal.daemon.gates``: a point base frame, a tool point), or a
    tool point (whose fit is of positions only) stored without gates. Summaries leave the
    rotation RMS out for such a result rather than print its 0."""
    gates = body.get("gates")
    checks = gates.get("checks") if isinstance(gates, Mapping) else None
    for c in checks if isinstance(checks, list) else ():
        if isinstance(c, Mapping) and c.get("name") == "rms_rotation" and c.get("applies") is False:
            return str(c.get("message") or "the measurements carry no orientation")
    if body.get("kind") == "tool_point":
        return "a tool point (pivot) fit has no rotation residuals: only the tip's positions are fitted"
    if body.get("rms_rotation_rad") is None:
        return "no rotation residual recorded"
    return None


def main_transform(body: Mapping[str, object]) -> str | None:
    """The transform a result is about: ``cell_T_base`` when it has one, else its first."""
    transforms = as_map(body.get("transforms"), "transforms")
    if "cell_T_base" in transforms:
        return "cell_T_base"
    return next(iter(transforms), None)


def sigma_of(body: Mapping[str, object], name: str) -> tuple[float | None, float | None]:
    """1-sigma of transform ``name`` (m, rad): roots of the traces of its covariance's
    translation and rotation blocks (None where the result has no covariance)."""
    uncertainty = as_map(body.get("uncertainty"), "uncertainty")
    cov = as_map(as_map(uncertainty.get("covariance"), "uncertainty.covariance").get(name), name)
    values = cov.get("values")
    if cov.get("shape") != [6, 6] or not values or any(v is None for v in as_list(values, "values")):
        return None, None
    C = np.asarray(values, dtype=float).reshape(6, 6)
    return math.sqrt(max(0.0, float(np.trace(C[:3, :3])))), math.sqrt(max(0.0, float(np.trace(C[3:, 3:]))))


def pose_text(body: Mapping[str, object], name: str) -> str:
    """``cell_T_base = (x, y, z) mm +- s mm, rotation vector (rx, ry, rz) deg +- s deg``
    (``name = unknown`` when the result does not carry it whole)."""
    t = as_map(as_map(body.get("transforms"), "transforms").get(name), name)
    xyz = [to_float(v) * 1e3 for v in as_list(t.get("translation_m"), "translation_m")]
    if len(xyz) != 3 or "matrix" not in t:
        return f"{name} = unknown (not in the result)"
    rx, ry, rz = _rotation_vector_deg(t["matrix"])
    s_t, s_r = sigma_of(body, name)
    st = "" if s_t is None else f" +- {s_t * 1e3:.3f} mm"
    sr = "" if s_r is None else f" +- {math.degrees(s_r):.4f} deg"
    return (f"{name} = ({xyz[0]:.3f}, {xyz[1]:.3f}, {xyz[2]:.3f}) mm{st}, "
            f"rotation vector ({rx:.4f}, {ry:.4f}, {rz:.4f}) deg{sr}")


def fit_text(body: Mapping[str, object]) -> str:
    """``fit rms 0.012 mm / 0.0031 deg``; the rotation left out for a fit without rotation
    residuals (:func:`no_rotation_reason`)."""
    rot = body.get("rms_rotation_rad")
    rotation = "" if no_rotation_reason(body) is not None else f" / {_deg(rot)}"
    return f"fit rms {_mm(body.get('rms_translation_m'))}{rotation}"


def station_line(body: Mapping[str, object]) -> str:
    """One station attempt (``cellcal/v1/station``) in words."""
    where = f"run {body.get('run_id')}: station {to_int(body.get('index', 0)) + 1}/{body.get('planned', '?')}"
    if body.get("accepted"):
        s = as_map(body.get("settle"), "settle")
        rest = s.get("robot_rest_s")
        rest_text = f"robot at rest {rest:.2f} s" if isinstance(rest, (int, float)) else "robot at rest"
        frame = as_map(body.get("frame"), "frame")
        corners, blur = frame.get("n_corners"), frame.get("blur_px")
        if isinstance(corners, int):  # a camera station (ADR 0030): what the frame showed
            seen = f"{corners} corners" + (f", blur {blur:.2f} px" if isinstance(blur, (int, float)) else "")
        else:
            seen = f"tracker std {_mm(s.get('tracker_std_translation_m'), 4)}"
        return (f"{where} accepted (attempt {body.get('attempt', 1)}, {body.get('accepted_count', '?')} accepted so "
                f"far; {rest_text}, {seen})")
    return (f"{where} {outcome_words(body)} ({body.get('reason')}): "
            f"{body.get('message') or body.get('reason')}")


#: A rejected station's ``outcome`` (its station event, zeromq.md 4.4.3) in words.
_OUTCOME_WORDS = {
    "retrying": "rejected on attempt {attempt}, measuring it again",
    "given_up": "GIVEN UP after {attempt} attempts",
    "dropped": "DROPPED from the run after it was accepted",
    "run_failed": "rejected on attempt {attempt}; the run fails",
}


def outcome_words(body: Mapping[str, object]) -> str:
    """What became of a rejected station, in words (its event's ``outcome``; events
    without one, from older daemons: "rejected on attempt N")."""
    attempt = body.get("attempt", 1)
    words = _OUTCOME_WORDS.get(str(body.get("outcome") or ""), "rejected on attempt {attempt}")
    return words.format(attempt=attempt)


def result_line(body: Mapping[str, object], *, exports: str | None = None, report: str | None = None) -> str:
    """A result (``cellcal/v1/result``) in words: its main transform with 1-sigma, fit, status."""
    name = main_transform(body)
    status = "active" if body.get("active") else "stored, not active"
    if body.get("suspect"):
        status += ", SUSPECT"
    stations = f", {body['n_stations']} stations" if isinstance(body.get("n_stations"), int) else ""
    parts = [f"result {body.get('result_id')} ({body.get('kind')}, run {body.get('run_id') or '-'}{stations}) {status}"]
    if name is not None:
        parts.append(pose_text(body, name))
    px = body.get("reprojection_rms_px")
    if isinstance(px, (int, float)):  # a camera's intrinsics (ADR 0030): fitted in pixels
        parts.append(f"reprojection rms {px:.4f} px")
    else:
        parts.append(fit_text(body))
    if exports is not None:
        parts.append(f"exports in {exports}")
    if report is not None:
        parts.append(f"report {report}")
    return "; ".join(parts)


_DRIFT_WORDS = {P.DRIFT_OK: "within the warning limit", P.DRIFT_WARN: "beyond the warning limit",
                P.DRIFT_FAIL: "beyond the failure limit"}
_ACTION_WORDS = {P.ACTION_NONE: "nothing to do", P.ACTION_MARKED_SUSPECT: "the result is marked suspect",
                 P.ACTION_RECALIBRATING: "the result is marked suspect and a recalibration starts"}


def drift_line(body: Mapping[str, object]) -> str:
    """A drift check (``cellcal/v1/drift``) in words."""
    status = str(body.get("status", "?"))
    dev_r = body.get("deviation_rotation_rad")
    dev = _mm(body.get("deviation_translation_m")) + ("" if dev_r is None else f" / {_deg(dev_r)}")
    cusum = as_map(body.get("cusum"), "cusum")
    alarm = " (CUSUM alarm)" if cusum.get("alarm") else ""
    return (f"drift check {body.get('check_id')} of result {body.get('result_id')}: {status.upper()}, the cell moved "
            f"{dev} at worst over {len(as_list(body.get('stations'), 'stations'))} check stations, "
            f"{_DRIFT_WORDS.get(status, status)} (warn {_mm(body.get('warn_translation_m'))}, fail "
            f"{_mm(body.get('fail_translation_m'))}); CUSUM {_mm(cusum.get('value_m'))} of "
            f"{_mm(cusum.get('h_m'))}{alarm}; {_ACTION_WORDS.get(str(body.get('action')), str(body.get('action')))}")
