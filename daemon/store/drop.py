"""Taking an accepted station out of its run (the consensus test found it a gross error).

A station is committed the moment it is accepted (``Store.add_station``); the run's
consensus test (``cellcal.daemon.consensus``, ADR 0032) may later find it far beyond the
fit the other stations agree on (a wrong reflector measured before enough stations existed
to tell). :func:`drop_station` then deletes its row and records a rejection with the reason
in the same transaction, so the store never holds the station and loses its history: the
run's stations are what its fit uses, its rejections say what was dropped and why. Only an
open run's station can be dropped; a dropped plan index may be captured again (a resumed run
measures it anew).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from cellcal.daemon.store.errors import UnknownRecord
from cellcal.daemon.store.records import _to_json
from cellcal.daemon.store.schema import _utc_now

if TYPE_CHECKING:  # the store's module imports this one
    from cellcal.daemon.store.sqlite import Store

__all__ = ["drop_station"]


def drop_station(store: Store, run_id: int, plan_index: int, reason: str, detail: Mapping[str, object]) -> None:
    """Delete station ``plan_index`` of open run ``run_id`` and record the rejection
    (``reason``, ``detail`` with ``"dropped": True`` added) in one transaction.

    Raises
    ------
    UnknownRecord
        No such run, or the run has no station at ``plan_index``.
    RunClosed
        The run has finished (its stations are its result's provenance).
    ValueError
        ``reason`` empty, or ``detail`` not JSON.
    """
    if not isinstance(reason, str) or not reason:
        raise ValueError(f"the reason a station is dropped must be a non-empty string, got {reason!r}")
    if isinstance(run_id, bool) or not isinstance(run_id, int) or isinstance(plan_index, bool) or \
            not isinstance(plan_index, int):
        raise ValueError(f"run_id and plan_index must be integers, got {run_id!r}, {plan_index!r}")
    detail_json = _to_json({**detail, "dropped": True}, f"detail of dropped station {plan_index}")
    with store._write(f"dropping station {plan_index} of run {run_id}") as conn:
        store._require_open_run(conn, run_id, f"cannot drop station {plan_index}")
        cur = conn.execute("DELETE FROM stations WHERE run_id = ? AND plan_index = ?", (run_id, plan_index))
        if cur.rowcount != 1:
            raise UnknownRecord("station", plan_index, state_dir=store.state_dir)
        conn.execute(
            "INSERT INTO rejections(run_id, plan_index, reason, detail_json, recorded_utc) VALUES (?, ?, ?, ?, ?)",
            (run_id, plan_index, reason, detail_json, _utc_now()),
        )
        conn.execute("UPDATE runs SET updated_utc = ? WHERE id = ?", (_utc_now(), run_id))
