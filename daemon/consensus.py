"""The per-station gross-error test against the run's consensus fit (ADR 0032).

The rough-estimate test of every station (``capture.Expected``) fits *all* accepted
stations: one wrong station among the first few drags that fit and widens its bound
(20 x its RMS closure), so a wrong reflector on every second station, 25 mm off, passes it.
This test is robust instead: once a run has a few stations (:data:`MIN_STATIONS`), each
new station is judged with the accepted ones by a minimal-subset consensus,

0. with more stations than subsets tried, when the accepted stations agree with their own
   joint fit (each was judged on arrival), that fit is the consensus, and only the new
   station is judged (a joint fit of few stations would absorb a gross error among them);
1. else fits from minimal subsets of the stations (:data:`SUBSET_SIZE`: 3 poses, 4 points, 3
   pivot poses; every subset when there are few, else :data:`MAX_SUBSETS` drawn with a
   fixed seed), each fit scored by how many stations lie within ``[tracker]
   consensus_error_mm`` / ``consensus_error_deg`` of it (ties: the smaller truncated
   squared deviation sum, MSAC);
2. the best subset's inliers fitted together (the consensus fit) and every station's
   deviation from it computed again;
3. a consensus only when two thirds of the stations, and a minimal subset at least (its
   fit is redundant already: 3 poses over-determine a base frame), agree on it. Without
   one, when the other stations agree with a fit of their own (a wrong reflector on every
   second station is a consistent model: the cell shifted by its offset), the run's
   stations are **split** into two groups the data cannot choose between: the run ends,
   named (``consensus_split``), rather than guess by a bare majority; else nothing is
   judged yet.

A station beyond the consensus is the run's gross error: the new one is rejected
(``consensus_outlier``; the run measures it once more, then gives it up), an accepted one
is dropped from the run (``Store.drop_station``). The fits are the solver's own linear ones
(no refinement, no hold-out): ``calibrate_base_frame``, ``calibrate_base_frame_points``,
``calibrate_tool_point``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellcal.daemon.consistency import RejectReason, StationRejected
from cellcal.daemon.store import StationRecord
from cellcal.solver import CalibrationError, calibrate_base_frame, calibrate_base_frame_points, calibrate_tool_point
from cellcal.solver.calibrate import CHECK_SPREAD
from cellcal.solver.se3 import rotation_angle

__all__ = ["POSE", "POINT", "PIVOT", "SUBSET_SIZE", "MIN_STATIONS", "MAX_SUBSETS", "Consensus", "Screened",
           "consensus", "screen"]

#: The models a run's stations are judged with: 6-DoF poses (``base_frame``), 3-DoF points
#: (``base_frame`` measuring points) and the pivot of robot poses alone (``tool_point``).
POSE, POINT, PIVOT = "pose", "point", "pivot"
#: Stations of a minimal subset fit.
SUBSET_SIZE = {POSE: 3, POINT: 4, PIVOT: 3}
#: Stations (the new one included) before the consensus judges any: two more than a
#: minimal subset, so a majority leaves a redundant fit.
MIN_STATIONS = {POSE: 5, POINT: 6, PIVOT: 5}
#: Minimal subsets drawn at most (all of them when there are fewer), per model: with half
#: the stations wrong, 200 draws of 3 miss every all-good subset with probability 3e-12, 60
#: draws of 4 with 2 % (a point fit costs ten times a pose fit; a miss judges nothing, and
#: the next station draws again). Beyond the stations whose every subset this many covers
#: (11 poses, 7 points), the accepted stations' joint fit is the consensus when they agree
#: with it (one fit), and subsets are drawn only when they do not.
MAX_SUBSETS = {POSE: 200, POINT: 60, PIVOT: 200}
#: Subset fits must have this axis spread (the rough estimate's, ``solve.ESTIMATE_MIN_AXIS_SPREAD``):
#: a subset whose motions share nearly one axis extrapolates its noise to the others.
_MIN_SUBSET_SPREAD = 0.1
#: The spread a fit of many stations together needs (the accepted stations' joint fit, the
#: consensus fit, the other group of a split): the solver's default floor.
_MIN_JOINT_SPREAD = 1e-4


@dataclass(frozen=True)
class Consensus:
    """What most of a run's stations agree on.

    Attributes
    ----------
    inliers : tuple of int
        Positions (in the stations judged) within the bounds of the consensus fit.
    deviation_m : (n,) array
        Each station's distance from the consensus fit's prediction, m.
    deviation_rad : (n,) array or None
        Each pose's rotation from the prediction, rad (None: points, pivot).
    split : tuple of int
        Not a consensus (empty when it is one): the stations outside ``inliers`` agree with
        a fit of their own, distinct from it, and neither group has two thirds of the
        stations: which is right cannot be told (a wrong reflector on every second station).
    """

    inliers: tuple[int, ...]
    deviation_m: npt.NDArray[np.float64]
    deviation_rad: npt.NDArray[np.float64] | None
    split: tuple[int, ...] = ()

    def outliers(self) -> tuple[int, ...]:
        """Positions of the stations beyond the consensus."""
        return tuple(i for i in range(len(self.deviation_m)) if i not in self.inliers)


_Fit = Callable[[npt.NDArray[np.intp], float], tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]]


def _fitter(model: str, G: npt.NDArray[np.float64], M: npt.NDArray[np.float64] | None, P: npt.NDArray[np.float64] | None) -> _Fit:
    """``fit(indices, min_axis_spread) -> (deviation_m (n,), deviation_rad (n,) or None)``
    of every station from the model fitted to the stations at ``indices``. Raises ``CalibrationError`` or
    ``ValueError`` for a subset that determines nothing."""
    opts = {"refine": False, "holdout": False}

    if model == POSE:
        assert M is not None

        def fit_pose(idx: npt.NDArray[np.intp], spread: float = _MIN_SUBSET_SPREAD
                     ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]:
            # The one refusal that needs the covariance (a rotation fixed only beyond a bound)
            # is made for nearly parallel axes alone, below CHECK_SPREAD: a fit held to a
            # larger spread never reaches it, so it skips the covariance and the diagnostics
            # (the same transforms and refusals; most of a run's screening CPU).
            r = calibrate_base_frame(G[idx], M[idx], min_axis_spread=spread, uncertainty=spread < CHECK_SPREAD,
                                     **opts)
            pred = r.cell_T_base @ G @ r.flange_T_target
            dt = np.linalg.norm(pred[:, :3, 3] - M[:, :3, 3], axis=1)
            dr = np.array([rotation_angle(a[:3, :3].T @ b[:3, :3]) for a, b in zip(pred, M, strict=True)])
            return dt, dr

        return fit_pose
    if model == POINT:
        assert P is not None

        def fit_point(idx: npt.NDArray[np.intp], spread: float = _MIN_SUBSET_SPREAD
                      ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]:
            r = calibrate_base_frame_points(G[idx], P[idx], min_axis_spread=spread, **opts)
            pred = (r.cell_T_base @ G)[:, :3, :3] @ r.flange_p_target + (r.cell_T_base @ G)[:, :3, 3]
            return np.linalg.norm(pred - P, axis=1), None

        return fit_point

    def fit_pivot(idx: npt.NDArray[np.intp], spread: float = _MIN_SUBSET_SPREAD
                  ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]:
        r = calibrate_tool_point(G[idx], min_axis_spread=spread, holdout=False)
        tips = G[:, :3, :3] @ r.flange_p_tip + G[:, :3, 3]
        return np.linalg.norm(tips - r.base_p_pivot, axis=1), None

    return fit_pivot


def _subsets(n: int, k: int, seed: int, most: int) -> list[npt.NDArray[np.intp]]:
    if math.comb(n, k) <= most:
        return [np.array(c) for c in itertools.combinations(range(n), k)]
    rng = np.random.default_rng(seed)
    return [np.sort(rng.choice(n, size=k, replace=False)) for _ in range(most)]


def consensus(model: str, G: npt.NDArray[np.float64], *, M: npt.NDArray[np.float64] | None = None,
              P: npt.NDArray[np.float64] | None = None,
              max_error_m: float, max_error_rad: float = math.inf, seed: int = 0) -> Consensus | None:
    """The consensus of a run's stations (module docstring), or None when there is none yet.

    Parameters
    ----------
    model : {"pose", "point", "pivot"}
    G : (n, 4, 4) array
        ``base_T_flange`` of the stations, m.
    M : (n, 4, 4) array, optional
        ``cell_T_target`` (model ``"pose"``), m.
    P : (n, 3) array, optional
        ``cell_p_target`` (model ``"point"``), m.
    max_error_m, max_error_rad : float
        A station within both of the consensus fit agrees with it (m, rad).
    seed : int
        Of the subsets drawn when there are many (the result is reproducible).
    """
    n, k = len(G), SUBSET_SIZE[model]
    if n < MIN_STATIONS[model]:
        return None
    fit = _fitter(model, G, M, P)

    def score(dev: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]) -> tuple[npt.NDArray[np.bool_], float]:
        dt, dr = dev
        ok = dt <= max_error_m
        cost = np.minimum(dt / max_error_m, 1.0) ** 2
        if dr is not None:
            ok &= dr <= max_error_rad
            cost = np.maximum(cost, np.minimum(dr / max_error_rad, 1.0) ** 2)
        return ok, float(cost.sum())

    # Many stations, one fit: the run's accepted stations (all but the last) agree with their
    # own joint fit (each was judged on arrival, and those beyond were dropped), so that fit
    # is the consensus the new station is judged against. Not while the stations are few
    # enough to try every subset: a joint fit of few stations absorbs a gross error among
    # them (5 points and a reflector 15 mm off all lie within 5 mm of their joint fit).
    ok = np.zeros(n, dtype=bool)
    if math.comb(n, k) > MAX_SUBSETS[model]:
        try:
            dev = fit(np.arange(n - 1), _MIN_JOINT_SPREAD)
            ok, _ = score(dev)
        except (CalibrationError, ValueError, np.linalg.LinAlgError):
            ok = np.zeros(n, dtype=bool)
    if bool(ok[:-1].all()):
        return Consensus(tuple(int(i) for i in np.flatnonzero(ok)), np.asarray(dev[0], dtype=float),
                         None if dev[1] is None else np.asarray(dev[1], dtype=float))
    best: tuple[int, float, npt.NDArray[np.bool_]] | None = None
    for idx in _subsets(n, k, seed, MAX_SUBSETS[model]):
        try:
            ok, cost = score(fit(idx, _MIN_SUBSET_SPREAD))
        except (CalibrationError, ValueError, np.linalg.LinAlgError):
            continue  # a subset that determines nothing (its motions about one axis ...)
        if best is None or (int(ok.sum()), -cost) > (best[0], -best[1]):
            best = (int(ok.sum()), cost, ok)
    if best is None or best[0] < k:
        return None
    inl = np.flatnonzero(best[2])
    try:
        dev = fit(inl, _MIN_JOINT_SPREAD)  # the consensus fit: the agreeing stations together
        ok, _ = score(dev)
    except (CalibrationError, ValueError, np.linalg.LinAlgError):
        return None
    found = Consensus(tuple(int(i) for i in np.flatnonzero(ok)), np.asarray(dev[0], dtype=float),
                      None if dev[1] is None else np.asarray(dev[1], dtype=float))
    if len(found.inliers) >= _needed(n, k):
        return found
    # No clear majority. The rest may be a consistent model of its own (a wrong reflector
    # is the cell shifted by its offset): two groups the data cannot choose between.
    rest = np.array(found.outliers())
    if len(rest) < k:
        return None  # too few to tell yet
    try:
        other, _ = score(fit(rest, _MIN_JOINT_SPREAD))
    except (CalibrationError, ValueError, np.linalg.LinAlgError):
        return None
    if bool(other[rest].all()) and not bool(other[list(found.inliers)].any()):
        return dataclasses.replace(found, split=tuple(int(i) for i in rest))
    return None


def _needed(n: int, k: int) -> int:
    """Stations that must agree for a consensus: two thirds of them (a bare majority of an
    alternating wrong reflector is a guess between two consistent groups), and a minimal
    subset at least."""
    return max(k, math.ceil(2.0 * n / 3.0))


@dataclass(frozen=True)
class Screened:
    """The consensus test's verdict on a new station (:func:`screen`).

    Attributes
    ----------
    drop : tuple of (StationRecord, StationRejected)
        Accepted stations beyond the consensus, each with the rejection it is dropped with.
    rejection : StationRejected or None
        The new station's rejection (``consensus_outlier``), or None when it agrees.
    ends_run : bool
        The stations are split into two consistent groups (``consensus_split``, the
        ``rejection``): the run cannot be finished honestly and ends with that reason.
    """

    drop: tuple[tuple[StationRecord, StationRejected], ...] = ()
    rejection: StationRejected | None = None
    ends_run: bool = False


def screen(model: str, accepted: Sequence[StationRecord], new: StationRecord, *, max_error_m: float,
           max_error_rad: float) -> Screened | None:
    """Judge ``new`` with the run's ``accepted`` stations by their consensus (module
    docstring): None when there is no consensus yet, else what to drop and whether ``new``
    is rejected (both with their deviations and the bounds in the rejection's figures)."""
    stations = [*accepted, new]
    G = np.array([s.base_T_flange for s in stations], dtype=float)
    M = P = None
    if model == POSE:
        if any(s.cell_T_target is None for s in stations):
            return None
        M = np.array([s.cell_T_target for s in stations], dtype=float)
    elif model == POINT:
        if any(s.cell_p_target is None for s in stations):
            return None
        P = np.array([np.asarray(s.cell_p_target, dtype=float).reshape(3) for s in stations])
    found = consensus(model, G, M=M, P=P, max_error_m=max_error_m, max_error_rad=max_error_rad, seed=len(stations))
    if found is None:
        return None

    def rejection(i: int, what: str) -> StationRejected:
        dt = float(found.deviation_m[i])
        dr = None if found.deviation_rad is None else float(found.deviation_rad[i])
        rot = "" if dr is None else f" / {math.degrees(dr):.4f} deg"
        lim = "" if dr is None else f" / consensus_error_deg = {math.degrees(max_error_rad):g}"
        figures: dict[str, object] = {
            "consensus_deviation_m": dt, "consensus_deviation_rad": dr, "consensus_bound_m": max_error_m,
            "consensus_bound_rad": None if dr is None else max_error_rad, "consensus_stations": len(found.inliers),
            "consensus_of": len(stations),
        }
        return StationRejected(
            RejectReason.CONSENSUS_OUTLIER,
            f"{what} {dt * 1e3:.3f} mm{rot} from the fit {len(found.inliers)} of the run's {len(stations)} stations "
            f"agree on (bound [tracker] consensus_error_mm = {max_error_m * 1e3:g}{lim}): a gross error (a wrong "
            "reflector, an instrument stuck on a point, a robot pose that is not the one reported)",
            figures,
        )

    last = len(stations) - 1
    if found.split:
        groups = [sorted(stations[i].plan_index + 1 for i in g) for g in (found.inliers, found.split)]
        apart = float(np.median(found.deviation_m[list(found.split)]))
        return Screened(rejection=StationRejected(
            RejectReason.CONSENSUS_SPLIT,
            f"the run's {len(stations)} stations form two groups, each agreeing with a fit of its own and about "
            f"{apart * 1e3:.1f} mm apart (stations {', '.join(map(str, groups[0]))} / {', '.join(map(str, groups[1]))}; "
            f"bound [tracker] consensus_error_mm = {max_error_m * 1e3:g}), neither two thirds of them: the instrument "
            "measures two reflectors (a wrong reflector on some stations) and the data cannot tell which is right; "
            "the run ends",
            {"groups": groups, "groups_apart_m": apart, "consensus_bound_m": max_error_m, "consensus_of": len(stations)},
        ), ends_run=True)
    drop = tuple((stations[i], rejection(i, f"station {stations[i].plan_index + 1}, accepted before, is"))
                 for i in found.outliers() if i != last)
    return Screened(drop=drop, rejection=rejection(last, "the station is") if last not in found.inliers else None)
