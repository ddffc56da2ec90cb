"""The calibration report as one self-contained HTML file: inline SVG and CSS, no script.

One file per result (:func:`write_report`, ``result_<id>_report.html`` next to the
exports), also made on demand by ``cellcal report``. It is read offline and archived, so:

* nothing is fetched (no script, no font, no image that is not inline SVG);
* the same inputs give the same bytes (no clock is read, numbers are formatted with fixed
  digits, everything is iterated in a stable order), so a report can be compared with
  ``cmp`` and regenerated without noise in a version-control history;
* the document is well-formed XML (XHTML syntax), so it parses with ``xml.etree`` as well
  as in a browser; tests rely on both.

What it shows (``docs/report.md`` says how to read each part): the summary (frames,
direction of the transform, units, quaternion order, ``cell_T_base`` or the result's
primary transform in mm/deg and as a matrix), gates passed and failed, warnings in words,
and five figures: residual vectors per station in two orthographic views, the error
distribution of the fit and of the held-out closure, 1-sigma/2-sigma uncertainty ellipses
at the task points, axis spread and per-axis uncertainty (observability), the drift history
with its warn/fail bands and CUSUM; then provenance. A run kind adds its own sections after
the summary (``RunKind.report_sections``: a kinematics result's "Kinematic identification",
``cellcal.daemon.runs.kinematics_report``) and may say which stations the figures draw.

Inputs are the result body as the daemon publishes it (``bodies.result_body``: any result
kind on the wire: base frame from poses or points, hand-eye, eye-to-hand, tool point,
kinematics) plus, when known, the run's stations and the result's drift checks. A figure that needs data the
result does not have (station data of a result solved elsewhere, drift checks before the
first one) is drawn as a box saying so, never left out, so every report has the same
sections.

The figures are plain SVG written here (no plotting library: nothing to install on the
cell's computer, and the bytes stay deterministic).
"""

from __future__ import annotations

import html
import logging
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeAlias, cast

import numpy as np
import numpy.typing as npt

from cellcal.daemon import runs
from cellcal.daemon.bodies import result_body
from cellcal.daemon.report.advice import recommendations
from cellcal.daemon.report.exports import atomic_write_bytes
from cellcal.daemon.report.human import no_rotation_reason
from cellcal.daemon.report.reading import as_list, as_map, to_float, to_int
from cellcal.daemon.store import StationRecord, Store
from cellcal.solver.se3 import quat_from_matrix, so3_log

log = logging.getLogger(__name__)

__all__ = [
    "render_report", "write_report", "report_path", "report_from_store", "export_report", "residual_vectors",
    "REPORT_SUFFIX", "SECTIONS", "FIGURES", "MAX_DRIFT_CHECKS", "e", "fmt", "scaled", "fig_residuals", "missing",
    "Station",
]

#: A station as the report draws it: one the store kept (``StationRecord``), or one a client
#: gave with the run (a mapping with the poses as 16 numbers, ``run.plan["given"]``).
Station: TypeAlias = StationRecord | Mapping[str, object]

#: The report's file name next to the exports: ``result_<id>`` + this.
REPORT_SUFFIX = "_report.html"
#: ``id`` of every section, in document order (tests and links rely on them).
SECTIONS = ("summary", "gates", "warnings", "figures", "provenance")
#: The most recent drift checks a report draws (the store keeps them all).
MAX_DRIFT_CHECKS = 1000
#: ``id`` of every figure, in document order.
FIGURES = ("fig-residuals", "fig-distribution", "fig-ellipses", "fig-observability", "fig-drift")

# Colours of the figures (distinct, readable on white, and distinct in grey-scale print).
_FIT = "#1f5fbf"
_HELD = "#e07b00"
_FAIL = "#c81e1e"
_WARN_BAND = "#ffe08a"
_FAIL_BAND = "#f7b4b4"
_OK = "#1e8c3a"
_CUSUM = "#7b3fb5"
_GRID = "#d0d4da"
_INK = "#1b1f24"

_CSS = """
body{font-family:sans-serif;color:#1b1f24;background:#ffffff;margin:1.5em auto;max-width:70em;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;border-bottom:2px solid #1f5fbf;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #c0c4ca;padding:.2em .6em;text-align:left}
td.num{text-align:right;font-family:monospace}td:first-child{white-space:nowrap}pre{background:#f3f5f8;padding:.6em;overflow-x:auto}
.pass{color:#1e8c3a;font-weight:bold}.fail{color:#c81e1e;font-weight:bold}.na{color:#6b7280}
.warn{background:#fff4d6;border-left:4px solid #e07b00;padding:.3em .6em;margin:.3em 0}
figure{margin:1em 0;border:1px solid #d0d4da;padding:.5em}figcaption{font-size:.9em;color:#374151}
.missing{background:#f3f5f8;border:1px dashed #9ca3af;padding:1em;color:#374151}
.banner{background:#fde2e2;border:2px solid #c81e1e;padding:.5em;font-weight:bold}
svg text{font-family:sans-serif}
"""


# --------------------------------------------------------------------------------------
# small helpers


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(v: object, digits: int = 4, unit: str = "") -> str:
    """A number for people (``n/a`` when missing or not finite), fixed digits."""
    if v is None or isinstance(v, bool):
        return "n/a"
    try:
        x = to_float(v)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(x):
        return "n/a"
    if x == 0.0:
        x = 0.0  # no "-0.0000"
    return f"{x:.{digits}f}" + (f" {unit}" if unit else "")


def _num(v: float) -> str:
    """SVG coordinate: 2 decimals, no negative zero."""
    s = f"{v:.2f}"
    return "0.00" if s == "-0.00" else s


def _matrix_of(wire: object) -> npt.NDArray[np.float64]:
    return np.array(as_map(wire, "transform")["matrix"], dtype=float).reshape(4, 4)


def _covariance(body: Mapping[str, object], name: str) -> npt.NDArray[np.float64] | None:
    u = as_map(body.get("uncertainty"), "uncertainty")
    c = as_map(as_map(u.get("covariance"), "uncertainty.covariance").get(name), name)
    if not c:
        return None
    vals = [math.nan if v is None else to_float(v) for v in as_list(c.get("values", []), "values")]
    shape = tuple(to_int(s) for s in as_list(c.get("shape", []), "shape"))
    if not shape or int(np.prod(shape)) != len(vals):
        return None
    return np.array(vals, dtype=float).reshape(shape)


def _primary(body: Mapping[str, object]) -> tuple[str, npt.NDArray[np.float64] | None]:
    """The result's main estimate: ``cell_T_base`` when present, else the first transform,
    else the first point (name, value: (4, 4) or (3,))."""
    tf = as_map(body.get("transforms"), "transforms")
    if "cell_T_base" in tf:
        return "cell_T_base", _matrix_of(tf["cell_T_base"])
    for name, w in tf.items():
        return name, _matrix_of(w)
    for name, p in as_map(body.get("points"), "points").items():
        return name, np.asarray(as_map(p, name)["position_m"], dtype=float)
    return "", None


def _percentiles(v: npt.NDArray[np.float64]) -> tuple[float, float, float]:
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    return float(np.percentile(v, 50)), float(np.percentile(v, 90)), float(np.max(v))


def _nice(x: float) -> float:
    """The largest of 1, 2, 5 x 10^k not above ``x`` (x > 0)."""
    k = math.floor(math.log10(x))
    for m in (5.0, 2.0, 1.0):
        if m * 10.0 ** k <= x:
            return m * 10.0 ** k
    return 10.0 ** k


def _nice_up(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k not below ``x`` (x > 0)."""
    k = math.floor(math.log10(x))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * 10.0 ** k >= x * (1 - 1e-12):
            return m * 10.0 ** k
    return 10.0 ** (k + 1)


def _ticks(lo: float, hi: float, n: int = 5, *, integer: bool = False) -> list[float]:
    """At most about ``n`` round ticks between ``lo`` and ``hi`` (whole numbers only: ``integer``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    step = _nice_up((hi - lo) / n)
    if integer:
        step = max(step, 1.0)
    first = math.ceil(lo / step) * step
    out: list[float] = []
    t = first
    while t <= hi + 1e-9 * step and len(out) < 50:
        out.append(0.0 if abs(t) < 1e-12 * step else t)
        t += step
    return out


def _tick_text(t: float, lo: float, hi: float) -> str:
    """A tick label with as many decimals as the tick step needs (no "100 100 100")."""
    step = _nice_up((hi - lo) / 5) if hi > lo else 1.0
    digits = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    s = f"{t:.{digits}f}"
    return s[1:] if s.startswith("-") and float(s) == 0.0 else s


def _missing(fig_id: str, title: str, why: str) -> str:
    return (f'<figure id="{fig_id}" class="figure not-applicable"><figcaption><b>{_e(title)}</b></figcaption>'
            f'<div class="missing">Not shown: {_e(why)}</div></figure>')


class _Panel:
    """One plot area: data coordinates to SVG pixels, axes, grid (y grows upwards)."""

    def __init__(self, x0: float, y0: float, w: float, h: float, xr: tuple[float, float], yr: tuple[float, float],
                 *, equal: bool = False, integer_x: bool = False) -> None:
        self.x0, self.y0, self.w, self.h = x0, y0, w, h
        self.integer_x = integer_x
        (xa, xb), (ya, yb) = xr, yr
        if not xb > xa:
            xa, xb = xa - 1.0, xa + 1.0
        if not yb > ya:
            ya, yb = ya - 1.0, ya + 1.0
        if equal:  # same scale on both axes (orthographic views), centred
            s = max((xb - xa) / w, (yb - ya) / h)
            cx, cy = (xa + xb) / 2, (ya + yb) / 2
            xa, xb = cx - s * w / 2, cx + s * w / 2
            ya, yb = cy - s * h / 2, cy + s * h / 2
        self.xr, self.yr = (xa, xb), (ya, yb)

    def px(self, x: float) -> float:
        return self.x0 + (x - self.xr[0]) / (self.xr[1] - self.xr[0]) * self.w

    def py(self, y: float) -> float:
        return self.y0 + self.h - (y - self.yr[0]) / (self.yr[1] - self.yr[0]) * self.h

    def frame(self, xlabel: str, ylabel: str) -> list[str]:
        out = [f'<rect x="{_num(self.x0)}" y="{_num(self.y0)}" width="{_num(self.w)}" height="{_num(self.h)}" '
               f'fill="#fbfcfd" stroke="{_INK}" stroke-width="1"/>']
        for t in _ticks(*self.xr, integer=self.integer_x):
            x = self.px(t)
            out.append(f'<line x1="{_num(x)}" y1="{_num(self.y0)}" x2="{_num(x)}" y2="{_num(self.y0 + self.h)}" '
                       f'stroke="{_GRID}" stroke-width="0.5"/>')
            out.append(f'<text x="{_num(x)}" y="{_num(self.y0 + self.h + 13)}" font-size="10" '
                       f'text-anchor="middle">{_e(f"{t:.0f}" if self.integer_x else _tick_text(t, *self.xr))}</text>')
        for t in _ticks(*self.yr):
            y = self.py(t)
            out.append(f'<line x1="{_num(self.x0)}" y1="{_num(y)}" x2="{_num(self.x0 + self.w)}" y2="{_num(y)}" '
                       f'stroke="{_GRID}" stroke-width="0.5"/>')
            out.append(f'<text x="{_num(self.x0 - 4)}" y="{_num(y + 3)}" font-size="10" '
                       f'text-anchor="end">{_e(_tick_text(t, *self.yr))}</text>')
        out.append(f'<text x="{_num(self.x0 + self.w / 2)}" y="{_num(self.y0 + self.h + 28)}" font-size="11" '
                   f'text-anchor="middle">{_e(xlabel)}</text>')
        out.append(f'<text x="{_num(self.x0 - 40)}" y="{_num(self.y0 + self.h / 2)}" font-size="11" '
                   f'text-anchor="middle" transform="rotate(-90 {_num(self.x0 - 40)} {_num(self.y0 + self.h / 2)})">'
                   f'{_e(ylabel)}</text>')
        return out


def _svg(width: int, height: int, parts: Sequence[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(label)}">'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>' + "".join(parts) + "</svg>")


def _legend(x: float, y: float, items: Sequence[tuple[str, str]]) -> list[str]:
    out = []
    for i, (colour, text) in enumerate(items):
        yy = y + 14 * i
        out.append(f'<rect x="{_num(x)}" y="{_num(yy - 8)}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{_num(x + 14)}" y="{_num(yy + 1)}" font-size="10">{_e(text)}</text>')
    return out


# --------------------------------------------------------------------------------------
# station data


def _station_dicts(stations: Sequence[Station] | None) -> list[dict[str, npt.NDArray[np.float64]]]:
    """Stations as ``{base_T_flange, cell_T_target?, cell_p_target?, camera_T_target?}`` arrays,
    from store records (``StationRecord``) or from given stations (dicts of 16 numbers)."""
    out: list[dict[str, npt.NDArray[np.float64]]] = []
    for s in stations or ():
        d: dict[str, npt.NDArray[np.float64]] = {}
        for key, shape in (("base_T_flange", (4, 4)), ("cell_T_target", (4, 4)), ("cell_p_target", (3,)),
                           ("camera_T_target", (4, 4))):
            v = s.get(key) if isinstance(s, Mapping) else getattr(s, key, None)
            if v is not None:
                d[key] = np.asarray(v, dtype=float).reshape(shape)
        if "base_T_flange" in d:
            out.append(d)
    return out


def residual_vectors(body: Mapping[str, object],
                     stations: Sequence[Station] | None) -> tuple[str, npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Where each station is and how far the fit misses it, as 3-D vectors.

    Parameters
    ----------
    body : dict
        The result body (``transforms`` and ``points`` by name).
    stations : sequence
        The run's stations (``StationRecord``) or the given stations (dicts).

    Returns
    -------
    frame : str
        The frame both arrays are in (``"cell"`` for a base frame, ``"base"`` otherwise),
        or ``""`` when the result's kind and the stations do not allow it.
    position_m : numpy.ndarray, shape (N, 3)
        Where each station is in the workspace, metres: the measured target for a base
        frame (cell frame), the flange for the others (base frame; their measured points
        all sit near one fixed point, the pivot or the target, so they would not show the
        workspace).
    residual_m : numpy.ndarray, shape (N, 3)
        Measured minus predicted by the result, metres, in ``frame``: the target position
        (base frame), the tool tip against the pivot (tool point), the target in the base
        seen through the camera against the estimate (hand-eye, eye-to-hand).
    """
    tf = as_map(body.get("transforms"), "transforms")
    pts = as_map(body.get("points"), "points")
    st = _station_dicts(stations)
    empty = ("", np.zeros((0, 3)), np.zeros((0, 3)))
    if not st:
        return empty

    def T(name: str) -> npt.NDArray[np.float64]:
        return _matrix_of(tf[name])

    def p(name: str) -> npt.NDArray[np.float64]:
        return np.asarray(as_map(pts[name], name)["position_m"], dtype=float).reshape(3)

    pos: list[npt.NDArray[np.float64]] = []
    res: list[npt.NDArray[np.float64]] = []
    if "cell_T_base" in tf and ("flange_T_target" in tf or "flange_p_target" in pts):
        X = T("cell_T_base")
        y = T("flange_T_target")[:3, 3] if "flange_T_target" in tf else p("flange_p_target")
        frame = "cell"
        for s in st:
            meas = s["cell_T_target"][:3, 3] if "cell_T_target" in s else s.get("cell_p_target")
            if meas is None:
                return empty
            pos.append(meas)
            res.append(meas - (X @ s["base_T_flange"] @ np.append(y, 1.0))[:3])
    elif "flange_p_tip" in pts and "base_p_pivot" in pts:
        tip, pivot = p("flange_p_tip"), p("base_p_pivot")
        frame = "base"
        for s in st:
            pos.append(s["base_T_flange"][:3, 3])
            res.append((s["base_T_flange"] @ np.append(tip, 1.0))[:3] - pivot)
    elif "flange_T_camera" in tf and "base_T_target" in tf:
        C, B = T("flange_T_camera"), T("base_T_target")
        frame = "base"
        for s in st:
            if "camera_T_target" not in s:
                return empty
            pos.append(s["base_T_flange"][:3, 3])
            res.append((s["base_T_flange"] @ C @ s["camera_T_target"])[:3, 3] - B[:3, 3])
    elif "base_T_camera" in tf and "flange_T_target" in tf:
        C, Y = T("base_T_camera"), T("flange_T_target")
        frame = "base"
        for s in st:
            if "camera_T_target" not in s:
                return empty
            pos.append(s["base_T_flange"][:3, 3])
            res.append((C @ s["camera_T_target"])[:3, 3] - (s["base_T_flange"] @ Y)[:3, 3])
    else:
        return empty
    return frame, np.array(pos), np.array(res)


# --------------------------------------------------------------------------------------
# figures


def _fig_residuals(body: Mapping[str, object], stations: Sequence[Station] | None, *, fig_id: str = "fig-residuals",
                   title: str = "Residual vectors per station (two orthographic views)") -> str:
    frame, P_m, R_m = residual_vectors(body, stations)
    if not frame or len(P_m) == 0:
        why = ("the stations of this result are not stored with it (e.g. solved from stations a client sent "
               "without their measurements)" if not stations else
               "this result's kind has no per-station vector residual")
        return _missing(fig_id, title, why)
    n = len(P_m)
    held_m = as_list(as_map(body.get("holdout"), "holdout").get("translation_m"), "holdout.translation_m")
    held = np.array([math.nan if v is None else to_float(v) for v in held_m], dtype=float)
    held_marked: set[int] = set()
    if held.size == n and np.isfinite(held).any():
        p90 = float(np.percentile(held[np.isfinite(held)], 90))
        held_marked = {i for i in range(n) if not math.isfinite(held[i]) or held[i] > p90}
    down = {to_int(i) for i in as_list(body.get("downweighted"), "downweighted")}
    check = _check_positions(body, stations)
    P_mm, R_mm = P_m * 1e3, R_m * 1e3
    extent = float(np.max(np.ptp(P_mm, axis=0))) if n > 1 else 100.0
    extent = extent if extent > 0 else 100.0
    longest = float(np.max(np.linalg.norm(R_mm, axis=1))) if n else 0.0
    # The longest vector drawn about an eighth of the stations' spread: visible, not hiding them.
    mag = _nice(0.12 * extent / longest) if longest > 0 else 1.0
    ends = np.vstack([P_mm, P_mm + mag * R_mm])
    views = (("top view", 0, 1), ("front view", 0, 2))
    parts: list[str] = []
    for k, (name, a, b) in enumerate(views):
        pad = 0.08 * float(np.max(np.ptp(ends, axis=0)) or 1.0)
        panel = _Panel(70 + 420 * k, 30, 330, 300,
                       (float(ends[:, a].min()) - pad, float(ends[:, a].max()) + pad),
                       (float(ends[:, b].min()) - pad, float(ends[:, b].max()) + pad), equal=True)
        axes = "xyz"
        parts.append(f'<text x="{_num(panel.x0)}" y="20" font-size="12" font-weight="bold">'
                     f'{_e(name)}: {axes[a]}-{axes[b]} plane of the {frame} frame</text>')
        parts += panel.frame(f"{axes[a]} [mm]", f"{axes[b]} [mm]")
        for i in range(n):
            x, y = panel.px(P_mm[i, a]), panel.py(P_mm[i, b])
            x2, y2 = panel.px(P_mm[i, a] + mag * R_mm[i, a]), panel.py(P_mm[i, b] + mag * R_mm[i, b])
            colour = _FAIL if i in down else _FIT
            parts.append(f'<line class="residual" x1="{_num(x)}" y1="{_num(y)}" x2="{_num(x2)}" y2="{_num(y2)}" '
                         f'stroke="{colour}" stroke-width="2"/>')
            parts.append(f'<circle class="station" cx="{_num(x)}" cy="{_num(y)}" r="3" fill="{_INK}"/>')
            if i in held_marked:
                parts.append(f'<circle class="held-out" cx="{_num(x)}" cy="{_num(y)}" r="7" fill="none" '
                             f'stroke="{_HELD}" stroke-width="2"/>')
            if i in check:
                parts.append(f'<rect class="check-station" x="{_num(x - 6)}" y="{_num(y - 6)}" width="12" '
                             f'height="12" fill="none" stroke="{_OK}" stroke-width="1.5"/>')
    parts.append(f'<text x="70" y="392" font-size="12" font-weight="bold">residual vectors magnified x{mag:g} '
                 f'(longest {longest:.4f} mm)</text>')
    parts += _legend(500, 388, [(_FIT, "residual (measured - predicted), magnified"),
                                (_HELD, "ring: held-out closure above its P90 (or undetermined)"),
                                (_OK, "square: drift check station"), (_FAIL, "down-weighted by the robust fit")])
    where = "the target's measured position" if frame == "cell" else "the flange position"
    caption = (f"{n} stations, each drawn at {where} in the {frame} frame, mm. Each line is the station's "
               f"residual (measured minus what the result predicts) magnified x{mag:g}; the magnification is the "
               "same in both views.")
    return (f'<figure id="{fig_id}" class="figure"><figcaption><b>{_e(title)}</b>. {_e(caption)}</figcaption>'
            + _svg(840, 450, parts, title) + "</figure>")


def _check_positions(body: Mapping[str, object], stations: Sequence[Station] | None) -> set[int]:
    """Indices (in station order) of the drift check stations."""
    idx = [getattr(s, "plan_index", None) for s in stations or ()]
    want = {cs.get("plan_index") for cs in as_list(body.get("check_stations"), "check_stations")
            if isinstance(cs, Mapping)}
    return {i for i, pi in enumerate(idx) if pi is not None and pi in want}


def _cdf(panel: _Panel, v_mm: npt.NDArray[np.float64], colour: str, cls: str) -> list[str]:
    v = np.sort(v_mm[np.isfinite(v_mm)])
    if v.size == 0:
        return []
    pts = []
    for i, x in enumerate(v):
        pts.append(f"{_num(panel.px(x))},{_num(panel.py(i / v.size))}")
        pts.append(f"{_num(panel.px(x))},{_num(panel.py((i + 1) / v.size))}")
    return [f'<polyline class="{cls}" points="{" ".join(pts)}" fill="none" stroke="{colour}" stroke-width="2.5"/>']


def _fig_distribution(body: Mapping[str, object]) -> tuple[str, str]:
    title = "Error distribution: fit residuals and held-out closure"
    res = as_map(body.get("residuals"), "residuals")
    fit = np.array([math.nan if v is None else to_float(v) for v in as_list(res.get("translation_m"), "translation_m")],
                   dtype=float) * 1e3
    h = as_map(body.get("holdout"), "holdout")
    held = np.array([math.nan if v is None else to_float(v) for v in as_list(h.get("translation_m"), "translation_m")],
                    dtype=float) * 1e3
    table = _distribution_table(body, fit, held)
    if fit.size == 0 or not np.isfinite(fit).any():
        return _missing("fig-distribution", title, "the result has no per-station residuals"), table
    hi = float(np.nanmax(np.concatenate([fit[np.isfinite(fit)], held[np.isfinite(held)]])))
    hi = hi * 1.05 if hi > 0 else 1.0
    panel = _Panel(70, 30, 700, 260, (0.0, hi), (0.0, 1.0))
    parts = panel.frame("translation error per station [mm]", "fraction of stations")
    parts += _cdf(panel, fit, _FIT, "cdf-fit")
    parts += _cdf(panel, held, _HELD, "cdf-held-out")
    for label, v, colour in (("fit", fit, _FIT), ("held-out", held, _HELD)):
        p50, p90, mx = _percentiles(v)
        for name, x, dash in (("P50", p50, "2,2"), ("P90", p90, "6,3"), ("max", mx, "")):
            if math.isfinite(x):
                X = panel.px(x)
                parts.append(f'<line class="marker" x1="{_num(X)}" y1="{_num(panel.y0)}" x2="{_num(X)}" '
                             f'y2="{_num(panel.y0 + panel.h)}" stroke="{colour}" stroke-width="1"'
                             + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
                parts.append(f'<text x="{_num(X + 2)}" y="{_num(panel.y0 + 10 + (0 if label == "fit" else 12))}" '
                             f'font-size="9" fill="{colour}">{_e(name)}</text>')
    parts += _legend(600, 250, [(_FIT, "fit (in-sample residual)"), (_HELD, "held-out closure")])
    caption = ("Cumulative distribution of the per-station translation error, mm: the fit's own residuals and "
               "each station's closure against the model fitted without it. Dotted: P50, dashed: P90, solid: max.")
    fig = (f'<figure id="fig-distribution" class="figure"><figcaption><b>{_e(title)}</b>. {_e(caption)}'
           f'</figcaption>{_svg(800, 330, parts, title)}</figure>')
    return fig, table


def _distribution_table(body: Mapping[str, object], fit_mm: npt.NDArray[np.float64], held_mm: npt.NDArray[np.float64]) -> str:
    rows = []
    for label, v in (("fit", fit_mm), ("held-out", held_mm)):
        p50, p90, mx = _percentiles(v) if v.size else (math.nan, math.nan, math.nan)
        rows.append(f'<tr><td>{label}</td><td class="num">{_fmt(p50)}</td><td class="num">{_fmt(p90)}</td>'
                    f'<td class="num">{_fmt(mx)}</td></tr>')
    method = as_map(body.get("holdout"), "holdout").get("method")
    note = f"held-out method: {_e(method)}" if method else "no held-out closure for this result"
    return ('<table class="distribution"><tr><th>translation error [mm]</th><th>P50</th><th>P90</th><th>max</th></tr>'
            + "".join(rows) + f'</table><p class="na">{note}</p>')


def _ellipse(C2: npt.NDArray[np.float64], k: float) -> tuple[float, float, float]:
    """Semi-axes (a >= b) and angle (deg, from x towards y) of the k-sigma ellipse of a 2x2 covariance."""
    w, V = np.linalg.eigh(0.5 * (C2 + C2.T))
    w = np.clip(w, 0.0, None)
    a, b = k * math.sqrt(w[1]), k * math.sqrt(w[0])
    ang = math.degrees(math.atan2(V[1, 1], V[0, 1]))
    return a, b, ang


def _task_points(body: Mapping[str, object],
                 stations: Sequence[Station] | None) -> tuple[str, npt.NDArray[np.float64], list[npt.NDArray[np.float64]]]:
    """``(frame, points (K, 3) m, covariances (K, 3x3) m^2 in that frame)`` of the task points."""
    tf = as_map(body.get("transforms"), "transforms")
    pts = as_map(body.get("points"), "points")
    if "cell_T_base" in tf:
        X = _matrix_of(tf["cell_T_base"])
        C6 = _covariance(body, "cell_T_base")
        if C6 is None or not np.all(np.isfinite(C6)):
            return "", np.zeros((0, 3)), []
        given = [np.asarray(as_map(t, "task point")["point_m"], dtype=float)
                 for t in as_list(body.get("task_points"), "task_points")]
        frame, P_m, _ = residual_vectors(body, stations)
        cand = np.array(given) if given else P_m
        if len(cand) == 0:
            return "", np.zeros((0, 3)), []
        R = X[:3, :3]
        covs = []
        for p in cand:
            pb = R.T @ (p - X[:3, 3])  # the task point in the base, where the robot is told to go
            J = np.hstack([np.eye(3), -_hat(pb)])
            covs.append(R @ J @ C6 @ J.T @ R.T)  # back in the cell frame, to draw beside the stations
        return "cell", cand, covs
    if "flange_p_tip" in pts:
        C3 = _covariance(body, "flange_p_tip")
        if C3 is None or not np.all(np.isfinite(C3)):
            return "", np.zeros((0, 3)), []
        tip = as_map(pts["flange_p_tip"], "flange_p_tip")
        return "flange", np.asarray(tip["position_m"], dtype=float).reshape(1, 3), [C3]
    for name in ("flange_T_camera", "base_T_camera"):
        if name in tf:
            T = _matrix_of(tf[name])
            C6 = _covariance(body, name)
            st = _station_dicts(stations)
            if C6 is None or not np.all(np.isfinite(C6)) or not st or "camera_T_target" not in st[0]:
                return "", np.zeros((0, 3)), []
            cam = [s["camera_T_target"][:3, 3] for s in st if "camera_T_target" in s]
            out, covs = [], []
            for p in cam:
                J = np.hstack([np.eye(3), -_hat(p)])
                out.append((T @ np.append(p, 1.0))[:3])
                covs.append(T[:3, :3] @ J @ C6 @ J.T @ T[:3, :3].T)
            return name.partition("_T_")[0], np.array(out), covs
    return "", np.zeros((0, 3)), []


def _hat(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


def _fig_ellipses(body: Mapping[str, object], stations: Sequence[Station] | None) -> str:
    title = "Uncertainty at the task points: 1-sigma and 2-sigma ellipses"
    frame, P_m, covs = _task_points(body, stations)
    if not frame:
        return _missing("fig-ellipses", title, "the result has no finite covariance of its primary estimate, or no "
                                               "task points to evaluate it at (no stations stored)")
    P_mm = P_m * 1e3
    C_mm = [c * 1e6 for c in covs]
    smax = max(math.sqrt(max(float(np.linalg.eigvalsh(0.5 * (c + c.T))[-1]), 0.0)) for c in C_mm)
    extent = float(np.max(np.ptp(P_mm, axis=0))) if len(P_mm) > 1 else 0.0
    if extent <= 0:
        extent = max(8 * smax, 1e-3)
    mag = _nice(0.05 * extent / smax) if smax > 0 else 1.0
    mag = max(mag, 1.0)
    parts: list[str] = []
    axes = "xyz"
    for k, (name, a, b) in enumerate((("top view", 0, 1), ("front view", 0, 2))):
        pad = 0.1 * extent + 2.2 * mag * smax
        panel = _Panel(70 + 420 * k, 30, 330, 300,
                       (float(P_mm[:, a].min()) - pad, float(P_mm[:, a].max()) + pad),
                       (float(P_mm[:, b].min()) - pad, float(P_mm[:, b].max()) + pad), equal=True)
        scale = panel.w / (panel.xr[1] - panel.xr[0])
        parts.append(f'<text x="{_num(panel.x0)}" y="20" font-size="12" font-weight="bold">'
                     f'{_e(name)}: {axes[a]}-{axes[b]} plane of the {frame} frame</text>')
        parts += panel.frame(f"{axes[a]} [mm]", f"{axes[b]} [mm]")
        for p, C in zip(P_mm, C_mm, strict=True):
            C2 = C[np.ix_([a, b], [a, b])]
            x, y = panel.px(p[a]), panel.py(p[b])
            for ks, colour, width in ((2.0, _HELD, 1.5), (1.0, _FIT, 2.0)):
                ra, rb, ang = _ellipse(C2, ks)
                parts.append(f'<ellipse class="sigma{ks:.0f}" cx="{_num(x)}" cy="{_num(y)}" '
                             f'rx="{_num(max(ra * mag * scale, 0.5))}" ry="{_num(max(rb * mag * scale, 0.5))}" '
                             f'transform="rotate({_num(-ang)} {_num(x)} {_num(y)})" fill="none" stroke="{colour}" '
                             f'stroke-width="{width}"/>')
            parts.append(f'<circle cx="{_num(x)}" cy="{_num(y)}" r="1.5" fill="{_INK}"/>')
    parts.append(f'<text x="70" y="392" font-size="12" font-weight="bold">ellipses magnified x{mag:g} '
                 f'(largest 1-sigma {smax:.4f} mm)</text>')
    parts += _legend(560, 388, [(_FIT, "1-sigma"), (_HELD, "2-sigma")])
    src = "the configured task points" if body.get("task_points") else "the stations' positions (the workspace used)"
    caption = (f"Predicted position error of {src} when expressed through this result (the calibration's share "
               f"only), projected on two planes of the {frame} frame; ellipses magnified x{mag:g}.")
    return (f'<figure id="fig-ellipses" class="figure"><figcaption><b>{_e(title)}</b>. {_e(caption)}</figcaption>'
            + _svg(840, 430, parts, title) + "</figure>")


def _fig_observability(body: Mapping[str, object]) -> str:
    title = "Axis spread and observability"
    name, _ = _primary(body)
    C = _covariance(body, name) if name else None
    spread = body.get("axis_spread")
    parts: list[str] = []
    # axis spread gauge: 0 (parallel axes, undetermined) .. 1 (isotropic)
    gauge = _Panel(70, 40, 700, 24, (0.0, 1.0), (0.0, 1.0))
    parts.append('<text x="70" y="30" font-size="12" font-weight="bold">axis spread of the motions '
                 '(0: parallel axes, a direction undetermined; 1: isotropic)</text>')
    parts.append(f'<rect x="70" y="40" width="700" height="24" fill="#eef1f5" stroke="{_INK}"/>')
    if isinstance(spread, (int, float)) and math.isfinite(float(spread)):
        s = min(max(float(spread), 0.0), 1.0)
        parts.append(f'<rect class="spread" x="70" y="40" width="{_num(700 * s)}" height="24" fill="{_FIT}"/>')
        parts.append(f'<text x="{_num(gauge.px(s) + 4)}" y="57" font-size="11">{s:.4f}</text>')
    wa = as_map(body.get("weakest_axis"), "weakest_axis")
    unit = as_list(wa.get("unit"), "weakest_axis.unit")
    if len(unit) == 3:
        parts.append(f'<text x="70" y="82" font-size="11">weakest axis [{unit[0]:.3f} {unit[1]:.3f} {unit[2]:.3f}] '
                     f'in the {_e(wa.get("frame", "?"))} frame</text>')
    if C is not None and C.shape[0] >= 3 and np.all(np.isfinite(np.diag(C))):
        d = np.sqrt(np.clip(np.diag(C), 0.0, None))
        t_mm = d[:3] * 1e3
        groups = [("translation 1-sigma [mm]", t_mm, "xyz", "{:.4f}")]
        if C.shape[0] == 6:
            groups.append(("rotation 1-sigma [deg]", np.degrees(d[3:6]), "xyz", "{:.5f}"))
        for g, (label, vals, axes, fmt) in enumerate(groups):
            top = 115
            panel = _Panel(70 + 400 * g, top, 300, 150, (0.0, 3.0), (0.0, float(max(vals.max(), 1e-12)) * 1.15))
            parts.append(f'<text x="{_num(panel.x0)}" y="{top - 8}" font-size="12" font-weight="bold">'
                         f'{_e(name)}: {_e(label)}</text>')
            parts.append(f'<rect x="{_num(panel.x0)}" y="{top}" width="300" height="150" fill="#fbfcfd" '
                         f'stroke="{_INK}"/>')
            for i, v in enumerate(vals):
                x0, x1 = panel.px(i + 0.2), panel.px(i + 0.8)
                y = panel.py(float(v))
                colour = _HELD if i == int(np.argmax(vals)) else _FIT
                parts.append(f'<rect class="sigma-bar" x="{_num(x0)}" y="{_num(y)}" width="{_num(x1 - x0)}" '
                             f'height="{_num(panel.y0 + panel.h - y)}" fill="{colour}"/>')
                parts.append(f'<text x="{_num((x0 + x1) / 2)}" y="{_num(y - 3)}" font-size="10" '
                             f'text-anchor="middle">{_e(fmt.format(float(v)))}</text>')
                parts.append(f'<text x="{_num((x0 + x1) / 2)}" y="{_num(panel.y0 + panel.h + 13)}" '
                             f'font-size="11" text-anchor="middle">{axes[i]}</text>')
        caption = (f"The motions' axis spread, and the 1-sigma of {name} along each axis of its frame (orange: the "
                   "least determined): a bar far above the others is a direction the stations did not observe well.")
    else:
        parts.append('<text x="70" y="140" font-size="12">no finite covariance: per-axis uncertainty not computed'
                     '</text>')
        caption = "The motions' axis spread; the result has no finite covariance to show per axis."
    return (f'<figure id="fig-observability" class="figure"><figcaption><b>{_e(title)}</b>. {_e(caption)}'
            f'</figcaption>{_svg(840, 300, parts, title)}</figure>')


def _fig_drift(drift_checks: Sequence[Mapping[str, object]] | None) -> str:
    title = "Drift history with warn/fail bands and CUSUM"
    checks = [d for d in drift_checks or [] if isinstance(d.get("deviation_translation_m"), (int, float))]
    if not checks:
        return _missing("fig-drift", title, "no drift check of this result yet (run one: cellcal ctl run_drift_check; "
                                            "then regenerate the report with cellcal report)")
    checks = sorted(checks, key=lambda d: to_int(d.get("check_id", 0)))
    dev = np.array([to_float(d["deviation_translation_m"]) for d in checks]) * 1e3
    warn = to_float(checks[-1].get("warn_translation_m") or 0.0) * 1e3
    fail = to_float(checks[-1].get("fail_translation_m") or 0.0) * 1e3
    cus = np.array([to_float(as_map(d.get("cusum"), "cusum").get("value_m") or 0.0) for d in checks]) * 1e3
    h = to_float(as_map(checks[-1].get("cusum"), "cusum").get("h_m") or 0.0) * 1e3
    n = len(checks)
    hi = max(float(dev.max()), fail, warn) * 1.2 or 1.0
    parts: list[str] = []
    p1 = _Panel(70, 30, 700, 200, (0.5, n + 0.5), (0.0, hi), integer_x=True)
    parts.append(f'<rect class="band-warn" x="{_num(p1.x0)}" y="{_num(p1.py(fail))}" width="{_num(p1.w)}" '
                 f'height="{_num(p1.py(warn) - p1.py(fail))}" fill="{_WARN_BAND}"/>')
    parts.append(f'<rect class="band-fail" x="{_num(p1.x0)}" y="{_num(p1.py(hi))}" width="{_num(p1.w)}" '
                 f'height="{_num(p1.py(fail) - p1.py(hi))}" fill="{_FAIL_BAND}"/>')
    frame = p1.frame("drift check (in order)", "deviation [mm]")
    parts += [frame[0].replace('fill="#fbfcfd"', 'fill="none"')] + frame[1:]
    pts = " ".join(f"{_num(p1.px(i + 1))},{_num(p1.py(v))}" for i, v in enumerate(dev))
    parts.append(f'<polyline class="deviation" points="{pts}" fill="none" stroke="{_FIT}" stroke-width="2"/>')
    for i, (v, d) in enumerate(zip(dev, checks, strict=True)):
        colour = {"ok": _OK, "warn": _HELD, "fail": _FAIL}.get(str(d.get("status")), _INK)
        parts.append(f'<circle cx="{_num(p1.px(i + 1))}" cy="{_num(p1.py(v))}" r="4" fill="{colour}"/>')
    p2 = _Panel(70, 290, 700, 110, (0.5, n + 0.5), (0.0, max(float(cus.max()), h) * 1.2 or 1.0), integer_x=True)
    parts += p2.frame("drift check (in order)", "CUSUM [mm]")
    if h > 0:
        parts.append(f'<line class="cusum-h" x1="{_num(p2.x0)}" y1="{_num(p2.py(h))}" x2="{_num(p2.x0 + p2.w)}" '
                     f'y2="{_num(p2.py(h))}" stroke="{_FAIL}" stroke-dasharray="6,3"/>')
    pts = " ".join(f"{_num(p2.px(i + 1))},{_num(p2.py(v))}" for i, v in enumerate(cus))
    parts.append(f'<polyline class="cusum" points="{pts}" fill="none" stroke="{_CUSUM}" stroke-width="2"/>')
    for i, v in enumerate(cus):
        parts.append(f'<circle cx="{_num(p2.px(i + 1))}" cy="{_num(p2.py(v))}" r="3.5" fill="{_CUSUM}"/>')
    parts += _legend(560, 445, [(_WARN_BAND, f"warn band {warn:.3f}-{fail:.3f} mm"), (_FAIL_BAND, "fail band"),
                                (_CUSUM, f"CUSUM (alarm at h = {h:.3f} mm, dashed)")])
    caption = (f"{n} drift checks: the deviation of the re-measured check stations from what the result predicts, "
               "mm (point colour: the verdict), against the warn and fail bands; below, the CUSUM of the "
               "deviations, which raises an alarm when it crosses h.")
    return (f'<figure id="fig-drift" class="figure"><figcaption><b>{_e(title)}</b>. {_e(caption)}</figcaption>'
            + _svg(840, 500, parts, title) + "</figure>")


# --------------------------------------------------------------------------------------
# text sections


def _transform_html(name: str, T: npt.NDArray[np.float64], C: npt.NDArray[np.float64] | None) -> str:
    parent, _, child = name.partition("_T_")
    t = T[:3, 3] * 1e3
    rv = np.degrees(so3_log(T[:3, :3]))
    q = quat_from_matrix(T[:3, :3])
    sig = ""
    if C is not None and C.shape == (6, 6) and np.all(np.isfinite(np.diag(C))):
        d = np.sqrt(np.clip(np.diag(C), 0.0, None))
        sig = (f'<tr><td>1-sigma translation along {_e(child)} x y z [mm]</td><td class="num">{_fmt(d[0] * 1e3)} '
               f'{_fmt(d[1] * 1e3)} {_fmt(d[2] * 1e3)}</td></tr><tr><td>1-sigma rotation about {_e(child)} x y z [deg]'
               f'</td><td class="num">'
               f'{_fmt(math.degrees(d[3]), 5)} {_fmt(math.degrees(d[4]), 5)} {_fmt(math.degrees(d[5]), 5)}</td></tr>')
    rows = "\n".join(" ".join(f"{v: .9f}" for v in row) for row in T)
    return (f'<h3>{_e(name)}</h3><p>The pose of frame <b>{_e(child)}</b> in frame <b>{_e(parent)}</b>: it maps '
            f'coordinates in {_e(child)} to coordinates in {_e(parent)}.</p>'
            f'<table class="transform"><tr><td>translation x y z [mm]</td><td class="num">{_fmt(t[0], 3)} '
            f'{_fmt(t[1], 3)} {_fmt(t[2], 3)}</td></tr>'
            f'<tr><td>rotation vector x y z [deg] (axis times angle)</td><td class="num">{_fmt(rv[0])} {_fmt(rv[1])} '
            f'{_fmt(rv[2])}</td></tr><tr><td>rotation angle [deg]</td><td class="num">'
            f'{_fmt(math.degrees(float(np.linalg.norm(so3_log(T[:3, :3])))))}</td></tr>'
            f'<tr><td>quaternion w x y z (w &gt;= 0)</td><td class="num">{_fmt(q[0], 8)} {_fmt(q[1], 8)} '
            f'{_fmt(q[2], 8)} {_fmt(q[3], 8)}</td></tr>{sig}</table>'
            f'<p>Matrix (4x4, row-major, translation in metres):</p><pre class="matrix">{_e(rows)}</pre>')


def _point_html(name: str, point: object, C: npt.NDArray[np.float64] | None) -> str:
    wire = as_map(point, name)
    p = np.asarray(wire["position_m"], dtype=float) * 1e3
    frame = wire.get("frame") or name.partition("_p_")[0]
    sig = ""
    if C is not None and C.shape == (3, 3) and np.all(np.isfinite(np.diag(C))):
        d = np.sqrt(np.clip(np.diag(C), 0.0, None)) * 1e3
        sig = f'<tr><td>1-sigma x y z [mm]</td><td class="num">{_fmt(d[0])} {_fmt(d[1])} {_fmt(d[2])}</td></tr>'
    return (f'<h3>{_e(name)}</h3><p>A point given in frame <b>{_e(frame)}</b>.</p><table class="point"><tr>'
            f'<td>position x y z [mm]</td><td class="num">{_fmt(p[0], 3)} {_fmt(p[1], 3)} {_fmt(p[2], 3)}</td></tr>'
            f'{sig}</table>')


def _summary(body: Mapping[str, object]) -> str:
    kind = body.get("kind", "calibration")
    rid = body.get("result_id", "?")
    status = "active" if body.get("active") else "not active"
    suspect = ""
    if body.get("suspect"):
        suspect = f'<p class="banner">SUSPECT: {_e(body.get("suspect_reason") or "marked suspect")}</p>'
    u = as_map(body.get("uncertainty"), "uncertainty")
    fit = {k: body[k] for k in ("converged", "stop_reason") if k in body}
    no_rotation = no_rotation_reason({**body, "kind": kind})
    # A positions-only fit (point base frame, pivot) pairs no motions: its 0 is not a figure.
    counts = [f"{body[k]} {k[2:]}" for k in ("n_stations", "n_motions")
              if isinstance(body.get(k), int) and not (k == "n_motions" and no_rotation is not None and not body[k])]
    rows = [
        ("result", f"{rid} ({kind}), {status}, run {body.get('run_id') or 'none'}"),
        ("stations", ", ".join(counts) or "n/a"),
        ("residual translation", f"RMS {_scaled(body.get('rms_translation_m'), 1e3, 4)} mm, worst "
                                 f"{_scaled(body.get('max_translation_m'), 1e3, 4)} mm"),
        ("residual rotation", f"n/a: {no_rotation.removeprefix('does not apply: ')}" if no_rotation is not None else
         f"RMS {_scaled(body.get('rms_rotation_rad'), math.degrees(1.0), 5)} deg, worst "
         f"{_scaled(body.get('max_rotation_rad'), math.degrees(1.0), 5)} deg"),
        ("uncertainty (1 sigma)", f"{_scaled(u.get('sigma_translation_m'), 1e3, 4)} mm"
                                  + ("" if no_rotation is not None else
                                     f", {_scaled(u.get('sigma_rotation_rad'), math.degrees(1.0), 5)} deg")
                                  + (f" (noise: {u['noise_source']})" if u.get("noise_source") else "")),
        ("solver", f"{body.get('solver', '?')}; {'converged' if fit.get('converged', True) else 'DID NOT CONVERGE'}"
                   f" ({fit.get('stop_reason', '')})"),
    ]
    if "reprojection_rms_px" in body:  # a camera's intrinsics: residuals in pixels, no pose (ADR 0030)
        rows[1:5] = [("views", f"{body.get('n_stations', '?')} views of the target"),
                     ("reprojection", f"RMS {_fmt(body.get('reprojection_rms_px'))} px (section Camera intrinsics)")]
    conv = ("Frames and units: a transform named a_T_b maps coordinates in frame b to coordinates in frame a (it is "
            "the pose of b in a). Lengths are shown in millimetres and angles in degrees (the files and the wire use "
            "metres and radians). Quaternions are in the order w, x, y, z with w &gt;= 0. Rotation vectors are the "
            "axis times the angle.")
    est = []
    for name, w in as_map(body.get("transforms"), "transforms").items():
        est.append(_transform_html(name, _matrix_of(w), _covariance(body, name)))
    for name, w in as_map(body.get("points"), "points").items():
        est.append(_point_html(name, w, _covariance(body, name)))
    table = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return (f'<section id="summary"><h2>Summary</h2>{suspect}<table class="summary">{table}</table>'
            f'<p class="convention">{conv}</p>{"".join(est)}</section>')


def _scaled(v: object, factor: float, digits: int) -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return "n/a"
    return _fmt(float(v) * factor, digits)


def _gates(body: Mapping[str, object]) -> str:
    g = as_map(body.get("gates"), "gates")
    checks = g.get("checks")
    if not g:
        return '<section id="gates"><h2>Acceptance gates</h2><p class="na">No gates recorded with this result.</p></section>'
    verdict = ('<p class="pass">All gates passed: the result may become the active one.</p>' if g.get("passed", True)
               else '<p class="fail">Gates FAILED: the result was not activated.</p>')
    rows = []
    for c in (as_map(check, "gates.checks") for check in as_list(checks, "gates.checks")):
        if c.get("applies") is False:
            state = '<span class="na">does not apply</span>'
        else:
            state = '<span class="pass">passed</span>' if c.get("passed") else '<span class="fail">FAILED</span>'
        rows.append(f"<tr><td>{_e(c.get('name', ''))}</td><td>{state}</td><td>{_e(c.get('message', ''))}</td></tr>")
    if checks is None:
        rows = [f'<tr><td>?</td><td><span class="fail">FAILED</span></td><td>{_e(m)}</td></tr>'
                for m in as_list(g.get("failed", []), "gates.failed")]
    return (f'<section id="gates"><h2>Acceptance gates</h2>{verdict}<table class="gates"><tr><th>gate</th>'
            f'<th>outcome</th><th>measured</th></tr>{"".join(rows)}</table></section>')


def _warnings(body: Mapping[str, object]) -> str:
    ws = runs.for_body(body).warnings(body)
    items = "".join(f'<div class="warn"><b>{_e(w.get("code", ""))}</b>: {_e(w.get("message", ""))}</div>' for w in ws)
    t = as_map(body.get("residual_tests"), "residual_tests")
    tests = ""
    if t:
        tests = (f"<p>Residual tests: chi-square per degree of freedom {_fmt(t.get('chi2_per_dof'), 2)}"
                 f" (p {_fmt(t.get('chi2_p'), 3)}), structure test p {_fmt(t.get('structure_p'), 3)}; uncertainty "
                 f"widened x{_fmt(t.get('inflation_translation'), 2)} (translation), "
                 f"x{_fmt(t.get('inflation_rotation'), 2)} (rotation) for model error.</p>")
    none = "" if ws else "<p>No warnings: the residuals are consistent with the noise the fit assumed.</p>"
    advice = "".join(f'<p class="advice"><b>Recommendation</b>: {_e(a)}</p>' for a in recommendations(body))
    return f'<section id="warnings"><h2>Warnings</h2>{items}{none}{tests}{advice}</section>'


def _provenance(body: Mapping[str, object]) -> str:
    prov = as_map(body.get("provenance"), "provenance")
    rows: list[tuple[str, str]] = [
        ("config sha256", str(prov.get("config_sha256") or "unknown")),
        ("cellcal version", str(prov.get("cellcal_version") or "unknown")),
        ("solver", str(prov.get("solver") or body.get("solver") or "unknown")),
        ("run", str(body.get("run_id") or "none")),
        ("parent result", str(prov.get("parent_result_id") or body.get("parent_result_id") or "none")),
        ("created (UTC)", str(body.get("created_utc") or _ns_text(body.get("created_ns")))),
        ("valid from (UTC)", str(body.get("valid_from") or prov.get("valid_from") or "unknown")),
        ("robot serial", str(prov.get("robot_serial") or "unknown")),
        ("kinematics digest", str(prov.get("kinematics_digest") or "unknown")),
    ]
    devices = as_map(prov.get("devices"), "provenance.devices")
    for dev in sorted(devices):
        ident: object = devices[dev] or {}
        if isinstance(ident, Mapping):
            text = ", ".join(f"{k} {ident[k]}" for k in sorted(ident) if not isinstance(ident[k], (dict, list)))
        else:
            text = str(ident)
        rows.append((f"device {dev}", text or "identity unknown"))
    table = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return (f'<section id="provenance"><h2>Provenance</h2><table class="provenance">{table}</table>'
            f'<p class="convention">{_e(body.get("frame_convention") or "")}</p></section>')


def _ns_text(ns: object) -> str:
    if not isinstance(ns, int) or ns <= 0:
        return "unknown"
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------
# the document


def render_report(body: Mapping[str, object], *, stations: Sequence[Station] | None = None,
                  drift_checks: Sequence[Mapping[str, object]] | None = None) -> str:
    """The HTML report of one result (a complete, self-contained document).

    Parameters
    ----------
    body : dict
        The result body as published (``bodies.result_body``), any result kind.
    stations : sequence, optional
        The run's stations (``StationRecord``, in plan order, as the fit saw them) or the
        stations a client gave (dicts with 16 numbers per pose); without them the
        station figures say they are not available.
    drift_checks : sequence of dict, optional
        The result's drift check records (``bodies.drift``), any order.

    Returns
    -------
    str
        XHTML text; the same inputs always give the same text.
    """
    kind = body.get("kind", "calibration")
    name, _ = _primary(body)
    # Given stations (mappings) go to the kind as they come: a kind's sections read a station
    # through getattr or as a mapping, as these figures do (kinematics_report._through);
    # RunKind.report_sections declares the stored ones only.
    parts = runs.for_body(body).report_sections(body, cast(Sequence[StationRecord] | None, stations))
    if parts.stations is not None:
        stations = parts.stations
    dist_fig, dist_table = _fig_distribution(body)
    figures = [
        _fig_residuals(body, stations),
        dist_fig + dist_table,
        _fig_ellipses(body, stations),
        _fig_observability(body),
        _fig_drift(drift_checks),
    ]
    title = f"cellcal result {body.get('result_id', '?')}: {kind} ({name})"
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n'
        '<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8"/>'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        + _summary(body) + parts.after_summary + _gates(body) + _warnings(body)
        + '<section id="figures"><h2>Figures</h2>' + "".join(figures) + "</section>"
        + _provenance(body)
        + "</body></html>\n"
    )


def report_path(directory: str | Path, result_id: int | str) -> Path:
    """Where the report of ``result_id`` goes in the export directory."""
    return Path(directory) / f"result_{int(result_id)}{REPORT_SUFFIX}"


def report_from_store(store: Store, result_id: int, *, cell: str = "") -> str:
    """The report of a stored result, with its run's stations (or given stations) and its
    drift checks, read from ``store``."""
    rec = store.get_result(int(result_id))
    body: dict[str, object] = {**result_body(rec, cell=cell), "created_utc": rec.created_utc}
    stations: Sequence[Station] = []
    if rec.run_id is not None:
        # The stations of the fit (a kinematics run's ISO 9283 measurements are not).
        stations = runs.for_body(body).fit_stations(store.stations(rec.run_id))
        if not stations:
            run = store.get_run(rec.run_id)
            given = as_list(as_map(run.plan, "plan").get("given"), "plan.given")
            stations = [s for s in given if isinstance(s, Mapping)]
    checks = [d.record for d in store.drift_checks(rec.id, limit=MAX_DRIFT_CHECKS)]
    return render_report(body, stations=stations, drift_checks=checks)


def write_report(directory: str | Path, result_id: int, text: str) -> Path:
    """Write ``text`` as the report of ``result_id`` in ``directory``, atomically."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    return atomic_write_bytes(report_path(directory, result_id), text.encode("utf-8"))


def export_report(store: Store, result_id: int, directory: str | Path, *, cell: str = "") -> Path | None:
    """Render and write a stored result's report next to its exports (what the daemon calls
    when it stores a result). A failure is logged, never raised: the result and its other
    exports stand without the report, and ``cellcal report`` can make it later."""
    try:
        path = write_report(directory, result_id, report_from_store(store, result_id, cell=cell))
    except Exception as exc:  # noqa: BLE001 - the report must never cost the daemon a result
        log.warning("report of result %s not written: %s: %s", result_id, type(exc).__name__, exc)
        return None
    log.info("report of result %s: %s", result_id, path)
    return path


# Public names of the helpers a run kind's own report sections use (``RunKind.report_sections``).
e = _e
fmt = _fmt
scaled = _scaled
fig_residuals = _fig_residuals
missing = _missing
