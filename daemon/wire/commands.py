"""The command catalogue of the ``cellcal/v1`` protocol and the validation of its arguments.

The handler interface (:class:`Caller`, :class:`CommandError`, :class:`Handler`), the
argument validators, :data:`COMMANDS` (every command with its role and typed arguments) and
:func:`validate_args`. Read through ``cellcal.daemon.protocol``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from cellcal.daemon.wire.vocabulary import (
    E_BAD_REQUEST,
    ERROR_CODES,
    MAX_JOINT_RAD,
    MAX_NAME_CHARS,
    MAX_POSITION_M,
    MAX_RECORD_ID_CHARS,
    MAX_STATIONS,
    MOTION_MODES,
    ROLE_OBSERVER,
    ROLE_OPERATOR,
    RUN_KINDS,
    TO_BASE_FRAMES,
)
from cellcal.solver.errors import CellcalError

# --- the handler interface -----------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """Who sent a command, as authenticated by the transport.

    Attributes
    ----------
    key_id : str
        First 8 characters of the client's Z85 CURVE public key; without CURVE ``"uid:N"``
        for an ipc peer (its kernel-reported uid) or ``"null"`` on loopback TCP. This is
        what the logs show.
    role : str
        ``"observer"`` or ``"operator"``.
    name : str
        The client's name from ``[[zmq.clients]]``, or ``"anonymous"`` without CURVE.
    """

    key_id: str
    role: str
    name: str


class CommandError(CellcalError):
    """A command refused with a protocol error code; the handler raises it, the client sees it.

    Parameters
    ----------
    code : str
        One of ``ERROR_CODES``.
    message : str
        For people: says what was wrong and, where it helps, what would be accepted.
    """

    def __init__(self, code: str, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class Handler(Protocol):
    """What the daemon implements for the command socket.

    ``handle`` is called on the server's single command thread, one command at a time, with
    ``args`` already validated against ``COMMANDS[cmd]`` (defaults filled in) and the caller
    already authorised. It returns the ``result`` (msgpack-able: dicts, lists, str, int,
    float, bool, None; numpy arrays and scalars are converted) or raises
    :class:`CommandError`. Any other exception becomes ``E_INTERNAL`` and is logged. It must
    not block for long (start a run, do not wait for it): commands queue behind it.
    ``get_snapshot`` never reaches the handler. The arguments' values are what the
    validators of ``COMMANDS[cmd]`` return (``str``, ``int``, ``list[float]``,
    :data:`PoseArg`, ``list[StationArg]``): the handler narrows the ones it reads.
    """

    def handle(self, cmd: str, args: dict[str, object], caller: Caller) -> object: ...


# --- argument validation -------------------------------------------------------------------------


class _ArgError(ValueError):
    """Private: a validator's complaint, turned into ``CommandError(E_BAD_REQUEST)`` naming
    the argument by :func:`validate_args`; never leaves this module."""


def _what(v: object) -> str:
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return f"boolean {v!r}".lower()
    if isinstance(v, (int, float)):
        return f"{type(v).__name__} {v!r}"
    if isinstance(v, str):
        return f"string {v[:40]!r}"
    if isinstance(v, (list, tuple)):
        return f"array of {len(v)}"
    if isinstance(v, dict):
        return f"map of {len(v)}"
    return type(v).__name__


def _names(keys: Iterable[object], limit: int = 5) -> str:
    """Some keys for a message, each shortened: a request's keys are the client's, any size."""
    names = list(keys)
    shown = ", ".join(repr(k[:40] if isinstance(k, str) else k) for k in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: A validated pose argument: ``{"matrix": [16]}`` or ``{"translation_m": [3], "quaternion":
#: {"w", "x", "y", "z"}}`` (:func:`v_pose`).
PoseArg: TypeAlias = dict[str, list[float] | dict[str, float]]
#: A validated explicit station: ``{"q_rad": [n]}`` or ``{"base_T_flange": PoseArg}`` (:func:`v_stations`).
StationArg: TypeAlias = dict[str, list[float] | PoseArg]
#: An argument's validator: the value from the wire in, the value the handler gets out (or
#: ``_ArgError``); each carries a ``type_name`` for messages and the catalogue.
Validator: TypeAlias = Callable[[object], object]


def v_string(max_len: int = 256) -> Callable[[object], str]:
    def check(v: object) -> str:
        if not isinstance(v, str) or not 1 <= len(v) <= max_len:
            raise _ArgError(f"expected a string of 1..{max_len} characters, got {_what(v)}")
        return v
    check.type_name = f"string (1..{max_len} chars)"  # type: ignore[attr-defined]
    return check


_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def v_record_id(v: object) -> str:
    """A record id (``result_id``, ``run_id``): 1..64 of ``[A-Za-z0-9._:-]``; a decimal id
    fits int64, as the store's ids do (a longer number names nothing and must not reach it)."""
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_RECORD_ID_CHARS or not set(v) <= _ID_CHARS:
        raise _ArgError(f"expected an id of 1..{MAX_RECORD_ID_CHARS} characters [A-Za-z0-9._:-], got {_what(v)}")
    if v.isdigit() and (len(v) > 19 or int(v) >= 2**63):
        raise _ArgError(f"a numeric id must be below 2**63, got {len(v)} digits")
    return v


v_record_id.type_name = f"id (1..{MAX_RECORD_ID_CHARS} chars [A-Za-z0-9._:-])"  # type: ignore[attr-defined]


def v_name(v: object) -> str:
    """A frame or plan name: 1..64 of ``[A-Za-z0-9._:-]`` (it ends up in names on the wire)."""
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_NAME_CHARS or not set(v) <= _ID_CHARS:
        raise _ArgError(f"expected a name of 1..{MAX_NAME_CHARS} characters [A-Za-z0-9._:-], got {_what(v)}")
    return v


v_name.type_name = f"name (1..{MAX_NAME_CHARS} chars [A-Za-z0-9._:-])"  # type: ignore[attr-defined]


def v_choice(*choices: str) -> Callable[[object], str]:
    def check(v: object) -> str:
        if not isinstance(v, str) or v not in choices:
            raise _ArgError(f"expected one of {', '.join(choices)}, got {_what(v)}")
        return v
    check.type_name = "string: " + " | ".join(choices)  # type: ignore[attr-defined]
    return check


def v_int(lo: int, hi: int) -> Callable[[object], int]:
    def check(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _ArgError(f"expected an integer in [{lo}, {hi}], got {_what(v)}")
        return v
    check.type_name = f"integer in [{lo}, {hi}]"  # type: ignore[attr-defined]
    return check


def _numbers(v: object, n: int | tuple[int, int], what: str, bound: float | None = None) -> list[float]:
    lo, hi = (n, n) if isinstance(n, int) else n
    count = f"{lo}" if lo == hi else f"{lo}..{hi}"
    within = f" within +-{bound:g}" if bound is not None else ""
    if not isinstance(v, (list, tuple)) or not lo <= len(v) <= hi:
        raise _ArgError(f"expected {what}: an array of {count} finite numbers{within}, got {_what(v)}")
    for i, x in enumerate(v):
        if not _is_number(x):
            raise _ArgError(f"expected {what}: an array of {count} finite numbers{within}, element {i} is {_what(x)}")
        if bound is not None and not -bound <= x <= bound:
            raise _ArgError(f"{what}: element {i} is {_what(x)}, beyond +-{bound:g}")
    return [float(x) for x in v]


def v_vec3(v: object) -> list[float]:
    return _numbers(v, 3, "[x, y, z] in metres", MAX_POSITION_M)


v_vec3.type_name = f"array of 3 numbers within +-{MAX_POSITION_M:g} m"  # type: ignore[attr-defined]


def _quat(v: object) -> dict[str, float]:
    if not isinstance(v, dict) or set(v) != {"w", "x", "y", "z"} or not all(_is_number(v[k]) for k in "wxyz"):
        raise _ArgError(f"quaternion: expected a map {{w, x, y, z}} of finite numbers, got {_what(v)}")
    n = math.sqrt(sum(v[k] ** 2 for k in "wxyz"))
    if abs(n - 1.0) > 1e-6:
        raise _ArgError(f"quaternion: expected unit norm, got norm {n:.9g}")
    return {k: float(v[k]) for k in "wxyz"}


def v_pose(v: object) -> PoseArg:
    """A pose: ``{matrix: [16]}`` or ``{translation_m: [3], quaternion: {w,x,y,z}}``."""
    if not isinstance(v, dict):
        raise _ArgError(f"expected a map with matrix, or translation_m and quaternion, got {_what(v)}")
    keys = set(v)
    if keys == {"matrix"}:
        m = _numbers(v["matrix"], 16, "matrix (16 numbers, row-major)", MAX_POSITION_M)
        if any(abs(a - b) > 1e-9 for a, b in zip(m[12:], (0.0, 0.0, 0.0, 1.0), strict=True)):
            raise _ArgError("matrix: the last row must be 0, 0, 0, 1")
        r = [m[0:3], m[4:7], m[8:11]]
        for i in range(3):
            for j in range(3):
                dot = sum(r[i][k] * r[j][k] for k in range(3))
                if abs(dot - (1.0 if i == j else 0.0)) > 1e-6:
                    raise _ArgError("matrix: the rotation part must be orthonormal (within 1e-6)")
        det = (r[0][0] * (r[1][1] * r[2][2] - r[1][2] * r[2][1]) - r[0][1] * (r[1][0] * r[2][2] - r[1][2] * r[2][0])
               + r[0][2] * (r[1][0] * r[2][1] - r[1][1] * r[2][0]))
        if det < 0:
            raise _ArgError("matrix: the rotation part is a reflection (determinant -1)")
        return {"matrix": m}
    if keys == {"translation_m", "quaternion"}:
        return {"translation_m": _numbers(v["translation_m"], 3, "translation_m", MAX_POSITION_M),
                "quaternion": _quat(v["quaternion"])}
    raise _ArgError(f"expected keys matrix, or translation_m and quaternion, got {_names(sorted(keys))}")


v_pose.type_name = "pose map"  # type: ignore[attr-defined]


def v_stations(v: object) -> list[StationArg]:
    """Explicit stations: ``[{q_rad: [n]}]`` or ``[{base_T_flange: pose}]``."""
    if not isinstance(v, (list, tuple)) or not 1 <= len(v) <= MAX_STATIONS:
        raise _ArgError(f"expected an array of 1..{MAX_STATIONS} stations, got {_what(v)}")
    out: list[StationArg] = []
    for i, st in enumerate(v):
        try:
            if isinstance(st, dict) and set(st) == {"q_rad"}:
                out.append({"q_rad": _numbers(st["q_rad"], (1, 12), "q_rad (joint angles, rad)", MAX_JOINT_RAD)})
            elif isinstance(st, dict) and set(st) == {"base_T_flange"}:
                out.append({"base_T_flange": v_pose(st["base_T_flange"])})
            else:
                raise _ArgError(f"expected a map with q_rad or base_T_flange, got {_what(st)}")
        except _ArgError as exc:
            raise _ArgError(f"[{i}]: {exc}") from None
    return out


v_stations.type_name = "array of station maps"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Arg:
    """One command argument: its validator, whether it is required, and its default."""

    name: str
    check: Validator
    required: bool = False
    default: object = None
    doc: str = ""

    @property
    def type_name(self) -> str:
        return getattr(self.check, "type_name", "value")


@dataclass(frozen=True)
class Command:
    """One command of the catalogue: the role it needs and its arguments."""

    name: str
    role: str
    args: tuple[Arg, ...] = ()
    doc: str = ""
    exclusive: tuple[tuple[str, ...], ...] = field(default=())  # at most one of each group
    one_of: tuple[str, ...] = ()  # exactly one of these must be given


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("get_status", ROLE_OBSERVER, doc="the daemon's status (same fields as the heartbeat body)"),
    Command("get_snapshot", ROLE_OBSERVER, doc="latest envelope of every topic and the seq it is current to"),
    Command("get_result", ROLE_OBSERVER, (
        Arg("result_id", v_record_id, doc="a result id; omitted: the active result"),
    ), doc="one calibration result (the active one by default)"),
    Command("list_results", ROLE_OBSERVER, (
        Arg("limit", v_int(1, 1000), default=50, doc="newest first, at most this many"),
        Arg("kind", v_choice(*RUN_KINDS), doc="only results of this kind"),
    ), doc="summaries of stored results, newest first"),
    Command("to_base", ROLE_OBSERVER, (
        Arg("point_m", v_vec3, doc="a point in the cell frame, metres"),
        Arg("pose", v_pose, doc="a pose cell_T_x: {matrix} or {translation_m, quaternion}"),
        Arg("child_frame", v_name, doc='name of frame x in the reply (pose only; default "pose")'),
        Arg("result_id", v_record_id, doc="use this result instead of the active one"),
        Arg("frame", v_choice(*TO_BASE_FRAMES), doc='the frame point_m / pose are in (default "cell")'),
        Arg("flange_pose", v_pose, doc="frame camera, eye in hand: base_T_flange when the camera saw it"),
    ), doc="express a cell-frame (or camera-frame) point or pose in the robot base frame", one_of=("point_m", "pose")),
    Command("start_run", ROLE_OPERATOR, (
        Arg("kind", v_choice(*RUN_KINDS), required=True, doc="what to calibrate"),
        Arg("plan", v_name, doc="a named station plan; omitted: the configured [plan]"),
        Arg("stations", v_stations, doc="explicit stations instead of a plan"),
        Arg("motion_mode", v_choice(*MOTION_MODES), doc="omitted: [capture] motion_mode"),
    ), doc="start a calibration run (returns at once; progress on station/state/result)",
        exclusive=(("plan", "stations"),)),
    Command("abort", ROLE_OPERATOR, (
        Arg("run_id", v_record_id, doc="abort only if this run is the one in progress"),
    ), doc="abort the run or drift check in progress (the robot stops)"),
    Command("run_drift_check", ROLE_OPERATOR, doc="revisit the check stations now"),
    Command("activate_result", ROLE_OPERATOR, (
        Arg("result_id", v_record_id, required=True, doc="the result to make active"),
    ), doc="make a stored result the active calibration (roll back or forward)"),
)}


def validate_args(cmd: str, args: object) -> dict[str, object]:
    """Check ``args`` against the catalogue entry of ``cmd``; return them with defaults filled.

    Raises
    ------
    CommandError
        ``E_BAD_REQUEST`` naming the argument, the type expected and what was given.
    """
    spec = COMMANDS.get(cmd)
    if spec is None:
        raise CommandError(E_BAD_REQUEST, f"unknown command {cmd!r} (known: {', '.join(COMMANDS)})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise CommandError(E_BAD_REQUEST, f"args: expected a map, got {_what(args)}")
    known = {a.name: a for a in spec.args}
    unknown = [k for k in args if k not in known]
    if unknown:
        accepted = ", ".join(known) if known else "none"
        raise CommandError(E_BAD_REQUEST, f"{cmd}: unknown argument(s) {_names(unknown)} (accepted: {accepted})")
    out: dict[str, object] = {}
    for a in spec.args:
        if a.name in args:
            try:
                out[a.name] = a.check(args[a.name])
            except _ArgError as exc:
                raise CommandError(E_BAD_REQUEST, f"{cmd}: args.{a.name}: {exc}") from None
        elif a.required:
            raise CommandError(E_BAD_REQUEST, f"{cmd}: args.{a.name} is required ({a.type_name})")
        elif a.default is not None:
            out[a.name] = a.default
    for group in spec.exclusive:
        given = [k for k in group if k in args]
        if len(given) > 1:
            raise CommandError(E_BAD_REQUEST, f"{cmd}: give at most one of {', '.join(group)}")
    if spec.one_of and sum(k in args for k in spec.one_of) != 1:
        raise CommandError(E_BAD_REQUEST, f"{cmd}: give exactly one of {', '.join(spec.one_of)}")
    return out


