"""The plant interfaces' sections, their security rules, and their isolation in a real daemon.

* ``[opcua]``, ``[mqtt]``, ``[metrics]`` are off by default; their errors name the dotted key;
  the security rules refuse what would expose the cell (OPC UA security ``none`` off
  loopback or without saying so, a password to a remote broker in clear, metrics on a
  network address without saying so).
* An enabled interface whose package is missing is a ``check-config`` error naming the
  package (the import made to fail with ``sys.modules[name] = None``, which is what Python
  does for a module that is not there).
* The frame and sigma views the OPC UA server and the metrics show (mm and deg, A-B-C).
* A daemon whose metrics port is taken and whose broker is down starts, serves ZeroMQ and
  publishes both interfaces' faults: one interface's failure never stops the daemon.
"""

from __future__ import annotations

import math
import socket
import sys

import numpy as np
import pytest
from conftest import wait_until

from cellcal.daemon import protocol as P
from cellcal.daemon.config import ConfigError, load_config_text, preflight
from cellcal.daemon.plant import enabled_interfaces
from cellcal.daemon.plant.views import frame_mm_deg, sigmas
from cellcal.solver.se3 import so3_exp
from cellcal.testing.harness import daemon_config, free_port, to_toml

BASE = "config_version = 1\n"


def load(extra: str):
    return load_config_text(BASE + extra)


def refused(extra: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(extra)
    return info.value


def test_every_interface_is_off_by_default():
    cfg = load("")
    assert enabled_interfaces(cfg) == []
    assert (cfg.opcua.enabled, cfg.mqtt.enabled, cfg.metrics.enabled) == (False, False, False)
    assert cfg.opcua.security == ["sign_and_encrypt"] and cfg.opcua.anonymous is False


def test_sections_load_and_name_their_keys(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    cfg = load(f"""
[opcua]
enabled = true
endpoint = "opc.tcp://127.0.0.1:4841"
security = ["none"]
allow_none_on_loopback = true
[[opcua.users]]
name = "ops"
role = "operator"
password_file = "{pw}"
[mqtt]
enabled = true
url = "mqtt://127.0.0.1:1884"
cell = "press-7"
[metrics]
enabled = true
listen = "127.0.0.1:9200"
""")
    assert enabled_interfaces(cfg) == ["metrics", "mqtt", "opcua"]
    assert cfg.opcua.users[0].role == "operator" and cfg.mqtt.cell == "press-7"
    assert refused("[mqtt]\nurl_x = 1\n").path == "mqtt.url_x"
    assert refused("[opcua]\n[[opcua.users]]\nname = 'a'\nrole = 'admin'\npassword_file = 'x'\n").path == "opcua.users[0].role"
    assert refused("[opcua]\nsecurity = ['sign', 'plain']\n").path == "opcua.security[1]"
    assert refused("[mqtt]\ncell = 'a/#'\n").path == "mqtt.cell"
    assert refused("[mqtt]\nreconnect_min_s = 0\n").path == "mqtt.reconnect_min_s"
    assert refused("[metrics]\nlisten = '127.0.0.1'\n").path == "metrics.listen"


@pytest.mark.parametrize(("extra", "path", "words"), [
    # OPC UA: no encryption only where nobody else reaches it, and only when said so.
    ("[opcua]\nendpoint = 'opc.tcp://0.0.0.0:4840'\nsecurity = ['none']\nallow_none_on_loopback = true\n",
     "opcua.security", "other hosts reach"),
    ("[opcua]\nsecurity = ['none']\n", "opcua.security", "allow_none_on_loopback"),
    ("[opcua]\nenabled = true\nanonymous = true\n", "opcua.certificate_file", "required"),
    ("[opcua]\nenabled = true\nsecurity = ['none']\nallow_none_on_loopback = true\n", "opcua", "nobody could connect"),
    ("[opcua]\nsecurity = ['none']\nallow_none_on_loopback = true\n[[opcua.certificates]]\nname = 'plc'\nfile = 'c.pem'\n",
     "opcua.certificates", "secure mode"),
    ("[opcua]\nsecurity = ['none']\nallow_none_on_loopback = true\ntrusted_certificates_dir = '/etc/pki'\n",
     "opcua.trusted_certificates_dir", "secure mode"),
    # MQTT: no password in clear across the network; TLS files only with mqtts.
    ("[mqtt]\nurl = 'mqtt://10.1.2.3'\nusername = 'u'\npassword_file = '/p'\n", "mqtt.url", "in clear"),
    ("[mqtt]\nusername = 'u'\n", "mqtt.password_file", "together"),
    ("[mqtt]\ntls_ca_file = '/ca.pem'\n", "mqtt.url", "mqtts"),
    ("[mqtt]\nurl = 'http://127.0.0.1'\n", "mqtt.url", "mqtt://"),
    # Metrics: a network address only knowingly.
    ("[metrics]\nenabled = true\nlisten = '0.0.0.0:9108'\n", "metrics.listen", "allow_non_loopback"),
])
def test_security_rules_refuse_what_would_expose_the_cell(extra, path, words):
    exc = refused(extra)
    assert exc.path == path and words in exc.message, exc


def test_what_the_rules_allow():
    load("[opcua]\nendpoint = 'opc.tcp://0.0.0.0:4840'\n")  # encrypted on the network: fine (disabled: no cert needed yet)
    load("[mqtt]\nurl = 'mqtts://broker.example:8883'\nusername = 'u'\npassword_file = '/p'\n")
    load("[metrics]\nenabled = true\nlisten = '192.0.2.7:9108'\nallow_non_loopback = true\n")


@pytest.mark.parametrize(("section", "module", "dist"), [
    ("opcua", "asyncua", "asyncua"), ("mqtt", "paho", "paho-mqtt"), ("metrics", "prometheus_client", "prometheus-client"),
])
def test_a_missing_package_is_a_check_config_error_naming_it(monkeypatch, tmp_path, section, module, dist):
    extra = {"opcua": "[opcua]\nenabled = true\nanonymous = true\nsecurity = ['none']\nallow_none_on_loopback = true\n",
             "mqtt": "[mqtt]\nenabled = true\n", "metrics": "[metrics]\nenabled = true\n"}[section]
    cfg = load(extra)
    preflight(cfg, devices=False)  # installed here (the test extra): accepted
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # what an absent package looks like to import
    with pytest.raises(ConfigError) as info:
        preflight(cfg, devices=False)
    assert info.value.path == f"{section}.enabled"
    assert dist in info.value.message and f"cellcal[{section}]" in info.value.message

    from cellcal.daemon.cli import check_config as cmd_check_config

    path = tmp_path / "c.toml"
    path.write_text(BASE + extra)

    class Args:
        file, no_devices, quiet, probe = str(path), True, True, False

    assert cmd_check_config.run(Args()) == 2  # type: ignore[arg-type]


def test_an_unreadable_password_file_is_named(tmp_path):
    cfg = load(f"[opcua]\nenabled = true\nsecurity = ['none']\nallow_none_on_loopback = true\n"
               f"[[opcua.users]]\nname = 'ops'\npassword_file = '{tmp_path / 'missing'}'\n")
    with pytest.raises(ConfigError) as info:
        preflight(cfg, devices=False)
    assert info.value.path == "opcua.users[0].password_file"


def test_a_missing_trusted_certificates_dir_is_named(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.der"
    key.write_text("k")
    cert.write_text("c")
    opcua = (f"[opcua]\nenabled = true\nanonymous = true\ncertificate_file = '{cert}'\nprivate_key_file = '{key}'\n"
             f"trusted_certificates_dir = '{{}}'\n")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    preflight(load(opcua.format(trusted)), devices=False)  # an empty directory: only the listed certificates
    for missing in (tmp_path / "absent", cert):  # no such path; a file, not a directory
        with pytest.raises(ConfigError) as info:
            preflight(load(opcua.format(missing)), devices=False)
        assert info.value.path == "opcua.trusted_certificates_dir" and str(missing) in info.value.message


# ---- the views --------------------------------------------------------------------------------


def _rx(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _ry(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def _rz(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def test_frames_are_mm_and_abc_degrees_with_r_equal_rz_ry_rx():
    rng = np.random.default_rng(0)
    for _ in range(50):
        T = np.eye(4)
        T[:3, :3] = so3_exp(rng.normal(size=3))
        T[:3, 3] = rng.uniform(-3, 3, size=3)
        x, y, z, a, b, c = frame_mm_deg({"matrix": T.reshape(16).tolist()})
        assert np.allclose([x, y, z], T[:3, 3] * 1e3, atol=1e-9)
        R = _rz(math.radians(c)) @ _ry(math.radians(b)) @ _rx(math.radians(a))
        assert np.allclose(R, T[:3, :3], atol=1e-12)
        assert -90.0 <= b <= 90.0


def test_sigmas_are_roots_of_the_covariance_traces():
    C = np.diag([1e-8, 4e-8, 4e-8, 1e-6, 1e-6, 2e-6])
    body = {"uncertainty": {"covariance": {"X": {"shape": [6, 6], "values": C.reshape(36).tolist()},
                                           "p": {"shape": [3, 3], "values": np.diag([1e-8, 1e-8, 2e-8]).reshape(9).tolist()},
                                           "bad": {"shape": [6, 6], "values": [None] * 36}}}}
    st, sr = sigmas(body, "X")
    assert st == pytest.approx(3e-4) and sr == pytest.approx(2e-3)
    assert sigmas(body, "p") == (pytest.approx(2e-4), None)
    assert sigmas(body, "bad") == (None, None) and sigmas(body, "missing") == (None, None)


# ---- isolation in a real daemon ----------------------------------------------------------------


def test_a_taken_port_and_a_dead_broker_leave_the_daemon_running_and_are_published(tmp_path):
    from cellcal.daemon.app import App

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    dead = free_port()  # nothing listens there: a broker that is down
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}", tracker_url=f"socket://127.0.0.1:{free_port()}",
                         workdir=tmp_path, overrides={
                             "metrics": {"enabled": True, "listen": f"127.0.0.1:{taken.getsockname()[1]}"},
                             "mqtt": {"enabled": True, "url": f"mqtt://127.0.0.1:{dead}", "reconnect_min_s": 0.05,
                                      "reconnect_max_s": 0.2}})
    cfg = load_config_text(to_toml(cfgd))
    try:
        with App(cfg, supervise=True) as app:
            assert app.plant is not None and [a.name for a in app.plant.adapters] == ["metrics", "mqtt"]

            wait_until(lambda: {"metrics", "mqtt"} <= set(app.plant.faults), 20.0, "the metrics and mqtt faults")
            seen = dict(app.plant.faults)
            # ... and the latest of them is the ZeroMQ fault topic's latest message.
            latest = wait_until(lambda: app.server.latest(P.TOPIC_FAULT), 5.0, "a fault on ZeroMQ")
            assert latest["body"]["interface"] in seen
            for name, body in seen.items():
                assert body["active"] is True and body["code"] == P.E_UNAVAILABLE and body["device"] is None, body
                assert body["message"].startswith(f"{name}: ") and not P.check_body(P.TOPIC_FAULT, body)
            assert seen["mqtt"]["retry_in_s"] is not None
            # The daemon goes on: it answers, and says it is idle, not in FAULT.
            assert app.service.heartbeat()["state"] == P.STATE_IDLE
            assert app.service.status()["queued_jobs"] == 0
    finally:
        taken.close()
