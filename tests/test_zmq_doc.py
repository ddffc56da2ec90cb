"""docs/protocols/zeromq.md against the code: examples conform, bytes match, the C++ client works.

Blocks marked ``<!-- check: KIND NAME -->`` in the document are checked here:
``body TOPIC`` and ``result CMD`` against the TypedDicts of ``protocol``, ``request NAME``
through the server's own parser and validator, ``bytes`` (a JSON block then its hex dump)
byte for byte, and ``cpp`` is compiled and run against a live ZmqServer, as observer and
as operator, with and without CURVE.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import typing
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_until
from test_zmq_support import CELL_T_BASE, curve_config, curve_setup, serving, short_tmpdir, zmq_config

from cellcal.daemon import bodies
from cellcal.daemon import protocol as P

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocols" / "zeromq.md"
TEXT = DOC.read_text(encoding="utf-8")
BLOCK = re.compile(r"<!-- check: (\w+)(?: (\S+))? -->\s*```(\w+)\n(.*?)```", re.S)
CHECKS = [(m.group(1), m.group(2), m.group(3), m.group(4)) for m in BLOCK.finditer(TEXT)]


def _blocks(kind: str) -> list[tuple[str | None, str]]:
    return [(name, body) for k, name, _lang, body in CHECKS if k == kind]


def _cmd(name: str) -> str:
    return name if name in P.COMMANDS else name.rsplit("_", 1)[0]


def test_the_document_has_its_examples():
    kinds = {(k, n) for k, n, _, _ in CHECKS}
    assert {("body", t) for t in P.TOPICS} <= kinds
    assert len(_blocks("bytes")) == 3 and len(_blocks("cpp")) == 1


@pytest.mark.parametrize("topic, text", _blocks("body"))
def test_body_examples_conform(topic, text):
    body = json.loads(text)
    assert P.check_body(topic, body) == []
    assert P.unpack(P.pack(body)) == body


@pytest.mark.parametrize("name, text", _blocks("result"))
def test_result_examples_conform(name, text):
    assert P.check_result(_cmd(name), json.loads(text)) == []


@pytest.mark.parametrize("name, text", _blocks("request"))
def test_request_examples_pass_the_server_checks(name, text):
    req = P.parse_request(P.pack(json.loads(text)))
    assert req.cmd == _cmd(name)
    P.validate_args(req.cmd, req.args)


def test_snapshot_example_holds_well_formed_envelopes():
    (snap,) = [json.loads(t) for n, t in _blocks("result") if n == "get_snapshot"]
    for topic, env in snap["messages"].items():
        assert P.check_envelope(env) is None and env["seq"] <= snap["seq"]
        assert P.check_body(topic, env["body"]) == []


@pytest.mark.parametrize("shape", ["point", "pose"])
def test_to_base_examples_are_the_transform_of_the_result_example(shape):
    (result,) = [json.loads(t) for n, t in _blocks("body") if n == P.TOPIC_RESULT]
    cell_T_base = np.array(result["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4)
    req = P.parse_request(P.pack(json.loads(dict(_blocks("request"))[f"to_base_{shape}"])))
    expected = json.loads(dict(_blocks("result"))[f"to_base_{shape}"])
    got = bodies.to_base_reply(cell_T_base, P.validate_args("to_base", req.args), result_id=result["result_id"], suspect=False)
    assert got.keys() == expected.keys()
    flat = lambda d: np.array([v for v in _numbers(d)])  # noqa: E731
    np.testing.assert_allclose(flat(got), flat(expected), atol=1e-12)


def _numbers(obj):
    if isinstance(obj, dict):
        for k in sorted(obj):
            yield from _numbers(obj[k])
    elif isinstance(obj, list):
        for v in obj:
            yield from _numbers(v)
    elif isinstance(obj, float):
        yield obj


def test_byte_dumps_are_exact():
    i = 0
    for k, _name, _lang, body in CHECKS:
        if k != "bytes":
            continue
        obj = json.loads(body)
        # The hex block follows the JSON block.
        start = TEXT.index(body) + len(body)
        hexdump = re.search(r"```text\n(.*?)```", TEXT[start:], re.S).group(1)
        assert P.pack(obj).hex() == "".join(hexdump.split()), f"bytes example {i}"
        i += 1
    env = json.loads(_blocks("bytes")[1][1])
    assert P.pack(env) == P.pack_envelope(env["seq"], env["boot_id"], env["ts_ns"], P.pack(env["body"]))


def test_tables_name_every_topic_command_code_and_field():
    for topic in P.TOPICS:
        assert f"`{topic}`" in TEXT
    catalogue = TEXT[TEXT.index("### 6.3 Catalogue"):TEXT.index("### 6.4")]
    for name, spec in P.COMMANDS.items():
        row = next(line for line in catalogue.splitlines() if line.startswith(f"| `{name}` |"))
        assert spec.role in row, name
        for arg in spec.args:
            assert f"`{arg.name}`" in row, (name, arg.name)
    codes = TEXT[TEXT.index("## 7. Error codes"):TEXT.index("## 8. Security")]
    for code in P.ERROR_CODES:
        assert f"| `{code}` |" in codes
    for tp in P.BODY_TYPES.values():
        for field in typing.get_type_hints(tp):
            assert f"`{field}`" in TEXT or f"`settle.{field}`" in TEXT, (tp.__name__, field)


# --- the C++ client of section 10.2 --------------------------------------------------------------


def _missing_cpp_toolchain() -> list[str]:
    have = {"g++": shutil.which("g++") is not None}
    have.update({h: Path("/usr/include", h).exists() for h in ("zmq.h", "zmq.hpp", "msgpack.hpp")})
    return [what for what, ok in have.items() if not ok]


@pytest.fixture(scope="module")
def cpp_client(tmp_path_factory):
    # The document's C++ client must build and run. The tests never install anything: a
    # missing toolchain fails them (never a skip) with the command that installs it.
    missing = _missing_cpp_toolchain()
    if missing:
        pytest.fail(f"the C++ client's toolchain is missing ({', '.join(missing)}): run `make os-deps` "
                    "(as root it installs the OS packages the suite needs)")
    d = tmp_path_factory.mktemp("cpp")
    (src,) = [body for _name, body in _blocks("cpp")]
    (d / "cellcal_client.cpp").write_text(src)
    exe = d / "cellcal_client"
    build = re.search(r"// Build: (g\+\+ .*)", src).group(1).replace("-o cellcal_client", f"-o {exe}")
    r = subprocess.run(build.split(), cwd=d, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    return exe


def _run_cpp(exe: Path, srv, daemon, *keys: str) -> list[str]:
    stop = threading.Event()

    def beat():
        while not stop.wait(0.05):
            daemon.publish_heartbeat()

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        r = subprocess.run([str(exe), srv.cmd_endpoint, srv.pub_endpoint, *keys], capture_output=True, text=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    finally:
        stop.set()
        t.join(5)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def _expected_point() -> np.ndarray:
    R, t = CELL_T_BASE[:3, :3], CELL_T_BASE[:3, 3]
    return R.T @ (np.array([1.0, 0.5, 0.25]) - t)


def _check_cpp_output(lines: list[str], rid: str) -> None:
    assert lines[0].startswith("snapshot seq=")
    assert any(ln.startswith("cellcal/v1/result") and f"result_id={rid}" in ln for ln in lines)
    assert sum(ln.startswith("cellcal/v1/heartbeat") and f"active={rid}" in ln for ln in lines) >= 3
    (tb,) = [ln for ln in lines if ln.startswith("to_base")]
    assert f"result_id={rid}" in tb
    got = np.array([float(v) for v in tb.split("point_m=")[1].split(",")])
    np.testing.assert_allclose(got, _expected_point(), atol=1e-9)


def test_cpp_client_follows_queries_and_is_refused(cpp_client):
    with serving() as (srv, daemon):
        rid = daemon.add_result()
        lines = _run_cpp(cpp_client, srv, daemon)
        _check_cpp_output(lines, rid)
        assert lines[-1].startswith("start_run refused code=E_FORBIDDEN")
        assert daemon.runs == 0


def test_cpp_client_under_curve_as_observer_and_operator(cpp_client):
    with short_tmpdir() as d:
        keys, server_file = curve_setup(d, ops="operator", viewer="observer")
        with serving(curve_config(keys, server_file, {"ops": "operator", "viewer": "observer"})) as (srv, daemon):
            rid = daemon.add_result()
            server_pub = keys["server"][0].decode()
            lines = _run_cpp(cpp_client, srv, daemon, server_pub, *(k.decode() for k in keys["viewer"]))
            _check_cpp_output(lines, rid)
            assert lines[-1].startswith("start_run refused code=E_FORBIDDEN")
            lines = _run_cpp(cpp_client, srv, daemon, server_pub, *(k.decode() for k in keys["ops"]))
            assert lines[-1] == "start_run run_id=run-1"
            assert daemon.runs == 1


def test_cpp_client_resynchronises_after_a_restart(cpp_client):
    # Snapshot from a first daemon, then that daemon is replaced on the same endpoints: the
    # client must see the new boot_id and take a fresh snapshot before it goes on.
    from test_zmq_support import MemoryDaemon

    with short_tmpdir() as d:
        cfg = zmq_config(pub_endpoint=f"ipc://{d}/pub", cmd_endpoint=f"ipc://{d}/cmd")
        with serving(cfg) as (srv1, daemon1):
            daemon1.add_result()
            proc = subprocess.Popen([str(cpp_client), srv1.cmd_endpoint, srv1.pub_endpoint], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
            try:
                wait_until(lambda: srv1.stats().get("requests", 0) >= 1, 10.0, "the client's snapshot request")
                first_boot = srv1.boot_id
            except BaseException:
                proc.kill()
                raise
        try:
            daemon2 = MemoryDaemon()
            with serving(cfg, daemon2) as (srv2, _):
                rid2 = daemon2.add_result(CELL_T_BASE)
                stop = threading.Event()

                def beats():
                    while not stop.wait(0.05):
                        daemon2.publish_heartbeat()

                beat = threading.Thread(target=beats, daemon=True)
                beat.start()
                out, err = proc.communicate(timeout=30)
                stop.set()
                beat.join(5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == f"snapshot seq=1 boot_id={first_boot}"
    i = lines.index("daemon restarted")
    assert lines[i + 1] == f"snapshot seq={lines[i + 1].split('seq=')[1].split()[0]} boot_id={srv2.boot_id}"
    _check_cpp_output(lines[i + 1:], rid2)
