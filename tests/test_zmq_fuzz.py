"""A fuzz of the command socket of the real daemon (``cellcal run`` as a process, real SQLite,
real ZeroMQ on loopback, devices offline): a few thousand requests from a fixed seed, random
and mutated msgpack, huge integers, deep nesting, wrong types, every command of the
catalogue. Every request gets a well-formed reply, none is an internal error, no reply holds
a non-finite number, the log holds no traceback, and the daemon still answers afterwards."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import result_to_wire
from cellcal.daemon.store import Store
from cellcal.daemon.wire.client import Client
from cellcal.solver import calibrate_base_frame
from cellcal.solver.synthetic import base_frame_scene
from cellcal.testing.harness import DaemonProcess, daemon_config, free_port, write_config

SEED = 1212
N_REQUESTS = 3000
WINDOW = 200


def _seed_store(state: Path) -> int:
    scene = base_frame_scene(8, np.random.default_rng(5), noise_mm=0.01, noise_deg=0.005)
    wire = result_to_wire(calibrate_base_frame(scene.base_T_flange, scene.measured))
    wire["gates"] = {"passed": True, "failed": []}
    with Store(state) as s:
        first = s.add_result(None, "base_frame", wire, {}, activate=True)
        s.add_result(None, "base_frame", wire, {})
    return first


class Fuzzer:
    def __init__(self, rng: random.Random, result_id: int) -> None:
        self.rng = rng
        self.result_id = result_id

    def hostile(self, depth: int = 0) -> Any:
        r = self.rng
        pool = [
            lambda: r.choice([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 10**18]),
            lambda: r.choice([0.0, -0.0, 1.7e308, -1.7e308, 5e-324, math.nan, math.inf, -math.inf, 0.1]),
            lambda: r.choice([True, False, None]),
            lambda: r.choice(["", "x", "r-1", str(self.result_id), "9" * 30, str(2**63), "é\x00\n", "a" * 5000]),
            lambda: bytes(r.getrandbits(8) for _ in range(r.randint(0, 40))),
            lambda: msgpack.ExtType(r.randint(0, 127), b"\x00" * r.randint(0, 8)),
            lambda: [self.hostile(depth + 1) for _ in range(r.randint(0, 4))] if depth < 6 else [],
            lambda: {r.choice(["w", "x", "matrix", "q_rad", "kind", "k"]): self.hostile(depth + 1)
                     for _ in range(r.randint(0, 3))} if depth < 6 else {},
            lambda: [r.uniform(-10, 10) for _ in range(r.choice([3, 6, 12, 16]))],
            lambda: self.nested(r.randint(10, 120)),
        ]
        return r.choice(pool)()

    def nested(self, n: int) -> Any:
        v: Any = 0
        for _ in range(n):
            v = [v] if self.rng.random() < 0.5 else {"k": v}
        return v

    def args_for(self, cmd: str) -> dict[str, Any]:
        r = self.rng
        spec = P.COMMANDS[cmd]
        args: dict[str, Any] = {}
        plausible = {
            "result_id": lambda: r.choice([str(self.result_id), str(self.result_id + 1), "777", "r-0001",
                                           "9" * 30, str(2**63), str(2**63 - 1), "0", "-1"]),
            "kind": lambda: r.choice(P.RUN_KINDS),
            "limit": lambda: r.randint(1, 1000),
            "point_m": lambda: [r.uniform(-5, 5) for _ in range(3)],
            "pose": lambda: r.choice([
                {"matrix": [1, 0, 0, r.uniform(-1, 1), 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]},
                {"translation_m": [0.1, 0.2, 0.3], "quaternion": {"w": 1, "x": 0, "y": 0, "z": 0}}]),
            "child_frame": lambda: r.choice(["part", "tool0"]),
            "stations": lambda: [{"q_rad": [r.uniform(-3, 3) for _ in range(r.choice([1, 6, 12]))]}
                                 for _ in range(r.randint(1, 4))],
            "plan": lambda: r.choice(["default", "nope"]),
            "motion_mode": lambda: r.choice(P.MOTION_MODES),
            "run_id": lambda: r.choice(["1", "2", "run-1", "9" * 30]),
        }
        for a in spec.args:
            if r.random() < 0.6:
                args[a.name] = plausible.get(a.name, self.hostile)() if r.random() < 0.6 else self.hostile()
        if r.random() < 0.1:
            args[r.choice(["bogus", "id", "k" * 100])] = self.hostile()
        return args

    def request(self, i: int) -> tuple[bytes, Any, str | None]:
        """(bytes, the id a reply must echo or None, the command when the id is ours)."""
        r = self.rng
        cmd = r.choice(list(P.COMMANDS))
        rid: Any = f"f{i}" if r.random() < 0.8 else 10**6 + i
        kind = r.random()
        if kind < 0.55:
            return msgpack.packb({"id": rid, "cmd": cmd, "args": self.args_for(cmd)}, use_bin_type=True), rid, cmd
        if kind < 0.65:  # a broken envelope around a good id
            body = {"id": rid, "cmd": r.choice([cmd, "no_such", 7, None, "get_status" * 10]),
                    "args": r.choice([self.hostile(), None, {}])}
            if r.random() < 0.3:
                body[r.choice(["extra", "ID", ""])] = 1
            known = body["cmd"] if isinstance(body["cmd"], str) and body["cmd"] in P.COMMANDS else None
            return msgpack.packb(body, use_bin_type=True), rid, known
        if kind < 0.72:  # a hostile id
            bad_id = r.choice([None, True, -1, 2**63, 2**64 - 1, 1.5, "", "i" * 200, [1], {"a": 1}, b"bin"])
            return msgpack.packb({"id": bad_id, "cmd": cmd}, use_bin_type=True), None, None
        if kind < 0.85:  # a valid request, mutated (an id of its own: a flipped byte must not
            # turn it into the id of another request, which would share its stored reply)
            mid = f"mut-{i:06d}-{r.getrandbits(32):08x}"
            data = bytearray(msgpack.packb({"id": mid, "cmd": cmd, "args": self.args_for(cmd)}, use_bin_type=True))
            for _ in range(r.randint(1, 4)):
                op, j = r.random(), r.randrange(len(data))
                if op < 0.5:
                    data[j] = r.getrandbits(8)
                elif op < 0.7:
                    del data[j:]
                    if not data:
                        data = bytearray(b"\xc1")
                else:
                    data[j:j] = bytes(r.getrandbits(8) for _ in range(r.randint(1, 8)))
            return bytes(data), None, None
        if kind < 0.9:  # raw byte soup
            return bytes(r.getrandbits(8) for _ in range(r.randint(1, 200))), None, None
        return r.choice([  # shapes that cost a naive decoder dearly
            b"\x91" * r.randint(100, 20000) + b"\xc0",
            b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
            b"\x81" + msgpack.packb(1) + msgpack.packb(2),
            msgpack.packb({"id": rid, "cmd": cmd, "args": self.nested(r.randint(200, 600))}),
        ]), None, None


def _check(reply_bytes: bytes, expect: dict[Any, str | None]) -> tuple[Any, str]:
    reply = P.unpack(reply_bytes, max_array=1 << 24, max_map=1 << 20)
    assert isinstance(reply, dict) and set(reply) >= {"id", "ok"}, reply
    assert P.find_non_finite(reply, "reply") is None, reply
    rid = reply["id"]
    cmd = expect.get(rid) if isinstance(rid, (str, int)) else None
    if reply["ok"]:
        assert "result" in reply, reply
        if cmd is not None:  # one of ours, whole: the result must be that command's
            problems = P.check_reply(cmd, reply, rid)
            assert not problems, (cmd, problems)
        else:  # a mutated request that still parsed (its id was mutated or broken)
            assert rid is not None and not (isinstance(rid, str) and rid.startswith("f")), reply
        return rid, "ok"
    err = reply["error"]
    assert err["code"] in P.ERROR_CODES and isinstance(err["message"], str) and err["message"], reply
    assert len(err["message"]) < 2000, err["message"][:200]
    return rid, err["code"]


def test_command_socket_fuzz_against_the_real_daemon(tmp_path):
    rng = random.Random(SEED)
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                         tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path)
    result_id = _seed_store(Path(cfgd["service"]["state_dir"]))
    conf = write_config(tmp_path / "cellcal.toml", cfgd)
    log = tmp_path / "run.log"
    daemon = DaemonProcess(conf, log).start()
    try:
        cmd_ep = cfgd["zmq"]["cmd_endpoint"]
        with Client(cmd_ep, timeout_s=2.0, retries=15) as c:
            assert c.call("get_status")["state"] in P.STATES
        fz = Fuzzer(rng, result_id)
        ctx = zmq.Context()
        try:
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.sndhwm = s.rcvhwm = 0
            s.connect(cmd_ep)
            expect: dict[Any, str | None] = {}
            codes: dict[str, int] = {}
            sent = got = 0
            deadline = time.monotonic() + 120.0
            while got < N_REQUESTS:
                while sent < N_REQUESTS and sent - got < WINDOW:
                    data, rid, cmd = fz.request(sent)
                    if rid is not None:
                        expect[rid] = cmd
                    s.send(data)
                    sent += 1
                assert time.monotonic() < deadline, f"{got} replies of {sent} after 120 s"
                if not s.poll(10_000):
                    raise AssertionError(f"no reply for 10 s: {got} of {sent}; daemon alive: {daemon.alive()}")
                while s.poll(0) and got < N_REQUESTS:
                    _rid, code = _check(s.recv(), expect)
                    codes[code] = codes.get(code, 0) + 1
                    got += 1
            assert not s.poll(300)  # one reply per request, no more
        finally:
            ctx.destroy(linger=0)
        assert codes.get(P.E_INTERNAL, 0) == 0, codes
        assert codes.get("ok", 0) > 100 and codes.get(P.E_BAD_REQUEST, 0) > 1000, codes
        assert daemon.alive()
        with Client(cmd_ep, timeout_s=3.0, retries=3) as c:
            assert c.call("get_status")["state"] in P.STATES
            assert c.call("get_snapshot")["seq"] >= 1
    finally:
        rc = daemon.terminate()
    text = log.read_text()
    assert rc == 0, text[-3000:]
    assert "Traceback" not in text, text[text.index("Traceback") - 500:][:4000]
