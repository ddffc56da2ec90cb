"""RTDE codec: round trips of every message, framing, and fuzzing of the client's stream decoder."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellcal.drivers import rtde_codec as rc
from cellcal.drivers.errors import ProtocolError
from cellcal.drivers.ur_rtde import RECIPE, RECIPE_TYPES, RtdeStream

P = rc.PacketType


def one_packet(data: bytes) -> tuple[int, bytes]:
    r = rc.PacketReader()
    r.feed(data)
    pkts = list(r.packets())
    assert len(pkts) == 1 and r.pending == 0
    return pkts[0]


def test_packet_header_is_size_then_type_big_endian():
    pkt = rc.encode_protocol_version_request(2)
    # size 5 (3 header + uint16), type 'V' = 86, payload 0x0002
    assert pkt == b"\x00\x05\x56\x00\x02"
    assert one_packet(pkt) == (86, b"\x00\x02")
    assert rc.decode_protocol_version_request(b"\x00\x02") == 2


def test_packet_types_are_the_ascii_letters():
    assert [int(t) for t in P] == [86, 118, 77, 85, 79, 73, 83, 80]


def test_accepted_and_controller_version_round_trip():
    t, p = one_packet(rc.encode_accepted(P.CONTROL_PACKAGE_START, True))
    assert t == P.CONTROL_PACKAGE_START and rc.decode_accepted(p) is True
    t, p = one_packet(rc.encode_accepted(P.REQUEST_PROTOCOL_VERSION, False))
    assert rc.decode_accepted(p) is False
    v = rc.ControllerVersion(5, 23, 1, 1234)
    t, p = one_packet(rc.encode_controller_version(v))
    assert p == struct.pack(">IIII", 5, 23, 1, 1234)
    assert rc.decode_controller_version(p) == v and str(v) == "5.23.1.1234"


@pytest.mark.parametrize("protocol", [1, 2])
def test_setup_outputs_request_round_trip(protocol):
    t, p = one_packet(rc.encode_setup_outputs_request(RECIPE, 500.0, protocol))
    freq, names = rc.decode_setup_outputs_request(p, protocol)
    assert names == list(RECIPE)
    assert freq == (500.0 if protocol == 2 else 0.0)
    if protocol == 2:
        assert p[:8] == struct.pack(">d", 500.0)


def test_trailing_comma_in_names_is_tolerated():
    # ur-rtde sends "timestamp,actual_q,actual_TCP_pose," (trailing comma)
    payload = struct.pack(">d", 125.0) + b"timestamp,actual_q,actual_TCP_pose,"
    assert rc.decode_setup_outputs_request(payload)[1] == ["timestamp", "actual_q", "actual_TCP_pose"]


@pytest.mark.parametrize("protocol", [1, 2])
def test_setup_reply_round_trip(protocol):
    types = [t.name for t in RECIPE_TYPES]
    t, p = one_packet(rc.encode_setup_reply(P.CONTROL_PACKAGE_SETUP_OUTPUTS, 7, types, protocol))
    rid, got = rc.decode_setup_reply(p, P.CONTROL_PACKAGE_SETUP_OUTPUTS, protocol)
    assert got == types
    assert rid == (7 if protocol == 2 else 0)
    assert got[:2] == ["DOUBLE", "VECTOR6D"] and got[-3:] == ["INT32", "INT32", "UINT32"]


@pytest.mark.parametrize("protocol", [1, 2])
def test_text_message_round_trip(protocol):
    msg = rc.TextMessage("hello robot", "URControl" if protocol == 2 else "", rc.TextLevel.WARNING)
    t, p = one_packet(rc.encode_text_message(msg, protocol))
    assert t == P.TEXT_MESSAGE
    assert rc.decode_text_message(p, protocol) == msg


def test_text_message_truncated_is_a_protocol_error():
    p = one_packet(rc.encode_text_message(rc.TextMessage("abc", "src")))[1]
    with pytest.raises(ProtocolError):
        rc.decode_text_message(p[:-1])


def sample_values(i: int = 0) -> dict:
    return {
        "timestamp": 1000.0 + i * 0.002,
        "actual_q": tuple(0.1 * k + i for k in range(6)),
        "actual_qd": (0.0, 0.5, -0.5, 0.0, 1e-3, -1e-3),
        "actual_TCP_pose": (0.4, -0.1, 0.5, 0.0, 3.1, 0.0),
        "robot_mode": 7,
        "safety_mode": 1,
        "runtime_state": 2,
    }


@pytest.mark.parametrize("protocol", [1, 2])
def test_data_package_round_trip(protocol):
    recipe = rc.Recipe(RECIPE, RECIPE_TYPES, 3, protocol)
    pkt = recipe.encode(sample_values())
    t, p = one_packet(pkt)
    assert t == P.DATA_PACKAGE
    # 1 recipe id byte (v2) + 8 + 3*48 + 4 + 4 + 4
    assert len(p) == (1 if protocol == 2 else 0) + 8 + 3 * 48 + 12 == recipe.payload_size
    assert recipe.decode(p) == sample_values()


def test_data_package_wrong_size_or_recipe_is_rejected():
    recipe = rc.Recipe(RECIPE, RECIPE_TYPES, 3)
    p = one_packet(recipe.encode(sample_values()))[1]
    with pytest.raises(ProtocolError, match="bytes"):
        recipe.decode(p[:-1])
    with pytest.raises(ProtocolError, match="recipe 4"):
        recipe.decode(b"\x04" + p[1:])


def test_unknown_type_name_in_recipe_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="actual_q"):
        rc.Recipe(["actual_q"], ["VECTOR7D"])


def test_every_output_field_encodes():
    names = list(rc.OUTPUT_FIELDS)
    recipe = rc.Recipe(names, [rc.OUTPUT_FIELDS[n] for n in names], 1)
    decoded = recipe.decode(one_packet(recipe.encode({}))[1])
    assert set(decoded) == set(names)
    assert decoded["joint_mode"] == (0,) * 6 and decoded["payload"] == 0.0


def test_reader_reassembles_split_packets_and_rejects_bad_header():
    recipe = rc.Recipe(RECIPE, RECIPE_TYPES, 1)
    stream = recipe.encode(sample_values(0)) + recipe.encode(sample_values(1))
    r = rc.PacketReader()
    got = []
    for i in range(len(stream)):  # one byte at a time
        r.feed(stream[i : i + 1])
        got += list(r.packets())
    assert [recipe.decode(p)["timestamp"] for _, p in got] == [1000.0, 1000.002]
    r.feed(b"\x00\x02U")  # size 2 < header size: cannot frame past it
    with pytest.raises(ProtocolError, match="stream lost"):
        list(r.packets())
    assert r.pending == 0


def test_oversized_announcement_is_lost_framing_not_a_wait():
    # A header announcing 65535 bytes is no data package of this recipe: the stream does not
    # wait for 64 kB of "payload" (seconds of good data it would swallow), it hunts.
    dec = RtdeStream(RECIPE_V2, rc.PROTOCOL_V2)
    assert dec.feed(b"\xff\xffU" + b"\x00" * 100) == []
    assert dec.bad_packets == 1 and dec._reader.pending < 4
    good = RECIPE_V2.encode(sample_values(3))
    assert [s["timestamp"] for s in dec.feed(good)] == [sample_values(3)["timestamp"]]
    assert dec.resyncs == 1 and dec.garbage_bytes == 103


def test_encode_packet_refuses_oversized_payload():
    with pytest.raises(ValueError, match="uint16"):
        rc.encode_packet(P.TEXT_MESSAGE, b"x" * 65533)


# -- the client's stream decoder under fuzzing ------------------------------------------------
RECIPE_V2 = rc.Recipe(RECIPE, RECIPE_TYPES, 1, rc.PROTOCOL_V2)

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
good_values = st.builds(
    lambda ts, q, qd, pose, rm, sm, rs: {
        "timestamp": ts,
        "actual_q": tuple(q),
        "actual_qd": tuple(qd),
        "actual_TCP_pose": tuple(pose),
        "robot_mode": rm,
        "safety_mode": sm,
        "runtime_state": rs,
    },
    finite,
    st.lists(finite, min_size=6, max_size=6),
    st.lists(finite, min_size=6, max_size=6),
    st.lists(finite, min_size=6, max_size=6),
    # codes a controller sends (after garbage the stream resynchronises only on these)
    st.integers(-1, 8),
    st.integers(1, 13),
    st.integers(0, 5),
)


def garbage_packet():
    """Packets that must never become a state: any type but U, U with the wrong size or
    recipe id, a U whose doubles are NaN/inf, text messages (valid or not)."""
    other_type = st.tuples(
        st.integers(0, 255).filter(lambda t: t != P.DATA_PACKAGE), st.binary(max_size=300)
    ).map(lambda tp: rc.encode_packet(tp[0], tp[1]))
    wrong_size = st.binary(max_size=400).filter(lambda b: len(b) != RECIPE_V2.payload_size).map(
        lambda b: rc.encode_packet(P.DATA_PACKAGE, b)
    )
    wrong_id = st.binary(min_size=RECIPE_V2.payload_size - 1, max_size=RECIPE_V2.payload_size - 1).flatmap(
        lambda b: st.integers(0, 255).filter(lambda i: i != 1).map(lambda i: rc.encode_packet(P.DATA_PACKAGE, bytes([i]) + b))
    )
    non_finite = st.sampled_from([math.nan, math.inf, -math.inf]).map(
        lambda x: RECIPE_V2.encode({**sample_values(), "actual_q": (0, 0, x, 0, 0, 0)})
    )
    text = st.text(max_size=40).map(lambda s: rc.encode_text_message(rc.TextMessage(s, "fuzz")))
    return st.one_of(other_type, wrong_size, wrong_id, non_finite, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(st.one_of(good_values.map(lambda v: ("good", v)), garbage_packet().map(lambda g: ("bad", g))), max_size=25),
    chunking=st.lists(st.integers(1, 600), min_size=1, max_size=30),
)
def test_fuzz_bad_packets_never_become_states(items, chunking):
    stream = b""
    expected = []
    for kind, v in items:
        if kind == "good":
            stream += RECIPE_V2.encode(v)
            expected.append(v)
        else:
            stream += v
    dec = RtdeStream(RECIPE_V2, rc.PROTOCOL_V2)
    got = []
    pos, i = 0, 0
    while pos < len(stream):
        n = chunking[i % len(chunking)]
        got += dec.feed(stream[pos : pos + n])
        pos += n
        i += 1
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000))
def test_fuzz_random_bytes_never_crash(data):
    # Random bytes frame into packets (each skipped or rejected) or lose the framing, which
    # the stream recovers from by itself: feed never raises.
    dec = RtdeStream(RECIPE_V2, rc.PROTOCOL_V2)
    states = dec.feed(data)
    for s in states:  # a random U packet of exactly the right size and id is a valid package
        assert set(s) == set(RECIPE)
        assert all(np.all(np.isfinite(np.asarray(s[k], dtype=float))) for k in RECIPE)
    assert dec._reader.pending <= max(rc.MAX_SKIP_BYTES, RECIPE_V2.payload_size + 3)


# -- resynchronisation after garbage -----------------------------------------------------------
GOOD_SIZE = RECIPE_V2.payload_size + 3


def _good_run(first: int, n: int) -> tuple[bytes, list[float]]:
    values = [sample_values(first + i) for i in range(n)]
    return b"".join(RECIPE_V2.encode(v) for v in values), [v["timestamp"] for v in values]


def _feed_in_chunks(dec: RtdeStream, stream: bytes, chunking: list[int]) -> list[float]:
    got: list[float] = []
    pos, i = 0, 0
    while pos < len(stream):
        n = chunking[i % len(chunking)]
        got += [s["timestamp"] for s in dec.feed(stream[pos : pos + n])]
        pos += n
        i += 1
    return got


@pytest.mark.parametrize("protocol", [rc.PROTOCOL_V1, rc.PROTOCOL_V2])
def test_unframeable_garbage_costs_nothing_after_it(protocol):
    # Garbage that starts with a header no controller sends: the very next intact data
    # package is found, whatever the garbage holds and however the bytes are split.
    recipe = rc.Recipe(RECIPE, RECIPE_TYPES, 0 if protocol == 1 else 7, protocol)
    rng = np.random.default_rng(5)
    for trial in range(200):
        garbage = b"\x00\x01" + rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
        before = [sample_values(i) for i in range(3)]
        after = [sample_values(100 + i) for i in range(5)]
        stream = b"".join(recipe.encode(v) for v in before) + garbage + b"".join(recipe.encode(v) for v in after)
        dec = RtdeStream(recipe, protocol)
        chunks = [int(c) for c in rng.integers(1, 700, 20)]
        got = _feed_in_chunks(dec, stream, chunks)
        assert got == [v["timestamp"] for v in before + after], trial
        assert dec.resyncs == 1 and dec.garbage_bytes == len(garbage)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    garbage=st.lists(st.binary(min_size=1, max_size=1500), min_size=1, max_size=4),
    chunking=st.lists(st.integers(1, 900), min_size=1, max_size=20),
)
def test_fuzz_resync_after_any_garbage_within_max_skip(garbage, chunking):
    # Any garbage between runs of good packages: nothing but good packages comes out, and
    # of each good run at most the first MAX_SKIP_BYTES (a garbage header that looked like a
    # short packet) are lost. 40 packages of 168 bytes are well past that.
    stream, expected_runs = b"", []
    first = 0
    for g in garbage:
        run, stamps = _good_run(first, 40)
        first += 40
        stream += g + run
        expected_runs.append(stamps)
    dec = RtdeStream(RECIPE_V2, rc.PROTOCOL_V2)
    got = _feed_in_chunks(dec, stream, chunking)
    every_good = {t for run in expected_runs for t in run}
    assert set(got) <= every_good and got == sorted(got)
    lost_at_most = -(-rc.MAX_SKIP_BYTES // GOOD_SIZE) + 1
    for run in expected_runs:
        assert set(run[lost_at_most:]) <= set(got)


def test_stream_reader_keeps_sync_through_short_other_packets_and_bounds_memory():
    r = rc.StreamReader(GOOD_SIZE, 1)
    good = RECIPE_V2.encode(sample_values(1))
    r.feed(rc.encode_packet(ord("X"), b"\x00" * 40) + good + rc.encode_text_message(rc.TextMessage("hi", "x")))
    assert [t for t, _ in r.packets()] == [ord("X"), P.DATA_PACKAGE, P.TEXT_MESSAGE]
    assert r.in_sync and r.bad_headers == 0 and r.resyncs == 0
    r.feed(b"\x7f" * 1_000_000)  # a megabyte without the data header: at most 3 bytes kept
    assert list(r.packets()) == [] and not r.in_sync and r.pending <= 3
    r.feed(good)
    assert [t for t, _ in r.packets()] == [P.DATA_PACKAGE] and r.in_sync and r.resyncs == 1
    with pytest.raises(ValueError):
        rc.StreamReader(2)


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=300), protocol=st.sampled_from([1, 2]))
def test_fuzz_message_decoders_raise_only_protocol_errors(payload, protocol):
    for fn in (
        lambda: rc.decode_text_message(payload, protocol),
        lambda: rc.decode_setup_reply(payload, P.CONTROL_PACKAGE_SETUP_OUTPUTS, protocol),
        lambda: rc.decode_setup_outputs_request(payload, protocol),
        lambda: rc.decode_controller_version(payload),
        lambda: rc.decode_accepted(payload),
        lambda: RECIPE_V2.decode(payload),
    ):
        try:
            fn()
        except ProtocolError:
            pass
