"""The encoding of the ``cellcal/v1`` protocol: msgpack, requests and replies, the envelope.

Read through ``cellcal.daemon.protocol``; the wire format is written in its docstring.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn, TypeGuard

import msgpack

from cellcal.daemon.wire.commands import COMMANDS, CommandError, _names, _what
from cellcal.daemon.wire.vocabulary import E_BAD_REQUEST, MAX_ID_CHARS, MAX_REQUEST_ARRAY, MAX_REQUEST_MAP, SCHEMA, V

# --- msgpack -------------------------------------------------------------------------------------


def _default(obj: object) -> object:
    # numpy arrays and scalars (duck-typed so this module does not need numpy): their exact
    # Python values. Anything else is a bug in the caller, reported as such.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot encode {type(obj).__name__} on the cellcal wire")


def pack(obj: object) -> bytes:
    """msgpack bytes of ``obj`` (str as msgpack str, bytes as bin, floats as float 64)."""
    return msgpack.packb(obj, use_bin_type=True, default=_default)


def _no_ext(code: int, data: bytes) -> NoReturn:
    # (msgpack's timestamp, type -1, is decoded before this hook; as an argument it fails
    # the type checks like any other wrong value.)
    raise ValueError(f"msgpack extension type {code} is not used by cellcal")


def unpack(data: bytes, *, max_array: int = MAX_REQUEST_ARRAY, max_map: int = MAX_REQUEST_MAP) -> object:
    """Decode msgpack strictly: UTF-8 strings, string map keys, no extension types, bounded.

    Returns what the bytes say (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
    lists and string-keyed dicts of them): the caller narrows it.

    Raises
    ------
    ValueError
        Any malformed input (msgpack's own errors are ``ValueError`` subclasses).
    """
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, ext_hook=_no_ext,
            max_str_len=len(data), max_bin_len=len(data), max_array_len=max_array,
            max_map_len=max_map, max_ext_len=len(data),
        )
    except ValueError:
        raise
    except Exception as exc:  # TypeError for unhashable keys, etc.: still malformed input
        raise ValueError(str(exc)) from exc


# --- requests and replies ------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A decoded, well-formed request (``args`` not yet validated against the command)."""

    id: str | int
    cmd: str
    args: dict[str, object]


class BadRequest(CommandError):
    """``E_BAD_REQUEST`` carrying the request id if one could be read (``None`` otherwise)."""

    def __init__(self, message: str, request_id: str | int | None = None) -> None:
        super().__init__(E_BAD_REQUEST, message)
        self.request_id = request_id


def _valid_id(rid: object) -> TypeGuard[str | int]:
    if isinstance(rid, bool):
        return False
    if isinstance(rid, int):
        return 0 <= rid < 2**63
    return isinstance(rid, str) and 1 <= len(rid) <= MAX_ID_CHARS


def parse_request(data: bytes) -> Request:
    """Decode one request frame: msgpack map with ``id``, ``cmd`` and optional ``args``.

    The command name is checked against the catalogue; its arguments are not (authorise
    first, then :func:`validate_args`).

    Raises
    ------
    BadRequest
        With a message for people and the request id when one was readable.
    """
    try:
        obj = unpack(data)
    except ValueError as exc:
        raise BadRequest(f"not valid msgpack: {str(exc)[:200] or type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"a request must be a map {{id, cmd, args}}, got {_what(obj)}")
    rid = obj.get("id")
    if not _valid_id(rid):
        raise BadRequest(f"id: expected a string of 1..{MAX_ID_CHARS} characters or an integer in [0, 2**63), got {_what(rid)}")
    extra = [k for k in obj if k not in ("id", "cmd", "args")]
    if extra:
        raise BadRequest(f"unknown request field(s) {_names(extra)} (a request has id, cmd, args)", rid)
    cmd = obj.get("cmd")
    if not isinstance(cmd, str):
        raise BadRequest(f"cmd: expected a string, got {_what(cmd)}", rid)
    if cmd not in COMMANDS:
        raise BadRequest(f"unknown command {cmd[:64]!r} (known: {', '.join(COMMANDS)})", rid)
    args = obj.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise BadRequest(f"args: expected a map, got {_what(args)}", rid)
    return Request(rid, cmd, args)


def ok_reply(request_id: str | int | None, result: object) -> dict[str, object]:
    return {"id": request_id, "ok": True, "result": result}


def error_reply(request_id: str | int | None, code: str, message: str) -> dict[str, object]:
    return {"id": request_id, "ok": False, "error": {"code": code, "message": message}}


def pack_ok(request_id: str | int | None, result: object) -> bytes:
    return pack(ok_reply(request_id, result))


def pack_error(request_id: str | int | None, code: str, message: str) -> bytes:
    return pack(error_reply(request_id, code, message))


# --- envelope ------------------------------------------------------------------------------------


def new_boot_id() -> str:
    """16 random hex characters, chosen once per daemon start."""
    return secrets.token_hex(8)


def make_envelope(seq: int, boot_id: str, body: Mapping[str, object], ts_ns: int | None = None) -> dict[str, object]:
    """The envelope as a dict (``ts_ns`` defaults to now, wall-clock UTC ns): the shape of
    ``protocol.Envelope``."""
    return {"schema": SCHEMA, "v": V, "seq": int(seq), "boot_id": boot_id,
            "ts_ns": time.time_ns() if ts_ns is None else int(ts_ns), "body": dict(body)}


_P_HEAD = b"\x86" + pack("schema") + pack(SCHEMA) + pack("v") + pack(V)  # fixmap of 6 entries
_P_SEQ, _P_BOOT, _P_TS, _P_BODY = pack("seq"), pack("boot_id"), pack("ts_ns"), pack("body")


def pack_envelope(seq: int, boot_id: str, ts_ns: int, body_packed: bytes) -> bytes:
    """Envelope bytes around an already-packed body.

    The body is packed in the publisher's thread (so a body that cannot be encoded fails
    there, at the caller) while ``seq`` is assigned in the I/O thread (so it follows the
    order on the wire). A msgpack map is a header and its key/value encodings in a row, so
    the two parts are joined without re-encoding. Equal to ``pack(make_envelope(...))``.
    """
    return b"".join((_P_HEAD, _P_SEQ, pack(int(seq)), _P_BOOT, pack(boot_id), _P_TS, pack(int(ts_ns)),
                     _P_BODY, body_packed))


def packed_map(items: list[tuple[str, bytes]]) -> bytes:
    """A msgpack map from keys and already-packed values (see :func:`pack_envelope`)."""
    n = len(items)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
    return head + b"".join(pack(k) + v for k, v in items)


def check_envelope(env: object) -> str | None:
    """``None`` if ``env`` is a well-formed v1 envelope, else what is wrong."""
    if not isinstance(env, dict):
        return f"envelope must be a map, got {_what(env)}"
    if env.get("schema") != SCHEMA or env.get("v") != V:
        return f"schema {env.get('schema')!r} v {env.get('v')!r} is not {SCHEMA} v {V}"
    seq, boot, ts, body = env.get("seq"), env.get("boot_id"), env.get("ts_ns"), env.get("body")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        return f"seq must be a positive integer, got {_what(seq)}"
    if not isinstance(boot, str) or not boot:
        return f"boot_id must be a non-empty string, got {_what(boot)}"
    if isinstance(ts, bool) or not isinstance(ts, int):
        return f"ts_ns must be an integer, got {_what(ts)}"
    if not isinstance(body, dict):
        return f"body must be a map, got {_what(body)}"
    return None


