"""The ZeroMQ contract as the real daemon speaks it: every body it publishes, every reply.

The cell is ``cellcal.daemon.harness.inprocess_cell``: the simulated robot over RTDE on
loopback, the simulated tracker, the real store, the real service and its real ZeroMQ
server. A raw SUB socket records what goes out on the wire and a raw DEALER sends every
command of ``protocol.COMMANDS``; each envelope must pass ``protocol.check_envelope``,
each body ``protocol.check_body`` for its topic and each reply ``protocol.check_reply``
(the command's result TypedDict, or an error with a known code). The sessions go through
what clients see: a run, a drift check, an abort from capturing, refused commands, and a
device fault that is raised, attributed to the device that failed, and cleared.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import numpy as np
import pytest
import zmq

from cellcal.daemon import protocol as P
from cellcal.daemon.harness import Recorder, free_port, inprocess_cell
from cellcal.daemon.report import transform_from_wire
from cellcal.daemon.store import RunStatus
from cellcal.solver.se3 import se3_inverse

WAIT_S = 90.0  # deadlines only: a loaded machine is slow, a broken daemon never answers
_ids = itertools.count(1)


class Commands:
    """A raw DEALER on the daemon's command socket; every reply is checked and kept."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.replies: list[tuple[str, dict]] = []
        self.problems: list[tuple[str, dict, list[str]]] = []

    def call(self, cmd: str, **args) -> dict:
        rid = f"contract-{next(_ids)}"
        self.sock.send(P.pack({"id": rid, "cmd": cmd, "args": args}))
        if not self.sock.poll(int(WAIT_S * 1000), zmq.POLLIN):
            pytest.fail(f"no reply to {cmd} within {WAIT_S} s")
        reply = P.unpack(self.sock.recv(), max_array=1 << 24, max_map=1 << 20)
        problems = P.check_reply(cmd, reply, rid)
        if problems:
            self.problems.append((cmd, reply, problems))
        self.replies.append((cmd, reply))
        return reply

    def ok(self, cmd: str, **args) -> dict:
        reply = self.call(cmd, **args)
        assert reply["ok"], (cmd, reply)
        return reply["result"]

    def error(self, cmd: str, code: str, **args) -> dict:
        reply = self.call(cmd, **args)
        assert not reply["ok"] and reply["error"]["code"] == code, (cmd, code, reply)
        return reply["error"]

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def _check_wire(rec: Recorder) -> set[str]:
    """Every envelope and body the SUB socket received conforms; returns the topics seen."""
    rec.pump(0.05)
    assert not rec.problems, rec.problems[:3]
    bad = []
    for topic, env in rec.messages:
        envelope_problem = P.check_envelope(env)
        problems = [envelope_problem] if envelope_problem else P.check_body(topic, env["body"])
        if problems:
            bad.append((topic, problems[:3], str(env["body"])[:300]))
    assert not bad, f"{len(bad)} published bodies do not conform, e.g. {bad[:3]}"
    return {t for t, _ in rec.messages}


def _check_snapshot(snap: dict) -> None:
    for topic, env in snap["messages"].items():
        assert P.check_envelope(env) is None, (topic, env)
        assert P.check_body(topic, env["body"]) == [], (topic, P.check_body(topic, env["body"]))


def _session(tmp_path: Path, **cell_kw):
    return inprocess_cell(tmp_path, n_stations=6, validate_bodies=True, **cell_kw)


def test_every_command_and_every_published_body_of_a_session_conform(tmp_path):
    """Before any calibration (refusals), a run, every observer command, a drift check, a
    second run aborted from CAPTURING, activation: each reply and each body on the wire
    matches the protocol, and every command of the catalogue answered ok at least once."""
    with _session(tmp_path) as cell:
        z = cell.cfg.zmq
        rec = Recorder(z.pub_endpoint)
        cmds = Commands(z.cmd_endpoint)
        try:
            # Nothing calibrated yet: the refusals have their documented codes.
            assert cmds.ok("get_status")["state"] == P.STATE_IDLE
            _check_snapshot(cmds.ok("get_snapshot"))
            assert cmds.ok("list_results") == {"results": [], "active_result_id": None}
            cmds.error("get_result", P.E_NO_CALIBRATION)
            cmds.error("to_base", P.E_NO_CALIBRATION, point_m=[1.0, 0.0, 0.0])
            cmds.error("run_drift_check", P.E_NO_CALIBRATION)
            cmds.error("activate_result", P.E_NOT_FOUND, result_id="99")
            cmds.error("start_run", P.E_BAD_REQUEST, kind="hand_eye", motion_mode="dance")
            assert cmds.ok("abort") == {"aborted": False, "run_id": None}

            # A run to its result. (Every wait looks from a mark set before the action, so a
            # message that came in one batch with an earlier one is not missed.)
            mark = rec.mark()
            started = cmds.ok("start_run", kind=P.KIND_BASE_FRAME)
            assert started["kind"] == P.KIND_BASE_FRAME and started["planned"] == 6
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b["run_id"] == started["run_id"], WAIT_S,
                                   what="the first run's result", since=mark)
            result = env["body"]
            assert result["active"] and not result["retained"] and result["gates"]["passed"]
            assert [c["name"] for c in result["gates"]["checks"]] == [
                "rms_translation", "rms_rotation", "converged", "model_error", "sigma_at_task_points", "reach"]

            # Every observer command against it.
            assert cmds.ok("get_result") == cmds.ok("get_result", result_id=result["result_id"])
            listed = cmds.ok("list_results", limit=5, kind=P.KIND_BASE_FRAME)
            assert listed["active_result_id"] == result["result_id"] and listed["results"][0]["accepted"]
            X = transform_from_wire(result["transforms"]["cell_T_base"])
            p = cmds.ok("to_base", point_m=[1.0, 0.5, 0.25])
            np.testing.assert_allclose(p["point_m"], (se3_inverse(X) @ [1.0, 0.5, 0.25, 1.0])[:3], atol=1e-12)
            pose = cmds.ok("to_base", pose={"matrix": np.eye(4).reshape(16).tolist()}, child_frame="part")
            assert pose["pose"]["child_frame"] == "part" and pose["result_id"] == result["result_id"]
            status = cmds.ok("get_status")
            assert status["active_result_id"] == result["result_id"] and status["devices"]["robot"]["connected"]
            _check_snapshot(cmds.ok("get_snapshot"))

            # A drift check: the reply names the check the drift topic then reports.
            mark = rec.mark()
            check = cmds.ok("run_drift_check")
            assert check["result_id"] == result["result_id"] and check["check_id"] >= 1
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_DRIFT, WAIT_S, what="the drift check", since=mark)
            drift = env["body"]
            assert (drift["result_id"], drift["check_id"]) == (check["result_id"], check["check_id"])
            assert drift["status"] in P.DRIFT_STATUSES and drift["action"] in P.DRIFT_ACTIONS

            # A second run, aborted while it captures; a drift check meanwhile is refused.
            assert cell.svc.wait_idle(WAIT_S)
            mark = rec.mark()
            run2 = cmds.ok("start_run", kind=P.KIND_BASE_FRAME)["run_id"]
            rec.wait_for(lambda t, b: t == P.TOPIC_STATION and b["run_id"] == run2 and b["accepted"], WAIT_S,
                         what="a station of the second run", since=mark)
            cmds.error("run_drift_check", P.E_BUSY)
            cmds.error("start_run", P.E_BUSY, kind=P.KIND_BASE_FRAME)
            cmds.error("abort", P.E_STATE, run_id="12345")
            mark = rec.mark()
            assert cmds.ok("abort", run_id=run2) == {"aborted": True, "run_id": run2}
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_STATE and b["reason"] == f"run {run2} aborted", WAIT_S,
                                   what="the abort's state message", since=mark)
            aborted = env["body"]
            assert aborted["run_id"] == run2 and aborted["kind"] == P.KIND_BASE_FRAME
            assert aborted["state"] == aborted["previous"] and aborted["motion_mode"] == P.MOTION_COMMAND
            rec.wait_for(lambda t, b: t == P.TOPIC_STATE and b["state"] == P.STATE_IDLE, WAIT_S, what="IDLE again",
                         since=mark)
            assert cell.svc.store.get_run(int(run2)).status == RunStatus.ABORTED

            # Activation (the same result again: roll forward to itself) is published.
            mark = rec.mark()
            act = cmds.ok("activate_result", result_id=result["result_id"])
            assert act == {"active_result_id": result["result_id"], "previous_result_id": result["result_id"]}
            rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b["result_id"] == result["result_id"] and b["active"]
                         and not b["retained"], WAIT_S, what="the activation", since=mark)
            rec.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT, WAIT_S, what="a heartbeat")

            assert not cmds.problems, cmds.problems[:3]
            answered_ok = {c for c, r in cmds.replies if r["ok"]}
            assert answered_ok == set(P.COMMANDS), set(P.COMMANDS) - answered_ok
            seen = _check_wire(rec)
            assert {P.TOPIC_HEARTBEAT, P.TOPIC_STATE, P.TOPIC_STATION, P.TOPIC_RESULT, P.TOPIC_DRIFT} <= seen
            assert cell.nonconforming() == []
        finally:
            cmds.close()
            rec.close()


def test_a_device_fault_is_attributed_published_and_cleared(tmp_path):
    """The tracker is offline when a run starts: the fault topic says so with the tracker
    named (by which device failed to open, not by its message), E_DEVICE, the retry delay
    and the FAULT state; get_status reports FAULT. When a tracker appears on the port, the
    fault is cleared on the same topic and the run completes. Every body conforms."""
    port = free_port()
    with _session(tmp_path, overrides={"tracker": {"url": f"socket://127.0.0.1:{port}"}}) as cell:
        z = cell.cfg.zmq
        rec = Recorder(z.pub_endpoint)
        cmds = Commands(z.cmd_endpoint)
        tracker = None
        try:
            mark = rec.mark()
            run_id = cmds.ok("start_run", kind=P.KIND_BASE_FRAME)["run_id"]
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_FAULT and b["active"], WAIT_S, what="the fault",
                                   since=mark)
            fault = env["body"]
            assert fault["device"] == P.DEVICE_TRACKER and fault["code"] == P.E_DEVICE
            assert fault["state"] == P.STATE_FAULT and fault["retry_in_s"] > 0
            assert "cannot open devices" in fault["message"]
            status = cmds.ok("get_status")
            assert status["state"] == P.STATE_FAULT and status["devices"]["robot"]["connected"] is False

            from cellcal.sim.tracker_sim import SimTracker

            tracker = SimTracker(cell.world, cell.scenario.tracker, transport="tcp", port=port,
                                 seed=cell.scenario.seed).start()
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_FAULT and not b["active"], WAIT_S,
                                   what="the cleared fault", since=mark)
            assert env["body"]["device"] == P.DEVICE_TRACKER and env["body"]["state"] != P.STATE_FAULT
            rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b["run_id"] == run_id, WAIT_S, what="the run's result",
                         since=mark)
            assert not cmds.problems, cmds.problems[:3]
            seen = _check_wire(rec)
            assert {P.TOPIC_FAULT, P.TOPIC_RESULT, P.TOPIC_STATE} <= seen
            assert cell.nonconforming() == []
        finally:
            cmds.close()
            rec.close()
            if tracker is not None:
                tracker.close()


def test_the_checkers_catch_the_shapes_that_once_drifted():
    """What the daemon used to send where the contract says otherwise is refused by the
    checkers (so the tests above would have caught it)."""
    old_abort = {"state": "IDLE", "detail": "run 3 aborted"}
    assert {f"body.{k}: missing" for k in ("previous", "reason", "run_id", "kind", "motion_mode")} <= set(
        P.check_body(P.TOPIC_STATE, old_abort))
    assert set(P.check_result("run_drift_check", {"queued": True})) == {"result.result_id: missing",
                                                                      "result.check_id: missing"}
    assert P.check_reply("run_drift_check", {"id": 1, "ok": True, "result": {"queued": True}})
    assert P.check_reply("abort", {"id": 1, "ok": False, "error": {"code": "E_OOPS", "message": "x"}})
    assert P.check_reply("abort", {"id": 2, "ok": True, "result": {"aborted": True, "run_id": None}}, 1)
    assert P.check_body(P.TOPIC_FAULT, {"code": "E_DEVICE", "device": "gripper", "message": "m", "state": "FAULT",
                                        "active": True, "retry_in_s": None})  # (a camera is a device since ADR 0030)
    heartbeat_without_tracker = {
        "cell": "c", "state": "IDLE", "uptime_s": 1.0, "heartbeat_s": 1.0,
        "devices": {"robot": {"connected": True, "url": "rtde://x", "identity": None}},
        "active_result_id": None, "suspect": False, "run_id": None, "version": "0",
    }
    assert "body.devices.tracker: missing" in P.check_body(P.TOPIC_HEARTBEAT, heartbeat_without_tracker)


# The modules that speak the contract take every vocabulary word from protocol.py.
_SPEAKERS = ("service", "zmq_glue", "bodies", "app", "drift", "gates", "devices", "solve", "capture")


def _string_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


@pytest.mark.parametrize("module", _SPEAKERS)
def test_no_protocol_word_is_spelt_out_outside_the_protocol_module(module):
    words = set(P.TOPICS) | set(P.ERROR_CODES) | set(P.STATES) | set(P.RUN_KINDS) | set(P.MOTION_MODES) | set(
        P.DRIFT_STATUSES) | set(P.DRIFT_ACTIONS) | set(P.DEVICES)
    path = Path(P.__file__).with_name(f"{module}.py")
    found = [(line, s) for line, s in _string_constants(path) if s in words or s.startswith(P.TOPIC_PREFIX)]
    assert not found, f"{path.name}: use the protocol constants for {found}"
