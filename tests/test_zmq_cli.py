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

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

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
        ep = ["--endpoint", srv.cmd_endpoint, "--json"]
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
        # Without --json: words for people, mm and degrees; an error reply on stderr.
        words = ep[:2]
        r = cellcal("ctl", "get_status", *words)
        assert r.returncode == 0 and r.stdout.startswith("cell ") and f"active result {rid}" in r.stdout, r.stdout
        r = cellcal("ctl", "to_base", "point_m=[1, 2, 3]", *words)
        assert r.returncode == 0 and " mm (result " in r.stdout and "{" not in r.stdout, r.stdout
        r = cellcal("ctl", "start_run", "kind=nope", *words)
        assert r.returncode == 1 and not r.stdout and "start_run refused: E_BAD_REQUEST" in r.stderr, r.stderr
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
            r = cellcal("ctl", "start_run", "kind=base_frame", "--key", f"{d}/viewer.key_secret", "--json", *common)
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
                    "--heartbeats", "--count", "6", "--duration", "10")
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
    (P.TOPIC_STATION, {"run_id": "run-1", "index": 4, "planned": 8, "attempt": 1, "accepted": False,
                       "reason": "consensus_outlier", "accepted_count": 3, "outcome": "dropped",
                       "message": "station 5, accepted before, is 25.000 mm from the fit", "settle": {}},
     ["5/8", "DROPPED (consensus_outlier): station 5, accepted before, is 25.000 mm"]),
    (P.TOPIC_STATION, {"run_id": "run-1", "index": 6, "planned": 8, "attempt": 3, "accepted": False,
                       "reason": "drive_target_mismatch", "accepted_count": 5, "outcome": "given_up",
                       "message": "node 2 (joint 2) reports target reached 0.2 deg off", "settle": {}},
     ["7/8", "GIVEN UP (drive_target_mismatch): node 2 (joint 2)"]),
    (P.TOPIC_DRIFT, {"result_id": "r-1", "status": "fail", "deviation_translation_m": 4e-4, "deviation_rotation_rad": 0.001,
                     "warn_translation_m": 1e-4, "fail_translation_m": 3e-4, "cusum": {"value_m": 5e-4, "h_m": 3e-4},
                     "action": "marked_suspect"}, ["FAIL", "0.400 mm", "0.0573 deg", "beyond the failure limit",
                                                   "the result is marked suspect"]),
    (P.TOPIC_FAULT, {"code": "E_DEVICE", "device": "tracker", "message": "no reply", "active": True}, ["FAULT", "tracker"]),
    (P.TOPIC_STATE, {"state": "CAPTURING", "previous": "IDLE", "run_id": "run-1", "reason": "go"}, ["IDLE -> CAPTURING"]),
    (P.TOPIC_HEARTBEAT, {"weird": [1, 2]}, ["heartbeat"]),
])
def test_watch_formats_every_topic(topic, body, needles):
    from cellcal.daemon.cli.watch import format_message

    line = format_message(topic, P.make_envelope(7, "b" * 16, body))
    assert "#7" in line and all(n in line for n in needles), line


def test_watch_summarises_heartbeats_and_shows_the_pose_with_sigma():
    with serving() as (srv, daemon), heartbeating(daemon):
        rid = daemon.add_result()
        r = cellcal("watch", "--endpoint", srv.pub_endpoint, "--cmd-endpoint", srv.cmd_endpoint, "--duration", "1.5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # ~30 heartbeats were published; they all say the same, so one is shown.
    assert len([ln for ln in lines if " heartbeat " in ln]) == 1, lines
    results = [ln for ln in lines if " result " in ln and rid in ln]
    assert results and "cell_T_base = (" in results[0] and " mm" in results[0] and " deg" in results[0], results


def test_watch_progress_lines_when_piped():
    from cellcal.daemon.cli.watch import Progress

    p = Progress()
    t0 = 1_000_000_000_000
    p.start("7", t0)
    for i in range(4):
        p.update({"run_id": "7", "index": i, "planned": 8, "accepted": True, "accepted_count": i + 1},
                 t0 + (i + 1) * 10_000_000_000)
    p.update({"run_id": "7", "index": 4, "planned": 8, "accepted": False, "accepted_count": 4},
             t0 + 45_000_000_000)
    text = p.text()
    assert "4/8 stations" in text and "1 rejected" in text and "0:45 elapsed" in text
    assert "~0:45 left" in text  # 45 s for 4 stations: 4 more take as long
    assert "[###############...............]" in p.text(bar_width=30)


def test_watch_progress_from_a_daemon(tmp_path):
    """Against the real (in-process) daemon: a progress line per station when piped."""
    from cellcal.testing.harness import inprocess_cell

    with inprocess_cell(tmp_path, n_stations=4) as cell:
        z = cell.cfg.zmq
        proc = subprocess.Popen([sys.executable, "-m", "cellcal.daemon.cli", "watch", "--endpoint", z.pub_endpoint,
                                 "--cmd-endpoint", z.cmd_endpoint, "--duration", "60", "--topics", "station,result"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        try:
            # The watcher has joined once the snapshot is answered; then the run starts.
            cell.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT, 30.0, "a heartbeat")
            run_id = cell.svc.start_run()
            cell.wait_result(run_id, timeout_s=60.0)
            lines: list[str] = []
            assert proc.stdout is not None
            while not any(" result " in ln for ln in lines):
                line = proc.stdout.readline()
                assert line, f"watch ended early: {lines} {proc.stderr.read() if proc.stderr else ''}"
                lines.append(line.rstrip("\n"))
        finally:
            proc.terminate()
            proc.wait(10)
    progress = [ln for ln in lines if " progress " in ln]
    assert progress and progress[-1].endswith("left") and "4/4 stations" in progress[-1], lines
    assert "\r" not in "".join(lines)  # piped: plain lines, no bar redrawn in place


def test_ctl_help_command_ids_as_typed_and_what_it_tried(tmp_path):
    r = cellcal("ctl", "--help", "get_result")
    assert r.returncode == 0 and "result_id" in r.stdout and "optional" in r.stdout, r.stdout
    r = cellcal("ctl", "start_run", "--help")
    assert r.returncode == 0 and "kind" in r.stdout and "required" in r.stdout and "motion_mode" in r.stdout
    r = cellcal("ctl", "--help")
    assert r.returncode == 0 and all(name in r.stdout for name in P.COMMANDS)
    with serving(zmq_config(null_role="operator")) as (srv, daemon):
        rid = daemon.add_result()
        assert rid.isdigit() or rid  # the memory daemon's ids
        r = cellcal("ctl", "get_result", f"result_id={rid}", "--endpoint", srv.cmd_endpoint)
        assert r.returncode == 0, r.stdout + r.stderr
        sent = [c for c in daemon.calls if c[0] == "get_result"][-1]
        assert isinstance(sent[1]["result_id"], str)
        # CELLCAL_CONFIG names the configuration, as for `cellcal run`.
        conf = tmp_path / "c.toml"
        conf.write_text(f'config_version = 1\n[zmq]\npub_endpoint = "{srv.pub_endpoint}"\n'
                        f'cmd_endpoint = "{srv.cmd_endpoint}"\nloopback_tcp_any_user = true\n')
        env = {**os.environ, "CELLCAL_CONFIG": str(conf)}
        r = subprocess.run([sys.executable, "-m", "cellcal.daemon.cli", "ctl", "get_status"], capture_output=True,
                           text=True, timeout=TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
    # Nothing answers: the message says which endpoint, where it came from and what was tried.
    env = {k: v for k, v in os.environ.items() if k != "CELLCAL_CONFIG"}
    dead = "tcp://127.0.0.1:9"
    r = subprocess.run([sys.executable, "-m", "cellcal.daemon.cli", "ctl", "get_status", "--endpoint", dead,
                        "--timeout", "0.2", "--retries", "0"], capture_output=True, text=True, timeout=TIMEOUT_S,
                       env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 3
    assert dead in r.stderr and "--endpoint" in r.stderr and "CELLCAL_CONFIG not set" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_broken_pipe_is_quiet():
    """`cellcal ... | head`: the reader went away before we wrote; no traceback, exit 141."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for argv in (["ctl", "--help"], ["ctl", "--help", "start_run"],
                 ["check-config", os.path.join(root, "config", "demo.toml"), "--no-devices"],
                 ["check-config", os.path.join(root, "config", "demo.toml"), "--no-devices", "--json"],
                 ["solve", "--synthetic", "8", "--json"], ["init"]):
        proc = subprocess.Popen([sys.executable, "-m", "cellcal.daemon.cli", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the interpreter even started: its first write fails
        err = proc.stderr.read()
        rc = proc.wait(TIMEOUT_S)
        assert "Traceback" not in err and "BrokenPipe" not in err, (argv, err)
        # 141 (the shell's SIGPIPE status), whether the write failed inside the command or at
        # the flush cli.main makes before returning (argparse's help, a short output)
        assert rc == 141, (argv, rc, err)
        assert "internal error" not in err, (argv, err)


def test_watch_says_what_it_tried_when_nothing_answers():
    env = {k: v for k, v in os.environ.items() if k != "CELLCAL_CONFIG"}
    r = subprocess.run([sys.executable, "-m", "cellcal.daemon.cli", "watch", "--endpoint", "tcp://127.0.0.1:9",
                        "--cmd-endpoint", "tcp://127.0.0.1:9", "--duration", "5"], capture_output=True, text=True,
                       timeout=TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 3, r.stderr  # no daemon answered: not a success
    assert "no daemon answered at tcp://127.0.0.1:9" in r.stderr and "is the daemon running?" in r.stderr, r.stderr
    assert "endpoints from --endpoint" in r.stderr and "CELLCAL_CONFIG not set" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
