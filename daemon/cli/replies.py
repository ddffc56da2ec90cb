"""A command's reply in words, for ``cellcal ctl`` (``--json`` prints the reply itself).

Lengths in mm and angles in degrees (the wire is SI); a pose as its translation and its
rotation vector, as everywhere else (``cellcal.daemon.report.human``). A command this module
does not know (a newer daemon's) is shown key by key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import numpy as np

from cellcal.daemon.report import human
from cellcal.daemon.report.reading import as_list, as_map, to_float
from cellcal.solver.se3 import so3_log

__all__ = ["reply_lines", "status_line"]


def _mm3(v: object) -> str:
    xyz = [to_float(x) * 1e3 for x in as_list(v, "point_m")]
    return "(" + ", ".join(f"{x:.3f}" for x in xyz) + ") mm"


def status_line(b: Mapping[str, object]) -> str:
    """The daemon's status (``get_status``, the heartbeat body) in one line."""
    devices = as_map(b.get("devices"), "devices")
    devs = ", ".join(f"{name} {'connected' if as_map(d, name).get('connected') else 'NOT CONNECTED'}"
                     for name, d in sorted(devices.items()))
    active = b.get("active_result_id")
    uptime = b.get("uptime_s")
    up = f"up {uptime:.0f} s" if isinstance(uptime, (int, float)) else "up ?"
    return (f"cell {b.get('cell', '?')}: {b.get('state', '?')}, {up}; active result "
            f"{active if active is not None else 'none'}{' (SUSPECT)' if b.get('suspect') else ''}; "
            f"run {b.get('run_id') or 'none'}; {devs or 'no devices'}; version {b.get('version', '?')}")


def _list_results(r: Mapping[str, object]) -> list[str]:
    rows = [as_map(x, "results") for x in as_list(r.get("results"), "results")]
    lines = [f"{len(rows)} result(s), active: {r.get('active_result_id') or 'none'}"]
    for x in rows:
        flags = [w for w, on in (("active", x.get("active")), ("SUSPECT", x.get("suspect")),
                                 ("GATES FAILED", x.get("accepted") is False)) if on]
        lines.append(f"  result {x.get('result_id')}: {x.get('kind')}, run {x.get('run_id') or '-'}, "
                     f"{x.get('n_stations')} stations, {human.fit_text(x)}{'; ' + ', '.join(flags) if flags else ''}")
    return lines


def _to_base(r: Mapping[str, object]) -> list[str]:
    suspect = " (the result is SUSPECT)" if r.get("suspect") else ""
    if "point_m" in r:
        return [f"in {r.get('frame', 'base')}: {_mm3(r['point_m'])} (result {r.get('result_id')}){suspect}"]
    pose = as_map(r.get("pose"), "pose")
    T = np.asarray(pose.get("matrix"), dtype=float).reshape(4, 4)
    rv = np.degrees(so3_log(T[:3, :3]))
    name = f"{pose.get('parent_frame', 'base')}_T_{pose.get('child_frame', 'pose')}"
    return [f"{name}: {_mm3(T[:3, 3].tolist())}, rotation vector ({rv[0]:.4f}, {rv[1]:.4f}, {rv[2]:.4f}) deg "
            f"(result {r.get('result_id')}){suspect}"]


def _snapshot(r: Mapping[str, object]) -> list[str]:
    messages = as_map(r.get("messages"), "messages")
    lines = [f"snapshot at seq {r.get('seq')} (boot {r.get('boot_id')}): {len(messages)} topic(s)"]
    for topic, env in sorted(messages.items()):
        lines.append(f"  {topic}: seq {as_map(env, topic).get('seq')}")
    return lines


_TEXT: dict[str, Callable[[Mapping[str, object]], list[str]]] = {
    "get_status": lambda r: [status_line(r)],
    "get_snapshot": _snapshot,
    "get_result": lambda r: [human.result_line(r)],
    "list_results": _list_results,
    "to_base": _to_base,
    "start_run": lambda r: [f"run {r.get('run_id')} started: {r.get('kind')}, {r.get('planned')} stations planned "
                            "(cellcal watch follows it)"],
    "abort": lambda r: [f"run {r.get('run_id')} aborted" if r.get("aborted") else "nothing to abort"],
    "run_drift_check": lambda r: [f"drift check {r.get('check_id')} of result {r.get('result_id')} queued "
                                  "(cellcal watch shows its outcome)"],
    "activate_result": lambda r: [f"result {r.get('active_result_id')} is active (before: "
                                  f"{r.get('previous_result_id') or 'none'})"],
}


def _generic(r: object) -> list[str]:
    if not isinstance(r, Mapping):
        return [json.dumps(r, default=repr)]
    return [f"{k}: {v if isinstance(v, (str, int)) else json.dumps(v, default=repr)[:200]}" for k, v in r.items()]


def reply_lines(cmd: str, reply: Mapping[str, object]) -> list[str]:
    """``reply`` (``{id, ok, result}`` or ``{id, ok: false, error}``) to ``cmd`` in words."""
    if reply.get("ok") is not True:
        err = as_map(reply.get("error"), "error")
        return [f"{cmd} refused: {err.get('code', '?')}: {err.get('message', '')}"]
    result = reply.get("result")
    fmt = _TEXT.get(cmd)
    if fmt is None or not isinstance(result, Mapping):
        return _generic(result)
    try:
        return fmt(result)
    except (TypeError, ValueError, KeyError, AttributeError):  # a reply of another version: key by key
        return _generic(result)

