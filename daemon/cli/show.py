"""``cellcal show [RESULT_ID]`` and ``cellcal show --diff A B``: a stored result for people.

``show``: the result (default: the active one) in mm and degrees with its 1-sigma per axis
(for a kinematics result also its parameters against nominal, what was not identifiable,
the held-out validation and the ISO 9283 pose test), its gates, its warnings in words, and
the paths of its exported files. ``show --diff A B``:
how the robot base (``cell_T_base``, or the results' common primary estimate) moved from
result A to result B: translation in mm, rotation in degrees, and the same in sigmas of the
two results' combined uncertainty (their covariances added: the results are independent
calibrations).

Reads the daemon's store read-only (``cellcal.daemon.cli.results``: ``--state-dir``, or
the configuration's ``[service] state_dir``). Exit codes: 0 shown; 2 no such result, store
or configuration, or two results with nothing in common to compare.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cellcal.daemon import runs
from cellcal.daemon.cli.results import (
    CommandError,
    add_state_arguments,
    export_paths,
    open_store,
    parse_id,
    result_or_active,
)
from cellcal.daemon.report import human
from cellcal.daemon.report.advice import recommendations
from cellcal.daemon.report.reading import as_list, as_map, to_float, to_int
from cellcal.daemon.store import ResultRecord
from cellcal.solver.se3 import so3_log


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("result_id", nargs="?", default=None, metavar="RESULT_ID",
                   help="the result to show (default: the active one)")
    p.add_argument("--diff", nargs=2, metavar=("A", "B"), default=None,
                   help="how the base moved from result A to result B (mm/deg and sigmas)")
    add_state_arguments(p)


def _cov(result: Mapping[str, object], name: str) -> npt.NDArray[np.float64] | None:
    u = as_map(result.get("uncertainty"), "uncertainty")
    c = as_map(as_map(u.get("covariance"), "uncertainty.covariance").get(name), name)
    if not c:
        return None
    vals = [math.nan if v is None else to_float(v) for v in as_list(c["values"], "values")]
    return np.array(vals, dtype=float).reshape(tuple(to_int(n) for n in as_list(c["shape"], "shape")))


def _entry(result: Mapping[str, object], group: str, name: str) -> Mapping[str, object]:
    """``result[group][name]``: a transform's or a point's wire form."""
    return as_map(as_map(result[group], group)[name], f"{group}.{name}")


def _pm(v: float, s: float | None, digits: int) -> str:
    if s is None or not math.isfinite(s):
        return f"{v:.{digits}f}"
    return f"{v:.{digits}f} +- {s:.{digits}f}"


def _sigmas(C: npt.NDArray[np.float64] | None, n: int) -> list[float | None]:
    if C is None or C.shape[0] < n:
        return [None] * n
    d = np.diag(C)[:n]
    return [math.sqrt(v) if math.isfinite(v) and v >= 0 else None for v in d]


def transform_lines(name: str, wire: Mapping[str, object], C: npt.NDArray[np.float64] | None) -> list[str]:
    """``name`` in mm and deg, each axis with its 1-sigma."""
    T = np.array(wire["matrix"], dtype=float).reshape(4, 4)
    s = _sigmas(C, 6)
    t = T[:3, 3] * 1e3
    rv = np.degrees(so3_log(T[:3, :3]))
    q = as_map(wire.get("quaternion"), "quaternion")
    st = [None if v is None else v * 1e3 for v in s[:3]]
    sr = [None if v is None else math.degrees(v) for v in s[3:]]
    return [
        f"  {name}  ({wire.get('child_frame', '?')} in {wire.get('parent_frame', '?')}; 1-sigma along "
        f"{wire.get('child_frame', '?')}'s axes)",
        f"    translation mm   x {_pm(t[0], st[0], 3)}, y {_pm(t[1], st[1], 3)}, z {_pm(t[2], st[2], 3)}",
        f"    rotation deg     x {_pm(rv[0], sr[0], 4)}, y {_pm(rv[1], sr[1], 4)}, z {_pm(rv[2], sr[2], 4)}"
        "  (rotation vector)",
        f"    quaternion wxyz  {q.get('w', 0.0):.8f} {q.get('x', 0.0):.8f} {q.get('y', 0.0):.8f} {q.get('z', 0.0):.8f}",
    ]


def point_lines(name: str, wire: Mapping[str, object], C: npt.NDArray[np.float64] | None) -> list[str]:
    p = np.asarray(wire["position_m"], dtype=float) * 1e3
    s = [None if v is None else v * 1e3 for v in _sigmas(C, 3)]
    return [f"  {name}  (a point in {wire.get('frame', '?')}; 1-sigma per axis)",
            f"    position mm      x {_pm(p[0], s[0], 3)}, y {_pm(p[1], s[1], 3)}, z {_pm(p[2], s[2], 3)}"]


def residual_line(r: Mapping[str, object]) -> str:
    """The closure of the fit: translation RMS, and rotation RMS where the fit has rotation
    residuals (a point base frame or a tool point has none: said so, never printed as 0)."""
    t = r.get("rms_translation_m")
    parts = [f"translation RMS {to_float(t) * 1e3:.4f} mm" if isinstance(t, (int, float)) else "translation RMS n/a"]
    rot = r.get("rms_rotation_rad")
    if human.no_rotation_reason(r) is not None:
        parts.append("rotation RMS n/a (no orientation measured)")
    elif isinstance(rot, (int, float)):
        parts.append(f"rotation RMS {math.degrees(to_float(rot)):.5f} deg")
    n = r.get("n_stations")
    return f"  residuals        {', '.join(parts)}" + (f" ({n} stations)" if isinstance(n, int) else "")


def show_lines(rec: ResultRecord, state_dir: Path) -> list[str]:
    """The text of ``cellcal show`` for one stored result."""
    r: Mapping[str, object] = rec.result
    status = ["active" if rec.active else "not active"]
    if rec.suspect:
        status.append(f"SUSPECT ({rec.suspect_reason})")
    lines = [f"result {rec.id}: {rec.kind}, {', '.join(status)}; run {rec.run_id if rec.run_id is not None else '-'}, "
             f"created {rec.created_utc}, parent result {rec.parent_result_id or '-'}"]
    for name, w in as_map(r.get("transforms"), "transforms").items():
        lines += transform_lines(name, as_map(w, name), _cov(r, name))
    for name, w in as_map(r.get("points"), "points").items():
        lines += point_lines(name, as_map(w, name), _cov(r, name))
    lines += runs.for_body({**r, "kind": rec.kind}).show_lines(r)
    if "reprojection_rms_px" not in r:  # a camera's intrinsics have no pose residuals (their lines say the pixels')
        lines.append(residual_line({**r, "kind": rec.kind}))
    g = as_map(r.get("gates"), "gates")
    if not g:
        lines.append("  gates            none recorded")
    else:
        lines.append(f"  gates            {'passed' if g.get('passed', True) else 'FAILED'}")
        for c in (as_map(check, "gates.checks") for check in as_list(g.get("checks"), "gates.checks")):
            mark = "n/a " if c.get("applies") is False else ("ok  " if c.get("passed") else "FAIL")
            lines.append(f"    {mark} {c.get('name')}: {c.get('message')}")
    ws = runs.for_body({**r, "kind": rec.kind}).warnings(r)
    lines.append(f"  warnings         {'none' if not ws else len(ws)}")
    for w in ws:
        lines.append(f"    {w.get('code')}: {w.get('message')}")
    for advice in recommendations({**r, "kind": rec.kind}):
        lines.append(f"  recommendation   {advice}")
    paths = export_paths(state_dir, rec.id)
    lines.append(f"  exports          {'none written' if not paths else ''}".rstrip())
    lines += [f"    {p}" for p in paths]
    return lines


def _primary_common(a: Mapping[str, object], b: Mapping[str, object]) -> tuple[str, bool]:
    ta, tb = as_map(a.get("transforms"), "transforms"), as_map(b.get("transforms"), "transforms")
    if "cell_T_base" in ta and "cell_T_base" in tb:
        return "cell_T_base", False
    for name in ta:
        if name in tb:
            return name, False
    pa, pb = as_map(a.get("points"), "points"), as_map(b.get("points"), "points")
    for name in pa:
        if name in pb:
            return name, True
    raise CommandError("the two results estimate nothing in common (different kinds): nothing to compare")


def diff_lines(ra: ResultRecord, rb: ResultRecord) -> list[str]:
    """The text of ``cellcal show --diff A B``: how the primary estimate moved from A to B."""
    a: Mapping[str, object] = ra.result
    b: Mapping[str, object] = rb.result
    name, is_point = _primary_common(a, b)
    Ca, Cb = _cov(a, name), _cov(b, name)
    C = None if Ca is None or Cb is None else Ca + Cb
    head = f"result {ra.id} -> result {rb.id}: {name}"
    if is_point:
        pa = np.asarray(_entry(a, "points", name)["position_m"], dtype=float)
        pb = np.asarray(_entry(b, "points", name)["position_m"], dtype=float)
        d = pb - pa
        lines = [head, f"  moved mm         x {d[0] * 1e3:.4f}, y {d[1] * 1e3:.4f}, z {d[2] * 1e3:.4f} "
                       f"(|d| {np.linalg.norm(d) * 1e3:.4f} mm, in {_entry(a, 'points', name).get('frame', '?')})"]
        lines.append("  in sigmas        " + _mahalanobis_text(d, C))
        return lines
    Ta = np.array(_entry(a, "transforms", name)["matrix"], dtype=float).reshape(4, 4)
    Tb = np.array(_entry(b, "transforms", name)["matrix"], dtype=float).reshape(4, 4)
    parent = _entry(a, "transforms", name).get("parent_frame", "?")
    child = _entry(a, "transforms", name).get("child_frame", "?")
    dt = Tb[:3, 3] - Ta[:3, 3]
    D = np.linalg.inv(Ta) @ Tb  # B's pose in A's: the right perturbation the covariances are in
    rho, phi = D[:3, 3], so3_log(D[:3, :3])
    ang = math.degrees(float(np.linalg.norm(phi)))
    lines = [
        head,
        f"  {child} origin moved in {parent} mm: x {dt[0] * 1e3:.4f}, y {dt[1] * 1e3:.4f}, z {dt[2] * 1e3:.4f} "
        f"(|d| {np.linalg.norm(dt) * 1e3:.4f} mm)",
        f"  {child} turned by {ang:.5f} deg (rotation vector in {child} deg: x {math.degrees(phi[0]):.5f}, "
        f"y {math.degrees(phi[1]):.5f}, z {math.degrees(phi[2]):.5f})",
    ]
    xi = np.concatenate([rho, phi])
    lines.append("  in sigmas        " + _mahalanobis_text(xi, C))
    if C is not None and C.shape == (6, 6):
        lines.append(f"                   translation alone {_mahalanobis_text(rho, C[:3, :3], short=True)}, "
                     f"rotation alone {_mahalanobis_text(phi, C[3:, 3:], short=True)}")
    return lines


def _mahalanobis_text(d: npt.NDArray[np.float64], C: npt.NDArray[np.float64] | None, *, short: bool = False) -> str:
    """``sqrt(d' C^-1 d)``: how many combined sigmas the change is (``C`` the sum of both results'
    covariances)."""
    if C is None or not np.all(np.isfinite(C)):
        return "unknown (a result has no finite covariance)"
    try:
        m = float(np.sqrt(max(float(d @ np.linalg.solve(C, d)), 0.0)))
    except np.linalg.LinAlgError:
        return "unknown (singular covariance)"
    if short:
        return f"{m:.2f} sigma"
    return (f"{m:.2f} sigma (Mahalanobis distance over both results' covariances added; "
            f"{'within' if m <= 3.0 else 'BEYOND'} 3 sigma)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.diff:
            if args.result_id is not None:
                raise CommandError("give either RESULT_ID or --diff A B, not both")
            # Both ids read before the store is opened: a typo is the argument's error.
            ids = [parse_id(x, what) for x, what in zip(args.diff, ("--diff A", "--diff B"), strict=True)]
        elif args.result_id is not None:
            parse_id(args.result_id, "RESULT_ID")
        store = open_store(args)
        try:
            if args.diff:
                ra, rb = (result_or_active(store, x) for x in ids)
                lines = diff_lines(ra, rb)
            else:
                lines = show_lines(result_or_active(store, args.result_id), store.state_dir)
        finally:
            store.close()
    except CommandError as exc:
        print(f"cellcal show: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0
