"""CURVE: only allow-listed keys reach the daemon, and each only as far as its role allows."""

from __future__ import annotations

import os

import pytest
import zmq
import zmq.auth
from conftest import wait_until
from test_zmq_support import MemoryDaemon, curve_config, curve_setup, dealer, serving, short_tmpdir, zctx, zmq_config

from cellcal.daemon import protocol as P
from cellcal.daemon.wire.client import Client, ClientTimeout, CommandFailed
from cellcal.daemon.wire.zmq_server import SecurityError, ZmqServer

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

ROLES = {"ops": "operator", "viewer": "observer"}


@pytest.fixture
def curve():
    with short_tmpdir() as d:
        keys, server_file = curve_setup(d, ops="operator", viewer="observer", stranger="observer")
        cfg = curve_config(keys, server_file, ROLES)  # "stranger" has a key pair but is not listed
        with serving(cfg) as (srv, daemon):
            yield srv, daemon, keys, d


def _client(srv, keys, name, **kw) -> Client:
    return Client(srv.cmd_endpoint, srv.pub_endpoint, curve_server_key=keys["server"][0],
                  curve_keypair=keys[name], **kw)


def test_operator_may_start_a_run_and_is_named_to_the_handler(curve):
    srv, daemon, keys, _ = curve
    with _client(srv, keys, "ops") as c:
        out = c.call("start_run", kind="base_frame")
        assert out["run_id"] == "run-1"
        assert c.call("abort") == {"aborted": True, "run_id": "run-1"}
    caller = daemon.calls[0][2]
    assert caller == P.Caller(keys["ops"][0].decode()[:8], "operator", "ops")


def test_observer_reads_but_cannot_start_a_run(curve):
    srv, daemon, keys, _ = curve
    daemon.add_result()
    with _client(srv, keys, "viewer") as c:
        assert c.call("get_status")["state"] == "IDLE"
        assert c.call("to_base", point_m=[1.0, 0.0, 0.0])["result_id"] == daemon.active
        for cmd, args in (("start_run", {"kind": "base_frame"}), ("abort", {}), ("run_drift_check", {}),
                          ("activate_result", {"result_id": daemon.active})):
            with pytest.raises(CommandFailed) as exc:
                c.call(cmd, **args)
            assert exc.value.code == P.E_FORBIDDEN
            assert "operator" in exc.value.message and keys["viewer"][0].decode()[:8] in exc.value.message
    assert [name for name, _, _ in daemon.calls] == ["get_status", "to_base"]
    assert daemon.runs == 0


def test_observer_can_subscribe_and_catch_up(curve):
    srv, daemon, keys, _ = curve
    rid = daemon.add_result()
    with _client(srv, keys, "viewer") as c:
        msg = c.subscribe([P.TOPIC_RESULT]).recv(2.0)
    assert msg is not None and msg[1]["body"]["result_id"] == rid


def test_unknown_key_executes_nothing_and_hears_nothing(curve):
    srv, daemon, keys, _ = curve
    daemon.add_result()
    with _client(srv, keys, "stranger", timeout_s=0.3, retries=1) as c:
        with pytest.raises(ClientTimeout):
            c.call("start_run", kind="base_frame")
        with pytest.raises(ClientTimeout):
            c.call("get_status")
        sub = c.subscribe()
        daemon.publish_heartbeat()
        assert sub.recv(0.5) is None
        assert sub.handshake_failures >= 1  # the client can tell "refused" from "absent"
    assert daemon.calls == []


def test_null_security_client_executes_nothing(curve):
    srv, daemon, keys, _ = curve
    with Client(srv.cmd_endpoint, srv.pub_endpoint, timeout_s=0.3, retries=1) as c:
        with pytest.raises(ClientTimeout):
            c.call("start_run", kind="base_frame")
        sub = c.subscribe()
        daemon.publish_heartbeat()
        assert sub.recv(0.5) is None
    with zctx() as ctx:  # raw bytes, no handshake at all
        s = dealer(ctx, srv.cmd_endpoint)
        s.send(P.pack({"id": 1, "cmd": "start_run", "args": {"kind": "base_frame"}}))
        assert not s.poll(300)
    assert daemon.calls == []


def test_wrong_server_key_gets_nothing(curve):
    srv, daemon, keys, _ = curve
    impostor = zmq.curve_keypair()[0]
    with Client(srv.cmd_endpoint, curve_server_key=impostor, curve_keypair=keys["ops"], timeout_s=0.3, retries=0) as c:
        with pytest.raises(ClientTimeout):
            c.call("get_status")
    assert daemon.calls == []


def test_repeated_request_id_under_curve_runs_once(curve):
    srv, daemon, keys, _ = curve
    with zctx() as ctx:
        s = dealer(ctx, srv.cmd_endpoint, curve_serverkey=keys["server"][0], curve_publickey=keys["ops"][0],
                   curve_secretkey=keys["ops"][1], routing_id=b"ops-1")
        req = P.pack({"id": "same", "cmd": "start_run", "args": {"kind": "hand_eye"}})
        replies = []
        for _ in range(3):
            s.send(req)
            assert s.poll(2000)
            replies.append(P.unpack(s.recv()))
    assert replies[0]["ok"] and replies[0] == replies[1] == replies[2]
    assert daemon.count("start_run") == 1


def test_curve_config_is_checked():
    with short_tmpdir() as d:
        keys, server_file = curve_setup(d, ops="operator")
        with pytest.raises(SecurityError, match="no .*clients"):
            ZmqServer(zmq_config(curve=True, server_secret_key_file=server_file), MemoryDaemon())
        # The public certificate has no secret key: refused at start, with the path.
        cfg = curve_config(keys, f"{d}/server.key", {"ops": "operator"})
        with pytest.raises(SecurityError) as exc:
            ZmqServer(cfg, MemoryDaemon()).start()
        assert exc.value.path == "zmq.server_secret_key_file"
        cfg = curve_config(keys, f"{d}/missing.key_secret", {"ops": "operator"})
        with pytest.raises(SecurityError):
            ZmqServer(cfg, MemoryDaemon()).start()
        # Network endpoints are allowed under CURVE.
        ZmqServer(curve_config(keys, server_file, {"ops": "operator"}, pub_endpoint="tcp://0.0.0.0:1"), MemoryDaemon())


def test_refused_key_is_logged_once_not_per_reconnect(curve, caplog):
    srv, daemon, keys, _ = curve
    with caplog.at_level("WARNING", logger="cellcal.daemon.zmq"):
        with _client(srv, keys, "stranger", timeout_s=0.2, retries=3) as c:
            with pytest.raises(ClientTimeout):
                c.call("get_status")

        def refusals():
            return [r for r in caplog.records if "refused CURVE key" in r.getMessage()]

        wait_until(refusals, 10.0, "the refusal in the log")
    assert len(refusals()) == 1 and keys["stranger"][0].decode()[:8] in refusals()[0].getMessage()


def test_secret_key_file_mode_is_checked(curve, caplog):
    _, _, keys, d = curve
    path = f"{d}/server.key_secret"
    os.chmod(path, 0o644)
    with caplog.at_level("WARNING", logger="cellcal.daemon.zmq"):
        with serving(curve_config(keys, path, ROLES)):
            pass
    assert any("chmod 600" in r.getMessage() for r in caplog.records)
