"""The MQTT publisher against a real broker: Debian's Mosquitto, started here on 127.0.0.1.

One broker and one simulated cell (``inprocess_cell``, one calibration and one drift check)
for the module; the subscriber is paho-mqtt's client (the broker and the subscriber are
nobody's code here). It shows:

* a subscriber that joins late gets ``result/active``, ``state`` and ``drift`` retained, each
  the JSON of the body the daemon published (the ZeroMQ body), and the live topics after;
* the broker killed and started again (no persistence: it forgets every retained message):
  the daemon reconnects by itself, every retained topic is back with its newest value, and a
  drift check made while the broker was down is the retained ``drift``; the outage is the
  ``mqtt`` interface's fault, raised then cleared, and the daemon worked on meanwhile;
* a daemon killed with SIGKILL leaves ``state`` = offline (its last will, retained), and one
  stopped cleanly says so itself.

Mosquitto comes from ``make os-deps``; without it the tests fail saying so (never skip).
"""

from __future__ import annotations

import getpass
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

# paho-mqtt is in the test extra (pip install -e '.[test]').
import paho.mqtt.client as mqtt
import pytest
from conftest import wait_until

from cellcal.daemon import protocol as P
from cellcal.testing.harness import DaemonProcess, daemon_config, free_port, inprocess_cell, write_config

pytestmark = pytest.mark.slow

CELL = "press-7"


def find_mosquitto() -> str:
    found = shutil.which("mosquitto", path="/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin")
    if found is None:
        pytest.fail("mosquitto is not installed: run `make os-deps` (as root it installs the OS packages the suite needs)")
    return found


class Mosquitto:
    """A broker on 127.0.0.1:``port`` that the test can kill and start again (no persistence)."""

    def __init__(self, workdir: Path) -> None:
        self.binary = find_mosquitto()
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Mosquitto:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        wait_until(self._accepts, 15.0, f"mosquitto on 127.0.0.1:{self.port} ({self.log})", poll_s=0.05)
        return self

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10.0)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


class Subscriber:
    """paho-mqtt subscribed to ``pattern``: every message (topic, JSON, retained flag) in order."""

    def __init__(self, port: int, pattern: str) -> None:
        self.messages: list[tuple[str, dict, bool]] = []
        self._cond = threading.Condition()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"test-sub-{time.monotonic_ns()}")
        self.c.on_message = self._on_message
        self.c.on_connect = lambda c, u, f, rc, p: c.subscribe(pattern, qos=1)
        self.c.connect("127.0.0.1", port, keepalive=10)
        self.c.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self._cond:
            self.messages.append((msg.topic, json.loads(msg.payload), bool(msg.retain)))
            self._cond.notify_all()

    def latest(self, topic: str, *, retained: bool | None = None) -> dict | None:
        with self._cond:
            for t, body, ret in reversed(self.messages):
                if t == topic and (retained is None or ret == retained):
                    return body
        return None

    def wait(self, topic: str, pred=lambda b: True, timeout_s: float = 20.0, *, retained: bool | None = None) -> dict:
        def found():
            with self._cond:
                for t, body, ret in self.messages:
                    if t == topic and pred(body) and (retained is None or ret == retained):
                        return body
            return None

        return wait_until(found, timeout_s, f"{topic} on the broker")

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def topic(sub: str, cell: str = CELL) -> str:
    return f"cellcal/{cell}/{sub}"


def as_json(body: dict) -> dict:
    return json.loads(json.dumps(body))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = Mosquitto(tmp_path_factory.mktemp("mosquitto")).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def cell(tmp_path_factory, broker):
    overrides = {"mqtt": {"enabled": True, "url": f"mqtt://127.0.0.1:{broker.port}", "cell": CELL,
                          "reconnect_min_s": 0.05, "reconnect_max_s": 0.5, "keepalive_s": 5}}
    with inprocess_cell(tmp_path_factory.mktemp("cell"), n_stations=6, overrides=overrides) as c:
        run_id = c.svc.start_run("base_frame", reason="test")
        c.wait_result(run_id)
        c.svc.request_drift_check("test")
        c.wait_for(lambda t, b: t == P.TOPIC_DRIFT, 30.0, "a drift check")
        assert c.svc.wait_idle(20.0)
        # The publisher runs on its own thread: on a loaded machine the drift check may still
        # be on its way to the broker, and a subscriber that joins before it lands gets it live
        # (retain flag 0), not retained. A probe that sees it at the broker first makes the
        # tests' subscribers late joiners, as they mean to be.
        probe = Subscriber(broker.port, topic("drift"))
        try:
            drift = as_json(c.bodies(P.TOPIC_DRIFT)[-1])
            probe.wait(topic("drift"), lambda b: b == drift, 30.0)
        finally:
            probe.close()
        yield c


def last_active(cell) -> dict:
    body = [b for b in cell.bodies(P.TOPIC_RESULT) if b.get("active")][-1]
    return {k: v for k, v in as_json(body).items() if k != "retained"}


def test_a_late_subscriber_sees_the_retained_topics_as_the_zeromq_bodies(broker, cell):
    sub = Subscriber(broker.port, f"cellcal/{CELL}/#")
    try:
        active = sub.wait(topic("result/active"), retained=True)
        assert {k: v for k, v in active.items() if k != "retained"} == last_active(cell)
        assert active["transforms"]["cell_T_base"]["parent_frame"] == "cell"
        drift = sub.wait(topic("drift"), retained=True)
        assert drift == as_json(cell.bodies(P.TOPIC_DRIFT)[-1]) and not P.check_body(P.TOPIC_DRIFT, drift)
        state = sub.wait(topic("state"), retained=True)
        assert state["online"] is True and not P.check_body(P.TOPIC_STATE, state)
        # The service is idle; on a loaded machine the publisher may still be sending the drift
        # check's CHECKING -> IDLE pair, so the retained state is IDLE or IDLE follows it live.
        if state["state"] != P.STATE_IDLE:
            assert state["state"] == P.STATE_CHECKING, state
            state = sub.wait(topic("state"), lambda b: b["state"] == P.STATE_IDLE)
            assert state["online"] is True and not P.check_body(P.TOPIC_STATE, state)
        # The live topics follow: heartbeats (QoS 0, not retained) as the daemon beats.
        hb = sub.wait(topic("heartbeat"), retained=False)
        assert hb["cell"] == cell.cfg.service.name and not P.check_body(P.TOPIC_HEARTBEAT, hb)
        # Nothing else is retained: events are events.
        retained_topics = {t for t, _b, ret in sub.messages if ret}
        assert retained_topics <= {topic("result/active"), topic("drift"), topic("state")}
    finally:
        sub.close()


def test_a_broker_restart_loses_no_retained_topic_and_stops_nothing(broker, cell):
    publisher = cell.app.plant.adapter("mqtt")
    connections = publisher.stats["connections"]
    broker.kill()
    wait_until(lambda: cell.app.plant.faults.get("mqtt", {}).get("active"), 20.0, "the mqtt fault")
    # The daemon works on without its broker: a drift check while it is away.
    before = cell.bodies(P.TOPIC_DRIFT)[-1]["check_id"]
    cell.svc.request_drift_check("during the outage")
    during = cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT and b["check_id"] > before, 30.0, "a check in the outage")
    assert cell.svc.wait_idle(20.0)
    broker.start()  # a new broker on the same port that knows no retained message
    wait_until(lambda: publisher.stats["connections"] > connections, 30.0, "the publisher's reconnection")
    wait_until(lambda: cell.app.plant.faults["mqtt"]["active"] is False, 10.0, "the mqtt fault cleared")
    # The publisher republishes right after connecting: a subscriber may see that live ...
    sub = Subscriber(broker.port, f"cellcal/{CELL}/#")
    try:
        sub.wait(topic("drift"), lambda b: b["check_id"] == during["check_id"])
    finally:
        sub.close()
    # ... and from then on the new broker holds every retained topic, the newest of each.
    late = Subscriber(broker.port, f"cellcal/{CELL}/#")
    try:
        drift = late.wait(topic("drift"), retained=True)
        assert drift == as_json(during)
        active = late.wait(topic("result/active"), retained=True)
        assert {k: v for k, v in active.items() if k != "retained"} == last_active(cell)
        assert late.wait(topic("state"), retained=True)["online"] is True
    finally:
        late.close()


def test_a_killed_daemon_leaves_its_last_will_and_a_stopped_one_says_goodbye(broker, tmp_path):
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}", tracker_url=f"socket://127.0.0.1:{free_port()}",
                         workdir=tmp_path, overrides={"mqtt": {"enabled": True, "url": f"mqtt://127.0.0.1:{broker.port}",
                                                               "cell": "doomed", "keepalive_s": 5}})
    config = write_config(tmp_path / "cellcal.toml", cfgd)
    sub = Subscriber(broker.port, "cellcal/doomed/state")
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    try:
        daemon.start()
        sub.wait(topic("state", "doomed"), lambda b: b.get("online") is True, 60.0)
        daemon.kill9()
        gone = sub.wait(topic("state", "doomed"), lambda b: b.get("state") == "offline", 30.0)
        assert gone["online"] is False and "last will" in gone["reason"]
        # Retained: a dashboard that starts now sees the cell offline, not its last state.
        late = Subscriber(broker.port, "cellcal/doomed/state")
        try:
            assert late.wait(topic("state", "doomed"), retained=True)["state"] == "offline"
        finally:
            late.close()
        mark = len(sub.messages)
        daemon = DaemonProcess(config, tmp_path / "daemon.log").start()
        wait_until(lambda: any(b.get("online") for _t, b, _r in sub.messages[mark:]), 60.0, "the daemon back online")
        assert daemon.terminate() == 0
        bye = sub.wait(topic("state", "doomed"), lambda b: b.get("reason") == "daemon stopped", 20.0)
        assert bye["online"] is False and bye["state"] == "offline"
    finally:
        daemon.stop()
        sub.close()


def _tls_files(tmp: Path) -> tuple[Path, Path, Path]:
    """A CA and a broker certificate for 127.0.0.1 (cryptography: asyncua's dependency, in the test extra)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool):
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(key.public_key())
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            import ipaddress

            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return b.sign(issuer_key, hashes.SHA256())

    ca_key, srv_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("cellcal test CA", ca_key, "cellcal test CA", ca_key, True)
    srv = cert("127.0.0.1", srv_key, "cellcal test CA", ca_key, False)
    paths = tmp / "ca.pem", tmp / "broker.pem", tmp / "broker.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(srv_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


def test_tls_and_a_password_from_the_configuration(tmp_path):
    from cellcal.daemon.app import App
    from cellcal.daemon.config import load_config_text
    from cellcal.testing.harness import to_toml

    ca, cert, key = _tls_files(tmp_path)
    passwd = tmp_path / "broker.passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwd), "cell-9", "pw-of-cell-9"], check=True,
                   capture_output=True, timeout=30)
    broker = Mosquitto(tmp_path)
    # (user: started as root, mosquitto drops to its own user, who cannot read the test's files)
    broker.conf.write_text(f"listener {broker.port} 127.0.0.1\ncafile {ca}\ncertfile {cert}\nkeyfile {key}\n"
                           f"allow_anonymous false\npassword_file {passwd}\npersistence false\n"
                           f"user {getpass.getuser()}\n")
    (tmp_path / "mqtt.password").write_text("pw-of-cell-9\n")
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}", tracker_url=f"socket://127.0.0.1:{free_port()}",
                         workdir=tmp_path, overrides={"mqtt": {
                             "enabled": True, "url": f"mqtts://127.0.0.1:{broker.port}", "cell": "cell-9",
                             "username": "cell-9", "password_file": str(tmp_path / "mqtt.password"),
                             "tls_ca_file": str(ca)}})
    broker.start()
    try:
        with App(load_config_text(to_toml(cfgd)), supervise=True) as app:
            publisher = app.plant.adapter("mqtt")
            wait_until(lambda: publisher.stats["connections"] >= 1, 20.0, "a TLS connection with the password")
            got: list[dict] = []
            sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls-sub")
            sub.tls_set(ca_certs=str(ca))
            sub.username_pw_set("cell-9", "pw-of-cell-9")
            sub.on_connect = lambda c, u, f, rc, p: c.subscribe("cellcal/cell-9/state", qos=1)
            sub.on_message = lambda c, u, m: got.append(json.loads(m.payload))
            sub.connect("127.0.0.1", broker.port)
            sub.loop_start()
            try:
                wait_until(lambda: any(b.get("online") for b in got), 20.0, "the state over TLS")
            finally:
                sub.loop_stop()
                sub.disconnect()
        # A wrong password is the broker's refusal: the publisher reports it and retries, the daemon runs.
        (tmp_path / "mqtt.password").write_text("not-it\n")
        with App(load_config_text(to_toml(cfgd)), supervise=True) as app:
            wait_until(lambda: app.plant.faults.get("mqtt", {}).get("active"), 20.0, "the refused connection's fault")
            assert "refused" in app.plant.faults["mqtt"]["message"]
            assert app.service.heartbeat()["state"] == P.STATE_IDLE
    finally:
        broker.stop()
