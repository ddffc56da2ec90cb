"""What a camera hand-eye result shows: ``cellcal show``'s lines and the report's section (ADR 0031).

The outputs of ``cellcal.daemon.runs.hand_eye_camera.CameraHandEyeKind`` (``hand_eye`` with
the cell's camera, ``eye_to_hand``), pure functions of the stored result body
(``hand_eye_camera.camera_record``'s layout: the transforms and the closure as every result
has them, the camera at the top, the chain's figures under ``camera_hand_eye``). A body
without ``camera_hand_eye`` (a ``hand_eye`` result from given stations) shows nothing here.

The report's section (``id="camera-hand-eye"``) has a table of the chain's figures (the
intrinsics taken and how, the reprojection in and out of the fit, the static-target closure
of every view in the fit and held out, the spread of OpenCV's five closed forms and how far
the closest is in the paired bootstrap's sigmas, the bootstrap's spread against the reported
sigma, the chain's tests, and the tracker check when one ran) and two figures:

* ``fig-hand-eye-views``: each view's RMS reprojection in the fit and held out of it;
* ``fig-hand-eye-closure``: each view's static-target closure (mm) in the fit and held out;
* ``fig-hand-eye-tracker`` (when the tracker check ran): each tracker point's distance from
  the camera chain's prediction and that difference's 1-sigma (mm).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from cellcal.daemon.report import html as H
from cellcal.daemon.runs.base import ReportParts

__all__ = ["show_lines", "report_parts", "SECTION", "FIGURES"]

#: ``id`` of the report section.
SECTION = "camera-hand-eye"
#: ``id`` of its figures, in document order.
FIGURES = ("fig-hand-eye-views", "fig-hand-eye-closure", "fig-hand-eye-tracker")
_KEY = "camera_hand_eye"
_FIT, _HELD, _INK = "#1f5fbf", "#e07b00", "#1b1f24"

ResultBody = Mapping[str, object]


def _map(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[object]:
    return list(v) if isinstance(v, (list, tuple)) else []


def _num(v: object) -> float:
    if v is None or isinstance(v, bool):
        return math.nan
    try:
        return float(v) if isinstance(v, (int, float)) else float(str(v))
    except ValueError:
        return math.nan


def _t(v: object, digits: int, scale: float = 1.0) -> str:
    x = _num(v) * scale
    return f"{x:.{digits}f}" if math.isfinite(x) else "n/a"


def _accuracy_from(source: object) -> str:
    """Where a camera result's declared robot accuracy came from, for its summary line."""
    s = _map(source)
    if s.get("from") == "kinematics":
        return f" (from kinematics result {s.get('result_id', '?')}, held-out)"
    if s.get("from") == "undeclared":
        return " (undeclared)"
    return ""


def show_lines(body: ResultBody) -> list[str]:
    """The camera chain's figures, one line each (``cellcal show``)."""
    d = _map(body.get(_KEY))
    if not d:
        return []
    wh = [int(_num(v)) for v in _list(body.get("image_size"))]
    src = _map(d.get("intrinsics_source"))
    taken = f"result {src.get('result_id')}" if src.get("use") == "result" else "estimated with the hand-eye"
    ii = _map(d.get("intrinsics"))
    names = [str(n) for n in _list(ii.get("parameter_names"))]
    vals = [_num(v) for v in _list(ii.get("parameters"))]
    sig = [_num(v) for v in _list(ii.get("sigmas"))]
    focal = ", ".join(f"{n} {v:.2f} +- {s:.2f}" for n, v, s in zip(names[:4], vals[:4], sig[:4], strict=False))
    lines = [f"  camera           {d.get('setup', '?')}, {wh[0] if wh else '?'} x {wh[1] if len(wh) > 1 else '?'} px; "
             f"intrinsics {taken} ({d.get('intrinsics_mode', '?')}): {focal} px"]
    lines.append(f"  reprojection     RMS {_t(body.get('reprojection_rms_px'), 4)} px over {len(_list(d.get('views')))} "
                 f"views; held out {_t(d.get('holdout_reprojection_rms_px'), 4)} px; corner noise "
                 f"{_t(d.get('noise_px'), 4)} px ({d.get('noise_source', '?')})")
    hold = _map(body.get("holdout"))
    lines.append(f"  closure          static target {_t(body.get('rms_translation_m'), 3, 1e3)} mm RMS, max "
                 f"{_t(body.get('max_translation_m'), 3, 1e3)} mm in the fit; held out P90 "
                 f"{_t(hold.get('p90_translation_m'), 3, 1e3)} mm, "
                 f"{_t(hold.get('p90_rotation_rad'), 4, 180.0 / math.pi)} deg")
    xc = _map(d.get("cross_check"))
    if xc:
        verdict = {True: "agrees", False: "DISAGREES", None: "not judged"}.get(xc.get("agrees"), "?")  # type: ignore[call-overload]
        closest = str(xc.get("closest", "?"))
        lines.append(f"  cross-check      OpenCV's {len(_list(xc.get('methods')))} closed forms spread "
                     f"{_t(xc.get('spread_translation_m'), 3, 1e3)} mm, "
                     f"{_t(xc.get('spread_rotation_rad'), 4, 180.0 / math.pi)} deg; closest {closest} "
                     f"{_t(_map(xc.get('translation_m')).get(closest), 3, 1e3)} mm away, "
                     f"{_t(_map(xc.get('distance')).get(closest), 2)} sigma (gate {_t(xc.get('gate'), 2)}): {verdict}")
    else:
        lines.append("  cross-check      none ran")
    b = _map(d.get("bootstrap"))
    if b:
        lines.append(f"  bootstrap        {b.get('n', '?')} of {b.get('n_requested', '?')} replicates over views spread "
                     f"{_t(b.get('sigma_ratio_translation'), 2)}x (translation), {_t(b.get('sigma_ratio_rotation'), 2)}x "
                     "(rotation) the reported sigma")
    t = _map(d.get("tests"))
    r = _map(d.get("robot"))
    lines.append(f"  tests            {'MODEL ERROR' if t.get('model_error') else 'noise only'}: consistency p "
                 f"{_t(t.get('consistency_p'), 3)}, image structure p {_t(t.get('structure_p'), 3)}; robot corrections "
                 f"{_t(r.get('corrections_rms_m'), 4, 1e3)} mm RMS under a prior of "
                 f"{_t(r.get('repeatability_m'), 4, 1e3)} mm repeatability, {_t(r.get('accuracy_m'), 3, 1e3)} mm accuracy"
                 f"{_accuracy_from(r.get('accuracy_source'))}")
    pl = _map(d.get("planner"))
    if pl.get("name") == "information":
        lines.append(f"  plan             views chosen by their information of {pl.get('n_candidates', '?')} "
                     "candidates, predicted 1-sigma "
                     f"{_t(pl.get('predicted_sigma_translation_mm'), 3)} mm, "
                     f"{_t(pl.get('predicted_sigma_rotation_deg'), 4)} deg (weakest: {pl.get('weakest', '?')})")
    elif pl:
        lines.append(f"  plan             {pl.get('name', '?')}: {pl.get('reason', 'views given')}")
    tc = _map(d.get("tracker_check"))
    if tc:
        lines.append(f"  tracker check    {'passed' if tc.get('passed') else 'FAILED'}: the camera chain predicts "
                     f"{tc.get('n', '?')} tracker points to {_t(tc.get('rms_m'), 3, 1e3)} mm RMS, max "
                     f"{_t(tc.get('max_m'), 3, 1e3)} mm (via {tc.get('via', '?')}, cell_T_base of result "
                     f"{tc.get('cell_T_base_result_id', '?')}; NEES {_t(tc.get('nees'), 1)} for {tc.get('dof', '?')} "
                     f"dof, p {_t(tc.get('p_value'), 3)})")
    else:
        lines.append(f"  tracker check    {d.get('tracker_check_note') or 'none ran'}")
    dc = _map(d.get("dynamic_check"))
    if dc.get("made"):
        beyond = abs(_num(dc.get("latency_ms"))) > _num(dc.get("bound_ms"))
        lines.append(f"  dynamic check    latency {_num(dc.get('latency_ms')):+.2f} ms (1 sigma "
                     f"{_t(dc.get('sigma_ms'), 2)} ms), {'BEYOND' if beyond else 'within'} the "
                     f"{_t(dc.get('bound_ms'), 3)} ms bound: {dc.get('n_frames', '?')} frames moving both ways "
                     f"({dc.get('n_forward', '?')} / {dc.get('n_backward', '?')}) at up to "
                     f"{_t(dc.get('max_speed_m_s'), 3, 1e3)} mm/s")
    elif dc:
        lines.append(f"  dynamic check    not made: {dc.get('note', '?')}")
    return lines


def report_parts(body: ResultBody) -> ReportParts:
    """The camera hand-eye section after the summary. The report's pose figures draw the
    result's own per-view closure (its ``residuals``); the stations have no tracker pose."""
    d = _map(body.get(_KEY))
    if not d:
        return ReportParts()
    rows = "".join(f"<tr><td>{H.e(line.strip())}</td></tr>" for line in show_lines(body))
    intro = ("<p>The camera's chain fitted on the image corners of every view (maximum likelihood with the robot's "
             "pose corrections under a prior), its held-out views, and the checks against OpenCV's closed forms on "
             "the same PnP poses and the bootstrap over views (ADR 0027, 0031).</p>")
    figures = [_fig_views(d), _fig_closure(body, d)]
    tc = _map(d.get("tracker_check"))
    if tc:
        figures.append(_bars(FIGURES[2], "Tracker check per point", (
            ([_num(v) * 1e3 for v in _list(tc.get("distances_m"))], _FIT, "distance"),
            ([_num(v) * 1e3 for v in _list(tc.get("sigma_m"))], _HELD, "1-sigma")),
            _list(tc.get("plan_indices")), "[mm]",
            "Each tracker point against the camera chain's prediction of it (blue) and that difference's 1-sigma "
            "(orange): the result's, the base frame's, the view's PnP and the tracker's covariance together."))
    return ReportParts(after_summary=(f'<section id="{SECTION}"><h2>Camera hand-eye</h2>{intro}'
                                      f'<table class="camera-hand-eye">{rows}</table>{"".join(figures)}</section>'),
                       stations=[])


def _c(v: float) -> str:
    s = f"{v:.2f}"
    return "0.00" if s == "-0.00" else s


def _bars(fig_id: str, title: str, series: Sequence[tuple[Sequence[float], str, str]], labels: Sequence[object],
          unit: str, caption: str) -> str:
    n = max((len(s[0]) for s in series), default=0)
    finite = [v for s in series for v in s[0] if math.isfinite(v)]
    if n == 0 or not finite:
        return H.missing(fig_id, title, "no per-view figures are stored with this result")
    W, Hh, x0, y0 = 560.0, 200.0, 60.0, 20.0
    top = max(finite + [1e-9])
    bw = W / n
    k_series = len(series)
    parts = [f'<rect x="{_c(x0)}" y="{_c(y0)}" width="{_c(W)}" height="{_c(Hh)}" fill="#fbfcfd" stroke="{_INK}"/>',
             f'<text x="{_c(x0 - 4)}" y="{_c(y0 + 8)}" font-size="10" text-anchor="end">{top:.3g}</text>',
             f'<text x="{_c(x0 - 4)}" y="{_c(y0 + Hh)}" font-size="10" text-anchor="end">0</text>',
             f'<text x="{_c(x0 + W / 2)}" y="{_c(y0 + Hh + 28)}" font-size="11" text-anchor="middle">station</text>',
             f'<text x="14" y="{_c(y0 + Hh / 2)}" font-size="11" text-anchor="middle" '
             f'transform="rotate(-90 14 {_c(y0 + Hh / 2)})">{H.e(unit)}</text>']
    for k in range(n):
        for j, (vals, colour, _name) in enumerate(series):
            v = vals[k] if k < len(vals) else math.nan
            if not math.isfinite(v):
                continue
            bh = v / top * Hh
            parts.append(f'<rect x="{_c(x0 + k * bw + 0.1 * bw + j * 0.8 / k_series * bw)}" y="{_c(y0 + Hh - bh)}" '
                         f'width="{_c(0.8 / k_series * bw)}" height="{_c(bh)}" fill="{colour}"/>')
        label = labels[k] if k < len(labels) else k
        parts.append(f'<text x="{_c(x0 + (k + 0.5) * bw)}" y="{_c(y0 + Hh + 13)}" font-size="9" '
                     f'text-anchor="middle">{H.e(str(label))}</text>')
    for j, (_vals, colour, name) in enumerate(series):
        xl = x0 + W - 160 + 80 * j
        parts.append(f'<rect x="{_c(xl)}" y="{_c(y0 + 6)}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{_c(xl + 14)}" y="{_c(y0 + 15)}" font-size="10">{H.e(name)}</text>')
    height = int(y0 + Hh + 36)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="640" height="{height}" viewBox="0 0 640 {height}" '
           f'role="img" aria-label="{H.e(title)}"><rect x="0" y="0" width="640" height="{height}" fill="#ffffff"/>'
           + "".join(parts) + "</svg>")
    return f'<figure id="{fig_id}" class="figure">{svg}<figcaption><b>{H.e(title)}</b> {H.e(caption)}</figcaption></figure>'


def _fig_views(d: Mapping[str, object]) -> str:
    fit = [_num(v) for v in _list(d.get("view_rms_px"))]
    held = [_num(v) for v in _list(d.get("holdout_view_rms_px"))]
    return _bars(FIGURES[0], "Reprojection per view", ((fit, _FIT, "in the fit"), (held, _HELD, "held out")),
                 _list(d.get("views")), "RMS [px]",
                 "Each view's RMS reprojection through the chain fitted on every view (blue) and fitted without it "
                 "(orange): a view far above the others is one the chain leans on, or a bad detection.")


def _fig_closure(body: ResultBody, d: Mapping[str, object]) -> str:
    ct = [_num(v) * 1e3 for v in _list(_map(body.get("residuals")).get("translation_m"))]
    ht = [_num(v) * 1e3 for v in _list(_map(body.get("holdout")).get("translation_m"))]
    return _bars(FIGURES[1], "Static-target closure per view", ((ct, _FIT, "in the fit"), (ht, _HELD, "held out")),
                 _list(d.get("views")), "closure [mm]",
                 "Each view's own PnP pose carried through the robot and the fitted chain, against the fitted target "
                 "(eye-in-hand) or camera (eye-to-hand) in the base frame: what a hand-eye error moves.")
