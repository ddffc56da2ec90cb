"""Input sanity (ADR 0014): what residuals cannot reveal, checked before and after a solve.

The base-frame model ``M_i = X G_i Y`` is symmetric: swapping the robot and tracker arrays
(``G_i = X^-1 M_i Y^-1``) or inverting both (``M_i^-1 = Y^-1 G_i^-1 X^-1``) fits *exactly*
with other unknowns, and so does a consistent change of units. No closure figure can see
those mistakes; these checks can:

* **Reach** (``max_reach_m``): a robot's flange is never farther from its base than the
  arm reaches. Tracker poses given as robot poses (the cell is metres away) and poses in
  millimetres both break it; :class:`~cellcal.solver.errors.UnreachableStations` names every
  offending station.
* **Prior** (``expected_<name>``): the answer against the cell drawing, with a tolerance;
  :class:`~cellcal.solver.errors.PriorMismatch` carries the difference, and says when the
  *inverse* of the answer would have matched (inverted or swapped inputs).
* **Mount** (``max_target_offset_m``, on by default): the fitted target (camera, reflector,
  tool tip) must sit on the tool, within the limit of the flange.
  :class:`~cellcal.solver.errors.ImplausibleGeometry` otherwise: inverted inputs fit exactly
  and put it where the cell's origin is seen from the base.
* **Units** (always): a warning when translations are far beyond anything a robot cell has
  (the flange a median 5 m or more from the base, a tracker target 200 m or more away):
  probably millimetres.
* **Duplicates** (always): stations whose robot pose repeats another one exactly (a copied
  row, or one reading logged twice) would count twice and make the covariance optimistic.
  Each group of k copies is weighted 1/k (it counts as one station) and reported.
"""

from __future__ import annotations

import math

import numpy as np

from cellcal.solver.diagnostics import SolveWarning
from cellcal.solver.errors import ImplausibleGeometry, PriorMismatch, UnreachableStations
from cellcal.solver.se3 import rotation_angle
from cellcal.solver.workspace import Workspace

__all__ = [
    "MAX_TRANSLATION_M",
    "UNITS_FLANGE_M",
    "UNITS_MEASURED_M",
    "DUPLICATE_TOL",
    "check_magnitudes",
    "check_reach",
    "units_warnings",
    "mark_duplicates",
    "check_prior",
    "check_offset",
]

#: Translations beyond this (100 km) are refused as bad input: no cell is that large, and
#: the arithmetic of a solve would lose every digit that matters.
MAX_TRANSLATION_M = 1.0e5
#: A median flange distance from the base beyond this (m) draws a ``"units"`` warning:
#: the largest industrial arms reach about 4 m.
UNITS_FLANGE_M = 5.0
#: A median distance of the measured target beyond this (m) draws one too (laser trackers
#: measure to about 80 m; 200 m is millimetres of a 0.2 m cell).
UNITS_MEASURED_M = 200.0
#: Robot poses equal to this (m, and the same on rotation entries) are the same reading.
DUPLICATE_TOL = 1e-9

# A fixed direction that projects a pose's translation to one number for sorting; equal
# poses give equal keys, different ones almost surely different keys (and candidates are
# compared pose by pose afterwards).
_KEY_T = np.array([0.5773502691896258, -0.2672612419124244, 0.7715167498104596])


def check_magnitudes(a: np.ndarray, name: str, n: int, ws: Workspace) -> None:
    """``ValueError`` naming the first station whose translation exceeds
    :data:`MAX_TRANSLATION_M`."""
    t = a[:, :3, 3]
    if max(float(t.max()), -float(t.min())) * math.sqrt(3.0) <= MAX_TRANSLATION_M:
        return  # two reductions decide the common case
    d = ws.s1[:n]
    np.copyto(ws.v3a[:n], t)
    np.einsum("ij,ij->i", ws.v3a[:n], ws.v3a[:n], out=d)
    worst = float(d.max())
    if worst > MAX_TRANSLATION_M**2:
        i = int(np.argmax(d))
        raise ValueError(
            f"{name}[{i}]: translation of {math.sqrt(worst):.3g} m is beyond any cell "
            f"(limit {MAX_TRANSLATION_M:.0e} m); cellcal works in metres"
        )


def _distances(T: np.ndarray, n: int, ws: Workspace) -> np.ndarray:
    d = ws.s2[:n]
    np.copyto(ws.v3a[:n], T[:, :3, 3])
    np.einsum("ij,ij->i", ws.v3a[:n], ws.v3a[:n], out=d)
    np.sqrt(d, out=d)
    return d


def check_reach(G: np.ndarray, max_reach_m: float | None, n: int, ws: Workspace, *, measured: str) -> None:
    """Raise :class:`UnreachableStations` if a flange is beyond ``max_reach_m`` of the base.

    Parameters
    ----------
    measured : str
        Name of the other input, for the hint (``"cell_T_target"``).
    """
    if max_reach_m is None:
        return
    reach = float(max_reach_m)
    if not (math.isfinite(reach) and reach > 0.0):
        raise ValueError(f"max_reach_m must be a positive finite number, got {max_reach_m!r}")
    d = _distances(G, n, ws)
    if float(d.max()) <= reach:
        return
    bad = np.flatnonzero(d > reach)  # the refusal path may allocate
    shown = ", ".join(str(int(i)) for i in bad[:10]) + (", ..." if bad.size > 10 else "")
    med = float(np.median(d))
    hint = (f"the poses look like millimetres (median {med:.3g} from the base)" if med > 100.0 * reach else
            f"are base_T_flange and {measured} swapped? (a tracker sees the cell from metres away)")
    raise UnreachableStations(
        f"base_T_flange[{shown}]: {bad.size} of {n} flange poses are farther from the base than the arm "
        f"reaches ({float(d[bad[0]]):.3f} m at station {int(bad[0])}, max_reach_m {reach:.3f} m): {hint}",
        stations=tuple(int(i) for i in bad), distances_m=tuple(float(d[i]) for i in bad), max_reach_m=reach,
    )


def units_warnings(G: np.ndarray, n: int, ws: Workspace, M: np.ndarray | None = None,
                   measured: str = "cell_T_target") -> list[SolveWarning]:
    """``"units"`` warnings for translations far beyond a robot cell (module docstring)."""
    out = []
    srt = ws.srt[:n]
    for T, name, limit, what in ((G, "base_T_flange", UNITS_FLANGE_M, "the flange is"),
                                 (M, measured, UNITS_MEASURED_M, "the target is")):
        if T is None:
            continue
        t = T[:, :3, 3]
        if max(float(t.max()), -float(t.min())) * math.sqrt(3.0) <= limit:
            continue  # no distance can exceed the limit: no median needed
        np.copyto(srt, _distances(T, n, ws))
        srt.sort()
        med = 0.5 * (float(srt[(n - 1) // 2]) + float(srt[n // 2]))
        if med > limit:
            out.append(SolveWarning(
                code="units",
                message=(f"{name}: {what} a median {med:.4g} m from its frame's origin, far beyond a robot "
                         f"cell: are these poses in millimetres? cellcal works in metres"),
                value=med,
            ))
    return out


def mark_duplicates(G: np.ndarray, n: int, ws: Workspace) -> tuple[bool, SolveWarning | None]:
    """Weight each group of k identical robot poses 1/k in ``ws.mask``; warn about them.

    Returns ``(masked, warning)``: ``masked`` False (and ``ws.mask`` untouched) when no pose
    repeats. Allocation-free unless a duplicate exists: the poses are projected to one key
    each, sorted in place and compared with their neighbours; only equal keys are checked
    pose by pose.
    """
    if n < 2:
        return False, None
    key = ws.key[:n]
    np.copyto(ws.v3a[:n], G[:, :3, 3])
    np.matmul(ws.v3a[:n], _KEY_T, out=key)  # equal poses have equal translations: enough to sort
    srt = ws.srt[:n]
    np.copyto(srt, key)
    srt.sort()
    gap = ws.s2[: n - 1]
    np.subtract(srt[1:], srt[:-1], out=gap)
    scale = max(1.0, abs(float(srt[0])), abs(float(srt[n - 1])))
    thr = 4.0 * DUPLICATE_TOL * scale
    if float(gap.min()) > thr:  # no neighbours close: the common case, decided by one reduction
        return False, None
    close = ws.ball[: n - 1]
    np.less_equal(gap, thr, out=close)
    # Equal keys: compare those stations pose by pose (distinct poses may share a key; the
    # allocations here are the size of the candidate groups, not of N).
    flat = G.reshape(n, 16)
    groups: list[list[int]] = []
    seen: set[int] = set()
    d = ws.s3[:n]
    near = ws.ball2[:n]
    for j in np.flatnonzero(close):
        np.subtract(key, float(srt[j]), out=d)
        np.abs(d, out=d)
        np.less_equal(d, 2.0 * thr, out=near)
        cand = [int(i) for i in np.flatnonzero(near) if int(i) not in seen]
        while len(cand) > 1:
            i = cand.pop(0)
            tol = DUPLICATE_TOL * max(1.0, float(np.max(np.abs(flat[i]))))
            grp = [i] + [k for k in cand if float(np.max(np.abs(flat[k] - flat[i]))) <= tol]
            cand = [k for k in cand if k not in grp]
            if len(grp) > 1:
                groups.append(sorted(grp))
                seen.update(grp)
    if not groups:
        return False, None
    ws.mask[:n] = 1.0
    for grp in groups:
        ws.mask[grp] = 1.0 / len(grp)
    extra = sum(len(g) - 1 for g in groups)
    text = "; ".join("stations " + ", ".join(str(i) for i in g) for g in sorted(groups)[:5])
    more = "; ..." if len(groups) > 5 else ""
    return True, SolveWarning(
        code="duplicate_stations",
        message=(f"{extra} station(s) repeat the robot pose of another ({text}{more}): each group counts "
                 f"as one station, so the uncertainty is not made optimistic by the copies"),
        value=float(extra),
    )


def check_prior(T: np.ndarray, expected: np.ndarray | None, tol_m: float, tol_rad: float, name: str,
                ws: Workspace | None = None) -> None:
    """Raise :class:`PriorMismatch` if ``T`` is beyond the tolerances of ``expected``.

    Parameters
    ----------
    T : numpy.ndarray, shape (4, 4)
        The answer.
    expected : array_like, shape (4, 4), or None
        The prior (None: nothing to check).
    tol_m, tol_rad : float
        Tolerances on the translation distance (m) and the rotation angle (rad).
    name : str
        The transform's name, for the message.
    """
    if expected is None:
        return
    from cellcal.solver.se3 import check_transform

    E = check_transform(np.asarray(expected, dtype=float), f"expected_{name}")
    for v, what in ((tol_m, "expected_tolerance_m"), (tol_rad, "expected_tolerance_rad")):
        if not (math.isfinite(float(v)) and float(v) > 0.0):
            raise ValueError(f"{what} must be a positive finite number, got {v!r}")
    dt = float(np.linalg.norm(T[:3, 3] - E[:3, 3]))
    dr = rotation_angle(E[:3, :3].T @ T[:3, :3])
    if dt <= tol_m and dr <= tol_rad:
        return
    Ti = np.linalg.inv(T)
    dti = float(np.linalg.norm(Ti[:3, 3] - E[:3, 3]))
    dri = rotation_angle(E[:3, :3].T @ Ti[:3, :3])
    hint = ""
    if dti <= tol_m and dri <= tol_rad:
        hint = (f"; its inverse matches the expected one ({1e3 * dti:.1f} mm, {math.degrees(dri):.2f} deg): "
                "are the inputs inverted, or the robot and tracker arrays swapped?")
    else:
        hint = ("; check the cell drawing's frame, or whether the inputs are swapped, inverted or in "
                "millimetres (these fit exactly, so the residuals cannot tell)")
    raise PriorMismatch(
        f"{name} is {1e3 * dt:.1f} mm and {math.degrees(dr):.2f} deg from the expected one (tolerance "
        f"{1e3 * tol_m:.1f} mm, {math.degrees(tol_rad):.2f} deg){hint}",
        translation_m=dt, rotation_rad=dr, tolerance_m=tol_m, tolerance_rad=tol_rad, name=name,
    )


def check_offset(offset: np.ndarray, limit_m: float | None, name: str, what: str) -> None:
    """Raise :class:`ImplausibleGeometry` if the flange-mounted ``offset`` (3,) is farther
    than ``limit_m`` from the flange (``what`` names it in the message: "the tracker target").

    ``limit_m`` None disables the check.
    """
    if limit_m is None:
        return
    lim = float(limit_m)
    if not (math.isfinite(lim) and lim > 0.0):
        raise ValueError(f"max_target_offset_m must be a positive finite number or None, got {limit_m!r}")
    d = float(np.linalg.norm(np.asarray(offset, dtype=float)))
    if d <= lim:
        return
    raise ImplausibleGeometry(
        f"{name}: the fit puts {what} {d:.3f} m from the flange (max_target_offset_m {lim:.3f} m), where no tool "
        f"carries it: are the inputs inverted (flange_T_base and target_T_cell given for base_T_flange and "
        f"cell_T_target) or the robot and instrument arrays swapped? These fit exactly, so the residuals cannot "
        f"tell; if the mount really is that long, raise max_target_offset_m",
        name=name, distance_m=d, limit_m=lim,
    )

