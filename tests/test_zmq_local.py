"""Local means the daemon's own user and group (ADR 0007): real ZeroMQ sockets, and clients
running as another uid (children that drop root's privileges after their imports).

Without CURVE, an ``ipc://`` peer gets ``null_role`` only for the credentials the kernel
reports for its connection; an abstract socket (``ipc://@name``, no file, no permissions) is
no exception. Loopback TCP, which carries no credentials, needs ``loopback_tcp_any_user``.
The tests that switch uids need root (the CI container is); elsewhere they skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_zmq_support import MemoryDaemon, heartbeating, serving, short_tmpdir, zmq_config

from cellcal.daemon import protocol as P
from cellcal.daemon.config import ConfigError, Zmq, load_config_text
from cellcal.daemon.store import Store
from cellcal.daemon.wire.client import Client
from cellcal.daemon.wire.zmq_server import SecurityError, ZmqServer, check_security, endpoint_kind
from cellcal.testing.harness import DaemonProcess, daemon_config, free_port, write_config

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching a child to another uid needs root")

# A client as another user: imports first (the interpreter may live where that user cannot
# read), then drops to uid/gid, then asks start_run on the command socket and listens on
# the PUB socket; prints what it got.
_PEER = r"""
import json, os, sys
import zmq
from cellcal.daemon import protocol as P
uid, gid, cmd_ep, pub_ep = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
ctx = zmq.Context()
d = ctx.socket(zmq.DEALER); d.linger = 0; d.connect(cmd_ep)
s = ctx.socket(zmq.SUB); s.linger = 0; s.setsockopt(zmq.SUBSCRIBE, b""); s.connect(pub_ep)
d.send(P.pack({"id": "peer-1", "cmd": "start_run", "args": {"kind": "base_frame"}}))
reply = P.unpack(d.recv()) if d.poll(2500) else None
heard = bool(s.poll(1500))
print(json.dumps({"reply": reply, "heard": heard}))
ctx.destroy(linger=0)
"""


def peer(uid: int, gid: int, cmd_ep: str, pub_ep: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _PEER, str(uid), str(gid), cmd_ep, pub_ep],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _ipc_cfg(pub: str, cmd: str, **over) -> Zmq:
    return zmq_config(pub_endpoint=pub, cmd_endpoint=cmd, null_role="operator", loopback_tcp_any_user=False, **over)


@contextlib.contextmanager
def abstract_endpoints():
    tag = uuid.uuid4().hex[:12]
    yield f"ipc://@cellcal-test-{tag}-pub", f"ipc://@cellcal-test-{tag}-cmd"


# --- abstract ipc ------------------------------------------------------------------------------


@needs_root
def test_abstract_ipc_other_uid_executes_nothing_and_hears_nothing(caplog):
    with abstract_endpoints() as (pub, cmd), serving(_ipc_cfg(pub, cmd)) as (srv, daemon), heartbeating(daemon):
        with caplog.at_level("WARNING", logger="cellcal.daemon.zmq"):
            got = peer(NOBODY, NOBODY, cmd, pub)
        assert got == {"reply": None, "heard": False}
        assert daemon.count() == 0
        assert any(f"refused local peer uid {NOBODY}" in r.getMessage() for r in caplog.records)
        # The daemon's own user is an operator, and the audit names its uid.
        with Client(cmd, timeout_s=3.0) as c:
            assert c.call("start_run", kind="base_frame")["run_id"] == "run-1"
        assert daemon.calls[-1][2] == P.Caller(f"uid:{os.geteuid()}", "operator", f"uid:{os.geteuid()}")


@needs_root
def test_abstract_ipc_allowed_uid_and_group_members_get_the_null_role():
    for over in ({"ipc_allowed_uids": [NOBODY]}, {"ipc_allowed_gids": [4242]}):
        gid = 4242 if "ipc_allowed_gids" in over else NOBODY
        with abstract_endpoints() as (pub, cmd), serving(_ipc_cfg(pub, cmd, **over)) as (srv, daemon), \
                heartbeating(daemon):
            got = peer(NOBODY, gid, cmd, pub)
            assert got["reply"] and got["reply"]["ok"] is True, (over, got)
            assert got["heard"] is True
            assert daemon.calls[-1][2].key_id == f"uid:{NOBODY}" and daemon.calls[-1][2].role == "operator"


# --- filesystem ipc ----------------------------------------------------------------------------


@needs_root
def test_filesystem_ipc_sockets_are_0660_in_a_0750_directory_and_others_are_refused():
    with short_tmpdir() as d:
        pub, cmd = f"ipc://{d}/run/pub.sock", f"ipc://{d}/run/cmd.sock"
        os.chmod(d, 0o755)  # so that only the socket's own mode keeps others out
        with serving(_ipc_cfg(pub, cmd)) as (srv, daemon), heartbeating(daemon):
            assert stat.S_IMODE(os.stat(f"{d}/run").st_mode) == 0o750
            for ep in (pub, cmd):
                assert stat.S_IMODE(os.stat(ep[len("ipc://"):]).st_mode) == 0o660
            os.chmod(f"{d}/run", 0o755)  # even where the directory lets others through ...
            got = peer(NOBODY, NOBODY, cmd, pub)
            assert got == {"reply": None, "heard": False}  # ... the socket's mode and the peer check do not
            os.chmod(f"{d}/run/cmd.sock", 0o666)
            os.chmod(f"{d}/run/pub.sock", 0o666)
            got = peer(NOBODY, NOBODY, cmd, pub)  # file permissions granted by mistake: credentials still decide
            assert got == {"reply": None, "heard": False}
            assert daemon.count() == 0


def test_socket_mode_is_configurable_within_bounds():
    with short_tmpdir() as d:
        pub, cmd = f"ipc://{d}/pub", f"ipc://{d}/cmd"
        with serving(_ipc_cfg(pub, cmd, ipc_socket_mode=0o600)):
            assert stat.S_IMODE(os.stat(f"{d}/cmd").st_mode) == 0o600
    for mode in (0o666, 0o604, 0o460, 0o4660, -1):
        with pytest.raises(SecurityError) as ei:
            check_security(_ipc_cfg(pub, cmd, ipc_socket_mode=mode))
        assert ei.value.path == "zmq.ipc_socket_mode"


# --- loopback TCP ------------------------------------------------------------------------------


def test_loopback_tcp_without_curve_needs_the_explicit_option():
    cfg = zmq_config(loopback_tcp_any_user=False)
    with pytest.raises(SecurityError) as ei:
        ZmqServer(cfg, MemoryDaemon())
    assert ei.value.path == "zmq.pub_endpoint" and "loopback_tcp_any_user" in str(ei.value)
    assert "every local user" in str(ei.value)
    # The same rule at load time, so check-config and run agree on it.
    text = ('config_version = 1\n[zmq]\npub_endpoint = "tcp://127.0.0.1:5560"\n'
            'cmd_endpoint = "tcp://127.0.0.1:5561"\nnull_role = "operator"\n')
    with pytest.raises(ConfigError) as ei:
        load_config_text(text, source="c.toml")
    assert ei.value.path == "zmq.pub_endpoint" and "c.toml" in str(ei.value)
    c = load_config_text(text + "loopback_tcp_any_user = true\n")
    assert c.zmq.loopback_tcp_any_user is True
    with serving(zmq_config(null_role="operator")) as (srv, daemon), Client(srv.cmd_endpoint) as c2:
        assert c2.call("start_run", kind="base_frame")["run_id"] == "run-1"  # any local user: documented


@pytest.mark.parametrize("endpoint, key_word", [
    ("ipc://relative/cmd.sock", "absolute"), ("ipc://*", "absolute"), ("ipc://@", "abstract"),
    ("ipc:///" + "x" * 200, "longer than"), ("tcp://127.0.0.1", "host:port"), ("tcp://127.0.0.1:99999", "host:port"),
    ("tcp://127.0.0.1:abc", "host:port"), ("udp://127.0.0.1:5", "expected"), ("inproc://", "expected"),
])
def test_malformed_endpoints_are_named_at_load_time(endpoint, key_word):
    with pytest.raises(ConfigError) as ei:
        load_config_text(f'config_version = 1\n[zmq]\ncmd_endpoint = "{endpoint}"\n')
    assert ei.value.path == "zmq.cmd_endpoint" and key_word in str(ei.value)


def test_endpoint_kinds():
    assert endpoint_kind("ipc://@x") == "ipc-abstract"
    assert endpoint_kind("ipc:///run/cellcal/cmd.sock") == "ipc"
    assert endpoint_kind("tcp://[::1]:5") == "tcp-loopback"
    assert endpoint_kind("tcp://10.0.0.1:*") == "tcp-network"
    assert endpoint_kind("inproc://x") == "inproc"


def test_uid_and_gid_lists_are_checked_under_their_keys():
    with pytest.raises(ConfigError) as ei:
        load_config_text("config_version = 1\n[zmq]\nipc_allowed_uids = [1000, -1]\n")
    assert ei.value.path == "zmq.ipc_allowed_uids[1]"
    with pytest.raises(ConfigError) as ei:
        load_config_text("config_version = 1\n[zmq]\nipc_allowed_gids = [1.5]\n")
    assert ei.value.path == "zmq.ipc_allowed_gids[0]"
    c = load_config_text("config_version = 1\n[zmq]\nipc_allowed_uids = [1000]\nipc_socket_mode = 0o640\n")
    assert c.zmq.ipc_allowed_uids == [1000] and c.zmq.ipc_socket_mode == 0o640


# --- the real daemon ---------------------------------------------------------------------------


@needs_root
def test_cellcal_run_on_abstract_ipc_lets_no_other_uid_start_a_run(tmp_path):
    tag = uuid.uuid4().hex[:12]
    pub, cmd = f"ipc://@cellcal-run-{tag}-pub", f"ipc://@cellcal-run-{tag}-cmd"
    cfg = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                        tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path,
                        pub_endpoint=pub, cmd_endpoint=cmd)
    cfg["zmq"]["loopback_tcp_any_user"] = False
    conf = write_config(tmp_path / "cellcal.toml", cfg)
    daemon = DaemonProcess(conf, tmp_path / "run.log").start()
    try:
        with Client(cmd, timeout_s=2.0, retries=10) as c:
            assert c.call("get_status")["state"] in P.STATES  # up; the daemon's own user is heard
        got = peer(NOBODY, NOBODY, cmd, pub)
        assert got["reply"] is None and got["heard"] is False
        assert daemon.alive()
        with Client(cmd, timeout_s=2.0, retries=3) as c:
            assert c.call("get_status")["run_id"] is None  # still serving, and idle
    finally:
        daemon.terminate()
    log = Path(tmp_path / "run.log").read_text()
    assert f"refused local peer uid {NOBODY}" in log and "Traceback" not in log
    with Store(Path(cfg["service"]["state_dir"]), read_only=True) as s:
        assert s.list_runs() == []  # nothing was started for the other user
