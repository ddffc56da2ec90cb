"""What a kinematics result shows: ``cellcal show`` lines, the report's identification section
and "before" residual map, and the parameter, URDF and UR calibration exports.

The outputs of ``cellcal.daemon.runs.kinematics.Kinematics`` (``RunKind.show_lines``,
``report_sections``, ``write_exports``), pure functions of the stored result body
(``kinematics.gate_and_wire``'s layout), with the arm it identified
(:func:`identified_model`) and its nominal arm (:func:`driver_model`) as the drivers'
``DHModel``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from cellcal.daemon.config import Export
from cellcal.daemon.gates import gates_passed
from cellcal.daemon.report import html as H
from cellcal.daemon.report.exports import atomic_write_bytes, robot_name, write_json_result
from cellcal.daemon.report.human import kinematic_unit
from cellcal.daemon.report.refused import mark_refused, refused_text
from cellcal.daemon.runs.base import ReportParts
from cellcal.daemon.store import StationRecord
from cellcal.drivers.kinematics import DHModel
from cellcal.solver import DHParameters, ur_calibration_yaml, urdf_from_model
from cellcal.solver.kinematic_export import origin_sigmas_from_parameters

__all__ = ["show_lines", "report_parts", "write_exports", "kinematics_lines", "identification_section",
           "identified_stations", "nominal_residuals_figure", "kinematics_export_file_names",
           "write_kinematics_exports", "driver_model", "identified_model", "KINEMATICS_SECTION", "KINEMATICS_FIGURE"]

#: ``id`` of the report section only a kinematics result has, right after the summary.
KINEMATICS_SECTION = "kinematics"
#: ``id`` of the figure a kinematics result adds in its own section (before the others):
#: the residuals of the nominal arm with its own best rigid base frame and target.
KINEMATICS_FIGURE = "fig-residuals-nominal"

#: A stored result body.
ResultBody = Mapping[str, object]
#: A station the report draws: a stored one, or a client-supplied one as its dict.
ReportStation = StationRecord | Mapping[str, object]


def _num(v: object, factor: float, digits: int) -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        return "n/a"
    return f"{float(v) * factor:.{digits}f}"


def _map(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def show_lines(body: ResultBody) -> list[str]:
    """``cellcal show``'s lines for a kinematics result (:func:`kinematics_lines`)."""
    return kinematics_lines(body.get("kinematics"))


def report_parts(body: ResultBody, stations: Sequence[StationRecord] | None) -> ReportParts:
    """The identification section (with the nominal arm's residual map) and the stations the
    report's figures draw: through the identified arm, to which its base frame belongs."""
    return ReportParts(after_summary=identification_section(body, nominal_residuals_figure(body, stations)),
                       stations=identified_stations(body, stations))


def write_exports(directory: Path, result_id: int, body: ResultBody, export: Export) -> dict[str, Path]:
    """The kinematics result's own exports (:func:`write_kinematics_exports`)."""
    return write_kinematics_exports(directory, result_id, body, export)


def driver_model(params: DHParameters | Mapping[str, object], name: str | None = None) -> DHModel:
    """The solver's model (or the ``identified`` dict of a stored result) as a drivers' ``DHModel``."""
    get = params.get if isinstance(params, Mapping) else (lambda k, d=None: getattr(params, k, d))
    label = name or str(get("name", "identified") or "identified")
    return DHModel(label, np.asarray(get("d"), dtype=float), np.asarray(get("a"), dtype=float),
                   np.asarray(get("alpha"), dtype=float), np.asarray(get("theta"), dtype=float),
                   np.asarray(get("beta"), dtype=float))


def identified_model(result: Mapping[str, object] | None) -> DHModel | None:
    """The identified arm of a stored kinematics result as a ``DHModel`` (None without one)."""
    if not result:
        return None
    ident = _map(result.get("kinematics") or {}).get("identified")
    if not ident or not isinstance(ident, Mapping):
        return None
    return driver_model(ident, name=f"{ident.get('name') or 'identified'}")


def kinematics_lines(k: object) -> list[str]:
    """The ``kinematics`` block of a kinematics result (``kinematics.gate_and_wire``):
    the identified parameters against nominal with their 1-sigma, what could not be
    identified and why, the held-out validation before and after, and the ISO 9283 pose
    test (or why it was not measured). Lengths in mm, angles in degrees."""
    if not isinstance(k, Mapping):
        return ["  kinematics       none recorded"]
    nominal, params = _map(k.get("nominal")), _map(k.get("parameters"))
    lines = [f"  kinematics       {nominal.get('name') or '?'} nominal, {k.get('measurement') or '?'} measurements, "
             f"{len(params)} parameters identified; condition number {_num(k.get('condition_number'), 1.0, 1)}, "
             f"{'converged' if k.get('converged', True) else 'NOT converged'} ({k.get('stop_reason') or '?'})"]
    if params:
        width = max(len(str(n)) for n in params)
        lines.append(f"    {'parameter':<{width}}  unit {'nominal':>12} {'identified':>12} {'delta':>11} {'1-sigma':>10}")
        for name, p in params.items():
            p = _map(p)
            unit, f, dig = kinematic_unit(str(name))
            val, delta = p.get("value"), p.get("delta")
            nom = (float(val) - float(delta)
                   if isinstance(val, (int, float)) and isinstance(delta, (int, float)) else None)
            lines.append(f"    {name!s:<{width}}  {unit:<4} {_num(nom, f, dig - 1):>12} {_num(val, f, dig - 1):>12} "
                         f"{_num(delta, f, dig - 1):>11} {_num(p.get('sigma'), f, dig - 1):>10}")
    reasons = _map(k.get("unidentifiable_reasons"))
    names = [str(n) for n in k.get("unidentifiable") or []] or sorted(str(n) for n in reasons)
    if names:
        lines.append("    not identifiable from these stations (fixed at nominal):")
        lines += [f"      {n}: {reasons.get(n) or 'no reason recorded'}" for n in names]
    lines += _considered_lines(k)
    v = k.get("validation")
    if isinstance(v, Mapping) and isinstance(v.get("after"), Mapping):
        before, after = _map(v.get("before")), _map(v["after"])
        lines.append(f"  held-out         {after.get('n_stations', '?')} validation stations never fitted, "
                     "nominal arm -> identified arm:")
        for label, key in (("RMS", "rms_translation_m"), ("P90", "p90_translation_m"), ("max", "max_translation_m")):
            lines.append(f"    {label:<4} {_num(before.get(key), 1e3, 4):>9} mm -> {_num(after.get(key), 1e3, 4):>9} mm")
        if isinstance(after.get("rms_rotation_rad"), (int, float)):
            lines.append(f"    orientation RMS {_num(before.get('rms_rotation_rad'), math.degrees(1.0), 5)} deg -> "
                         f"{_num(after.get('rms_rotation_rad'), math.degrees(1.0), 5)} deg")
    else:
        lines.append("  held-out         no validation stations measured with this result")
    iso = k.get("iso9283")
    if isinstance(iso, Mapping) and isinstance(iso.get("before"), Mapping) and isinstance(iso.get("after"), Mapping):
        b, a = iso["before"], iso["after"]
        lines.append(f"  ISO 9283         {iso.get('cycles', '?')} cycles at P1-P5, nominal arm -> identified arm: "
                     f"worst AP {_num(b.get('max_ap_m'), 1e3, 4)} -> {_num(a.get('max_ap_m'), 1e3, 4)} mm, "
                     f"worst RP {_num(b.get('max_rp_m'), 1e3, 4)} -> {_num(a.get('max_rp_m'), 1e3, 4)} mm")
    elif isinstance(k.get("iso9283_not_measured"), str) and k["iso9283_not_measured"]:
        lines.append(f"  ISO 9283         not measured: {k['iso9283_not_measured']}")
    else:
        lines.append("  ISO 9283         not part of this result")
    return lines


def _considered(k: Mapping[str, object]) -> tuple[list[tuple[str, str, str]], str]:
    """The parameters held at nominal whose prior the sigmas carry (name, prior 1-sigma in edge
    units with its unit, why), and the weak-excitation sentence ('' when none) (ADR 0016)."""
    rows = []
    for name, c in _map(k.get("considered")).items():
        c = _map(c)
        unit, f, dig = kinematic_unit(str(name))
        rows.append((str(name), f"{_num(c.get('prior_sigma'), f, dig - 1)} {unit}", str(c.get("reason") or "")))
    weak = _map(k.get("weak_excitation"))
    sentence = ""
    if weak:
        listed_j, listed_p = weak.get("joints"), weak.get("parameters")  # joints 1-based (solver)
        joints = ", ".join(f"joint{int(j)}" for j in (listed_j if isinstance(listed_j, list) else [])
                           if isinstance(j, (int, float)))
        params = ", ".join(str(p) for p in (listed_p if isinstance(listed_p, list) else []))
        sentence = (f"weakly excited: {joints or 'some joints'} moved too little to identify {params or 'some parameters'}"
                    "; their prior uncertainty is in every sigma and in the predictions (consider covariance)")
    return rows, sentence


def _considered_lines(k: Mapping[str, object]) -> list[str]:
    rows, weak = _considered(k)
    lines = []
    if rows:
        lines.append("    held at nominal, their prior uncertainty carried in every sigma (consider covariance):")
        lines += [f"      {n}: 1-sigma {prior} ({why})" for n, prior, why in rows]
    if weak:
        lines.append(f"    {weak}")
    return lines


def identification_section(body: ResultBody, before_map: str = "") -> str:
    """The "Kinematic identification" section of a kinematics result, ending with
    ``before_map`` (:func:`nominal_residuals_figure`)."""
    k = body.get("kinematics")
    head = f'<section id="{KINEMATICS_SECTION}"><h2>Kinematic identification</h2>'
    if not isinstance(k, Mapping):
        return head + '<p class="na">This result carries no kinematics block.</p></section>'
    nominal = k.get("nominal") or {}
    conv = (f"Model: {H.e(nominal.get('name') or '?')} nominal, {H.e(k.get('convention') or 'standard DH')}. "
            f"Measured as {H.e(k.get('measurement') or '?')}s; noise {H.e(k.get('noise_source') or '?')}; "
            f"{H.e(k.get('dof', '?'))} degrees of freedom. Lengths in mm, angles in deg; nominal = identified - "
            "delta (a joint's zero offset is itself the correction, nominal 0).")
    rows = []
    params = k.get("parameters") or {}
    for name in params:  # the identification's own order (its preference order)
        p = params[name] or {}
        unit, f, dig = kinematic_unit(name)
        val, delta = p.get("value"), p.get("delta")
        nom = float(val) - float(delta) if isinstance(val, (int, float)) and isinstance(delta, (int, float)) else None
        rows.append(f'<tr class="parameter"><td>{H.e(name)}</td><td>{unit}</td><td class="num">{H.scaled(nom, f, dig)}'
                    f'</td><td class="num">{H.scaled(val, f, dig)}</td><td class="num">{H.scaled(delta, f, dig)}</td>'
                    f'<td class="num">{H.scaled(p.get("sigma"), f, dig)}</td></tr>')
    table = ('<table class="kinematic-parameters"><tr><th>parameter</th><th>unit</th><th>nominal</th>'
             '<th>identified</th><th>delta</th><th>1-sigma</th></tr>' + "".join(rows) + "</table>"
             if rows else '<p class="na">No parameter was identified.</p>')
    reasons = k.get("unidentifiable_reasons")
    if not isinstance(reasons, Mapping):
        reasons = {}
    names = [str(n) for n in k.get("unidentifiable") or []] or sorted(str(n) for n in reasons)
    if names:
        un = ('<p>Not identifiable from these stations, fixed at their nominal values:</p>'
              '<table class="unidentifiable"><tr><th>parameter</th><th>why</th></tr>'
              + "".join(f'<tr class="unidentifiable-parameter"><td>{H.e(n)}</td><td>{H.e(reasons.get(n) or "")}</td>'
                        "</tr>" for n in names) + "</table>")
    else:
        un = "<p>Every parameter considered was identifiable from these stations.</p>"
    crow, weak = _considered(k)
    if crow:
        un += ('<p>Held at nominal; their prior uncertainty is carried in every sigma and prediction (consider '
               'covariance):</p><table class="considered"><tr><th>parameter</th><th>prior 1-sigma</th><th>why</th></tr>'
               + "".join(f"<tr><td>{H.e(n)}</td><td>{H.e(p)}</td><td>{H.e(w)}</td></tr>" for n, p, w in crow)
               + "</table>")
    if weak:
        un += f'<p class="warn">{H.e(weak)}</p>'
    cond = k.get("condition_number")
    facts = [("condition number (column-normalised Jacobian)", H.fmt(cond, 1)),
             ("converged", f"{'yes' if k.get('converged', True) else 'NO'} ({k.get('stop_reason', '')})"),
             ("observability O1, O3", f"{H.fmt(k.get('observability_o1'), 6)}, {H.fmt(k.get('observability_o3'), 6)}")]
    corr = [c for c in k.get("correlations") or [] if isinstance(c, (list, tuple)) and len(c) == 3]
    corr.sort(key=lambda c: (-abs(float(c[2] or 0.0)), str(c[0]), str(c[1])))
    if corr:
        shown = ", ".join(f"{c[0]} / {c[1]} {H.fmt(c[2], 3)}" for c in corr[:10])
        more = f" (and {len(corr) - 10} more)" if len(corr) > 10 else ""
        facts.append(("strongest correlations", shown + more))
    facts_html = ('<table class="kinematic-facts">'
                  + "".join(f"<tr><td>{H.e(a)}</td><td>{H.e(b)}</td></tr>" for a, b in facts) + "</table>")
    return (head + f'<p class="convention">{conv}</p>{table}{un}{facts_html}{_validation(k)}{before_map}'
            "</section>")


def _validation(k: Mapping[str, object]) -> str:
    v = k.get("validation")
    out = ["<h3>Validation on held-out stations</h3>"]
    if isinstance(v, Mapping) and isinstance(v.get("after"), Mapping):
        before, after = v.get("before") or {}, v.get("after") or {}
        n = after.get("n_stations", before.get("n_stations", "?"))
        out.append(f"<p>{H.e(n)} stations the identification never saw: the error of the nominal arm (its own best "
                   "base frame and target fitted on the same stations) and of the identified arm.</p>")
        rows = []
        for label, key in (("RMS", "rms_translation_m"), ("P50", "p50_translation_m"), ("P90", "p90_translation_m"),
                           ("max", "max_translation_m"), ("pairwise distance RMS", "pairwise_rms_m"),
                           ("pairwise distance max", "pairwise_max_m")):
            rows.append(f'<tr><td>{label} [mm]</td><td class="num">{H.scaled(before.get(key), 1e3, 4)}</td>'
                        f'<td class="num">{H.scaled(after.get(key), 1e3, 4)}</td></tr>')
        for label, key in (("RMS", "rms_rotation_rad"), ("P50", "p50_rotation_rad"), ("P90", "p90_rotation_rad"),
                           ("max", "max_rotation_rad")):
            if isinstance(after.get(key), (int, float)):  # None for point measurements: no orientation
                rows.append(f'<tr><td>orientation {label} [deg]</td><td class="num">'
                            f'{H.scaled(before.get(key), math.degrees(1.0), 5)}</td><td class="num">'
                            f'{H.scaled(after.get(key), math.degrees(1.0), 5)}</td></tr>')
        out.append('<table class="kinematic-validation"><tr><th>held-out error</th>'
                   '<th>before (nominal)</th><th>after (identified)</th></tr>' + "".join(rows) + "</table>")
    else:
        out.append('<p class="na">No held-out validation stations were measured with this result.</p>')
    iso = k.get("iso9283")
    not_measured = k.get("iso9283_not_measured")
    if isinstance(iso, Mapping) and iso:
        out.append(_iso9283(iso))
    elif isinstance(not_measured, str) and not_measured:
        out.append("<h3>ISO 9283 pose test</h3>"
                   f'<p class="na">ISO 9283 not measured: {H.e(not_measured)}</p>')
    else:
        out.append('<p class="na">ISO 9283 pose accuracy (AP) and repeatability (RP) are not part of this result: '
                   "they need repeated cycles at the ISO test poses, which a calibration run does not make; "
                   "bench/kinematics_bench.py measures them in a simulated cell, before and after identification."
                   "</p>")
    return "".join(out)


def _iso9283(iso: Mapping[str, object]) -> str:
    """The ISO 9283 pose test of a kinematics result: the worst pose before and after, then
    AP and RP per pose (and orientation AP for 6-DoF measurements)."""
    groups = [(g, _map(iso[g])) for g in ("before", "after") if isinstance(iso.get(g), Mapping)] or [("", iso)]
    centre = iso.get("cube_centre_m")
    where = ""
    if isinstance(centre, (list, tuple)) and len(centre) == 3:
        where = (f" on the diagonal plane of a cube of side {H.scaled(iso.get('cube_side_m'), 1e3, 1)} mm about "
                 f"({', '.join(H.scaled(v, 1e3, 1) for v in centre)}) mm in the base frame")
    head = ("<h3>ISO 9283 pose test</h3>"
            f"<p>P1-P5{where}, {H.e(iso.get('cycles', '?'))} cycles, measured by the tracker "
            f"({H.e(iso.get('measurement') or 'pose')} measurements). Before: joint targets from the nominal arm's "
            "inverse kinematics (with its own best rigid base frame and target); after: from the identified arm's. "
            "AP: distance of the mean attained position from the commanded one; RP: repeatability (mean + 3 "
            "standard deviations of the distance from the mean), mm.</p>")
    rows = [f'<tr><td>{H.e(g or "identified")}</td><td class="num">{H.scaled(d.get("max_ap_m"), 1e3, 4)}</td>'
            f'<td class="num">{H.scaled(d.get("max_rp_m"), 1e3, 4)}</td></tr>' for g, d in groups]
    worst = ('<table class="iso9283"><tr><th>ISO 9283, worst pose of P1-P5 [mm]</th><th>AP</th><th>RP</th>'
             "</tr>" + "".join(rows) + "</table>")
    before, after = iso.get("before"), iso.get("after")
    if not (isinstance(before, Mapping) and isinstance(after, Mapping)):
        return head + worst
    poses = iso.get("poses") or ("P1", "P2", "P3", "P4", "P5")
    names = [str(n) for n in (poses if isinstance(poses, (list, tuple)) else ())]

    def at(d: Mapping[str, object], key: str, j: int, factor: float, digits: int) -> str:
        v = d.get(key)
        if not isinstance(v, (list, tuple)) or j >= len(v):
            return "n/a"
        x = v[j]
        if isinstance(x, (list, tuple)):  # orientation AP a, b, c: its magnitude
            vals = [float(c) for c in x if isinstance(c, (int, float))]
            x = math.sqrt(sum(c * c for c in vals)) if len(vals) == 3 else None
        return H.scaled(x, factor, digits)

    orient = isinstance(after.get("ap_abc_rad"), (list, tuple)) and bool(after.get("ap_abc_rad"))
    cols = ["AP before", "AP after", "RP before", "RP after"] + (["orientation AP before, |a, b, c| [deg]",
                                                                 "orientation AP after, |a, b, c| [deg]"] if orient else [])
    body_rows = []
    for j, name in enumerate(names):
        cells = [at(before, "ap_m", j, 1e3, 4), at(after, "ap_m", j, 1e3, 4), at(before, "rp_m", j, 1e3, 4),
                 at(after, "rp_m", j, 1e3, 4)]
        if orient:
            cells += [at(before, "ap_abc_rad", j, math.degrees(1.0), 5), at(after, "ap_abc_rad", j, math.degrees(1.0), 5)]
        body_rows.append(f"<tr><td>{H.e(name)}</td>" + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>")
    per_pose = ('<table class="iso9283-poses"><tr><th>pose [mm]</th>' + "".join(f"<th>{H.e(c)}</th>" for c in cols)
                + "</tr>" + "".join(body_rows) + "</table>")
    return head + worst + per_pose


def identified_stations(body: ResultBody,
                        stations: Sequence[StationRecord] | None) -> list[ReportStation] | None:
    """A kinematics result's stations with the flange pose the identified arm gives at the
    joints read: its ``cell_T_base`` and target belong to that model, and against the
    controller's nominal FK every residual would show the kinematic error the result
    removed. Stations without joint angles are left out (nothing to predict them with)."""
    if stations is None:
        return None
    model = identified_model(body)
    if model is None:
        return list(stations)
    return _through(model, stations)


def _through(model: DHModel, stations: Sequence[ReportStation]) -> list[ReportStation]:
    """``stations`` with the flange pose ``model`` gives at each one's joints (those without
    joint angles left out)."""
    out: list[ReportStation] = []
    for s in stations:
        q = s.get("q_rad") if isinstance(s, Mapping) else getattr(s, "q_rad", None)
        if not isinstance(q, (list, tuple, np.ndarray)) or len(q) != 6:
            continue
        G = np.asarray(model.forward(np.asarray(q, dtype=float)), dtype=float).reshape(4, 4)
        if isinstance(s, Mapping):
            out.append({**s, "base_T_flange": G})
        elif dataclasses.is_dataclass(s) and not isinstance(s, type):
            out.append(dataclasses.replace(s, base_T_flange=G))
        else:
            out.append({k: getattr(s, k) for k in ("plan_index", "cell_T_target", "cell_p_target")
                        if getattr(s, k, None) is not None} | {"base_T_flange": G})
    return out


def nominal_residuals_figure(body: ResultBody, stations: Sequence[StationRecord] | None) -> str:
    """The residuals before identification: the stations through the nominal arm (its FK at
    the joints read) against the nominal arm's own best rigid base frame and target
    (``kinematics.nominal_fit``); the same views as ``fig-residuals``, which shows them
    after. "" when the result has no nominal fit (stored before it was kept)."""
    k = body.get("kinematics")
    fit = k.get("nominal_fit") if isinstance(k, Mapping) else None
    title = "Before identification: residual vectors of the nominal arm with its own best base frame and target"
    if not isinstance(fit, Mapping):
        return ""
    nominal = k.get("nominal") if isinstance(k, Mapping) else None
    if not nominal or stations is None:
        return H.missing(KINEMATICS_FIGURE, title, "the stations or the nominal arm of this result are not stored "
                        "with it")
    before = _through(driver_model(nominal, name=str(nominal.get("name") or "nominal")), stations)
    view = {**body, "transforms": fit.get("transforms") or {}, "points": fit.get("points") or {},
            "holdout": None, "downweighted": [], "check_stations": []}
    return H.fig_residuals(view, before, fig_id=KINEMATICS_FIGURE, title=title)


def kinematics_export_file_names(result_id: int) -> dict[str, str]:
    """File name of each export of a kinematics result beside the others, by key."""
    r = f"result_{int(result_id)}"
    return {"kinematics": f"{r}_kinematics.json", "arm_urdf": f"{r}_arm.urdf",
            "ur_calibration": f"{r}_ur_calibration.yaml"}


def _is_ur(result_dict: Mapping[str, object]) -> bool:
    """Whether the result's robot is a UR controller (its own FK; the ROS driver's YAML applies)."""
    robot = _map(_map(_map(result_dict.get("provenance") or {}).get("devices") or {}).get("robot") or {})
    return str(robot.get("driver", "")).startswith("Ur")


def write_kinematics_exports(directory: str | os.PathLike[str], result_id: int, result_dict: Mapping[str, object],
                             export: Export | None = None) -> dict[str, Path]:
    """The exports of a kinematics result (``kind = "kinematics"``), each atomically.

    ``result_<id>_kinematics.json``
        The identified parameters with values, deltas and sigmas, the unidentifiable ones
        with reasons, the nominal and identified DH arrays, the frames and the held-out
        figures (``cellcal.solver.kinematic_parameters_json``'s layout, the stored
        ``kinematics`` of the result).
    ``result_<id>_arm.urdf``
        The arm's chain with the calibrated joint origins (``cellcal.solver.urdf_from_model``),
        robot name ``[export] robot_name`` + ``_arm``.
    ``result_<id>_ur_calibration.yaml``
        For a UR robot only: the UR ROS driver's calibration file
        (``cellcal.solver.ur_calibration_yaml``).

    Raises
    ------
    ValueError
        A result without ``kinematics.identified`` DH arrays.
    StoreError
        A file that cannot be written.
    """
    kin = result_dict.get("kinematics")
    if not isinstance(kin, Mapping):
        raise ValueError(f"result {result_id}: a kinematics result without its kinematics")
    ident = kin.get("identified")
    if not isinstance(ident, Mapping):
        raise ValueError(f"result {result_id}: a kinematics result without kinematics.identified DH arrays")
    model = DHParameters(a=ident["a"], d=ident["d"], alpha=ident["alpha"], theta=ident["theta"],
                         beta=ident.get("beta", [0.0] * 6), name=str(ident.get("name", "identified")))
    directory = Path(directory)
    files = kinematics_export_file_names(result_id)
    # Each joint origin's 1-sigma (the consider covariance's: ADR 0016) as a comment beside it.
    sigmas = origin_sigmas_from_parameters(kin)
    refused = not gates_passed(result_dict)
    doc = {"result_id": int(result_id), "active": bool(result_dict.get("active", False)),
           "suspect": bool(result_dict.get("suspect", False)), **kin}
    if refused:  # the same marks as the generic exports of a refused result (report/refused.py)
        doc = {"GATES_FAILED": refused_text(result_dict), **doc}
    texts = {"arm_urdf": urdf_from_model(model, robot_name=f"{robot_name(export)}_arm", origin_sigmas=sigmas)}
    if _is_ur(result_dict):
        texts["ur_calibration"] = ur_calibration_yaml(model, origin_sigmas=sigmas)
    if refused:
        texts = {k: mark_refused("urdf", t, result_dict) if k == "arm_urdf"
                 else f"# {refused_text(result_dict)}\n{t}" for k, t in texts.items()}
    out = {"kinematics": write_json_result(directory / files["kinematics"], doc)}
    for key, text in texts.items():
        out[key] = atomic_write_bytes(directory / files[key], text.encode())
    return out
