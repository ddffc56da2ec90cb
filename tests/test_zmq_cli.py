"""``cellcal keys``, ``cellcal ctl`` and ``cellcal watch`` as subprocesses against a server in this process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import zmq
import zmq.auth
from test_zmq_support import curve_config, curve_setup, heartbeating, serving, short_tmpdir, zctx, zmq_config

from cellcal.daemon import protocol as P

TIMEOUT_S = 20.0


def cellcal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cellcal.daemon.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


# --- keys ----------------------------------------------------------------------------------------


def test_keys_writes_a_loadable_pair_with_a_private_secret(tmp_path):
    out = tmp_path / "keys"
    r = cellcal("keys", "--out", str(out), "ops")
    assert r.returncode == 0, r.stderr
    public_line = r.stdout.strip()
    assert len(public_line) == 40
    pub, sec = out / "ops.key", out / "ops.key_secret"
    assert stat.S_IMODE(os.stat(sec).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o700
    assert zmq.auth.load_certificate(pub) == (public_line.encode(), None)
    p2, s2 = zmq.auth.load_certificate(sec)
    assert p2 == public_line.encode() and len(s2) == 40
    assert zmq.utils.z85.decode(p2) == zmq.utils.z85.decode(zmq.curve_public(s2))  # a real pair
    # No silent overwrite; --force overwrites with a new pair.
    again = cellcal("keys", "--out", str(out), "ops")
    assert again.returncode == 2 and "exist" in again.stderr
    forced = cellcal("keys", "--out", str(out), "--force", "ops")
    assert forced.returncode == 0 and forced.stdout.strip() != public_line
    assert cellcal("keys", "--out", str(out), "../evil").returncode == 2
    assert not list(out.glob(".*tmp*"))


# --- ctl -----------------------------------------------------------------------------------------


def test_ctl_exit_codes_and_reply_json():
    with serving(zmq_config(null_role="operator")) as (srv, daemon):
        rid = daemon.add_result()
        ep = ["--endpoint", srv.cmd_endpoint]
        r = cellcal("ctl", "get_status", *ep)
        assert r.returncode == 0, r.stderr
        reply = json.loads(r.stdout)
        assert reply["ok"] is True and reply["result"]["active_result_id"] == rid
        r = cellcal("ctl", "to_base", "point_m=[1, 2, 3]", *ep)
        assert r.returncode == 0 and json.loads(r.stdout)["result"]["result_id"] == rid
        r = cellcal("ctl", "to_base", "--json-args", '{"pose": {"matrix": [1,0,0,0, 0,1,0,0, 0,0,1,0, 0,0,0,1]}}',
                    "child_frame=part", *ep)
        assert r.returncode == 0 and json.loads(r.stdout)["result"]["pose"]["child_frame"] == "part"
        r = cellcal("ctl", "start_run", "kind=base_frame", *ep)
        assert r.returncode == 0 and json.loads(r.stdout)["result"]["run_id"] == "run-1"
        r = cellcal("ctl", "start_run", "kind=nope", *ep)  # an error reply
        assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == P.E_BAD_REQUEST
        assert cellcal("ctl", "get_result", "result_id=r-404", *ep).returncode == 1
        assert cellcal("ctl", "no_such_command", *ep).returncode == 2
        assert cellcal("ctl", "get_status", "novalue", *ep).returncode == 2
        assert cellcal("ctl", "get_status", "--json-args", "[1]", *ep).returncode == 2
    assert [c[0] for c in daemon.calls].count("start_run") == 1  # kind=nope never reached it


def test_ctl_times_out_with_exit_3():
    with zctx() as ctx:  # a port nobody listens on
        port = ctx.socket(zmq.ROUTER).bind_to_random_port("tcp://127.0.0.1")
    r = cellcal("ctl", "get_status", "--endpoint", f"tcp://127.0.0.1:{port}", "--timeout", "0.2", "--retries", "0")
    assert r.returncode == 3 and "no reply" in r.stderr


def test_ctl_under_curve_with_key_files_and_config(tmp_path):
    with short_tmpdir() as d:
        keys, server_file = curve_setup(d, ops="operator", viewer="observer")
        cfg = curve_config(keys, server_file, {"ops": "operator", "viewer": "observer"})
        with serving(cfg) as (srv, daemon):
            common = ["--endpoint", srv.cmd_endpoint, "--server-key", f"{d}/server.key"]
            r = cellcal("ctl", "start_run", "kind=base_frame", "--key", f"{d}/viewer.key_secret", *common)
            assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == P.E_FORBIDDEN
            r = cellcal("ctl", "start_run", "kind=base_frame", "--key", f"{d}/ops.key_secret", *common)
            assert r.returncode == 0, r.stderr
            # --config: endpoints and the server key come from the file; only --key is needed.
            conf = tmp_path / "cellcal.toml"
            conf.write_text(
                "config_version = 1\n[zmq]\n"
                f'pub_endpoint = "{srv.pub_endpoint}"\ncmd_endpoint = "{srv.cmd_endpoint}"\n'
                f'curve = true\nserver_secret_key_file = "{server_file}"\n'
                f'[[zmq.clients]]\nname = "ops"\npublic_key = "{keys["ops"][0].decode()}"\nrole = "operator"\n')
            r = cellcal("ctl", "get_status", "--config", str(conf), "--key", f"{d}/ops.key_secret")
            assert r.returncode == 0, r.stderr
            r = cellcal("ctl", "get_status", "--config", str(conf))
            assert r.returncode == 2 and "--key" in r.stderr
        assert [c[0] for c in daemon.calls] == ["start_run", "get_status"]


# --- watch ---------------------------------------------------------------------------------------


def test_watch_prints_one_line_per_message():
    with serving() as (srv, daemon), heartbeating(daemon):
        rid = daemon.add_result()
        r = cellcal("watch", "--endpoint", srv.pub_endpoint, "--cmd-endpoint", srv.cmd_endpoint,
                    "--count", "6", "--duration", "10")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 6
    assert any(" result " in ln and rid in ln and "active" in ln and "mm" in ln for ln in lines)
    beats = [ln for ln in lines if " heartbeat " in ln]
    assert beats and all("state=IDLE" in ln and f"active={rid}" in ln and "robot=up" in ln for ln in beats)
    seqs = [int(ln.split("#")[1].split()[0]) for ln in lines]
    assert seqs == sorted(seqs)


def test_watch_json_topics_and_duration(tmp_path):
    with serving() as (srv, daemon), heartbeating(daemon):
        daemon.add_result()
        conf = tmp_path / "watch.toml"
        conf.write_text(f'config_version = 1\n[zmq]\npub_endpoint = "{srv.pub_endpoint}"\n'
                        f'cmd_endpoint = "{srv.cmd_endpoint}"\nloopback_tcp_any_user = true\n')
        r = cellcal("watch", "--config", str(conf), "--topics", "result", "--json", "--duration", "1.0")
        assert r.returncode == 0, r.stderr
        envs = [json.loads(ln) for ln in r.stdout.splitlines()]
        assert envs and all(e["topic"] == P.TOPIC_RESULT and e["schema"] == P.SCHEMA for e in envs)
        # --count not reached within --duration: exit 3, as ctl's timeout.
        r = cellcal("watch", "--config", str(conf), "--topics", "drift", "--count", "1", "--duration", "0.5")
        assert r.returncode == 3
        assert cellcal("watch", "--config", str(conf), "--topics", "nope").returncode == 2


@pytest.mark.parametrize("topic, body, needles", [
    (P.TOPIC_STATION, {"run_id": "run-1", "index": 2, "planned": 20, "attempt": 1, "accepted": False,
                       "reason": "tracker not settled", "accepted_count": 2,
                       "settle": {"robot_rest_s": 0.6, "tracker_std_translation_m": 3e-5}}, ["3/20", "REJECTED", "0.030mm"]),
    (P.TOPIC_DRIFT, {"result_id": "r-1", "status": "fail", "deviation_translation_m": 4e-4, "deviation_rotation_rad": 0.001,
                     "warn_translation_m": 1e-4, "fail_translation_m": 3e-4, "cusum": {"value_m": 5e-4, "h_m": 3e-4},
                     "action": "marked_suspect"}, ["FAIL", "0.400mm", "0.0573deg", "marked_suspect"]),
    (P.TOPIC_FAULT, {"code": "E_DEVICE", "device": "tracker", "message": "no reply", "active": True}, ["FAULT", "tracker"]),
    (P.TOPIC_STATE, {"state": "CAPTURING", "previous": "IDLE", "run_id": "run-1", "reason": "go"}, ["IDLE -> CAPTURING"]),
    (P.TOPIC_HEARTBEAT, {"weird": [1, 2]}, ["heartbeat"]),
])
def test_watch_formats_every_topic(topic, body, needles):
    from cellcal.daemon.cmd_watch import format_message

    line = format_message(topic, P.make_envelope(7, "b" * 16, body))
    assert "#7" in line and all(n in line for n in needles), line
