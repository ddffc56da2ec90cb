"""What an intrinsics result shows: ``cellcal show``'s lines, the report's section and its four
figures, and the ROS ``camera_info`` and OpenCV FileStorage exports (ADR 0030).

The outputs of ``cellcal.daemon.runs.intrinsics.Intrinsics`` (``RunKind.show_lines``,
``report_sections``, ``write_exports``), pure functions of the stored result body
(``intrinsics.intrinsics_record``'s layout: ``camera_matrix``, ``dist_coeffs``,
``image_size``, ``reprojection_rms_px`` at the top, the rest under ``intrinsics``).

The figures (inline SVG, deterministic, like the rest of the report):

* ``fig-intrinsics-residuals``: every corner where the camera saw it, with its reprojection
  residual as an arrow magnified so the 95th-percentile residual draws 16 px long: a
  systematic pattern (arrows along the radius at the edges, a swirl) is a model the
  distortion terms do not fit, noise is arrows every which way;
* ``fig-intrinsics-radial``: each corner's radial residual (outward positive) against its
  distance from the principal point: a curve through it is distortion left over;
* ``fig-intrinsics-coverage``: the 10 x 10 grid over the image the coverage gate counts,
  occupied cells shaded, every corner a dot;
* ``fig-intrinsics-views``: each view's RMS reprojection in the fit and held out of it.

Exports beside the common ones: ``result_<id>_camera_info.yaml`` (the format of ROS's
``camera_calibration_parsers``: ``image_width``, ``image_height``, ``camera_name``,
``camera_matrix``, ``distortion_model: plumb_bob``, ``distortion_coefficients``,
``rectification_matrix`` (identity) and ``projection_matrix`` (``[K | 0]``: a monocular
camera with no rectification)) and ``result_<id>_opencv.yaml`` (OpenCV's FileStorage YAML:
``image_width``, ``image_height``, ``camera_matrix`` and ``distortion_coefficients`` as
``!!opencv-matrix``, ``reprojection_rms_px``), both written atomically; numbers with Python's
``repr``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cellcal.daemon.config import Export
from cellcal.daemon.report import html as H
from cellcal.daemon.report.exports import atomic_write_bytes
from cellcal.daemon.runs.base import ReportParts
from cellcal.daemon.store import StationRecord

__all__ = ["show_lines", "report_parts", "write_exports", "camera_info_yaml", "opencv_yaml", "export_file_names",
           "INTRINSICS_SECTION", "FIGURES"]

#: ``id`` of the report section an intrinsics result adds after the summary.
INTRINSICS_SECTION = "intrinsics"
#: ``id`` of its figures, in document order.
FIGURES = ("fig-intrinsics-residuals", "fig-intrinsics-radial", "fig-intrinsics-coverage", "fig-intrinsics-views")

_FIT, _HELD, _INK, _GRID, _SHADE = "#1f5fbf", "#e07b00", "#1b1f24", "#d0d4da", "#cfe0f7"

#: A stored result body.
ResultBody = Mapping[str, object]


def _map(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[object]:
    return list(v) if isinstance(v, (list, tuple)) else []


def _num(v: object) -> float:
    try:
        x = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float(str(v))
    except ValueError:
        return math.nan
    return x


def _camera(body: ResultBody) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], tuple[int, int]] | None:
    """``(K (3, 3), dist (5,), (width, height))`` of a body, or None."""
    K = np.array([[_num(v) for v in _list(row)] for row in _list(body.get("camera_matrix"))], dtype=float)
    d = np.array([_num(v) for v in _list(body.get("dist_coeffs"))], dtype=float)
    wh = [int(_num(v)) for v in _list(body.get("image_size"))]
    if K.shape != (3, 3) or d.shape != (5,) or len(wh) != 2:
        return None
    return K, d, (wh[0], wh[1])


# ---- cellcal show ----------------------------------------------------------------------------


def show_lines(body: ResultBody) -> list[str]:
    """The intrinsics with their 1-sigma, the reprojection, coverage and held-out figures."""
    cam = _camera(body)
    if cam is None:
        return ["  intrinsics       none stored"]
    _K, _d, (w, h) = cam
    ii = _map(body.get("intrinsics"))
    names = [str(n) for n in _list(ii.get("parameter_names"))]
    values = [_num(v) for v in _list(ii.get("parameters"))]
    sigmas = [_num(v) if v is not None else math.nan for v in _list(ii.get("sigmas"))]
    fixed = {str(n) for n in _list(ii.get("fixed"))}
    lines = [f"  camera           {w} x {h} px; target {_target_text(ii)}"]
    for name, v, s in zip(names, values, sigmas, strict=False):
        unit, digits = ("px", 3) if name in ("fx", "fy", "cx", "cy") else ("", 6)
        held = " (held)" if name in fixed else ""
        sig = f" +- {s:.{digits}f}" if math.isfinite(s) and name not in fixed else ""
        lines.append(f"    {name:<4} {v:.{digits}f}{sig} {unit}{held}".rstrip())
    hold = _map(ii.get("holdout"))
    cov = _map(ii.get("coverage"))
    lines.append(f"  reprojection     RMS {_num(body.get('reprojection_rms_px')):.4f} px over "
                 f"{ii.get('n_corners', '?')} corners of {ii.get('n_views', '?')} views; held out "
                 f"{_text(hold.get('rms_px'), 4)} px ({hold.get('method', '?')}, inflation {_text(hold.get('inflation'), 2)})")
    lines.append(f"  coverage         {_num(cov.get('fraction')) * 100:.0f} % of a {_grid_text(cov)} grid; farthest "
                 f"corner {_num(cov.get('max_radius_fraction')) * 100:.0f} % of the half-diagonal; corner noise "
                 f"{_text(ii.get('noise_px'), 4)} px ({ii.get('noise_source', '?')})")
    return lines


def _text(v: object, digits: int) -> str:
    x = _num(v) if v is not None else math.nan
    return f"{x:.{digits}f}" if math.isfinite(x) else "n/a"


def _grid_text(cov: Mapping[str, object]) -> str:
    g = [int(_num(v)) for v in _list(cov.get("grid"))]
    return f"{g[0]} x {g[1]}" if len(g) == 2 else "?"


def _target_text(ii: Mapping[str, object]) -> str:
    t = _map(ii.get("target"))
    if not t:
        return "?"
    sha = str(t.get("sha256") or "")
    return (f"{t.get('type', '?')} {t.get('squares_x', '?')}x{t.get('squares_y', '?')}, "
            f"{_num(t.get('square_m')) * 1e3:g} mm squares" + (f" (file sha256 {sha[:12]}...)" if sha else ""))


# ---- the report ------------------------------------------------------------------------------


def report_parts(body: ResultBody, stations: Sequence[StationRecord] | None) -> ReportParts:
    """The intrinsics section after the summary (its table and figures). The report's pose
    figures say they have no stations to draw: an intrinsics result has no poses."""
    cam = _camera(body)
    ii = _map(body.get("intrinsics"))
    if cam is None or not ii:
        return ReportParts(after_summary=f'<section id="{INTRINSICS_SECTION}"><h2>Camera intrinsics</h2>'
                                         '<p class="na">No intrinsics stored with this result.</p></section>',
                           stations=[])
    K, d, (w, h) = cam
    rows = "".join(f'<tr><td>{H.e(line.strip())}</td></tr>' for line in show_lines(body)[1:])
    corners = _map(ii.get("corners"))
    pts = np.array([[_num(u) for u in _list(p)] for p in _list(corners.get("image_points_px"))], dtype=float).reshape(-1, 2)
    res = np.array([[_num(u) for u in _list(p)] for p in _list(corners.get("residuals_px"))], dtype=float).reshape(-1, 2)
    figures = [
        _fig_vectors(pts, res, w, h),
        _fig_radial(pts, res, K),
        _fig_coverage(pts, _map(ii.get("coverage")), w, h),
        _fig_views(ii),
    ]
    kmat = " ".join(H.fmt(v, 3) for v in K.reshape(-1))
    intro = (f"<p>The camera's intrinsics (pinhole with Brown-Conrady distortion, OpenCV's model and order; pixel "
             f"(0, 0) is the centre of the first pixel) from views of its target, {w} x {h} px. Camera matrix "
             f"(row-major, px): <code>{H.e(kmat)}</code>; distortion k1 k2 p1 p2 k3: "
             f"<code>{H.e(' '.join(f'{v:.6g}' for v in d))}</code>.</p>")
    return ReportParts(after_summary=(f'<section id="{INTRINSICS_SECTION}"><h2>Camera intrinsics</h2>{intro}'
                                      f'<table class="intrinsics">{rows}</table>{"".join(figures)}</section>'),
                       stations=[])


def _svg(width: int, height: int, parts: Sequence[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'role="img" aria-label="{H.e(label)}"><rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>'
            + "".join(parts) + "</svg>")


def _c(v: float) -> str:
    s = f"{v:.2f}"
    return "0.00" if s == "-0.00" else s


def _figure(fig_id: str, title: str, svg: str, caption: str) -> str:
    return (f'<figure id="{fig_id}" class="figure">{svg}<figcaption><b>{H.e(title)}</b> {H.e(caption)}</figcaption>'
            "</figure>")


def _image_frame(w: int, h: int, box_w: float = 560.0) -> tuple[float, float, float, list[str]]:
    """Scale and origin drawing a ``w`` x ``h`` image in a box ``box_w`` wide, and its outline."""
    s = box_w / max(w, 1)
    x0, y0 = 40.0, 20.0
    return s, x0, y0, [f'<rect x="{_c(x0)}" y="{_c(y0)}" width="{_c(w * s)}" height="{_c(h * s)}" fill="#fbfcfd" '
                       f'stroke="{_INK}" stroke-width="1"/>',
                       f'<text x="{_c(x0)}" y="{_c(y0 - 6)}" font-size="10">(0, 0)</text>',
                       f'<text x="{_c(x0 + w * s)}" y="{_c(y0 + h * s + 14)}" font-size="10" text-anchor="end">'
                       f'({w}, {h}) px</text>']


def _fig_vectors(pts: npt.NDArray[np.float64], res: npt.NDArray[np.float64], w: int, h: int) -> str:
    title = "Reprojection residuals over the image"
    if pts.shape[0] == 0:
        return H.missing(FIGURES[0], title, "no corner residuals are stored with this result")
    s, x0, y0, parts = _image_frame(w, h)
    norm = np.hypot(res[:, 0], res[:, 1])
    p95 = float(np.percentile(norm, 95)) if norm.size else 0.0
    gain = 16.0 / (p95 * s) if p95 > 0 else 1.0
    for (u, v), (du, dv) in zip(pts, res, strict=True):
        xa, ya = x0 + u * s, y0 + v * s
        parts.append(f'<line x1="{_c(xa)}" y1="{_c(ya)}" x2="{_c(xa + du * gain * s)}" y2="{_c(ya + dv * gain * s)}" '
                     f'stroke="{_FIT}" stroke-width="1"/>')
        parts.append(f'<circle cx="{_c(xa)}" cy="{_c(ya)}" r="1.2" fill="{_INK}"/>')
    svg_h = int(y0 + h * s + 30)
    caption = (f"Each dot a corner where the camera saw it, each line its residual (detected minus reprojected) "
               f"magnified {gain:.0f}x: the 95th percentile ({p95:.3f} px) draws 16 px long.")
    return _figure(FIGURES[0], title, _svg(640, svg_h, parts, title), caption)


def _fig_radial(pts: npt.NDArray[np.float64], res: npt.NDArray[np.float64], K: npt.NDArray[np.float64]) -> str:
    title = "Radial residual against the distance from the principal point"
    if pts.shape[0] == 0:
        return H.missing(FIGURES[1], title, "no corner residuals are stored with this result")
    d = pts - np.array([K[0, 2], K[1, 2]])
    r = np.hypot(d[:, 0], d[:, 1])
    with np.errstate(invalid="ignore", divide="ignore"):
        radial = np.where(r > 0, np.sum(d * res, axis=1) / r, 0.0)
    W, Hh, x0, y0 = 560.0, 220.0, 60.0, 20.0
    rmax = max(float(r.max()), 1.0)
    amax = max(float(np.max(np.abs(radial))), 1e-3)
    parts = [f'<rect x="{_c(x0)}" y="{_c(y0)}" width="{_c(W)}" height="{_c(Hh)}" fill="#fbfcfd" stroke="{_INK}"/>',
             f'<line x1="{_c(x0)}" y1="{_c(y0 + Hh / 2)}" x2="{_c(x0 + W)}" y2="{_c(y0 + Hh / 2)}" stroke="{_GRID}"/>',
             f'<text x="{_c(x0 - 4)}" y="{_c(y0 + 8)}" font-size="10" text-anchor="end">+{amax:.3f}</text>',
             f'<text x="{_c(x0 - 4)}" y="{_c(y0 + Hh)}" font-size="10" text-anchor="end">-{amax:.3f}</text>',
             f'<text x="{_c(x0 - 4)}" y="{_c(y0 + Hh / 2 + 3)}" font-size="10" text-anchor="end">0</text>',
             f'<text x="{_c(x0 + W)}" y="{_c(y0 + Hh + 14)}" font-size="10" text-anchor="end">{rmax:.0f} px</text>',
             f'<text x="{_c(x0 + W / 2)}" y="{_c(y0 + Hh + 28)}" font-size="11" text-anchor="middle">'
             'distance from the principal point [px]</text>',
             f'<text x="{_c(14)}" y="{_c(y0 + Hh / 2)}" font-size="11" text-anchor="middle" '
             f'transform="rotate(-90 14 {_c(y0 + Hh / 2)})">radial residual [px]</text>']
    for ri, ai in zip(r, radial, strict=True):
        parts.append(f'<circle cx="{_c(x0 + ri / rmax * W)}" cy="{_c(y0 + Hh / 2 - ai / amax * Hh / 2)}" r="1.4" '
                     f'fill="{_FIT}"/>')
    caption = ("Each corner's residual along the ray from the principal point (outward positive): noise scatters "
               "about zero; a trend with the radius is distortion the model does not capture.")
    return _figure(FIGURES[1], title, _svg(640, int(y0 + Hh + 36), parts, title), caption)


def _fig_coverage(pts: npt.NDArray[np.float64], cov: Mapping[str, object], w: int, h: int) -> str:
    title = "Image coverage"
    occ = [[bool(x) for x in _list(row)] for row in _list(cov.get("occupied"))]
    if not occ:
        return H.missing(FIGURES[2], title, "no coverage grid is stored with this result")
    s, x0, y0, parts = _image_frame(w, h)
    rows, cols = len(occ), len(occ[0])
    cw, ch = w * s / cols, h * s / rows
    for i, row in enumerate(occ):
        for j, on in enumerate(row):
            parts.append(f'<rect x="{_c(x0 + j * cw)}" y="{_c(y0 + i * ch)}" width="{_c(cw)}" height="{_c(ch)}" '
                         f'fill="{_SHADE if on else "none"}" stroke="{_GRID}" stroke-width="0.5"/>')
    for u, v in pts:
        parts.append(f'<circle cx="{_c(x0 + u * s)}" cy="{_c(y0 + v * s)}" r="1" fill="{_INK}"/>')
    frac = _num(cov.get("fraction"))
    caption = (f"The {cols} x {rows} grid the coverage gate counts: {frac * 100:.0f} % of its cells hold a corner "
               "of some view (shaded); the distortion is extrapolated in the empty ones.")
    return _figure(FIGURES[2], title, _svg(640, int(y0 + h * s + 30), parts, title), caption)


def _fig_views(ii: Mapping[str, object]) -> str:
    title = "Reprojection per view"
    fit = [_num(v) for v in _list(ii.get("view_rms_px"))]
    held = [(_num(v) if v is not None else math.nan) for v in _list(_map(ii.get("holdout")).get("view_rms_px"))]
    views = [int(_num(v)) for v in _list(ii.get("views"))]
    if not fit:
        return H.missing(FIGURES[3], title, "no per-view figures are stored with this result")
    W, Hh, x0, y0 = 560.0, 200.0, 60.0, 20.0
    top = max([v for v in fit + held if math.isfinite(v)] + [1e-3])
    n = len(fit)
    bw = W / n
    parts = [f'<rect x="{_c(x0)}" y="{_c(y0)}" width="{_c(W)}" height="{_c(Hh)}" fill="#fbfcfd" stroke="{_INK}"/>',
             f'<text x="{_c(x0 - 4)}" y="{_c(y0 + 8)}" font-size="10" text-anchor="end">{top:.3f}</text>',
             f'<text x="{_c(x0 - 4)}" y="{_c(y0 + Hh)}" font-size="10" text-anchor="end">0</text>',
             f'<text x="{_c(x0 + W / 2)}" y="{_c(y0 + Hh + 28)}" font-size="11" text-anchor="middle">station</text>',
             f'<text x="{_c(14)}" y="{_c(y0 + Hh / 2)}" font-size="11" text-anchor="middle" '
             f'transform="rotate(-90 14 {_c(y0 + Hh / 2)})">RMS [px]</text>']
    for k in range(n):
        for j, (vals, colour) in enumerate(((fit, _FIT), (held, _HELD))):
            v = vals[k] if k < len(vals) else math.nan
            if not math.isfinite(v):
                continue
            bh = v / top * Hh
            parts.append(f'<rect x="{_c(x0 + k * bw + 0.1 * bw + j * 0.4 * bw)}" y="{_c(y0 + Hh - bh)}" '
                         f'width="{_c(0.4 * bw)}" height="{_c(bh)}" fill="{colour}"/>')
        label = views[k] if k < len(views) else k
        parts.append(f'<text x="{_c(x0 + (k + 0.5) * bw)}" y="{_c(y0 + Hh + 13)}" font-size="9" '
                     f'text-anchor="middle">{label}</text>')
    parts.append(f'<rect x="{_c(x0 + W - 150)}" y="{_c(y0 + 6)}" width="10" height="10" fill="{_FIT}"/>'
                 f'<text x="{_c(x0 + W - 136)}" y="{_c(y0 + 15)}" font-size="10">in the fit</text>'
                 f'<rect x="{_c(x0 + W - 80)}" y="{_c(y0 + 6)}" width="10" height="10" fill="{_HELD}"/>'
                 f'<text x="{_c(x0 + W - 66)}" y="{_c(y0 + 15)}" font-size="10">held out</text>')
    caption = ("Each view's RMS reprojection with the intrinsics fitted on every view (blue) and on the other folds "
               "only (orange): a view far above the others is one the fit leans on, or a bad detection.")
    return _figure(FIGURES[3], title, _svg(640, int(y0 + Hh + 36), parts, title), caption)


# ---- exports ----------------------------------------------------------------------------------


def export_file_names(result_id: int) -> dict[str, str]:
    """File name of each intrinsics export of a result, by key."""
    r = f"result_{int(result_id)}"
    return {"camera_info": f"{r}_camera_info.yaml", "opencv": f"{r}_opencv.yaml"}


def _r(v: float) -> str:
    return repr(float(v))


def _flow(values: Sequence[float] | npt.NDArray[np.float64]) -> str:
    return "[" + ", ".join(_r(float(v)) for v in np.asarray(values, dtype=float).reshape(-1)) + "]"


def camera_info_yaml(body: ResultBody, camera_name: str = "camera") -> str:
    """ROS ``camera_info`` YAML of an intrinsics result (module docstring)."""
    cam = _camera(body)
    if cam is None:
        raise ValueError("the result holds no intrinsics (camera_matrix, dist_coeffs, image_size)")
    K, d, (w, h) = cam
    P = np.hstack([K, np.zeros((3, 1))])
    name = camera_name  # an [export] frame name: letters, digits, _ and / (a plain YAML scalar)
    return (f"# cellcal result {body.get('result_id', '?')}: camera intrinsics, ROS camera_info "
            f"(camera_calibration_parsers YAML)\n"
            f"image_width: {w}\nimage_height: {h}\ncamera_name: {name}\n"
            f"camera_matrix:\n  rows: 3\n  cols: 3\n  data: {_flow(K.reshape(-1))}\n"
            f"distortion_model: plumb_bob\n"
            f"distortion_coefficients:\n  rows: 1\n  cols: 5\n  data: {_flow(d)}\n"
            f"rectification_matrix:\n  rows: 3\n  cols: 3\n  data: {_flow(np.eye(3).reshape(-1))}\n"
            f"projection_matrix:\n  rows: 3\n  cols: 4\n  data: {_flow(P.reshape(-1))}\n")


def opencv_yaml(body: ResultBody) -> str:
    """OpenCV FileStorage YAML of an intrinsics result (module docstring)."""
    cam = _camera(body)
    if cam is None:
        raise ValueError("the result holds no intrinsics (camera_matrix, dist_coeffs, image_size)")
    K, d, (w, h) = cam

    def mat(name: str, m: npt.NDArray[np.float64]) -> str:
        rows, cols = m.shape
        return f"{name}: !!opencv-matrix\n   rows: {rows}\n   cols: {cols}\n   dt: d\n   data: {_flow(m.reshape(-1))}\n"

    return ("%YAML:1.0\n---\n"
            f"image_width: {w}\nimage_height: {h}\n"
            + mat("camera_matrix", K) + mat("distortion_coefficients", d.reshape(1, 5))
            + f"reprojection_rms_px: {_r(_num(body.get('reprojection_rms_px')))}\n")


def write_exports(directory: Path, result_id: int, body: ResultBody, export: Export) -> dict[str, Path]:
    """The two camera files of an intrinsics result (module docstring); none without intrinsics."""
    if _camera(body) is None:
        return {}
    files = export_file_names(result_id)
    return {
        "camera_info": atomic_write_bytes(Path(directory) / files["camera_info"],
                                          camera_info_yaml(body, export.camera_frame).encode()),
        "opencv": atomic_write_bytes(Path(directory) / files["opencv"], opencv_yaml(body).encode()),
    }
