"""Checking a CiA 402 profile-position move against the drives' own actual positions, without I/O.

A drive's statusword bit 10 (*target reached*) is the drive's claim; the position actual
value 0x6064 is what the joint did. :class:`MoveWatch` holds one move's targets and each
drive's position window, is fed every coherent sample and every statusword the driver
receives, and decides (``docs/protocols/robot.md`` section 3.6, ADR 0011):

* **Complete**: every commanded joint's actual position has been inside the position
  window 0x6067 of its target continuously for the window time 0x6068, in samples taken
  after the set-point was acknowledged, *and* its drive reports target reached. Bit 10 alone
  never completes a move.
* **Target mismatch** (:class:`TargetMismatch`): a drive reports target reached while its
  actual position is outside the window, continuously for more than ``mismatch_s``.
* **Joint not moving** (:class:`JointNotMoving`): a joint outside its target window whose
  actual position has stayed within one window's width for ``stall_timeout_s`` although even
  a profile twice as slow as the planned one (:data:`PLAN_STRETCH`) would have taken it more
  than two windows further (a frozen encoder, a blocked joint, a drive not executing the
  set-point); also a target mismatch on a joint that never left its start.
* **Fault** (:class:`FaultSeen`): any statusword with the FAULT bit (3) set (FAULT, FAULT
  REACTION ACTIVE), from any frame, after the move started. It is latched: the move's
  target is not reached until the next move.

The driver turns a fault into :class:`DriveFaultDuringMove` with the drive's error code
(0x603F) and its last EMCY, stops the move and raises; a mismatch or a stalled joint is
raised as it is. Each names the node and the joint.

Drives that do not implement 0x6067 / 0x6068 (an SDO abort, or 0x6067 = 0xFFFFFFFF, the
window function switched off): :func:`resolve_window` takes the configured
``position_window_counts`` / ``position_window_time_ms``, else :data:`FALLBACK_WINDOW_RAD`
for :data:`FALLBACK_WINDOW_TIME_S`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.drivers.cia402_units import SyncMove
from cellcal.drivers.errors import DeviceError

__all__ = [
    "FALLBACK_WINDOW_RAD",
    "FALLBACK_WINDOW_TIME_S",
    "PLAN_STRETCH",
    "WINDOW_SWITCHED_OFF",
    "PositionWindow",
    "resolve_window",
    "FaultSeen",
    "MoveVerificationError",
    "TargetMismatch",
    "JointNotMoving",
    "DriveFaultDuringMove",
    "MoveWatch",
]

#: The window a drive without 0x6067 is judged with (joint angle), when none is configured:
#: tight enough that a station is measured where the joints are commanded.
FALLBACK_WINDOW_RAD = math.radians(0.01)
#: ... and its window time (s).
FALLBACK_WINDOW_TIME_S = 0.02
#: 0x6067 = 0xFFFFFFFF: the drive's position window function is switched off (CiA 402).
WINDOW_SWITCHED_OFF = 0xFFFFFFFF
#: How much slower than planned a drive may move before a joint that stays put is stuck.
PLAN_STRETCH = 2.0

_SW_FAULT = 1 << 3  # statusword: FAULT (set in FAULT and in FAULT REACTION ACTIVE)
_SW_TARGET_REACHED = 1 << 10


@dataclass(frozen=True)
class PositionWindow:
    """One drive's position window, in its position units and seconds.

    ``source`` says where it came from: ``drive`` (read from 0x6067 / 0x6068 after anything
    cellcal wrote), ``configured`` (the URL keys, the drive lacking the object) or
    ``fallback`` (neither: :data:`FALLBACK_WINDOW_RAD` / :data:`FALLBACK_WINDOW_TIME_S`).
    """

    counts: int
    time_s: float
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "time_s": self.time_s, "source": self.source}


def resolve_window(read_counts: int | None, read_time_ms: int | None, *, configured_counts: int,
                   configured_time_ms: int, counts_per_rad: float) -> PositionWindow:
    """The window one drive's moves are judged with.

    ``read_*`` are what the drive answered for 0x6067 / 0x6068 (``None``: the drive has no
    such object); ``configured_*`` the URL keys (-1: not set); ``counts_per_rad`` the joint's
    position units per radian (for the fallback). The two halves resolve independently.
    """
    sources = []
    if read_counts is not None and read_counts != WINDOW_SWITCHED_OFF:
        counts, sources = int(read_counts), ["drive"]
    elif configured_counts >= 0:
        counts, sources = int(configured_counts), ["configured"]
    else:
        counts, sources = max(1, math.floor(FALLBACK_WINDOW_RAD * abs(counts_per_rad))), ["fallback"]
    if read_time_ms is not None:
        time_s = read_time_ms * 1e-3
        sources.append("drive")
    elif configured_time_ms >= 0:
        time_s = configured_time_ms * 1e-3
        sources.append("configured")
    else:
        time_s = FALLBACK_WINDOW_TIME_S
        sources.append("fallback")
    source = sources[0] if sources[0] == sources[1] else "/".join(sources)
    return PositionWindow(counts, time_s, source)


@dataclass(frozen=True)
class FaultSeen:
    """A statusword with the FAULT bit, seen during a move (node, joint 1-based, statusword,
    host ``monotonic_ns`` of the frame)."""

    node_id: int
    joint: int
    statusword: int
    t_ns: int


class MoveVerificationError(DeviceError):
    """A drive's account of a move disagrees with its actual position (``node_id``,
    ``joint`` 1-based); no station may be taken from the move."""

    def __init__(self, message: str, code: str, *, node_id: int, joint: int) -> None:
        super().__init__(message, code)
        self.node_id = node_id
        self.joint = joint


class TargetMismatch(MoveVerificationError):
    """The drive reports target reached (statusword bit 10) while its actual position
    (0x6064) is outside its position window (0x6067) of the target; ``code`` ``TARGET_MISMATCH``.

    Attributes
    ----------
    error_counts, window_counts : int
        How far the actual position is from the target, and the window (position units).
    """

    def __init__(self, message: str, *, node_id: int, joint: int, error_counts: int, window_counts: int) -> None:
        super().__init__(message, "TARGET_MISMATCH", node_id=node_id, joint=joint)
        self.error_counts = error_counts
        self.window_counts = window_counts


class JointNotMoving(MoveVerificationError):
    """A commanded joint whose actual position stays while its target differs by more than
    the window; ``code`` ``JOINT_NOT_MOVING``."""

    def __init__(self, message: str, *, node_id: int, joint: int) -> None:
        super().__init__(message, "JOINT_NOT_MOVING", node_id=node_id, joint=joint)


class DriveFaultDuringMove(DeviceError):
    """A drive showed FAULT (or FAULT REACTION ACTIVE) in its statusword during a move;
    ``code`` ``FAULT``.

    Attributes
    ----------
    node_id, joint : int
    statusword : int
        The statusword with the fault.
    error_code : int or None
        0x603F as read after the fault (``None``: not readable).
    emcy_code : int or None
        The drive's last emergency error code since the move started (``None``: none came).
    """

    def __init__(self, message: str, *, node_id: int, joint: int, statusword: int, error_code: int | None,
                 emcy_code: int | None) -> None:
        super().__init__(message, "FAULT")
        self.node_id = node_id
        self.joint = joint
        self.statusword = statusword
        self.error_code = error_code
        self.emcy_code = emcy_code


class MoveWatch:
    """One move, checked sample by sample (see the module docstring). Not thread-safe: the
    driver calls it under its own lock.

    Parameters
    ----------
    nodes : sequence of int
        Node ids in joint order.
    target_counts, start_counts : (n,) arrays
        The targets written to 0x607A and the actual positions when the move started.
    windows : sequence of PositionWindow
        Per joint.
    plan : SyncMove or None
        The planned profile (``None``: no timing expectation; the stall rule then waits for
        ``stall_timeout_s`` alone).
    acked_ns : int
        Host ``monotonic_ns`` when the last set-point was acknowledged: only samples taken
        after it judge the move.
    deg_per_count : (n,) array
        Joint degrees per position unit (messages only).
    mismatch_s, stall_timeout_s : float
        The bounds of the mismatch and stall rules (s).
    """

    def __init__(self, *, nodes: Sequence[int], target_counts: Any, start_counts: Any,
                 windows: Sequence[PositionWindow], plan: SyncMove | None, acked_ns: int, deg_per_count: Any,
                 mismatch_s: float, stall_timeout_s: float) -> None:
        self.nodes = tuple(int(n) for n in nodes)
        n = len(self.nodes)
        self.target = np.asarray(target_counts, dtype=float).reshape(n)
        self.start = np.asarray(start_counts, dtype=float).reshape(n)
        self.windows = tuple(windows)
        self.window = np.array([w.counts for w in self.windows], dtype=float)
        self.window_ns = np.array([round(w.time_s * 1e9) for w in self.windows], dtype=np.int64)
        self.plan = plan
        self.acked_ns = int(acked_ns)
        self.deg_per_count = np.abs(np.asarray(deg_per_count, dtype=float).reshape(n))
        self.mismatch_ns = round(mismatch_s * 1e9)
        self.stall_ns = round(stall_timeout_s * 1e9)
        self._inside_since = np.zeros(n, dtype=np.int64)
        self._mismatch_since = np.zeros(n, dtype=np.int64)
        self._anchor = self.start.copy()
        self._anchor_ns = np.full(n, self.acked_ns, dtype=np.int64)
        self._moved = np.abs(self.target - self.start) <= self.window  # nothing to move: counts as moved
        self.fault: FaultSeen | None = None
        self.error: MoveVerificationError | None = None
        self.complete_ns = 0
        self.stopped_ns = 0
        self.samples = 0
        self.last_counts = self.start.copy()
        self.held = np.zeros(n, dtype=bool)

    # -- inputs ----------------------------------------------------------------------------
    def stop(self, t_ns: int) -> None:
        """The move was halted at ``t_ns``: from now on its target is not reached and the
        rules no longer apply (a halted joint stands short of its target by design)."""
        if not self.stopped_ns:
            self.stopped_ns = int(t_ns)

    def note_statusword(self, node_id: int, statusword: int, t_ns: int) -> None:
        """Any statusword of node ``node_id`` received at ``t_ns`` (a TPDO, an SDO read)."""
        if self.fault is None and statusword & _SW_FAULT and node_id in self.nodes:
            self.fault = FaultSeen(node_id, self.nodes.index(node_id) + 1, int(statusword), int(t_ns))

    def update(self, t_ns: int, counts: Any, statuswords: Any, commanded: Any) -> bool:
        """One coherent sample (stamped ``t_ns``): actual positions (n,) in position units,
        statuswords (n,), and which joints the driver still commands (n,) bools. Returns
        whether the move's target is reached now (every commanded joint held in its window
        and reported reached, no fault, no error)."""
        counts = np.asarray(counts, dtype=float)
        sws = np.asarray(statuswords, dtype=np.int64)
        for j, n in enumerate(self.nodes):
            self.note_statusword(n, int(sws[j]), t_ns)
        self.samples += 1
        self.last_counts = counts.copy()
        err = np.abs(counts - self.target)
        inside = err <= self.window
        self._inside_since = np.where(inside, np.where(self._inside_since > 0, self._inside_since, t_ns), 0)
        self.held = inside & (t_ns - self._inside_since >= self.window_ns)
        bit10 = (sws & _SW_TARGET_REACHED) != 0
        after = t_ns > self.acked_ns
        cmd = np.asarray(commanded, dtype=bool)
        if after and self.error is None and not self.stopped_ns:
            # only joints still executing the set-point are judged (one that left OPERATION
            # ENABLED is the driver's to report)
            self._moved |= np.abs(counts - self.start) > self.window
            self._check_mismatch(t_ns, counts, err, inside | ~cmd, bit10 & cmd)
            if self.error is None:
                self._check_stall(t_ns, counts, err, inside | ~cmd, bit10)
        reached = bool(after and self.fault is None and self.error is None and not self.stopped_ns and np.any(cmd)
                       and np.all((self.held & bit10)[cmd]))
        if reached and not self.complete_ns:
            self.complete_ns = int(t_ns)
        return reached

    # -- rules ---------------------------------------------------------------------------------
    def _check_mismatch(self, t_ns: int, counts: np.ndarray, err: np.ndarray, inside: np.ndarray,
                        bit10: np.ndarray) -> None:
        bad = bit10 & ~inside
        self._mismatch_since = np.where(bad, np.where(self._mismatch_since > 0, self._mismatch_since, t_ns), 0)
        over = np.flatnonzero(bad & (t_ns - self._mismatch_since > self.mismatch_ns))
        if not over.size:
            return
        j = int(over[0])
        if not self._moved[j]:
            self.error = self._not_moving(j, counts, t_ns, "reports target reached (statusword bit 10) but")
            return
        s = (t_ns - int(self._mismatch_since[j])) * 1e-9
        self.error = TargetMismatch(
            f"node {self.nodes[j]} (joint {j + 1}): reports target reached (statusword bit 10) while its actual "
            f"position 0x6064 = {int(counts[j])} is {int(err[j])} counts ({err[j] * self.deg_per_count[j]:.3g} deg) "
            f"from the target 0x607A = {int(self.target[j])}, outside its position window 0x6067 of "
            f"{int(self.window[j])} counts ({self.windows[j].source}), for {s:.2f} s: the drive's report and its "
            "position disagree; no station taken",
            node_id=self.nodes[j], joint=j + 1, error_counts=int(err[j]), window_counts=int(self.window[j]))

    def _check_stall(self, t_ns: int, counts: np.ndarray, err: np.ndarray, inside: np.ndarray,
                     bit10: np.ndarray) -> None:
        moved_away = np.abs(counts - self._anchor) > self.window
        self._anchor = np.where(moved_away, counts, self._anchor)
        self._anchor_ns = np.where(moved_away, t_ns, self._anchor_ns)
        if self.plan is None:
            due = 1.0
        else:
            since_s = (t_ns - self.acked_ns - self.stall_ns) * 1e-9
            due = self.plan.progress(since_s / PLAN_STRETCH)
        behind = np.abs(self.target - self.start) * due - np.abs(counts - self.start) > 2 * self.window
        still = t_ns - self._anchor_ns >= self.stall_ns
        stuck = np.flatnonzero(~inside & ~bit10 & still & behind)
        if stuck.size:
            self.error = self._not_moving(int(stuck[0]), counts, t_ns, "")

    def _not_moving(self, j: int, counts: np.ndarray, t_ns: int, claim: str) -> JointNotMoving:
        s = (t_ns - int(self._anchor_ns[j])) * 1e-9
        off = abs(self.target[j] - counts[j])
        head = f"{claim} " if claim else ""
        return JointNotMoving(
            f"node {self.nodes[j]} (joint {j + 1}): {head}the joint does not move: its actual position 0x6064 "
            f"stayed near {int(counts[j])} for {s:.2f} s while the target 0x607A = {int(self.target[j])} is "
            f"{int(off)} counts ({off * self.deg_per_count[j]:.3g} deg) away, beyond its position window of "
            f"{int(self.window[j])} counts: a frozen encoder, a blocked joint or a drive not executing its "
            "set-point; no station taken",
            node_id=self.nodes[j], joint=j + 1)

    # -- what happened -------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """JSON-ready account of the move so far: per joint the target, the last actual
        position, the error (counts and deg), the window and whether it is held; whether
        the move completed, and the fault or error if any."""
        err = self.last_counts - self.target
        return {
            "nodes": list(self.nodes),
            "target_counts": [int(x) for x in self.target],
            "actual_counts": [int(x) for x in self.last_counts],
            "error_counts": [int(x) for x in err],
            "error_deg": [float(x) for x in err * self.deg_per_count],
            "windows": [w.as_dict() for w in self.windows],
            "held": [bool(x) for x in self.held],
            "samples": self.samples,
            "complete": bool(self.complete_ns),
            "stopped": bool(self.stopped_ns),
            "fault": None if self.fault is None else {"node": self.fault.node_id, "joint": self.fault.joint,
                                                      "statusword": self.fault.statusword},
            "error": None if self.error is None else {"code": self.error.code, "node": self.error.node_id,
                                                      "joint": self.error.joint, "message": str(self.error)},
        }
