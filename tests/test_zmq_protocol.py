"""cellcal.daemon.protocol without sockets: names, envelope bytes, request parsing, argument checks."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_zmq_support import CELL_T_BASE, MemoryDaemon, pose

from cellcal.daemon import bodies
from cellcal.daemon import protocol as P
from cellcal.solver.se3 import quat_from_matrix, se3_inverse


def test_names_are_exactly_the_design():
    assert (P.SCHEMA, P.V) == ("cellcal/v1", 1)
    assert P.TOPICS == ("cellcal/v1/heartbeat", "cellcal/v1/state", "cellcal/v1/station",
                        "cellcal/v1/result", "cellcal/v1/drift", "cellcal/v1/fault")
    assert all(t.startswith(P.TOPIC_PREFIX) for t in P.TOPICS)
    assert {c: s.role for c, s in P.COMMANDS.items()} == {
        "get_status": "observer", "get_snapshot": "observer", "get_result": "observer",
        "list_results": "observer", "to_base": "observer", "start_run": "operator", "abort": "operator",
        "run_drift_check": "operator", "activate_result": "operator"}
    for code in P.ERROR_CODES:
        assert getattr(P, code) == code
    assert set(P.RESULT_TYPES) == set(P.COMMANDS) and set(P.BODY_TYPES) == set(P.TOPICS)


def test_roles():
    assert P.role_allows("operator", "observer") and P.role_allows("operator", "operator")
    assert P.role_allows("observer", "observer") and not P.role_allows("observer", "operator")
    assert not P.role_allows("", "observer") and not P.role_allows("admin", "observer")


@given(seq=st.integers(1, 2**63 - 1), ts=st.integers(0, 2**63 - 1),
       boot=st.text(min_size=1, max_size=32),
       body=st.dictionaries(st.text(max_size=10), st.one_of(st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                                                            st.text(), st.none(), st.booleans()), max_size=8))
def test_envelope_bytes_equal_the_plain_encoding(seq, ts, boot, body):
    packed = P.pack_envelope(seq, boot, ts, P.pack(body))
    assert packed == P.pack(P.make_envelope(seq, boot, body, ts))
    env = P.unpack(packed)
    assert P.check_envelope(env) is None and env["body"] == body


def test_envelope_checks():
    good = P.make_envelope(1, "ab", {})
    assert P.check_envelope(good) is None
    for bad in ({**good, "schema": "x"}, {**good, "v": 2}, {**good, "seq": 0}, {**good, "seq": True},
                {**good, "boot_id": ""}, {**good, "ts_ns": 1.5}, {**good, "body": []}, [good]):
        assert P.check_envelope(bad)
    assert len(P.new_boot_id()) == 16 and P.new_boot_id() != P.new_boot_id()
    assert abs(good["ts_ns"] - __import__("time").time_ns()) < 5e9


@given(st.binary(max_size=200))
def test_parse_request_never_fails_otherwise_on_garbage(data):
    try:
        req = P.parse_request(data)
    except P.BadRequest as exc:
        assert exc.code == P.E_BAD_REQUEST and exc.message
        return
    assert req.cmd in P.COMMANDS and isinstance(req.args, dict)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=8),
                  st.binary(max_size=8))
_value = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


@given(cmd=st.sampled_from([*P.COMMANDS, "nope"]), args=st.dictionaries(st.text(max_size=12), _value, max_size=4),
       rid=st.one_of(st.text(max_size=140), st.integers(-5, 2**64 - 1), st.none(), st.booleans()))
def test_structured_garbage_is_bad_request_or_valid(cmd, args, rid):
    data = msgpack.packb({"id": rid, "cmd": cmd, "args": args}, use_bin_type=True)
    try:
        req = P.parse_request(data)
        P.validate_args(req.cmd, req.args)
    except P.CommandError as exc:
        assert exc.code == P.E_BAD_REQUEST and exc.message


def test_request_parsing_names_the_problem():
    cases = {
        b"\xc1": "not valid msgpack",
        P.pack([1]): "must be a map",
        P.pack({"cmd": "get_status"}): "id:",
        P.pack({"id": "", "cmd": "get_status"}): "id:",
        P.pack({"id": "x" * 129, "cmd": "get_status"}): "id:",
        P.pack({"id": -1, "cmd": "get_status"}): "id:",
        P.pack({"id": 1, "cmd": 5}): "cmd: expected a string",
        P.pack({"id": 1, "cmd": "fly"}): "unknown command 'fly'",
        P.pack({"id": 1, "cmd": "get_status", "args": "x"}): "args: expected a map",
        P.pack({"id": 1, "cmd": "get_status", "v": 2}): "unknown request field",
        msgpack.packb({"id": 1, "cmd": "get_status", "args": {"a": msgpack.ExtType(5, b"x")}}): "extension",
        msgpack.packb({"id": 1, "cmd": "get_status", "args": {}}, use_bin_type=True) + b"\x00": "extra data",
    }
    for data, needle in cases.items():
        with pytest.raises(P.BadRequest) as exc:
            P.parse_request(data)
        assert needle in exc.value.message, (data, exc.value.message)
    with pytest.raises(P.BadRequest) as exc:
        P.parse_request(P.pack({"id": "k", "cmd": "fly"}))
    assert exc.value.request_id == "k"
    assert P.parse_request(P.pack({"id": 3, "cmd": "get_status", "args": None})).args == {}
    assert P.parse_request(P.pack({"id": 3, "cmd": "get_status"})).id == 3


def test_argument_validation():
    ok = P.validate_args
    assert ok("list_results", {}) == {"limit": 50}
    assert ok("list_results", {"limit": 3, "kind": "hand_eye"}) == {"limit": 3, "kind": "hand_eye"}
    assert ok("to_base", {"point_m": [1, 2, 3.5]}) == {"point_m": [1.0, 2.0, 3.5]}
    assert ok("start_run", {"kind": "base_frame", "stations": [{"q_rad": [0, 1]}]})["stations"] == [{"q_rad": [0.0, 1.0]}]
    bad = [
        ("list_results", {"limit": 0}, "args.limit"), ("list_results", {"limit": True}, "args.limit"),
        ("list_results", {"kind": "x"}, "one of"), ("to_base", {}, "exactly one"),
        ("to_base", {"point_m": [1, 2, math.nan]}, "element 2"), ("to_base", {"point_m": [1, 2, "3"]}, "element 2"),
        ("to_base", {"pose": {"matrix": [1] * 16}}, "last row"),
        ("to_base", {"pose": {"matrix": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, -1, 0, 0, 0, 0, 1]}}, "reflection"),
        ("to_base", {"pose": {"matrix": [2, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]}}, "orthonormal"),
        ("to_base", {"pose": {"translation_m": [0, 0, 0], "quaternion": {"w": 2, "x": 0, "y": 0, "z": 0}}}, "unit norm"),
        ("to_base", {"pose": {"translation_m": [0, 0, 0], "quaternion": [1, 0, 0, 0]}}, "quaternion"),
        ("to_base", {"pose": {"translation_m": [0, 0, 0]}}, "expected keys"),
        ("start_run", {"kind": "base_frame", "stations": []}, "1..1000"),
        ("start_run", {"kind": "base_frame", "stations": [{"q_rad": [0]}, {"x": 1}]}, "[1]"),
        ("start_run", {"kind": "base_frame", "motion_mode": "dance"}, "motion_mode"),
        ("activate_result", {}, "required"), ("activate_result", {"result_id": ""}, "1..64"),
        ("abort", {"force": True}, "unknown argument"), ("get_status", {"x": 1}, "accepted: none"),
    ]
    for cmd, args, needle in bad:
        with pytest.raises(P.CommandError) as exc:
            ok(cmd, args)
        assert exc.value.code == P.E_BAD_REQUEST and needle in exc.value.message, (cmd, args, exc.value.message)
        assert cmd in exc.value.message


def test_command_error_codes_are_checked():
    with pytest.raises(ValueError):
        P.CommandError("E_WHATEVER", "x")
    e = P.CommandError(P.E_BUSY, "run in progress")
    assert (e.code, e.message, str(e)) == ("E_BUSY", "run in progress", "E_BUSY: run in progress")


def test_pack_converts_numpy_and_refuses_the_rest():
    assert P.unpack(P.pack({"a": np.arange(3), "b": np.float32(1.5), "c": np.int64(7)})) == {"a": [0, 1, 2], "b": 1.5, "c": 7}
    with pytest.raises(TypeError):
        P.pack({"a": object()})
    assert P.unpack(P.pack({"s": "é", "b": b"\x00"})) == {"s": "é", "b": b"\x00"}


def _heartbeat() -> dict:
    """A heartbeat as the daemon builds it (cellcal.daemon.bodies)."""
    from cellcal.daemon import bodies

    dev = {"connected": True, "url": "rtde://127.0.0.1:30004", "identity_text": "UR5e 1"}
    return dict(bodies.heartbeat(cell="c", state=P.STATE_IDLE, detail="", uptime_s=1.0, heartbeat_s=1.0,
                                 devices={P.DEVICE_ROBOT: dev, P.DEVICE_TRACKER: dict(dev, identity_text=None)},
                                 active_result_id=3, suspect=False, run_id=None, version="0"))


def test_body_checker_finds_missing_and_mistyped_fields():
    d = MemoryDaemon()
    assert P.check_body(P.TOPIC_HEARTBEAT, _heartbeat()) == []
    body = _heartbeat()
    del body["suspect"]
    body["uptime_s"] = "long"
    body["devices"]["robot"]["connected"] = 1
    problems = P.check_body(P.TOPIC_HEARTBEAT, body)
    assert "body.suspect: missing" in problems
    assert any(p.startswith("body.uptime_s") for p in problems)
    assert any(p.startswith("body.devices.robot.connected") for p in problems)
    assert P.check_body(P.TOPIC_RESULT, d.make_result(CELL_T_BASE)) == []
    assert P.check_body(P.TOPIC_STATE, {"state": "NAPPING"})
    assert P.check_body("cellcal/v1/x", {}) == ["unknown topic 'cellcal/v1/x'"]
    assert P.check_body(P.TOPIC_FAULT, {"code": "E_DEVICE", "device": None, "message": "m", "state": "FAULT",
                                        "active": True, "retry_in_s": None, "extra": 1}) == []


@given(st.lists(st.floats(-3, 3), min_size=6, max_size=6), st.lists(st.floats(-5, 5), min_size=3, max_size=3))
def test_to_base_point_and_pose_agree_with_the_inverse(xi, p):
    cell_T_base = pose(xi[:3], xi[3:])
    base_T_cell = se3_inverse(cell_T_base)
    out = bodies.to_base_reply(cell_T_base, P.validate_args("to_base", {"point_m": p}), result_id="r", suspect=True)
    assert out["suspect"] is True and out["frame"] == "base"
    np.testing.assert_allclose(out["point_m"], base_T_cell[:3, :3] @ p + base_T_cell[:3, 3], atol=1e-9)
    cell_T_x = pose(p, xi[3:][::-1])
    q = quat_from_matrix(cell_T_x[:3, :3])
    a = bodies.to_base_reply(cell_T_base, P.validate_args("to_base", {"pose": {"matrix": cell_T_x.reshape(16).tolist()}}),
                        result_id="r", suspect=False)
    b = bodies.to_base_reply(cell_T_base, P.validate_args("to_base", {"pose": {
        "translation_m": list(p), "quaternion": dict(zip("wxyz", map(float, q), strict=True))}, "child_frame": "tcp"}),
        result_id="r", suspect=False)
    np.testing.assert_allclose(a["pose"]["matrix"], (base_T_cell @ cell_T_x).reshape(16), atol=1e-9)
    np.testing.assert_allclose(b["pose"]["matrix"], a["pose"]["matrix"], atol=1e-9)
    assert (a["pose"]["child_frame"], b["pose"]["child_frame"]) == ("pose", "tcp")
    assert P.check_result("to_base", a) == [] and P.check_result("to_base", b) == []
