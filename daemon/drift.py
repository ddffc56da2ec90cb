"""Heartbeat drift checks: which stations to revisit, how far the cell moved, the verdict.

After a calibration the daemon revisits a few *check stations* (chosen here, stored with
the result as ``result["check_stations"]``), compares each tracker measurement with the
model ``X G Y`` (``X = cell_T_base``, ``Y = flange_T_target``, ``G`` the robot's
``base_T_flange`` at the station), and judges the worst deviation against the
``[drift]`` thresholds and a one-sided CUSUM of the translation deviation. A point
calibration (3-DoF tracker) has the reflector's ``flange_p_target = y`` instead of ``Y``:
the deviation is the distance of the measured point from ``X G y`` and there is no
rotation deviation (``None``; the rotation thresholds then judge nothing):

* ``S_k = max(0, S_{k-1} + d_k - k)``; an alarm when ``S_k > h`` (``cusum_k_mm``,
  ``cusum_h_mm``). It accumulates small persistent shifts that a single check would call
  ok, and is reset when a new calibration becomes active.
* status ``warn`` above the warn thresholds, ``fail`` above the fail thresholds or on a
  CUSUM alarm; on ``fail`` the result is marked suspect and, with ``on_drift =
  "recalibrate"``, a new run starts (action ``recalibrating``, else ``marked_suspect``).

Check ids (ADR 0009): a check gets its id when it is requested (the ``run_drift_check``
reply names it) from :class:`CheckIds`, 1, 2, 3, ... per result, continuing after a
restart from what the store holds. The worker (``cellcal.daemon.service``) moves and
measures; this module has no I/O besides the store read of :class:`CheckIds`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.config import Drift
from cellcal.daemon.runs.plan import PlannedStation, plan_from_dict
from cellcal.daemon.store import StationRecord, Store
from cellcal.solver.se3 import rotation_angle

__all__ = ["Cusum", "Verdict", "CheckIds", "choose_check_stations", "check_station_plan", "deviation", "judge",
           "model_of"]


def _map(v: object) -> Mapping[str, object]:
    """A part of a stored record that should be a JSON object (``{}`` when it is not)."""
    return v if isinstance(v, Mapping) else {}


def choose_check_stations(stations: Sequence[StationRecord], plan: Mapping[str, object], k: int) -> list[P.JsonObject]:
    """Farthest-point choice of ``k`` of a run's stations over the workspace.

    The first is the station farthest from the centroid of the flange positions, each next
    one the farthest from those chosen. Each is given by its plan's joint target when the
    plan has one (so a check revisits exactly the commanded pose), else by the measured
    joints.

    Parameters
    ----------
    stations : sequence of StationRecord
        The run's stations (base frame, metres).
    plan : dict
        The run's stored plan (``plan_to_dict``).
    k : int
        How many (``[drift] check_stations``).

    Returns
    -------
    list of dict
        ``{plan_index, q_rad: [n], base_T_flange: [16, row-major]}``, JSON-ready.
    """
    if not stations or k <= 0:
        return []
    k = min(k, len(stations))
    P_m = np.array([s.base_T_flange[:3, 3] for s in stations])
    chosen = [int(np.argmax(np.linalg.norm(P_m - P_m.mean(axis=0), axis=1)))]
    while len(chosen) < k:
        d = np.min(np.linalg.norm(P_m[:, None, :] - P_m[None, chosen, :], axis=2), axis=1)
        chosen.append(int(np.argmax(d)))
    planned = {ps.index: ps for ps in plan_from_dict(dict(plan))} if plan.get("stations") else {}
    out: list[P.JsonObject] = []
    for i in chosen:
        s = stations[i]
        ps = planned.get(s.plan_index)
        q = ps.q_rad if ps is not None and ps.q_rad is not None else s.q_rad
        out.append({"plan_index": s.plan_index, "q_rad": [float(v) for v in q],
                    "base_T_flange": [float(v) for v in np.asarray(s.base_T_flange).reshape(16)]})
    return out


def _int(v: object) -> int:
    if isinstance(v, (int, float, str)):
        return int(v)
    raise TypeError(f"a check station's plan_index must be a number, got {type(v).__name__}")


def check_station_plan(cs: Mapping[str, object]) -> PlannedStation:
    """The planned station of one stored check station (``choose_check_stations`` output)."""
    return PlannedStation(_int(cs["plan_index"]), np.asarray(cs["q_rad"], dtype=float),
                          np.asarray(cs["base_T_flange"], dtype=float).reshape(4, 4))


def model_of(result: Mapping[str, object]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None:
    """``(cell_T_base (4, 4), flange_T_target (4, 4) or flange_p_target (3,))`` of a stored
    result's wire form, or None when it has neither a target pose nor a reflector point."""
    transforms, points = _map(result.get("transforms") or {}), _map(result.get("points") or {})
    if "cell_T_base" not in transforms:
        return None
    X = transform_from_wire(_map(transforms["cell_T_base"]))
    if "flange_T_target" in transforms:
        return X, transform_from_wire(_map(transforms["flange_T_target"]))
    if "flange_p_target" in points:
        return X, np.asarray(_map(points["flange_p_target"])["position_m"], dtype=float).reshape(3)
    return None


def deviation(cell_T_base: npt.NDArray[np.float64], flange_T_target: npt.NDArray[np.float64],
              station: StationRecord) -> tuple[float, float | None]:
    """``(translation_m, rotation_rad)`` of a measured station against the model ``X G Y``.

    ``flange_T_target`` is the target pose on the flange (4, 4), or the reflector's point
    ``flange_p_target`` (3,) of a point calibration. The rotation is None when either side
    has no orientation: a point (3-DoF) measurement, or a point calibration.
    """
    Y = np.asarray(flange_T_target, dtype=float)
    point = Y.shape == (3,)
    if point:
        Y4 = np.eye(4)
        Y4[:3, 3] = Y
        Y = Y4
    model = cell_T_base @ station.base_T_flange @ Y
    et = float(np.linalg.norm(model[:3, 3] - station.cell_p_target))
    er = (rotation_angle(model[:3, :3].T @ station.cell_T_target[:3, :3])
          if station.cell_T_target is not None and not point else None)
    return et, er


class Cusum:
    """One-sided CUSUM of the translation deviation (module docstring), metres."""

    def __init__(self) -> None:
        self.value_m = 0.0

    def update(self, deviation_m: float, k_m: float) -> float:
        self.value_m = max(0.0, self.value_m + float(deviation_m) - float(k_m))
        return self.value_m

    def reset(self) -> None:
        self.value_m = 0.0


@dataclass(frozen=True)
class Verdict:
    """What one drift check found, with the thresholds it was judged against (SI)."""

    deviation_translation_m: float
    deviation_rotation_rad: float | None  # None: no check station had a rotation (points)
    cusum_m: float
    alarm: bool
    status: P.DriftStatus
    action: P.DriftAction

    @property
    def failed(self) -> bool:
        return self.status == P.DRIFT_FAIL


def judge(dev_t: Sequence[float], dev_r: Sequence[float | None], cusum: Cusum, cfg: Drift) -> Verdict:
    """The verdict of one check from its per-station deviations; updates ``cusum``.

    Parameters
    ----------
    dev_t, dev_r : sequence of float
        Translation (m) and rotation (rad) deviation of every check station measured (at
        least one); a rotation is None for a point measurement (the rotation thresholds
        judge only the stations that have one).
    cusum : Cusum
        The result's running CUSUM (updated with the worst translation deviation).
    cfg : config.Drift
        Thresholds and ``on_drift``.
    """
    if not dev_t:
        raise ValueError("judge: no check station was measured")
    t = max(dev_t)
    rotations = [float(v) for v in dev_r if v is not None]
    r = max(rotations) if rotations else None
    value = cusum.update(t, cfg.cusum_k_m)
    alarm = value > cfg.cusum_h_m
    status: P.DriftStatus = P.DRIFT_OK
    if t > cfg.warn_translation_m or (r is not None and r > cfg.warn_rotation_rad):
        status = P.DRIFT_WARN
    if t > cfg.fail_translation_m or (r is not None and r > cfg.fail_rotation_rad) or alarm:
        status = P.DRIFT_FAIL
    action: P.DriftAction = P.ACTION_NONE
    if status == P.DRIFT_FAIL:
        action = P.ACTION_RECALIBRATING if cfg.on_drift == "recalibrate" else P.ACTION_MARKED_SUSPECT
    return Verdict(t, r, value, alarm, status, action)


class CheckIds:
    """Drift check ids per result: 1, 2, 3, ... allocated when a check is requested.

    The first allocation for a result continues from the highest ``check_id`` the store
    holds for it, so ids do not repeat across daemon restarts. An id allocated for a check
    that then ends without a drift message (aborted, no station measurable, result no
    longer active) is not reused: ids increase but may skip (ADR 0009). Thread-safe.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._last: dict[int, int] = {}
        self._lock = threading.Lock()

    def allocate(self, result_id: int) -> int:
        with self._lock:
            if result_id not in self._last:
                self._last[result_id] = self._store.last_drift_check_id(result_id)
            self._last[result_id] += 1
            return self._last[result_id]
