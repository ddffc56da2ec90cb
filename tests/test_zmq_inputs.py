"""Inputs at the protocol edge: ids and numbers bounded and typed, replies never non-finite,
and no request a client may send turns into a traceback in the log (a flood least of all).

Through the real daemon (``App``: store in SQLite, service, ZeroMQ server on loopback, devices
offline) where the command needs it, else through ``ZmqServer`` with a small handler.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from test_zmq_support import dealer, rpc, serving, zctx, zmq_config

from cellcal.daemon import protocol as P
from cellcal.daemon.app import App
from cellcal.daemon.bodies import result_to_wire, transform_to_wire
from cellcal.daemon.config import load_config_text
from cellcal.daemon.store import Store
from cellcal.solver import calibrate_base_frame
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.solver.synthetic import base_frame_scene
from cellcal.testing.harness import daemon_config, free_port, to_toml

HUGE = 1.5e308  # finite, but a rotation of it by 45 degrees is not


def _seed(state: Path) -> tuple[int, int]:
    scene = base_frame_scene(8, np.random.default_rng(3), noise_mm=0.01, noise_deg=0.005)
    wire = result_to_wire(calibrate_base_frame(scene.base_T_flange, scene.measured))
    wire["gates"] = {"passed": True, "failed": []}
    far = make_transform(so3_exp([0.0, 0.0, math.pi / 4]), [HUGE, HUGE, 0.0])
    giant = {"transforms": {"cell_T_base": transform_to_wire("cell_T_base", far)}, "gates": {"passed": True, "failed": []}}
    with Store(state) as s:
        good = s.add_result(None, "base_frame", wire, {}, activate=True)
        far_id = s.add_result(None, "base_frame", giant, {})
    return good, far_id


@contextlib.contextmanager
def daemon(tmp_path: Path):
    """The real daemon in this process, devices offline; yields (cmd_endpoint, good id, far id)."""
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                         tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path)
    cfgd["zmq"]["null_role"] = "observer"  # the attack came from the observer role
    good, far = _seed(Path(cfgd["service"]["state_dir"]))
    cfg = load_config_text(to_toml(cfgd))
    with App(cfg, supervise=True) as app:
        yield app.server.cmd_endpoint, good, far


def _tracebacks(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_result_id_beyond_int64_is_a_bad_request_logged_once_never_a_traceback(tmp_path, caplog):
    with daemon(tmp_path) as (cmd, good, _far), zctx() as ctx, caplog.at_level(logging.DEBUG, logger="cellcal"):
        s = dealer(ctx, cmd)
        caplog.clear()
        for i in range(500):
            for rid in ("9" * 30, str(2**63), "1" + "0" * 19):
                reply = rpc(s, {"id": f"{i}-{rid[:3]}", "cmd": "get_result", "args": {"result_id": rid}})
                assert reply["ok"] is False and reply["error"]["code"] == P.E_BAD_REQUEST, reply
                assert "2**63" in reply["error"]["message"]
        for rid, code in ((str(2**63 - 1), P.E_NOT_FOUND), ("r-7", P.E_NOT_FOUND), ("7 ", P.E_BAD_REQUEST),
                          ("+7", P.E_BAD_REQUEST), ("1_0", P.E_NOT_FOUND), ("", P.E_BAD_REQUEST)):
            reply = rpc(s, {"id": "x" + rid, "cmd": "get_result", "args": {"result_id": rid}})
            assert reply["error"]["code"] == code, (rid, reply)
        assert rpc(s, {"id": "ok", "cmd": "get_result", "args": {"result_id": str(good)}})["ok"] is True
        assert not _tracebacks(caplog)
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "malformed request" in r.getMessage()]
        assert 1 <= len(warnings) <= 2  # once per 10 s window, not once per request


def test_to_base_never_replies_a_non_finite_number(tmp_path, caplog):
    with daemon(tmp_path) as (cmd, good, far), zctx() as ctx, caplog.at_level(logging.INFO, logger="cellcal"):
        s = dealer(ctx, cmd)
        for point in ([1.7e308, 0, 0], [-1.7e308, 1.7e308, 1.0], [2e6, 0, 0], [0, 0, 18446744073709551615]):
            reply = rpc(s, {"id": "p", "cmd": "to_base", "args": {"point_m": point}})
            assert reply["error"]["code"] == P.E_BAD_REQUEST and "point_m" in reply["error"]["message"]
        pose = {"translation_m": [1.7e308, 0, 0], "quaternion": {"w": 1, "x": 0, "y": 0, "z": 0}}
        reply = rpc(s, {"id": "q", "cmd": "to_base", "args": {"pose": pose}})
        assert reply["error"]["code"] == P.E_BAD_REQUEST and "translation_m" in reply["error"]["message"]
        # In-range arguments, but a calibration whose translation is near the float maximum:
        # the product is not finite, and the request is refused rather than answered with inf.
        for args in ({"point_m": [1e6, 1e6, 0.0]},
                     {"pose": {"translation_m": [1e6, 0, 0], "quaternion": {"w": 1, "x": 0, "y": 0, "z": 0}}}):
            reply = rpc(s, {"id": "r", "cmd": "to_base", "args": {**args, "result_id": str(far)}})
            assert reply["ok"] is False and reply["error"]["code"] == P.E_BAD_REQUEST, reply
            assert "finite" in reply["error"]["message"]
        reply = rpc(s, {"id": "g", "cmd": "to_base", "args": {"point_m": [1.0, 0.5, 0.25]}})
        assert reply["ok"] is True and P.find_non_finite(reply) is None
        assert not _tracebacks(caplog)


class _Broken:
    """A handler with a bug a client can trigger at will, and one that returns inf."""

    def handle(self, cmd, args, caller):
        if cmd == "list_results":
            return {"results": [], "active_result_id": None, "x": [1.0, float("inf")]}
        raise KeyError("a bug")


def test_internal_errors_log_one_traceback_per_window_and_never_send_inf(caplog):
    with serving(zmq_config(), daemon=None) as (srv, _mem), zctx() as ctx:
        srv._handler = _Broken()
        s = dealer(ctx, srv.cmd_endpoint)
        with caplog.at_level(logging.ERROR, logger="cellcal.daemon.zmq"):
            for i in range(300):
                reply = rpc(s, {"id": i, "cmd": "get_status"})
                assert reply["error"]["code"] == P.E_INTERNAL and "KeyError" in reply["error"]["message"]
            s.send(P.pack({"id": "inf", "cmd": "list_results"}))
            assert s.poll(2000)
            raw = s.recv()
        reply = P.unpack(raw)
        assert reply["ok"] is False and reply["error"]["code"] == P.E_INTERNAL
        assert b"\xcb\x7f\xf0" not in raw  # no float 64 infinity anywhere in the bytes
        with_tb = [r for r in caplog.records if r.exc_info]
        assert len(with_tb) == 2  # one per (command, exception type) in the window: KeyError, ValueError
        assert srv.stats()["internal_errors"] == 301


def test_client_supplied_names_are_bounded_in_replies():
    with serving(zmq_config()) as (srv, _mem), zctx() as ctx:
        s = dealer(ctx, srv.cmd_endpoint)
        args = {("k" * 2000) + str(i): 1 for i in range(300)}  # 600 kB, under max_msg_bytes
        reply = rpc(s, {"id": "big", "cmd": "get_status", "args": args})
        assert reply["error"]["code"] == P.E_BAD_REQUEST and len(reply["error"]["message"]) < 600
        reply = rpc(s, {"id": "big2", "cmd": "to_base", "args": {"pose": {"m" * 100_000: 1}}})
        assert reply["error"]["code"] == P.E_BAD_REQUEST and len(reply["error"]["message"]) < 600
        for frame in ("a b", "x" * 65, "é", "a\nb"):
            reply = rpc(s, {"id": "cf", "cmd": "to_base", "args": {
                "pose": {"matrix": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]}, "child_frame": frame}})
            assert reply["error"]["code"] == P.E_BAD_REQUEST and "child_frame" in reply["error"]["message"]


@pytest.mark.parametrize("value, ok", [(0.0, True), (-99.9, True), (100.0, True), (100.5, False), (1e300, False)])
def test_joint_angles_are_bounded(value, ok):
    try:
        P.validate_args("start_run", {"kind": "base_frame", "stations": [{"q_rad": [value] * 6}]})
    except P.CommandError as exc:
        assert not ok and "q_rad" in exc.message and "beyond" in exc.message
    else:
        assert ok
