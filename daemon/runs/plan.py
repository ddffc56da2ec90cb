"""Station plans: which flange poses a calibration run visits.

* **explicit**: the stations listed in the configuration (joint vectors, or flange poses in
  the base frame), in the order given.
* **generated**: with the tracker's rough position (``[plan] tracker_xyz_mm``), ``n``
  stations chosen by the one planner, ``cellcal.solver.planning``, from candidates inside a
  workspace box (base frame), reachable by inverse kinematics from the home configuration
  within the joint limits, with the target in the tracker's line of sight (that position
  and the target's acceptance cone); the planner picks the stations that determine
  ``cell_T_base`` best. Without a position, stations tilted from the home orientation
  (which is taken to face the tracker) about axes spread around the circle and turned
  about the tool axis (a high ``axis_spread``, ADR 0002). The order is a nearest-neighbour
  tour in joint space from home, which keeps moves short.
* **to a target** (``[plan] target_sigma_mm`` with task points): a run starts with the
  first few planned stations and then, after every accepted station, solves what it has:
  once the predicted error at every task point is at most the target it stops, otherwise
  it measures the station :func:`cellcal.solver.planning.suggest_next_station` picks for the
  task points (:func:`next_station`, called from the capture loop through
  :func:`stations_to_visit`), up to ``[plan] max_stations``.

A plan is stored with its run (as plain lists), so a run resumed after a crash visits
exactly the same stations.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config, Plan, PlanStation
from cellcal.drivers.kinematics import DHModel
from cellcal.solver.errors import CellcalError
from cellcal.solver.planning import candidate_stations, plan_stations
from cellcal.solver.se3 import make_transform, matrix_from_quat, so3_exp

__all__ = ["PlannedStation", "PlanError", "generate_plan", "sight_of", "explicit_plan", "plan_to_dict",
           "plan_from_dict", "plan_from_config", "to_target", "candidate_pool", "joint_limits", "FIRST_STATIONS_POSE",
           "FIRST_STATIONS_POINT"]

log = logging.getLogger(__name__)


class PlanError(CellcalError, ValueError):
    """No plan can be made from the settings given (say which and why)."""


@dataclass(frozen=True)
class PlannedStation:
    """One station of a plan.

    Attributes
    ----------
    index : int
        Position in the plan (the store's ``plan_index``).
    q_rad : numpy.ndarray or None, shape (6,)
        Joint target, when known.
    base_T_flange : numpy.ndarray or None, shape (4, 4)
        Flange target in the base frame (m), when known.
    """

    index: int
    q_rad: npt.NDArray[np.float64] | None
    base_T_flange: npt.NDArray[np.float64] | None


#: Candidate stations solved by inverse kinematics per planned station (at least
#: ``_MIN_POOL``): the pool the planner chooses from (about 1 ms of IK each).
_POOL_PER_STATION = 5
_MIN_POOL = 150
#: Distance of the stand-in tracker along the home pose's facing direction when the
#: tracker's position is not known: far enough that the line-of-sight cone becomes "tilted
#: at most max_tilt_deg from the home orientation".
_FAR_M = 1e3
#: The target's offset from the flange along its axis assumed for the plan's information.
_NOMINAL_OFFSET_M = 0.05

#: A vector given as numbers (a configuration list) or an array.
Vector: TypeAlias = Sequence[float] | npt.NDArray[np.float64]


def sight_of(model: DHModel, *, home_q_rad: npt.NDArray[np.float64], max_tilt_rad: float,
             tracker_base_m: Vector | None = None,
             target_axis: Vector = (0.0, 0.0, 1.0),
             cone_rad: float = math.radians(45.0)) -> tuple[npt.NDArray[np.float64], float]:
    """The line of sight a plan is made for: ``(tracker position in the base frame (3,), cone_deg)``.

    With the tracker's rough position (``[plan] tracker_xyz_mm``) that position and the
    target's acceptance cone; without it, a stand-in tracker far along the direction the
    target faces at home with a cone of ``max_tilt_rad``: the operator's home pose faces the
    tracker, and the stations stay within ``max_tilt`` of it.
    """
    if tracker_base_m is not None and len(tracker_base_m):
        return np.asarray(tracker_base_m, float).reshape(3), math.degrees(cone_rad)
    T = model.forward(np.asarray(home_q_rad, float))
    a = np.asarray(target_axis, float)
    facing = T[:3, :3] @ (a / np.linalg.norm(a))
    return T[:3, 3] + _FAR_M * facing, math.degrees(max(max_tilt_rad, math.radians(1.0)))


def _halton(i: int, base: int) -> float:
    f, r = 1.0, 0.0
    while i > 0:
        f /= base
        r += f * (i % base)
        i //= base
    return r


def _tilt_plan(
    model: DHModel,
    *,
    n: int,
    box_min_m: npt.NDArray[np.float64],
    box_max_m: npt.NDArray[np.float64],
    max_tilt_rad: float,
    home_q_rad: npt.NDArray[np.float64],
    q_min_rad: npt.NDArray[np.float64] | None = None,
    q_max_rad: npt.NDArray[np.float64] | None = None,
    seed: int = 0,
    max_draws: int | None = None,
) -> list[PlannedStation]:
    """``n`` reachable stations tilted from the home orientation with well-spread rotation
    axes: the plan when the tracker's position is not configured (the home pose is then
    taken to face the tracker, and the stations stay within ``max_tilt_rad`` of it).

    Parameters
    ----------
    model : object with ``forward(q) -> (4, 4)`` and ``inverse(T, q_seed) -> q``
        The robot's kinematics (``cellcal.drivers.kinematics.DHModel``).
    n : int
        Stations wanted (>= 3).
    box_min_m, box_max_m : (3,) arrays
        Workspace box for the flange origin, base frame, metres.
    max_tilt_rad : float
        Largest tilt from the home orientation (the turn about the tool axis is up to the
        same angle).
    home_q_rad : (6,) array
        Home configuration: IK seed and the start of the tour.
    q_min_rad, q_max_rad : (6,) arrays, optional
        Joint limits (default +-2 pi).
    seed : int
        Seed for the position draw (the plan is a deterministic function of its inputs).

    Raises
    ------
    PlanError
        If fewer than ``n`` reachable stations were found in ``max_draws`` draws.
    """
    if n < 3:
        raise PlanError(f"a plan needs at least 3 stations, got {n}")
    home = np.asarray(home_q_rad, dtype=float)
    lo = np.full(home.shape, -2 * math.pi) if q_min_rad is None else np.asarray(q_min_rad, float)
    hi = np.full(home.shape, 2 * math.pi) if q_max_rad is None else np.asarray(q_max_rad, float)
    box_min_m, box_max_m = np.asarray(box_min_m, float), np.asarray(box_max_m, float)
    R_home = model.forward(home)[:3, :3]
    rng = np.random.default_rng(seed)
    shift = rng.uniform(0, 1, 3)  # a seeded Cranley-Patterson rotation of the Halton points
    golden = math.pi * (3.0 - math.sqrt(5.0))
    stations: list[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = []
    draws = 0
    limit = max_draws if max_draws is not None else 20 * n
    while len(stations) < n and draws < limit:
        draws += 1
        u = np.array([(_halton(draws, b) + s) % 1.0 for b, s in zip((2, 3, 5), shift, strict=True)])
        p = box_min_m + u * (box_max_m - box_min_m)
        # Tilt axis turns by the golden angle per station; tilt and tool-axis turn alternate
        # in sign and size so every pair of stations differs about a different axis.
        phi = golden * draws
        tilt = max_tilt_rad * (0.5 + 0.5 * _halton(draws, 7))
        yaw = max_tilt_rad * (2.0 * _halton(draws, 11) - 1.0)
        axis = np.array([math.cos(phi), math.sin(phi), 0.0])
        R = R_home @ so3_exp(np.array([0.0, 0.0, yaw])) @ so3_exp(axis * tilt)
        T = make_transform(R, p)
        seed_q = stations[-1][0] if stations else home
        try:
            q = model.inverse(T, seed_q)
        except ValueError:
            try:
                q = model.inverse(T, home)
            except ValueError:
                continue
        if np.any(q < lo) or np.any(q > hi):
            continue
        stations.append((q, T))
    if len(stations) < n:
        raise PlanError(
            f"only {len(stations)} of {n} stations reachable in {draws} draws: widen the "
            f"workspace box, reduce max_tilt_deg or move it nearer the robot's home pose"
        )
    order = _tour([q for q, _ in stations], home)
    return [PlannedStation(i, stations[j][0], stations[j][1]) for i, j in enumerate(order)]



def generate_plan(
    model: DHModel,
    *,
    n: int,
    box_min_m: npt.NDArray[np.float64],
    box_max_m: npt.NDArray[np.float64],
    max_tilt_rad: float,
    home_q_rad: npt.NDArray[np.float64],
    q_min_rad: npt.NDArray[np.float64] | None = None,
    q_max_rad: npt.NDArray[np.float64] | None = None,
    seed: int = 0,
    max_draws: int | None = None,
    tracker_base_m: Vector | None = None,
    target_axis: Vector = (0.0, 0.0, 1.0),
    cone_rad: float = math.radians(45.0),
    min_separation_m: float = 5e-3,
    min_separation_rad: float = math.radians(2.0),
    measurement: str = "pose",
) -> list[PlannedStation]:
    """``n`` stations chosen by the planner (``cellcal.solver.planning.plan_stations``).

    With the tracker's position (``tracker_base_m``), candidates are solved by inverse
    kinematics from the home configuration: flange
    origins in the box, the target facing the tracker within its acceptance cone and turned
    about its axis by at most ``max_tilt_rad``, within the joint limits; the planner picks
    the ``n`` that determine ``cell_T_base`` best (E-optimal). The order is a
    nearest-neighbour tour in joint space from home. Without it, the stations are tilted
    from the home orientation (:func:`_tilt_plan`, the plan before the planner: the home
    pose is taken to face the tracker); a run to a target then estimates the tracker from
    those first stations and the planner chooses the rest.

    Parameters
    ----------
    model : object with ``forward(q) -> (4, 4)`` and ``inverse(T, q_seed) -> q``
        The robot's kinematics (``cellcal.drivers.kinematics.DHModel``).
    n : int
        Stations wanted (>= 3).
    box_min_m, box_max_m : (3,) arrays
        Workspace box for the flange origin, base frame, metres.
    max_tilt_rad : float
        Largest turn about the target axis; without ``tracker_base_m`` also the largest
        tilt from the home orientation (:func:`sight_of`).
    home_q_rad : (6,) array
        Home configuration: IK seed and the start of the tour.
    q_min_rad, q_max_rad : (6,) arrays, optional
        Joint limits (default +-2 pi).
    seed : int
        Sampling seed (the plan is a deterministic function of its inputs).
    max_draws : int, optional
        Candidates to solve (default ``max(150, 5 n)``).
    tracker_base_m : (3,) array, optional
        Rough tracker position in the base frame, m (``[plan] tracker_xyz_mm``).
    target_axis : (3,) array
        Direction the target faces, flange frame.
    cone_rad : float
        The target's acceptance half-angle.
    min_separation_m, min_separation_rad : float
        No two stations within both of these of each other (``[capture]
        min_pose_change_mm`` and ``_deg``: the capture refuses such a pose as a duplicate).
    measurement : {"pose", "point"}
        What the tracker measures (``[tracker] measure``): the information the stations
        are chosen for (a point calibration needs flange rotations about spread axes to
        separate the reflector's offset from the base translation).

    Raises
    ------
    PlanError
        If fewer than ``n`` candidates are feasible.
    """
    if n < 3:
        raise PlanError(f"a plan needs at least 3 stations, got {n}")
    home = np.asarray(home_q_rad, dtype=float)
    if tracker_base_m is None or not len(tracker_base_m):
        return _tilt_plan(model, n=n, box_min_m=box_min_m, box_max_m=box_max_m, max_tilt_rad=max_tilt_rad,
                          home_q_rad=home, q_min_rad=q_min_rad, q_max_rad=q_max_rad, seed=seed, max_draws=max_draws)
    pool, tracker, cone_deg = candidate_pool(model, n=n, box_min_m=box_min_m, box_max_m=box_max_m, max_tilt_rad=max_tilt_rad,
                                    home_q_rad=home, q_min_rad=q_min_rad, q_max_rad=q_max_rad, seed=seed,
                                    max_draws=max_draws, tracker_base_m=tracker_base_m, target_axis=target_axis,
                                    cone_rad=cone_rad)
    lim = joint_limits(home, q_min_rad, q_max_rad)
    # A point fit must also separate the reflector's offset from the base translation, which
    # takes flange rotations about spread axes: its stations are chosen for every unknown.
    focus = "all"
    # The target a few centimetres out along its axis (its offset is not known before the
    # first calibration): at the flange origin no rotation would move a point at all.
    Y = np.eye(4)
    Y[:3, 3] = _NOMINAL_OFFSET_M * np.asarray(target_axis, float) / np.linalg.norm(np.asarray(target_axis, float))
    try:
        chosen = plan_stations(model.forward, lim, (box_min_m, box_max_m), tracker, np.eye(4), n,
                               flange_T_target=Y, target_axis=target_axis, cone_deg=cone_deg, candidates=pool, rng=seed,
                               min_separation_m=min_separation_m, min_separation_rad=min_separation_rad,
                               measurement=measurement, focus=focus)
    except ValueError as exc:
        raise PlanError(
            f"{exc}; the plan is for a tracker at {np.round(tracker, 3).tolist()} m (base frame) and a cone of "
            f"{cone_deg:.0f} deg: check plan.tracker_xyz_mm, plan.cone_deg and plan.max_tilt_deg, or widen the "
            f"workspace box"
        ) from None
    order = _tour(list(chosen.q_rad), home)
    return [PlannedStation(i, chosen.q_rad[j], chosen.base_T_flange[j]) for i, j in enumerate(order)]


def joint_limits(home: npt.NDArray[np.float64], q_min_rad: Vector | None, q_max_rad: Vector | None) -> npt.NDArray[np.float64]:
    lo = np.full(home.shape, -2 * math.pi) if q_min_rad is None else np.asarray(q_min_rad, float)
    hi = np.full(home.shape, 2 * math.pi) if q_max_rad is None else np.asarray(q_max_rad, float)
    return np.column_stack([lo, hi])


def _coarse_ik(model: DHModel) -> Callable[[npt.NDArray[np.float64], npt.NDArray[np.float64]], npt.NDArray[np.float64]]:
    """The model's IK to a micrometre: a candidate's pose is ``forward(q)`` of the joints
    found, so it need not be the pose asked for exactly, and the plan is made in the API
    call that starts a run (it must be quick)."""
    def ik(T: npt.NDArray[np.float64], q_seed: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.asarray(model.inverse(T, q_seed, tol_m=1e-6, tol_rad=1e-6, max_iter=60), float)
    return ik


_Pool: TypeAlias = tuple[tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]], npt.NDArray[np.float64], float]
_POOLS: dict[tuple[object, ...], _Pool] = {}


def candidate_pool(model: DHModel, *, n: int, box_min_m: Vector, box_max_m: Vector, max_tilt_rad: float,
                   home_q_rad: npt.NDArray[np.float64], q_min_rad: Vector | None, q_max_rad: Vector | None, seed: int,
                   max_draws: int | None, tracker_base_m: Vector | None, target_axis: Vector,
                   cone_rad: float) -> _Pool:
    """The candidate pool of a plan, ``((Q, G), tracker_base (3,), cone_deg)``; its joints
    are cached per inputs (a deterministic function of them), so the next-station choices of
    a run do not solve the inverse kinematics again."""
    lim = joint_limits(home_q_rad, q_min_rad, q_max_rad)
    tracker, cone_deg = sight_of(model, home_q_rad=home_q_rad, max_tilt_rad=max_tilt_rad,
                                 tracker_base_m=tracker_base_m, target_axis=target_axis, cone_rad=cone_rad)
    count = int(max_draws) if max_draws is not None else max(_MIN_POOL, _POOL_PER_STATION * n)
    box = (np.asarray(box_min_m, float).reshape(3), np.asarray(box_max_m, float).reshape(3))
    key = (getattr(model, "name", ""), count, int(seed), float(max_tilt_rad), float(cone_deg),
           tuple(np.round(tracker, 9)), tuple(np.asarray(target_axis, float)), tuple(home_q_rad),
           tuple(lim.reshape(-1)), tuple(box[0]), tuple(box[1]))
    hit = _POOLS.get(key)
    if hit is not None:
        # The joints are kept; their poses are this model's (the controller's calibrated
        # one differs from the nominal by millimetres: nothing the choice depends on).
        (Q, _), tr, cone = hit
        return (Q, np.array([model.forward(q) for q in Q]).reshape(-1, 4, 4)), tr, cone
    try:
        Q, G = candidate_stations(model.forward, lim, box, tracker, np.eye(4), target_axis=target_axis,
                                  cone_deg=cone_deg, ik=_coarse_ik(model), q_seed_rad=home_q_rad,
                                  max_roll_rad=max_tilt_rad, n_candidates=count, rng=seed)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if len(_POOLS) >= 8:
        _POOLS.pop(next(iter(_POOLS)))
    _POOLS[key] = ((Q, G), tracker, cone_deg)
    return _POOLS[key]


def _tour(qs: list[npt.NDArray[np.float64]], start: npt.NDArray[np.float64]) -> list[int]:
    """Nearest-neighbour order in joint space (largest joint move as the distance)."""
    left = list(range(len(qs)))
    order: list[int] = []
    cur = start
    while left:
        j = min(left, key=lambda i: float(np.max(np.abs(qs[i] - cur))))
        order.append(j)
        left.remove(j)
        cur = qs[j]
    return order


def explicit_plan(stations: Sequence[PlanStation], model: DHModel | None = None) -> list[PlannedStation]:
    """A plan from the configuration's ``[[plan.stations]]`` (already in SI)."""
    out = []
    for i, st in enumerate(stations):
        if st.q_rad:
            q = np.asarray(st.q_rad, dtype=float)
            T = model.forward(q) if model is not None else None
            out.append(PlannedStation(i, q, T))
        else:
            T = make_transform(matrix_from_quat(np.asarray(st.flange_quat_wxyz, float)), np.asarray(st.flange_xyz_m, float))
            out.append(PlannedStation(i, None, T))
    return out


def plan_to_dict(plan: Sequence[PlannedStation]) -> P.JsonObject:
    """JSON-ready form stored with a run."""
    stations: list[P.JsonValue] = [
        {
            "index": s.index,
            "q_rad": None if s.q_rad is None else [float(v) for v in s.q_rad],
            "base_T_flange": None if s.base_T_flange is None else [float(v) for v in np.asarray(s.base_T_flange).reshape(16)],
        }
        for s in plan
    ]
    return {"stations": stations}


def _list(v: object) -> list[object]:
    if isinstance(v, (list, tuple)):
        return list(v)
    raise TypeError(f"a stored plan's stations must be a list, got {type(v).__name__}")


def _station(v: object) -> Mapping[str, object]:
    if isinstance(v, Mapping):
        return v
    raise TypeError(f"a stored plan's station must be an object, got {type(v).__name__}")


def _index(v: object) -> int:
    if isinstance(v, (int, float, str)):
        return int(v)
    raise TypeError(f"a stored plan station's index must be a number, got {type(v).__name__}")


def plan_from_dict(d: Mapping[str, object]) -> list[PlannedStation]:
    """Inverse of :func:`plan_to_dict`."""
    out = []
    for item in _list(d["stations"]):
        s = _station(item)
        q = None if s["q_rad"] is None else np.asarray(s["q_rad"], dtype=float)
        T = None if s["base_T_flange"] is None else np.asarray(s["base_T_flange"], dtype=float).reshape(4, 4)
        out.append(PlannedStation(_index(s["index"]), q, T))
    return out


# ---- from the configuration; capturing to a target -------------------------------------------

#: Stations a run to a target starts with (the first ones of the generated plan): enough
#: for a pose calibration with redundancy; a point calibration needs one more than its
#: minimum of 4 (``cellcal.daemon.runs.points.ESTIMATE_MIN_POINT_STATIONS``).
FIRST_STATIONS_POSE = 4
FIRST_STATIONS_POINT = 5


def to_target(plan_cfg: Plan) -> bool:
    """Whether runs capture until ``[plan] target_sigma_mm`` is reached."""
    return float(plan_cfg.target_sigma_m) > 0.0 and plan_cfg.kind == "generated"


def plan_from_config(cfg: Config, model: DHModel) -> list[PlannedStation]:
    """The plan of a new run: ``[plan]``'s explicit stations, the generated plan, or (to a
    target) the first stations of the generated plan."""
    p = cfg.plan
    if p.kind == "explicit":
        return explicit_plan(p.stations, model)
    n = p.n_stations
    if to_target(p):
        n = min(p.max_stations, FIRST_STATIONS_POINT if cfg.tracker.measure == "point" else FIRST_STATIONS_POSE)
    return generate_plan(
        model, n=n, box_min_m=np.array(p.workspace_min_m), box_max_m=np.array(p.workspace_max_m),
        max_tilt_rad=p.max_tilt_rad, home_q_rad=np.array(p.home_q_rad), q_min_rad=np.array(p.joint_min_rad),
        q_max_rad=np.array(p.joint_max_rad), seed=p.seed, tracker_base_m=p.tracker_xyz_m or None,
        target_axis=p.target_axis, cone_rad=p.cone_rad, min_separation_m=cfg.capture.min_pose_change_m,
        min_separation_rad=cfg.capture.min_pose_change_rad, measurement=cfg.tracker.measure,
    )
