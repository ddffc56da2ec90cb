"""The capture paths beside the plan's stations are screened like them (issue 24, ADR 0032):
a drift check's check stations, where a lying tracker must never be counted as drift, and
the planner's extra stations, where a wrong reflector must not enter the solve.

The in-process cell with a fault injected into the simulated tracker after a good run.
"""

from __future__ import annotations

import logging

import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.store import RunStatus
from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell, scenario_with

# The slow tier (make test, not make check): simulated devices in (scaled) real time.
pytestmark = pytest.mark.slow

WAIT_S = 120.0


def test_a_frozen_tracker_in_a_drift_check_is_rejected_never_counted_as_drift(tmp_path, caplog):
    """After a good run the tracker repeats one position bit for bit (with a fresh std): each
    check station after the first is rejected ``tracker_position_repeated`` and logged, and
    what the check reports holds only stations the tracker really measured."""
    caplog.set_level(logging.WARNING, logger="cellcal")
    with inprocess_cell(tmp_path, n_stations=6, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        body = cell.wait_result(run_id, WAIT_S)
        assert body["active"]
        assert cell.svc.wait_idle(WAIT_S)
        n_check = len(cell.svc.store.get_result(int(body["result_id"])).result["check_stations"])
        assert n_check >= 2
        cell.tracker.inject("frozen_position", 1e6)
        cell.svc.request_drift_check("test")
        b = cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT or (t == P.TOPIC_FAULT and b.get("active")
                                                               and "drift check" in str(b.get("message"))),
                          WAIT_S, "the drift check or its fault")
        logged = [r.getMessage() for r in caplog.records if "drift check" in r.getMessage()]
        rejected = {int(m.split("check station ")[1].split()[0]) for m in logged
                    if "rejected (tracker_position_repeated)" in m}
        assert rejected, logged
        if "stations" in b:  # a drift record: only what was really measured is in it
            measured = {s["index"] for s in b["stations"]}
            assert measured and not measured & rejected, (measured, rejected)
            assert len(measured | rejected) == n_check
            # the one reading the frozen value did not falsify is the pose it froze at
            assert b["deviation_translation_m"] < 0.1e-3
        else:  # every check station rejected: a fault naming them, no drift verdict
            assert "no check station could be measured" in b["message"] and "rejected" in b["message"]
            assert not cell.bodies(P.TOPIC_DRIFT)


#: A wrong reflector on every seventh station, 15 mm from the right one (beyond the
#: consensus bound of 5 mm, inside the rough test's 25 mm floor: only the consensus can tell).
EVERY_SEVENTH = """
[[tracker.faults]]
kind = "wrong_reflector"
start_s = 0.0
duration_s = 1e6
offset_mm = 15.0
every = 7
"""


def test_the_planners_extra_station_is_screened_by_the_consensus(tmp_path):
    """A solve that asks for more rotation spread than the cell gives (``[solve]
    min_axis_spread`` 0.8) makes the planner add stations; the first of them sees the wrong
    reflector (and keeps seeing it: the robot does not move between attempts at one pose). It
    is rejected ``consensus_outlier`` as a planned station would be, given up after its
    attempts, never stored; the run ends naming the degenerate axis, not with a result fitted
    to a reflector 15 mm off."""
    scenario = scenario_with(tmp_path / "wrong.toml", EVERY_SEVENTH)
    overrides = {"solve": {"min_axis_spread": 0.8}, "plan": {"max_extra_stations": 2}}
    with inprocess_cell(tmp_path, scenario=scenario, n_stations=6, overrides=overrides,
                        time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and b.get("active") and f"run {run_id} failed" in b["message"],
                      WAIT_S, "the run's end")
        run = cell.svc.store.get_run(int(run_id))
        assert run.status is RunStatus.FAILED and "DegenerateGeometry" in (run.status_reason or "")
        assert [s.plan_index for s in cell.svc.store.stations(int(run_id))] == [0, 1, 2, 3, 4, 5]
        extra = [b for b in cell.bodies(P.TOPIC_STATION) if b["run_id"] == str(run_id) and b["index"] >= 6]
        assert extra and all(not b["accepted"] and b["reason"] == "consensus_outlier" for b in extra), extra
        assert [b["outcome"] for b in extra].count("given_up") == 2  # each extra station given up
        stored = [r for r in cell.svc.store.rejections(int(run_id)) if r.reason == "consensus_outlier"]
        assert stored and all(10e-3 < r.detail["consensus_deviation_m"] < 20e-3 for r in stored)
