"""Configuration input: bounds on values that could switch a gate off, typed errors for files
that parse badly, every option error under its own dotted key, and ``cellcal run`` and
``cellcal check-config`` agreeing on every file (one validation path), fuzzed."""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cellcal.daemon.app import App
from cellcal.daemon.cli import check_config as cmd_check_config
from cellcal.daemon.cli import run as cmd_run
from cellcal.daemon.config import ConfigError, load_config, load_config_text, preflight

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "config"
BASE = "config_version = 1\n"
DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[\d+\])?(\.[A-Za-z0-9_\-]+(\[\d+\])?)*$")


def _err(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load_config_text(text, source="t.toml")
    assert "t.toml" in str(ei.value)
    return ei.value


@pytest.mark.parametrize("section, key, value", [
    ("solve", "max_rms_deg", "1e308"), ("solve", "max_rms_mm", "0"), ("solve", "max_rms_mm", "1e9"),
    ("solve", "min_axis_spread", "0"), ("zmq", "max_msg_bytes", "0"), ("zmq", "max_msg_bytes", "-1"),
    ("zmq", "sndhwm", "-1"), ("zmq", "sndhwm", "0"), ("zmq", "heartbeat_s", "1e-9"),
    ("robot.settle", "dwell_s", "0"), ("robot.settle", "max_joint_speed_deg_s", "1e6"),
    ("tracker.settle", "max_std_mm", "1000"), ("drift", "fail_mm", "1e9"), ("drift", "fail_deg", "360"),
    ("drift", "cusum_h_mm", "0"), ("drift", "interval_s", "0.001"), ("capture", "max_attempts_per_station", "100000"),
    ("plan", "n_stations", "1000000"), ("zmq", "ipc_socket_mode", "0o777"),
    ("tracker", "consensus_error_mm", "0"), ("tracker", "consensus_error_mm", "1e9"),
    ("tracker", "consensus_error_deg", "0"), ("tracker", "consensus_error_deg", "90"),
])
def test_values_that_would_switch_a_gate_off_are_refused_under_their_key(section, key, value):
    e = _err(f"{BASE}[{section}]\n{key} = {value}\n")
    assert e.path == f"{section}.{key}" and "must be in" in e.message


@pytest.mark.parametrize("text, path, needle", [
    (BASE + "x = " + "{a = " * 2000 + "1" + "}" * 2000 + "\n", "", "nested too deep"),
    (BASE + "x = " + "[" * 5000 + "]" * 5000 + "\n", "", "nested too deep"),
    (BASE + "[solve]\nmax_rms_mm = " + "9" * 400 + "\n", "solve.max_rms_mm", "does not fit a float 64"),
    (BASE + "[plan]\nhome_q_deg = [0, 0, 0, 0, 0, " + "9" * 400 + "]\n", "plan.home_q_deg[5]", "does not fit"),
    (BASE + "[zmq]\nsndhwm = " + "9" * 30 + "\n", "zmq.sndhwm", "64-bit integer"),
    (BASE + "[solve]\nmax_rms_mm = inf\n", "solve.max_rms_mm", "finite"),
    (BASE + "[solve]\nmax_rms_mm = nan\n", "solve.max_rms_mm", "finite"),
    (BASE + "[service]\nname = '" + "n" * 5000 + "'\n", "service.name", "characters"),
    (BASE + "[tracker.options]\nx = [[[[[[1]]]]]]\n", "tracker.options.x", "nested deeper"),
    ("config_version = " + "9" * 30 + "\n", "config_version", "64-bit"),
    ("config_version = " + "9" * 5000 + "\n", "", "4300 digits"),
    (BASE + "#" + "x" * (1 << 20) + "\n", "", "larger than"),
])
def test_inputs_that_parse_badly_are_typed_errors(text, path, needle):
    e = _err(text)
    assert e.path == path and needle in e.message, str(e)


def test_unreadable_file_is_a_config_error(tmp_path):
    p = tmp_path / "bin.toml"
    p.write_bytes(b"config_version = 1\n\xff\xfe\n")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(p)


def _devices(robot: str = "rtde://127.0.0.1", tracker: str = "socket://127.0.0.1:4000",
             robot_opts: str = "", tracker_opts: str = "") -> str:
    return (f"{BASE}[robot]\nurl = '{robot}'\n[robot.options]\n{robot_opts}\n"
            f"[tracker]\nurl = '{tracker}'\n[tracker.options]\n{tracker_opts}\n")


@pytest.mark.parametrize("kw, path", [
    ({"tracker_opts": "timeout_s = -1"}, "tracker.options.timeout_s"),
    ({"tracker_opts": "timeout_s = 1.0\ntimeout_sec = 3"}, "tracker.options.timeout_sec"),
    ({"tracker_opts": "baudrate = 'fast'"}, "tracker.options.baudrate"),
    ({"tracker_opts": "retries = -5"}, "tracker.options.retries"),
    ({"robot_opts": "frequency_hz = 9999"}, "robot.options.frequency_hz"),
    ({"robot_opts": "tcp_offset = [1, 2]"}, "robot.options.tcp_offset"),
    ({"robot_opts": "stream_timeout_s = 0"}, "robot.options.stream_timeout_s"),
    ({"robot": "rtde://127.0.0.1?frequency_hz=abc"}, "robot.url"),
    ({"robot": "rtde://"}, "robot.url"),
    ({"robot": "bogus://x"}, "robot.url"),
    ({"tracker": "bogus://x"}, "tracker.url"),
    ({"tracker": "socket://localhost"}, "tracker.url"),
    ({"tracker": "socket://127.0.0.1:70000"}, "tracker.url"),
    ({"tracker": "socket://:4000"}, "tracker.url"),
    ({"tracker": "ttyUSB0"}, "tracker.url"),
    ({"tracker": ""}, "tracker.url"),
])
def test_device_errors_name_their_own_key(kw, path):
    cfg = load_config_text(_devices(**kw), source="d.toml")
    with pytest.raises(ConfigError) as ei:
        preflight(cfg)
    assert ei.value.path == path, str(ei.value)
    assert "d.toml" in str(ei.value)


def _basic_devices(robot: str = "rtde://127.0.0.1", tracker: str = "socket://127.0.0.1:4000", robot_opts: str = "",
                   tracker_opts: str = "") -> str:
    """:func:`_devices` with the URLs as TOML basic strings (JSON's escapes: any character); an
    emScon or GeoCOM URL measures points."""
    measure = "point" if tracker.lower().startswith(("emscon", "geocom")) else "pose"
    return (f"{BASE}[robot]\nurl = {json.dumps(robot)}\n[robot.options]\n{robot_opts}\n"
            f"[tracker]\nurl = {json.dumps(tracker)}\nmeasure = '{measure}'\n[tracker.options]\n{tracker_opts}\n")


@pytest.mark.parametrize("kw, path, needle", [
    # what the drivers (or pyserial at open) would fail on, or misread, each refused under its key
    ({"robot": "rtde://[::1"}, "robot.url", "without its ']'"),
    ({"robot": "rtde://h\x00:1"}, "robot.url", "control character"),
    ({"robot": "rtde://[::1]x"}, "robot.url", "after ']'"),
    ({"robot": "rtde://[host]:30004"}, "robot.url", "IPv6"),
    ({"robot": "rtde://999.1.1.1"}, "robot.url", "not an IPv4 address"),
    ({"robot": "rtde://ur controller"}, "robot.url", "control character or a space"),
    ({"robot": "rtde://host:0"}, "robot.url", "1..65535"),
    ({"robot": "rtde://a..b"}, "robot.url", "not a host name"),
    ({"tracker": "spy://"}, "tracker.url", "names no port"),
    ({"tracker": "spy://x?raw"}, "tracker.url", "absolute device path"),
    ({"tracker": "spy:///dev/ttyUSB0?bogus"}, "tracker.url", "unknown spy option"),
    ({"tracker": "loop://?logging=bogus"}, "tracker.url", "pyserial's levels"),
    ({"tracker": "loop://?colour=1"}, "tracker.url", "unknown option"),
    ({"tracker": "hwgrep://"}, "tracker.url", "needs a pattern"),
    ({"tracker": "alt://x"}, "tracker.url", "absolute device path"),
    ({"tracker": "alt:///dev/ttyUSB0?class=Nope"}, "tracker.url", "unknown class"),
    ({"tracker": "socket://[::1"}, "tracker.url", "Invalid IPv6 URL"),
    ({"tracker": "socket://h\x00:1"}, "tracker.url", "control character"),
    ({"tracker": "socket://bad_host!:4000"}, "tracker.url", "not a host name"),
    ({"tracker": "socket://127.0.0.1:4000?logging=loud"}, "tracker.url", "pyserial's levels"),
    ({"tracker": "rfc2217://127.0.0.1:2217?timeout=x"}, "tracker.url", "could not convert"),
    ({"tracker": "emscon://[::1"}, "tracker.url", "Invalid IPv6 URL"),
    ({"tracker": "/dev/tty\x00USB0"}, "tracker.url", "control character"),
    ({"tracker_opts": "baudrate = -1"}, "tracker.options.baudrate", "above 0"),
    ({"tracker_opts": "baudrate = 0"}, "tracker.options.baudrate", "above 0"),
    ({"tracker_opts": "baudrate = true"}, "tracker.options.baudrate", "an integer"),
    ({"tracker_opts": "auto_reconnect = 'maybe'"}, "tracker.options.auto_reconnect", "true or false"),
    ({"tracker_opts": "auto_reconnect = 1"}, "tracker.options.auto_reconnect", "true or false"),
    ({"tracker_opts": "retries = 2.5"}, "tracker.options.retries", "an integer"),
    ({"tracker_opts": "clock_resync_s = '5'"}, "tracker.options.clock_resync_s", "a number"),
    ({"robot_opts": "auto_reconnect = 'maybe'"}, "robot.options.auto_reconnect", "unknown option key"),
])
def test_values_the_drivers_would_fail_on_are_refused_under_their_key(kw, path, needle):
    cfg = load_config_text(_basic_devices(**kw), source="d.toml")
    with pytest.raises(ConfigError) as ei:
        preflight(cfg)
    assert ei.value.path == path, str(ei.value)
    assert needle in ei.value.message, str(ei.value)


def test_good_device_urls_pass(tmp_path):
    for tracker in ("socket://127.0.0.1:4000", "/dev/ttyUSB0", "/dev/serial/by-id/usb-FTDI-if00", "loop://",
                    "spy:///dev/ttyUSB0", "loop://?logging=debug", "spy://socket://127.0.0.1:4000?raw",
                    "alt:///dev/ttyUSB0?class=PosixPollSerial", "socket://[::1]:4000", "socket://cell-7_tracker.local:4000",
                    "rfc2217://127.0.0.1:2217?timeout=3&poll_modem"):
        preflight(load_config_text(_devices(tracker=tracker)))
    for robot in ("rtde://[::1]:30004", "rtde://::1", "rtde://ur-5e.cell.local:30004", "rtde://10.0.0.7"):
        preflight(load_config_text(_devices(robot=robot)))
    preflight(load_config_text(_devices(tracker_opts="baudrate = 115200\nauto_reconnect = false\nretries = 3")))


_URL_SEEDS = {"robot.url": ["rtde://127.0.0.1:30004", "rtde://[::1]:30004", "rtde://ur.local?frequency_hz=125"],
              "tracker.url": ["socket://127.0.0.1:4000", "spy://socket://127.0.0.1:4000?raw", "loop://?logging=info",
                              "alt:///dev/ttyUSB0?class=PosixPollSerial", "rfc2217://[::1]:2217", "/dev/ttyUSB0",
                              "emscon://10.0.0.5:700"]}
_URL_CHARS = ["[", "]", "\x00", ":", "?", "&", "=", "%", "@", " ", "\u00e9", "#", "/", "\\", "\u0661", "\t", "99999"]
_URL_QUERIES = ["logging=bogus", "logging=debug", "class=Nope", "class=Serial", "n=1", "raw", "file", "timeout=x"]


def _mutate_url(rng: random.Random, url: str) -> str:
    for _ in range(rng.randint(1, 3)):
        op = rng.random()
        j = rng.randrange(len(url) + 1)
        if op < 0.45:
            url = url[:j] + rng.choice(_URL_CHARS) + url[j:]
        elif op < 0.65:
            url = url[:j]
        elif op < 0.8:
            url += ("&" if "?" in url else "?") + rng.choice(_URL_QUERIES)
        else:
            url = url[:j] + url[j + 1:]
    return url


def test_fuzz_device_urls_pass_or_are_refused_under_their_key():
    """Mutated device URLs (unclosed brackets, control characters, truncations, hostile query
    options): preflight accepts a URL or refuses it under its key, never raises anything else."""
    rng = random.Random(20270101)
    seen = {"ok": 0, "refused": 0}
    for n in range(600):
        key = rng.choice(sorted(_URL_SEEDS))
        url = _mutate_url(rng, rng.choice(_URL_SEEDS[key]))
        cfg = load_config_text(_basic_devices(**({"robot": url} if key == "robot.url" else {"tracker": url})),
                               source="u.toml")
        try:
            preflight(cfg)
            seen["ok"] += 1
        except ConfigError as exc:
            assert exc.path in (key, "tracker.measure"), (n, url, str(exc))
            seen["refused"] += 1
    assert seen["ok"] > 30 and seen["refused"] > 200, seen


def test_run_and_check_config_refuse_the_same_files_with_the_same_key(tmp_path):
    """As processes: every file check-config refuses, run refuses at once with the same
    message (exit 2), before opening a store or a socket."""
    cases = {
        "gate.toml": _devices() + "[solve]\nmax_rms_deg = 1e308\n",
        "loop.toml": _devices() + "[zmq]\ncmd_endpoint = 'tcp://127.0.0.1:5561'\n",
        "opt.toml": _devices(tracker_opts="timeout_s = -1"),
        "key.toml": _devices() + f"[zmq]\ncurve = true\nserver_secret_key_file = '{tmp_path}/missing.key_secret'\n"
                    "[[zmq.clients]]\npublic_key = 'rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7'\nrole = 'operator'\n",
    }
    procs = {}
    for name, text in cases.items():  # all at once: each is a Python start-up, mostly waiting
        p = tmp_path / name
        p.write_text(text + f"[service]\nstate_dir = '{tmp_path}/state-{name}'\n")
        procs[name] = [subprocess.Popen([sys.executable, "-m", "cellcal.daemon.cli", *a], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
                       for a in (("check-config", str(p)), ("run", "--config", str(p)))]
    for name, pair in procs.items():
        (rc_chk, err_chk), (rc_run, err_run) = ((p.wait(timeout=120), p.communicate()[1]) for p in pair)
        assert rc_chk == 2 and rc_run == 2, (name, err_chk, err_run)
        assert err_chk.strip().split(": ", 1)[1] == err_run.strip().split(": ", 1)[1], name
        assert "Traceback" not in err_chk + err_run
        assert not (tmp_path / f"state-{name}").exists()  # refused before anything was opened


# --- fuzz ----------------------------------------------------------------------------------------

_HOSTILE = ["1e308", "-1e308", "-1", "0", "1", "0.0", "-0.0", "inf", "-inf", "nan", "9" * 40, "9" * 400, "true",
            "false", "'text'", "''", "[]", "[1, 2]", "[[1]]", "{}", "{a = 1}", "1979-05-27T07:32:00Z", "0o777",
            "'" + "x" * 300 + "'", "[" * 60 + "]" * 60, "{a = " * 40 + "1" + "}" * 40, "0x7fffffffffffffff",
            "'tcp://0.0.0.0:1'", "'ipc://@x'", "'ipc://rel'", "'socket://h'", "'rtde://'", "-9223372036854775809",
            # device URLs and options the drivers fail on or misread (issue 24): refused by key
            "'rtde://[::1'", "'rtde://h\\u0000:1'", "'spy://'", "'loop://?logging=bogus'", "'hwgrep://'", "'alt://x'",
            "'socket://[::1'", "'maybe'"]
_KEYS = ["bogus", "timeout_s", "max_rms_deg", "url", "null_role", "sndhwm", "x", "baudrate", "auto_reconnect"]


def _mutate(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        op = rng.random()
        if op < 0.55 and "=" in lines[i] and not lines[i].lstrip().startswith("#"):
            k = lines[i].split("=", 1)[0]
            lines[i] = f"{k}= {rng.choice(_HOSTILE)}"
        elif op < 0.65:
            del lines[i]
        elif op < 0.75:
            lines.insert(i, f"{rng.choice(_KEYS)} = {rng.choice(_HOSTILE)}")
        elif op < 0.82:
            lines.insert(i, lines[i])  # duplicate key or table
        elif op < 0.9:
            s = lines[i]
            j = rng.randrange(len(s) + 1)
            lines[i] = s[:j] + rng.choice(["[", "]", "=", "\"", "'", "{", "\\", "\x00", "é", "#"]) + s[j:]
        else:
            lines = lines[: i + 1]
    return "\n".join(lines) + "\n"


def _verdict_check_config(path: Path, capsys) -> tuple[int, str]:
    rc = cmd_check_config.run(argparse.Namespace(file=str(path), no_devices=False, quiet=True))
    return rc, capsys.readouterr().err.strip()


def _verdict_run(path: Path) -> tuple[int, str]:
    """What ``cellcal run`` decides before its first I/O: the checked load, then building the
    app (store, service, ZeroMQ server: constructors that do no I/O, but validate)."""
    try:
        cfg = cmd_run.load_checked(str(path))
        App(cfg).close()
    except ConfigError as exc:
        return 2, f"cellcal check-config: {exc}"
    return 0, ""


def test_fuzz_mutated_configs_load_or_name_a_key_and_run_agrees(tmp_path, capsys):
    rng = random.Random(20261212)
    bases = [(CONFIGS / n).read_text() for n in ("demo.toml", "cellcal.toml", "cellcal-can.toml")]
    outcomes = {0: 0, 2: 0}
    for n in range(240):
        text = _mutate(rng, bases[n % len(bases)])
        text = re.sub(r"state_dir = .*", f"state_dir = '{tmp_path}/state'", text)
        p = tmp_path / f"m{n}.toml"
        p.write_text(text, encoding="utf-8", errors="surrogateescape")
        rc, err = _verdict_check_config(p, capsys)
        assert (rc, err) == _verdict_run(p), f"mutation {n} disagrees:\n{text}"
        outcomes[rc] += 1
        if rc == 2:
            try:
                load_config(p) and preflight(load_config(p))
            except ConfigError as exc:
                assert exc.path == "" or DOTTED.match(exc.path), (n, exc.path, text)
                if exc.path == "":
                    assert any(w in exc.message for w in ("not valid TOML", "nested too deep", "cannot read")), exc
    assert outcomes[0] > 10 and outcomes[2] > 100, outcomes  # both sides of the line were exercised
    assert not (tmp_path / "state").exists()  # no verdict opened a store


def _schema_paths(cls: type, prefix: str = "") -> list[str]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        path = f"{prefix}.{f.metadata['key']}" if prefix else f.metadata["key"]
        t = hints[f.name]
        out += _schema_paths(t, path) if dataclasses.is_dataclass(t) else [path]
    return out


def test_every_key_and_every_bound_is_in_the_configuration_reference():
    from cellcal.daemon.config import _BOUNDS, Config

    doc = (ROOT / "docs" / "configuration.md").read_text()
    missing = [p for p in _schema_paths(Config) if f"`{p}`" not in doc]
    assert not missing, f"keys not documented in docs/configuration.md: {missing}"
    for key in _BOUNDS:
        name = key.replace("[]", "").split(".")[-1]
        assert f"`{key.replace('[]', '')}`" in doc or f"`{name}`" in doc, key
