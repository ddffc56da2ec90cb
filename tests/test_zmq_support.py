"""Shared pieces of the ZeroMQ tests (no tests here).

``MemoryDaemon`` is a real, small implementation of the handler interface
(:class:`cellcal.daemon.protocol.Handler`): results in memory, a state, no devices. The
tests run it behind a real :class:`ZmqServer` on loopback TCP with random ports or ipc in
short temporary directories; every socket has linger 0 and every receive a timeout.

It is a double for testing the *transport* (the server, the clients, the CLI, the C++
example): its heartbeat, state and drift bodies and its command results are built by the
daemon's own ``cellcal.daemon.bodies``, so they cannot drift from what the daemon sends,
but what the daemon itself publishes and replies is tested against the real service in
``tests/test_contract.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shutil
import tempfile
import threading
import time
import types
from typing import Any

import numpy as np
import pytest
import zmq

from cellcal.daemon import bodies
from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import transform_to_wire
from cellcal.daemon.config import Drift, Zmq, ZmqClient
from cellcal.daemon.drift import Verdict
from cellcal.daemon.wire.zmq_server import ZmqServer
from cellcal.solver.se3 import so3_exp

RECV_TIMEOUT_MS = 2000


def zmq_config(**over: Any) -> Any:
    """A ``[zmq]`` section on loopback with random ports.

    ``null_role`` is passed to ``config.Zmq`` when it has the field, else added as an
    attribute (the server reads it with getattr), so these tests do not depend on it.
    """
    null_role = over.pop("null_role", None)
    # Loopback TCP without CURVE lets every local user in: these transport tests say so.
    base = {"pub_endpoint": "tcp://127.0.0.1:*", "cmd_endpoint": "tcp://127.0.0.1:*", "loopback_tcp_any_user": True}
    base.update(over)
    has_field = any(f.name == "null_role" for f in dataclasses.fields(Zmq))
    if null_role is None or has_field:
        return Zmq(**base, **({"null_role": null_role} if null_role is not None else {}))
    cfg = Zmq(**base)
    return types.SimpleNamespace(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, null_role=null_role)


@contextlib.contextmanager
def short_tmpdir():
    """A short directory for ipc:// paths (sun_path is ~107 bytes; pytest's tmp_path can be longer)."""
    d = tempfile.mkdtemp(prefix="cczmq")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pose(xyz_m, rotvec_rad) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = so3_exp(np.asarray(rotvec_rad, dtype=float))
    T[:3, 3] = xyz_m
    return T


CELL_T_BASE = pose([2.5, -0.8, 0.1], [0.0, 0.0, math.radians(30.0)])


class MemoryDaemon:
    """The handler interface with a few results in memory; records every call it runs."""

    def __init__(self, *, cell: str = "test-cell") -> None:
        self.server: ZmqServer | None = None
        self.cell = cell
        self.calls: list[tuple[str, dict, P.Caller]] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.active: str | None = None
        self.suspect = False
        self.state = "IDLE"
        self.run_id: str | None = None
        self.runs = 0
        self.checks = 0
        self.t0 = time.monotonic()
        self.delay_s = 0.0               # make start_run slow (dedup of in-flight retries)
        self.gate = threading.Event()    # start_run waits on it when block is set
        self.block = False
        self.fail_next: BaseException | None = None
        self._lock = threading.Lock()

    # --- bodies ------------------------------------------------------------------------------

    def heartbeat_body(self) -> dict[str, Any]:
        dev = {"connected": True, "url": "sim://", "identity_text": "SIM 1"}
        return dict(bodies.heartbeat(
            cell=self.cell, state=self.state, detail="", uptime_s=time.monotonic() - self.t0, heartbeat_s=1.0,
            devices={P.DEVICE_ROBOT: dev, P.DEVICE_TRACKER: dict(dev)}, active_result_id=self.active,
            suspect=self.suspect, run_id=self.run_id, version="0.1.0"))

    def make_result(self, cell_T_base: np.ndarray, *, kind: str = "base_frame", n: int = 12) -> dict[str, Any]:
        rid = f"r-{len(self.results) + 1:04d}"
        rng = np.random.default_rng(len(self.results))
        now = time.time_ns()
        transforms = {"cell_T_base": transform_to_wire("cell_T_base", cell_T_base),
                      "flange_T_target": transform_to_wire("flange_T_target", pose([0, 0, 0.05], [0, 0, 0]))}
        if kind != "base_frame":
            transforms = {"flange_T_camera": transform_to_wire("flange_T_camera", pose([0, 0.02, 0.05], [0, 0, 0.1]))}
        res_t = np.abs(rng.normal(0, 1e-4, n))
        res_r = np.abs(rng.normal(0, 1e-4, n))
        return {
            "result_id": rid, "run_id": None, "kind": kind, "cell": self.cell, "created_ns": now,
            "active": False, "suspect": False, "retained": False, "transforms": transforms,
            "n_stations": n, "rms_translation_m": float(np.sqrt(np.mean(res_t ** 2))),
            "max_translation_m": float(res_t.max()), "rms_rotation_rad": float(np.sqrt(np.mean(res_r ** 2))),
            "max_rotation_rad": float(res_r.max()), "axis_spread": 0.4,
            "residuals": {"translation_m": res_t.tolist(), "rotation_rad": res_r.tolist()},
            "provenance": {"config_sha256": "0" * 64, "device_serials": {"robot": "SIM-R", "tracker": "SIM-T"},
                           "solver": "test", "frame_convention": "a_T_b maps b to a", "valid_from_ns": now,
                           "cellcal_version": "0.1.0"},
        }

    def add_result(self, cell_T_base: np.ndarray = CELL_T_BASE, *, kind: str = "base_frame", activate: bool = True) -> str:
        body = self.make_result(cell_T_base, kind=kind)
        with self._lock:
            self.results[body["result_id"]] = body
            self.order.append(body["result_id"])
        if activate:
            self._activate(body["result_id"])
        return body["result_id"]

    def _activate(self, rid: str) -> str | None:
        with self._lock:
            prev = self.active
            if prev:
                self.results[prev]["active"] = False
            self.active = rid
            self.results[rid]["active"] = True
            self.suspect = False
            body = dict(self.results[rid])
        if self.server is not None:
            self.server.publish(P.TOPIC_RESULT, body)
        return prev

    def publish_heartbeat(self) -> None:
        assert self.server is not None
        self.server.publish(P.TOPIC_HEARTBEAT, self.heartbeat_body())

    # --- the handler interface ---------------------------------------------------------------

    def handle(self, cmd: str, args: dict[str, Any], caller: P.Caller) -> Any:
        with self._lock:
            self.calls.append((cmd, args, caller))
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return getattr(self, f"_cmd_{cmd}")(args, caller)

    def count(self, cmd: str | None = None) -> int:
        with self._lock:
            return sum(1 for c in self.calls if cmd is None or c[0] == cmd)

    def _result(self, rid: str | None) -> dict[str, Any]:
        if rid is None:
            if self.active is None:
                raise P.CommandError(P.E_NO_CALIBRATION, "no active calibration")
            rid = self.active
        if rid not in self.results:
            raise P.CommandError(P.E_NOT_FOUND, f"no result {rid!r}")
        return self.results[rid]

    def _cmd_get_status(self, args, caller):
        return self.heartbeat_body()

    def _cmd_get_result(self, args, caller):
        return dict(self._result(args.get("result_id")))

    def _cmd_list_results(self, args, caller):
        rows = []
        for rid in reversed(self.order):
            r = self.results[rid]
            if args.get("kind") and r["kind"] != args["kind"]:
                continue
            rows.append({k: r[k] for k in ("result_id", "run_id", "kind", "created_ns", "active", "suspect",
                                           "n_stations", "rms_translation_m", "rms_rotation_rad")} | {"accepted": True})
        return {"results": rows[: args["limit"]], "active_result_id": self.active}

    def _cmd_to_base(self, args, caller):
        r = self._result(args.get("result_id"))
        if "cell_T_base" not in r["transforms"]:
            raise P.CommandError(P.E_NO_CALIBRATION, f"result {r['result_id']} ({r['kind']}) has no cell_T_base")
        m = np.array(r["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4)
        return bodies.to_base_reply(m, args, result_id=r["result_id"], suspect=r["suspect"])

    def _cmd_start_run(self, args, caller):
        if self.block:
            self.gate.wait(10)
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            if self.run_id is not None:
                raise P.CommandError(P.E_BUSY, f"run {self.run_id} in progress")
            self.runs += 1
            self.run_id = f"run-{self.runs}"
            self.state = "CAPTURING"
        if self.server is not None:
            self.server.publish(P.TOPIC_STATE, bodies.state(
                P.STATE_CAPTURING, previous=P.STATE_IDLE, reason=f"started by {caller.name} ({caller.key_id})",
                run_id=self.run_id, kind=args["kind"], motion_mode=P.MOTION_COMMAND))
        return bodies.start_run_reply(self.run_id, args["kind"], len(args.get("stations", [])) or 20)

    def _cmd_abort(self, args, caller):
        with self._lock:
            rid, self.run_id, self.state = self.run_id, None, P.STATE_IDLE
        return bodies.abort_reply(rid is not None, rid)

    def _cmd_run_drift_check(self, args, caller):
        r = self._result(None)
        self.checks += 1
        if self.server is not None:
            verdict = Verdict(deviation_translation_m=2e-5, deviation_rotation_rad=1e-5, cusum_m=0.0, alarm=False,
                              status=P.DRIFT_OK, action=P.ACTION_NONE)
            self.server.publish(P.TOPIC_DRIFT, bodies.drift(
                result_id=r["result_id"], check_id=self.checks, verdict=verdict, cfg=Drift(),
                stations=[bodies.drift_station(0, 2e-5, 1e-5)], suspect=False, reason="test"))
        return bodies.drift_check_reply(r["result_id"], self.checks)

    def _cmd_activate_result(self, args, caller):
        self._result(args["result_id"])
        prev = self._activate(args["result_id"])
        return bodies.activate_reply(args["result_id"], prev)


@contextlib.contextmanager
def serving(cfg: Any = None, daemon: MemoryDaemon | None = None, **server_kw: Any):
    """A started server with a MemoryDaemon behind it; stopped on exit."""
    daemon = daemon if daemon is not None else MemoryDaemon()
    srv = ZmqServer(cfg if cfg is not None else zmq_config(), daemon, **server_kw)
    daemon.server = srv
    srv.start()
    try:
        yield srv, daemon
    finally:
        srv.stop()


@contextlib.contextmanager
def heartbeating(daemon: MemoryDaemon, period_s: float = 0.05):
    """Publish heartbeats as the daemon does (faster), until the block ends."""
    stop = threading.Event()

    def beat():
        while not stop.wait(period_s):
            daemon.publish_heartbeat()

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)


@contextlib.contextmanager
def zctx():
    """A context whose sockets are all closed with linger 0 on exit."""
    ctx = zmq.Context()
    try:
        yield ctx
    finally:
        ctx.destroy(linger=0)


def dealer(ctx: zmq.Context, endpoint: str, **opts: Any) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    for k, v in opts.items():
        setattr(s, k, v)
    s.connect(endpoint)
    return s


def rpc(sock: zmq.Socket, request: Any, timeout_ms: int = RECV_TIMEOUT_MS) -> dict[str, Any]:
    """One request over a raw DEALER; fails the test on timeout instead of hanging."""
    sock.send(request if isinstance(request, bytes) else P.pack(request))
    if not sock.poll(timeout_ms, zmq.POLLIN):
        pytest.fail(f"no reply to {request!r} within {timeout_ms} ms")
    return P.unpack(sock.recv(), max_array=1 << 24, max_map=1 << 20)


def wait_until(pred, timeout_s: float = 2.0, interval_s: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval_s)
    return pred()


def curve_setup(tmpdir: str, **roles: str) -> tuple[dict[str, tuple[bytes, bytes]], str]:
    """Key pairs for the server and each named client; the server's secret certificate file."""
    import zmq.auth

    keys = {}
    for name in ("server", *roles):
        pub, sec = zmq.auth.create_certificates(tmpdir, name)
        keys[name] = zmq.auth.load_certificate(sec)
    return keys, f"{tmpdir}/server.key_secret"


def curve_config(keys: dict[str, tuple[bytes, bytes]], server_file: str, roles: dict[str, str], **over: Any) -> Any:
    clients = [ZmqClient(name=n, public_key=keys[n][0].decode(), role=r) for n, r in roles.items()]
    return zmq_config(curve=True, server_secret_key_file=server_file, clients=clients, **over)
