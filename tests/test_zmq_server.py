"""ZmqServer and Client over real sockets: envelope, snapshot, gaps, back-pressure, commands.

Loopback TCP with random ports (or ipc in a short temp dir), linger 0, every receive with a
timeout. The daemon behind the server is ``MemoryDaemon`` (tests/test_zmq_support.py).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq
from test_zmq_support import (
    CELL_T_BASE,
    MemoryDaemon,
    dealer,
    heartbeating,
    pose,
    rpc,
    serving,
    short_tmpdir,
    wait_until,
    zctx,
    zmq_config,
)

from cellcal.daemon import protocol as P
from cellcal.daemon.wire.client import Client, ClientTimeout, CommandFailed
from cellcal.daemon.wire.zmq_server import BindError, SecurityError, ZmqServer, is_local_endpoint
from cellcal.solver.se3 import se3_inverse


def _sub(ctx: zmq.Context, endpoint: str, prefix: bytes = P.TOPIC_PREFIX.encode(), **opts) -> zmq.Socket:
    s = ctx.socket(zmq.SUB)
    s.linger = 0
    for k, v in opts.items():
        setattr(s, k, v)
    s.connect(endpoint)
    s.setsockopt(zmq.SUBSCRIBE, prefix)
    return s


def _join(srv: ZmqServer, subs: list[zmq.Socket], timeout_s: float = 3.0) -> None:
    """Publish probe heartbeats until every SUB has one (ZeroMQ's slow-joiner), then drain."""
    pending = set(subs)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        srv.publish(P.TOPIC_HEARTBEAT, {"probe": True})
        time.sleep(0.01)
        for s in list(pending):
            if s.poll(0):
                pending.discard(s)
    assert not pending, f"{len(pending)} subscriber(s) never connected"
    time.sleep(0.02)
    for s in subs:
        while s.poll(0):
            s.recv_multipart()


# --- envelope, seq, snapshot ---------------------------------------------------------------------


def test_envelope_frames_and_seq_across_topics():
    with serving() as (srv, daemon), zctx() as ctx:
        sub = _sub(ctx, srv.pub_endpoint)
        _join(srv, [sub])
        base = srv.seq
        before = time.time_ns()
        srv.publish(P.TOPIC_STATE, {"state": "IDLE"})
        srv.publish(P.TOPIC_FAULT, {"code": P.E_DEVICE, "message": "x"})
        daemon.add_result()
        seen = []
        for _ in range(3):
            assert sub.poll(2000)
            frames = sub.recv_multipart()
            assert len(frames) == 2
            seen.append((frames[0].decode(), P.unpack(frames[1])))
        topics = [t for t, _ in seen]
        assert topics == [P.TOPIC_STATE, P.TOPIC_FAULT, P.TOPIC_RESULT]
        for i, (_, env) in enumerate(seen):
            assert set(env) == {"schema", "v", "seq", "boot_id", "ts_ns", "body"}
            assert env["schema"] == "cellcal/v1" and env["v"] == 1
            assert env["seq"] == base + 1 + i
            assert env["boot_id"] == srv.boot_id and len(srv.boot_id) == 16
            assert before <= env["ts_ns"] <= time.time_ns()
        assert seen[2][1]["body"]["retained"] is False  # the result topic always says
        assert "retained" not in seen[0][1]["body"]


def test_boot_id_differs_per_start():
    ids = set()
    for _ in range(3):
        with serving() as (srv, _):
            ids.add(srv.boot_id)
    assert len(ids) == 3


def test_snapshot_is_latest_per_topic_and_current_seq():
    with serving() as (srv, daemon), Client(srv.cmd_endpoint) as c:
        daemon.add_result()
        daemon.publish_heartbeat()
        daemon.publish_heartbeat()
        wait_until(lambda: srv.seq == 3)
        snap = c.call("get_snapshot")
        assert snap["seq"] == 3 and snap["boot_id"] == srv.boot_id
        assert set(snap["messages"]) == {P.TOPIC_RESULT, P.TOPIC_HEARTBEAT}
        assert snap["messages"][P.TOPIC_HEARTBEAT]["seq"] == 3
        assert snap["messages"][P.TOPIC_RESULT]["seq"] == 1
        assert snap["messages"][P.TOPIC_RESULT]["body"]["result_id"] == daemon.active
        assert not P.check_result("get_snapshot", snap)
        assert daemon.count() == 0  # answered by the server itself


def test_late_joiner_gets_current_result_within_1s():
    with serving() as (srv, daemon):
        rid = daemon.add_result()
        for _ in range(5):
            daemon.publish_heartbeat()
        t0 = time.monotonic()
        with Client(srv.cmd_endpoint, srv.pub_endpoint) as c:
            sub = c.subscribe()
            got = {}
            while P.TOPIC_RESULT not in got and time.monotonic() - t0 < 1.0:
                msg = sub.recv(max(0.01, 1.0 - (time.monotonic() - t0)))
                if msg:
                    got[msg[0]] = msg[1]
            elapsed = time.monotonic() - t0
        assert P.TOPIC_RESULT in got, "no result within 1 s"
        assert elapsed < 1.0
        body = got[P.TOPIC_RESULT]["body"]
        assert body["result_id"] == rid and body["active"] is True
        assert not P.check_body(P.TOPIC_RESULT, body)


def test_subscription_is_contiguous_and_filters_after_seq_check():
    with serving() as (srv, daemon), Client(srv.cmd_endpoint, srv.pub_endpoint) as c:
        daemon.add_result()
        sub = c.subscribe([P.TOPIC_HEARTBEAT])
        assert sub.recv(0.5) is None  # the snapshot has no heartbeat; the result is filtered
        assert sub.snapshots == 1
        for i in range(50):
            srv.publish(P.TOPIC_HEARTBEAT if i % 2 else P.TOPIC_STATION, {"i": i})
        got = [sub.recv(2.0) for _ in range(25)]
        assert all(g is not None and g[0] == P.TOPIC_HEARTBEAT for g in got)
        assert [g[1]["body"]["i"] for g in got] == list(range(1, 50, 2))
        assert sub.gaps == 0 and sub.last_seq == srv.seq


# --- gaps and restarts ---------------------------------------------------------------------------


def test_client_detects_seq_gap_and_resynchronises():
    # A tiny queue at both ends and a burst far beyond the socket buffers forces ZeroMQ to
    # drop messages for this subscriber; the client must see the gap and catch up.
    with short_tmpdir() as d:
        cfg = zmq_config(pub_endpoint=f"ipc://{d}/pub", cmd_endpoint=f"ipc://{d}/cmd", sndhwm=10)
        with serving(cfg) as (srv, daemon), Client(srv.cmd_endpoint, srv.pub_endpoint, sub_rcvhwm=10) as c:
            gaps = []
            daemon.publish_heartbeat()
            sub = c.subscribe(on_gap=lambda expected, got: gaps.append((expected, got)))
            assert sub.recv(2.0) is not None  # synced (the heartbeat came with the snapshot)
            last = srv.seq + 3001  # seq is assigned on the I/O thread: count ahead
            pad = "x" * 8192
            for i in range(3000):  # ~25 MB while nobody reads
                srv.publish(P.TOPIC_STATION, {"i": i, "pad": pad})
            daemon.add_result()
            # Generous deadlines: they end as soon as the condition holds, and a loaded
            # machine (the suite runs beside other work) may take seconds to move 25 MB.
            assert wait_until(lambda: srv.seq == last, 30.0)
            latest = {}
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:
                msg = sub.recv(0.3)
                if msg:
                    latest[msg[0]] = msg[1]
                elif sub.last_seq == last:
                    break
            assert sub.gaps >= 1 and gaps, "the client did not notice the dropped messages"
            assert all(got > expected for expected, got in gaps)
            assert sub.last_seq == last
            assert latest[P.TOPIC_RESULT]["body"]["result_id"] == daemon.active  # caught up through a snapshot
            assert latest[P.TOPIC_STATION]["body"]["i"] == 2999
            seqs = [e["seq"] for e in latest.values()]
            assert len(seqs) == len(set(seqs))


def test_messages_queued_while_the_caller_was_away_are_not_silence():
    # A caller busy for longer than silence_timeout_s comes back to messages waiting in the
    # socket: the link was alive, so they are delivered (no reconnect that would drop them);
    # real silence, nothing arriving while it listens, still reconnects.
    with short_tmpdir() as d:
        cfg = zmq_config(pub_endpoint=f"ipc://{d}/pub", cmd_endpoint=f"ipc://{d}/cmd")
        with serving(cfg) as (srv, daemon), Client(srv.cmd_endpoint, srv.pub_endpoint) as c:
            daemon.publish_heartbeat()
            sub = c.subscribe(silence_timeout_s=0.3)
            assert sub.recv(2.0) is not None
            last = srv.seq + 5
            for i in range(5):
                srv.publish(P.TOPIC_STATION, {"i": i})
            assert wait_until(lambda: srv.seq == last, 10.0)
            time.sleep(0.6)  # the caller is away for twice the silence timeout
            got = [sub.recv(2.0) for _ in range(5)]
            assert [m[1]["body"]["i"] for m in got if m] == [0, 1, 2, 3, 4]
            assert sub.reconnects == 0 and sub.gaps == 0 and sub.last_seq == last
            assert sub.recv(1.0) is None  # nothing comes while it listens: that is silence
            assert sub.reconnects >= 1


def test_client_sees_restart_as_new_boot_id_and_catches_up():
    with short_tmpdir() as d:
        cfg = zmq_config(pub_endpoint=f"ipc://{d}/pub", cmd_endpoint=f"ipc://{d}/cmd")
        restarts = []
        with Client(cfg.cmd_endpoint, cfg.pub_endpoint, timeout_s=0.5) as c:
            with serving(cfg) as (srv1, daemon1):
                daemon1.add_result()
                sub = c.subscribe(on_restart=lambda old, new: restarts.append((old, new)))
                first = sub.recv(2.0)
                assert first and first[1]["boot_id"] == srv1.boot_id
            daemon2 = MemoryDaemon()
            with serving(cfg, daemon2) as (srv2, _):
                rid2 = daemon2.add_result(pose([1.0, 0.0, 0.0], [0, 0, 0.1]))
                got = {}
                deadline = time.monotonic() + 5.0
                while P.TOPIC_RESULT not in got and time.monotonic() < deadline:
                    daemon2.publish_heartbeat()  # as the daemon does, at a faster cadence
                    msg = sub.recv(0.1)
                    if msg:
                        got[msg[0]] = msg[1]
                assert got[P.TOPIC_RESULT]["body"]["result_id"] == rid2
                assert got[P.TOPIC_RESULT]["boot_id"] == srv2.boot_id
                assert sub.restarts == 1 and restarts == [(srv1.boot_id, srv2.boot_id)]
                assert sub.boot_id == srv2.boot_id


# --- back-pressure -------------------------------------------------------------------------------


def test_stalled_subscriber_never_blocks_publishing():
    with short_tmpdir() as d:
        cfg = zmq_config(pub_endpoint=f"ipc://{d}/pub", cmd_endpoint=f"ipc://{d}/cmd", sndhwm=100)
        with serving(cfg) as (srv, daemon), zctx() as ctx, Client(srv.cmd_endpoint) as c:
            stalled = _sub(ctx, srv.pub_endpoint, b"", rcvhwm=1)
            reader = _sub(ctx, srv.pub_endpoint, P.TOPIC_HEARTBEAT.encode())
            _join(srv, [stalled, reader])
            pad = "y" * 16384
            n = 4000  # 64 MB: far beyond what the kernel and both queues can hold for `stalled`
            target = srv.seq + n
            t0 = time.monotonic()
            for i in range(n):
                srv.publish(P.TOPIC_STATION, {"i": i, "pad": pad})
            publish_s = time.monotonic() - t0
            assert wait_until(lambda: srv.seq >= target, 10.0), "the I/O thread stalled"
            sent_s = time.monotonic() - t0
            # The daemon keeps its cadence: a heartbeat right after the burst arrives at once,
            # and commands are answered.
            t1 = time.monotonic()
            srv.publish(P.TOPIC_HEARTBEAT, {"after": True})
            assert reader.poll(1000), "heartbeat after the burst did not arrive"
            assert P.unpack(reader.recv_multipart()[1])["body"] == {"after": True}
            assert time.monotonic() - t1 < 0.5
            assert c.call("get_status")["state"] == "IDLE"
            # And the stalled subscriber really was stalled: ZeroMQ dropped most of its messages.
            received = 0
            while stalled.poll(200):
                stalled.recv_multipart()
                received += 1
            assert received < n // 2, f"stalled subscriber got {received} of {n}: it did not stall"
            assert publish_s < 5.0 and sent_s < 10.0


def test_fifty_subscribers_with_one_stalled_lose_no_heartbeat():
    # The heartbeat runs at 20 Hz here (the daemon's is 1 Hz) so 2.5 s give 50 beats; a bulk
    # stream on another topic fills the stalled subscriber's queue meanwhile.
    period_s, beats = 0.05, 50
    with short_tmpdir() as d:
        cfg = zmq_config(pub_endpoint=f"ipc://{d}/pub", cmd_endpoint=f"ipc://{d}/cmd", sndhwm=100)
        with serving(cfg) as (srv, daemon), zctx() as ctx:
            readers = [_sub(ctx, srv.pub_endpoint, P.TOPIC_HEARTBEAT.encode()) for _ in range(49)]
            stalled = _sub(ctx, srv.pub_endpoint, b"", rcvhwm=1)
            _join(srv, readers + [stalled])
            stop = threading.Event()

            def bulk():
                pad = "z" * 16384
                while not stop.is_set():
                    for _ in range(50):
                        srv.publish(P.TOPIC_STATION, {"pad": pad})
                    time.sleep(0.01)

            def beat():
                t_next = time.monotonic()
                for k in range(beats):
                    t_next += period_s
                    srv.publish(P.TOPIC_HEARTBEAT, {"k": k, "t_mono_ns": time.monotonic_ns()})
                    time.sleep(max(0.0, t_next - time.monotonic()))

            bulk_t = threading.Thread(target=bulk, daemon=True)
            beat_t = threading.Thread(target=beat, daemon=True)
            bulk_t.start()
            beat_t.start()
            poller = zmq.Poller()
            for s in readers:
                poller.register(s, zmq.POLLIN)
            arrivals: dict[zmq.Socket, list[int]] = {s: [] for s in readers}
            # Wait for the beats as long as they are being sent, and a while after (a loaded
            # machine delays both sides); 60 s at most.
            t_end = time.monotonic() + 60.0
            done_at: float | None = None
            while any(len(v) < beats for v in arrivals.values()) and time.monotonic() < t_end:
                if done_at is None and not beat_t.is_alive():
                    done_at = time.monotonic()
                if done_at is not None and time.monotonic() > done_at + 10.0:
                    break
                for s, _ in poller.poll(100):
                    while s.poll(0):
                        env = P.unpack(s.recv_multipart()[1])
                        now = time.monotonic_ns()
                        arrivals[s].append(now)
                        assert env["body"]["k"] == len(arrivals[s]) - 1  # in order, none skipped
            stop.set()
            beat_t.join(5)
            bulk_t.join(5)
            counts = [len(v) for v in arrivals.values()]
            assert counts == [beats] * 49, f"heartbeats lost: {sorted(set(counts))}"
            # Each reader got every beat, in order: the stalled subscriber's full queue held
            # nobody back. (How fast they arrive is bench/zmq_bench.py's, not a test's: timing
            # on a loaded machine says nothing about the daemon.)
            assert srv.stats()["published"] > beats + 500  # the bulk really flowed


def test_publish_is_thread_safe_and_seq_has_no_holes():
    with serving(zmq_config(sndhwm=100_000)) as (srv, _), zctx() as ctx:
        sub = _sub(ctx, srv.pub_endpoint, rcvhwm=100_000)
        _join(srv, [sub])
        base = srv.seq
        threads = [threading.Thread(target=lambda k=k: [srv.publish(P.TOPIC_STATION, {"t": k, "i": i})
                                                        for i in range(500)]) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        seqs, per_thread = [], {k: [] for k in range(8)}
        while len(seqs) < 4000 and sub.poll(2000):
            env = P.unpack(sub.recv_multipart()[1])
            seqs.append(env["seq"])
            per_thread[env["body"]["t"]].append(env["body"]["i"])
        assert seqs == list(range(base + 1, base + 4001))
        assert all(v == list(range(500)) for v in per_thread.values())  # each thread's order kept


def test_result_is_republished_retained():
    with serving(zmq_config(republish_s=0.2)) as (srv, daemon), Client(srv.cmd_endpoint, srv.pub_endpoint) as c:
        rid = daemon.add_result()
        sub = c.subscribe([P.TOPIC_RESULT])
        first = sub.recv(1.0)
        again = sub.recv(1.0)
        assert first and again
        assert again[1]["body"]["result_id"] == rid and again[1]["body"]["retained"] is True
        assert again[1]["seq"] > first[1]["seq"]
        srv.republish_retained(P.TOPIC_RESULT)
        assert sub.recv(1.0)[1]["body"]["retained"] is True


# --- commands ------------------------------------------------------------------------------------


def test_ten_thousand_malformed_requests_get_ten_thousand_errors():
    with serving(zmq_config(null_role="operator")) as (srv, daemon), zctx() as ctx:
        s = dealer(ctx, srv.cmd_endpoint, rcvhwm=0, sndhwm=0)
        kinds = [
            b"\xc1",                                        # never-used msgpack byte
            b"\x93\x01\x02\x03",                            # an array, not a map
            P.pack({"id": "a", "cmd": "no_such"}),          # unknown command
            P.pack({"id": "b", "cmd": "to_base", "args": {"point_m": "here"}}),  # wrong type
            P.pack({"id": 7, "cmd": "get_status", "args": [1]}),               # args not a map
            P.pack({"id": True, "cmd": "get_status"}),      # id of the wrong type
            b"\x81\x01\x02",                                # int map key
            b"\xdd\xff\xff\xff\xff",                        # array of 4 G elements, 5 bytes
            b"\x91" * 5000 + b"\xc0",                       # nesting too deep
            P.pack({"id": "c", "cmd": "start_run", "args": {"kind": "nope"}}),
        ]
        n, window, sent, codes = 10_000, 500, 0, []
        t0 = time.monotonic()
        while len(codes) < n:
            while sent < n and sent - len(codes) < window:  # pipelined, bounded in flight
                s.send(kinds[sent % len(kinds)])
                sent += 1
            if not s.poll(2000):
                pytest.fail(f"only {len(codes)} replies of {n}")
            while s.poll(0) and len(codes) < n:
                reply = P.unpack(s.recv())
                assert reply["ok"] is False and reply["error"]["message"]
                codes.append(reply["error"]["code"])
        elapsed = time.monotonic() - t0
        assert codes == [P.E_BAD_REQUEST] * n
        assert daemon.count() == 0
        assert srv.stats()["bad_requests"] == n
        # Still healthy: a valid request works on the same socket and on a new one.
        assert rpc(s, {"id": "ok", "cmd": "get_status"})["ok"] is True
        with Client(srv.cmd_endpoint) as c:
            assert c.call("start_run", kind="base_frame")["run_id"] == "run-1"
        assert elapsed < 20.0


@pytest.mark.parametrize("request_, needle", [
    ({"id": "1", "cmd": "to_base", "args": {"point_m": [1, 2]}}, "point_m"),
    ({"id": "1", "cmd": "to_base", "args": {"point_m": [1, 2, 3], "pose": {
        "translation_m": [0, 0, 0], "quaternion": {"w": 1, "x": 0, "y": 0, "z": 0}}}}, "exactly one"),
    ({"id": "1", "cmd": "to_base", "args": {"pose": {"matrix": [2] + [0] * 15}}}, "last row"),
    ({"id": "1", "cmd": "list_results", "args": {"limit": "5"}}, "integer"),
    ({"id": "1", "cmd": "get_result", "args": {"id": "r-1"}}, "unknown argument"),
    ({"id": "1", "cmd": "start_run", "args": {}}, "args.kind is required"),
    ({"id": "1", "cmd": "start_run", "args": {"kind": "base_frame", "plan": "a", "stations": [{"q_rad": [0]}]}}, "at most one"),
    ({"id": "1", "cmd": "get_status", "extra": 1}, "unknown request field"),
    ({"cmd": "get_status"}, "id:"),
])
def test_bad_requests_name_the_field(request_, needle):
    with serving(zmq_config(null_role="operator")) as (srv, daemon), zctx() as ctx:
        reply = rpc(dealer(ctx, srv.cmd_endpoint), request_)
        assert reply["ok"] is False and reply["error"]["code"] == P.E_BAD_REQUEST
        assert needle in reply["error"]["message"]
        assert reply["id"] == request_.get("id")
        assert daemon.count() == 0


def test_handler_exception_becomes_internal_error_and_server_survives(caplog):
    with serving() as (srv, daemon), Client(srv.cmd_endpoint) as c:
        daemon.fail_next = ZeroDivisionError("boom")
        with caplog.at_level("ERROR", logger="cellcal.daemon.zmq"):
            with pytest.raises(CommandFailed) as exc:
                c.call("get_status")
        assert exc.value.code == P.E_INTERNAL and "ZeroDivisionError" in exc.value.message
        assert any("boom" in (r.exc_text or "") or r.exc_info for r in caplog.records)
        assert c.call("get_status")["state"] == "IDLE"
        assert srv.stats()["internal_errors"] == 1


def test_handler_command_errors_pass_through():
    with serving() as (srv, daemon), Client(srv.cmd_endpoint) as c:
        with pytest.raises(CommandFailed) as exc:
            c.call("get_result")
        assert exc.value.code == P.E_NO_CALIBRATION
        with pytest.raises(CommandFailed) as exc:
            c.call("get_result", result_id="r-9999")
        assert exc.value.code == P.E_NOT_FOUND


def test_repeated_request_id_gets_stored_reply_and_runs_once():
    with serving(zmq_config(null_role="operator")) as (srv, daemon), zctx() as ctx:
        a = dealer(ctx, srv.cmd_endpoint, routing_id=b"client-a")
        req = {"id": "run-req-1", "cmd": "start_run", "args": {"kind": "base_frame"}}
        first = rpc(a, req)
        second = rpc(a, req)
        assert first == second and first["ok"] is True
        assert daemon.count("start_run") == 1
        assert srv.stats()["dedup_hits"] == 1
        # Another client using the same id is another request (and finds the run busy).
        b = dealer(ctx, srv.cmd_endpoint, routing_id=b"client-b")
        other = rpc(b, req)
        assert other["ok"] is False and other["error"]["code"] == P.E_BUSY
        assert daemon.count("start_run") == 2
        # Integer and string ids are different ids.
        assert rpc(a, {"id": 5, "cmd": "get_status"})["id"] == 5
        assert rpc(a, {"id": "5", "cmd": "get_status"})["id"] == "5"
        assert daemon.count("get_status") == 2


def test_lazy_pirate_retry_of_a_slow_command_runs_it_once():
    daemon = MemoryDaemon()
    daemon.delay_s = 0.6
    with serving(zmq_config(null_role="operator"), daemon) as (srv, _):
        with Client(srv.cmd_endpoint, timeout_s=0.2, retries=8) as c:
            result = c.call("start_run", kind="base_frame")
        assert result["run_id"] == "run-1"
        assert daemon.count("start_run") == 1
        assert srv.stats()["dedup_hits"] >= 1


def test_client_times_out_without_daemon():
    with zctx() as ctx:
        probe = ctx.socket(zmq.ROUTER)
        port = probe.bind_to_random_port("tcp://127.0.0.1")
        probe.close(linger=0)
    with Client(f"tcp://127.0.0.1:{port}", timeout_s=0.1, retries=2) as c:
        t0 = time.monotonic()
        with pytest.raises(ClientTimeout):
            c.call("get_status")
        assert isinstance(ClientTimeout("x"), TimeoutError)
        assert time.monotonic() - t0 < 2.0


def test_req_socket_clients_work_too():
    with serving() as (srv, _), zctx() as ctx:
        s = ctx.socket(zmq.REQ)
        s.linger = 0
        s.connect(srv.cmd_endpoint)
        s.send(P.pack({"id": 1, "cmd": "get_status"}))
        assert s.poll(2000)
        assert P.unpack(s.recv())["ok"] is True


def test_busy_when_too_many_commands_wait():
    daemon = MemoryDaemon()
    daemon.block = True
    with serving(zmq_config(null_role="operator"), daemon, max_queued_commands=2) as (srv, _), zctx() as ctx:
        s = dealer(ctx, srv.cmd_endpoint)
        for i in range(5):
            s.send(P.pack({"id": i, "cmd": "start_run", "args": {"kind": "base_frame"}}))
        busy = []
        for _ in range(3):
            assert s.poll(2000)
            busy.append(P.unpack(s.recv()))
        assert all(r["error"]["code"] == P.E_BUSY for r in busy) and {r["id"] for r in busy} == {2, 3, 4}
        daemon.gate.set()
        done = [rpc_reply for rpc_reply in (P.unpack(s.recv()) for _ in range(2) if s.poll(3000))]
        assert sorted(r["id"] for r in done) == [0, 1]


def test_without_handler_only_the_snapshot_answers():
    srv = ZmqServer(zmq_config(), None)
    with srv, Client(srv.cmd_endpoint) as c:
        srv.publish(P.TOPIC_STATE, {"state": "IDLE"})
        wait_until(lambda: srv.seq == 1)
        assert c.call("get_snapshot")["seq"] == 1
        with pytest.raises(CommandFailed) as exc:
            c.call("get_status")
        assert exc.value.code == P.E_UNAVAILABLE


def test_oversized_message_is_dropped_and_server_stays_healthy():
    with serving(zmq_config(max_msg_bytes=4096)) as (srv, daemon), zctx() as ctx:
        big = dealer(ctx, srv.cmd_endpoint)
        big.send(P.pack({"id": "big", "cmd": "get_status", "args": {"x": "a" * 10_000}}))
        assert not big.poll(300)
        with Client(srv.cmd_endpoint) as c:
            assert c.call("get_status")["state"] == "IDLE"
        assert daemon.count() == 1


def test_to_base_round_trip_with_the_active_calibration():
    with serving() as (srv, daemon), Client(srv.cmd_endpoint) as c:
        rid = daemon.add_result(CELL_T_BASE)
        base_T_cell = se3_inverse(CELL_T_BASE)
        p_cell = np.array([1.2, 0.3, -0.4])
        out = c.call("to_base", point_m=p_cell.tolist())
        assert out["result_id"] == rid and out["frame"] == "base" and out["suspect"] is False
        np.testing.assert_allclose(out["point_m"], base_T_cell[:3, :3] @ p_cell + base_T_cell[:3, 3], atol=1e-12)
        cell_T_part = pose([1.0, 0.5, 0.2], [0.1, -0.2, 0.3])
        out = c.call("to_base", pose={"matrix": cell_T_part.reshape(16).tolist()}, child_frame="part")
        assert out["pose"]["parent_frame"] == "base" and out["pose"]["child_frame"] == "part"
        np.testing.assert_allclose(np.array(out["pose"]["matrix"]).reshape(4, 4), base_T_cell @ cell_T_part, atol=1e-12)
        q = out["pose"]["quaternion"]
        out2 = c.call("to_base", pose={"translation_m": cell_T_part[:3, 3].tolist(),
                                       "quaternion": P.unpack(P.pack(_wire_q(cell_T_part)))})
        np.testing.assert_allclose(out2["pose"]["matrix"], out["pose"]["matrix"], atol=1e-12)
        assert not P.check_result("to_base", out) and not P.check_result("to_base", out2)
        assert q["w"] >= 0


def _wire_q(T):
    from cellcal.solver.se3 import quat_from_matrix

    w, x, y, z = quat_from_matrix(T[:3, :3])
    return {"w": float(w), "x": float(x), "y": float(y), "z": float(z)}


def test_activate_result_rolls_back_and_publishes():
    cfg = zmq_config(null_role="operator")
    with serving(cfg) as (srv, daemon), Client(srv.cmd_endpoint, srv.pub_endpoint) as c:
        r1 = daemon.add_result()
        r2 = daemon.add_result(pose([2.5, -0.8, 0.1001], [0, 0, 0.5]))
        sub = c.subscribe([P.TOPIC_RESULT])
        assert sub.recv(1.0)[1]["body"]["result_id"] == r2
        out = c.call("activate_result", result_id=r1)
        assert out == {"active_result_id": r1, "previous_result_id": r2}
        # A message published within ~1 ms of the join may precede the subscription; the
        # next heartbeat then shows the gap and a snapshot repairs it. Beat as the daemon does.
        with heartbeating(daemon):
            msg = sub.recv(2.0)
        assert msg[1]["body"]["result_id"] == r1 and msg[1]["body"]["active"] is True
        listed = c.call("list_results")
        assert listed["active_result_id"] == r1 and [r["result_id"] for r in listed["results"]] == [r2, r1]
        assert not P.check_result("list_results", listed)
        assert not P.check_result("get_status", c.call("get_status"))
        assert not P.check_result("get_result", c.call("get_result"))


# --- security without CURVE ----------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:5999", "tcp://*:5999", "tcp://192.168.1.20:5999",
                                      "tcp://eth0:5999", "tcp://[::]:5999", "tcp://cell.example.com:5999"])
def test_refuses_network_endpoint_without_curve(endpoint):
    for field in ("pub_endpoint", "cmd_endpoint"):
        with pytest.raises(SecurityError) as exc:
            ZmqServer(zmq_config(**{field: endpoint}), MemoryDaemon())
        assert exc.value.path == f"zmq.{field}" and "curve" in str(exc.value)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5999", "tcp://127.0.0.2:1", "tcp://localhost:5999",
                                      "tcp://[::1]:5999", "ipc:///run/cellcal/cmd.sock", "inproc://x"])
def test_local_endpoints_are_local(endpoint):
    assert is_local_endpoint(endpoint)


def test_null_clients_are_observers_by_default():
    with serving() as (srv, daemon), Client(srv.cmd_endpoint) as c:
        assert c.call("get_status")["state"] == "IDLE"
        for cmd, args in (("start_run", {"kind": "base_frame"}), ("abort", {}), ("run_drift_check", {}),
                          ("activate_result", {"result_id": "r-0001"})):
            with pytest.raises(CommandFailed) as exc:
                c.call(cmd, **args)
            assert exc.value.code == P.E_FORBIDDEN and "operator" in exc.value.message
        assert [name for name, _, _ in daemon.calls] == ["get_status"]
        assert daemon.calls[0][2] == P.Caller("null", "observer", "anonymous")


def test_null_role_operator_allows_commands_on_loopback():
    with serving(zmq_config(null_role="operator")) as (srv, daemon), Client(srv.cmd_endpoint) as c:
        assert c.call("start_run", kind="tool_point")["kind"] == "tool_point"
        assert daemon.calls[0][2].role == "operator"


def test_bad_null_role_is_refused():
    with pytest.raises(SecurityError):
        ZmqServer(zmq_config(null_role="admin"), MemoryDaemon())


# --- lifecycle -----------------------------------------------------------------------------------


def test_stop_is_idempotent_and_releases_the_endpoints():
    with short_tmpdir() as d:
        cfg = zmq_config(pub_endpoint=f"ipc://{d}/sub/pub", cmd_endpoint=f"ipc://{d}/sub/cmd")
        srv = ZmqServer(cfg, MemoryDaemon())
        srv.stop()  # never started: fine
        srv = ZmqServer(cfg, MemoryDaemon())
        srv.start()
        with pytest.raises(RuntimeError):
            srv.start()
        srv.stop()
        srv.stop()
        srv.publish(P.TOPIC_HEARTBEAT, {})  # after stop: dropped, no error
        with serving(cfg) as (srv2, _), Client(srv2.cmd_endpoint) as c:
            assert c.call("get_status")
        assert threading.active_count() < 20


def test_bind_error_is_typed():
    with zctx() as ctx:
        holder = ctx.socket(zmq.PUB)
        port = holder.bind_to_random_port("tcp://127.0.0.1")
        with pytest.raises(BindError):
            ZmqServer(zmq_config(pub_endpoint=f"tcp://127.0.0.1:{port}"), MemoryDaemon()).start()


def test_publish_rejects_unknown_topic_and_unencodable_body():
    with serving(validate_bodies=True) as (srv, daemon):
        with pytest.raises(ValueError):
            srv.publish("cellcal/v1/nope", {})
        with pytest.raises(TypeError):
            srv.publish(P.TOPIC_FAULT, {"x": object()})
        with pytest.raises(ValueError, match="missing"):
            srv.publish(P.TOPIC_HEARTBEAT, {"state": "IDLE"})
        daemon.publish_heartbeat()  # a conforming body passes
        assert wait_until(lambda: srv.seq == 1)


def test_per_peer_state_stays_bounded_however_many_clients_come_and_go():
    """Short-lived clients, each with its own routing id (a `cellcal ctl` per command): the
    stored replies never exceed their bound, reads store nothing, nothing stays in flight; and a
    retried state-changing command still gets its stored reply. Counts, not memory."""
    with serving(zmq_config(null_role="operator"), dedup_entries=16) as (srv, daemon), zctx() as ctx:
        for i in range(120):
            s = dealer(ctx, srv.cmd_endpoint)
            assert rpc(s, {"id": i, "cmd": "get_status"})["ok"] is True
            assert rpc(s, {"id": f"r{i}", "cmd": "list_results"})["ok"] is True
            s.close(linger=0)
        assert srv.peer_state()["stored_replies"] == 0  # 240 reads from 120 peers: nothing kept
        for i in range(200):
            s = dealer(ctx, srv.cmd_endpoint, routing_id=f"peer-{i}".encode())
            assert rpc(s, {"id": f"a{i}", "cmd": "abort"})["ok"] is True
            s.close(linger=0)
            state = srv.peer_state()
            assert state["stored_replies"] <= 16 and state["inflight"] == 0 and state["queued"] == 0, state
        assert srv.peer_state()["stored_replies"] == 16
        assert srv.peer_state()["stored_reply_bytes"] <= 16 * 200  # each abort reply is small
        again = dealer(ctx, srv.cmd_endpoint, routing_id=b"peer-199")  # the newest survives: its retry is safe
        hits = srv.stats().get("dedup_hits", 0)
        assert rpc(again, {"id": "a199", "cmd": "abort"})["ok"] is True
        assert srv.stats()["dedup_hits"] == hits + 1 and daemon.count("abort") == 200
        assert all(v <= 1000 for v in srv.peer_state().values())
