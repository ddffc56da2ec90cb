"""The emScon TPI codec: byte layouts, round trips, incremental decoding, resynchronisation."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.drivers import emscon_codec as tpi
from cellcal.drivers.emscon_codec import Command, Decoder, PacketFault, Status, TpiProtocolError, encode

COMMANDS = [
    tpi.SimpleCommand(Command.INITIALIZE),
    tpi.SimpleCommand(Command.START_MEASUREMENT),
    tpi.SimpleCommand(Command.GET_SYSTEM_STATUS),
    tpi.SetUnits(0, 0, 0, 0, 0),
    tpi.SetUnits(1, 1, 1, 6, 0),
    tpi.SetCoordinateSystemType(0),
    tpi.SetMeasurementMode(0),
    tpi.SetStationaryModeParams(500, 1),
    tpi.SetStatisticMode(1, 0),
]
ANSWERS = [
    tpi.Reply(Command.INITIALIZE, Status.ALL_OK),
    tpi.Reply(Command.START_MEASUREMENT, Status.MEASUREMENT_STATUS_NOT_READY),
    tpi.Reply(Command.GET_SYSTEM_STATUS, Status.SERVER_BUSY),  # a failed typed answer, sent short
    tpi.SystemStatusReply(0, 0, 5, 3, 2, 3, 8, 900, 1, 0, 390793),
    tpi.TrackerStatusReply(0, 2),
    tpi.UnitsReply(0, 1, 1, 0, 0, 0),
    tpi.CoordinateSystemTypeReply(0, 0),
    tpi.MeasurementModeReply(0, 0),
    tpi.StationaryModeParamsReply(0, 1000, 0),
    tpi.StatisticModeReply(0, 1, 0),
    tpi.MeasurementStatusInfoReply(0, 0, 2048 | 65536),
    tpi.ErrorPacket(Command.START_MEASUREMENT, Status.NO_STATIONARY_RESULT),
    tpi.SingleMeasResult(0, 0, 0, 1.5, -2.25, 0.125, 1e-6, 2e-6, 3e-6, 4e-6, 0.0, 0.0, 0.0,
                         1e-5, 1e-5, 1e-5, 2e-5, 20.0, 1013.25, 50.0),
    tpi.SingleMeasResult2(0, 0, 0, 1.5, -2.25, 0.125, 1e-6, 2e-6, 3e-6, 4e-6, 1e-13, 0.0, -1e-13,
                          0.0, 0.0, 0.0, 1e-5, 1e-5, 1e-5, 2e-5, 0.0, 0.0, 0.0, 20.0, 1013.25, 50.0),
    tpi.SystemStatusChange(tpi.StatusChange.MEAS_STATUS_NOT_READY),
]


def test_byte_layouts_by_hand():
    # header: int32 size (whole packet), uint32 type; then the command id, little-endian
    assert encode(tpi.SimpleCommand(Command.INITIALIZE)) == bytes.fromhex("0c000000" "00000000" "07000000")
    assert encode(tpi.SetStationaryModeParams(250, 1)) == bytes.fromhex(
        "14000000" "00000000" "1c000000" "fa000000" "01000000")
    assert encode(tpi.Reply(Command.START_MEASUREMENT, Status.ALL_OK)) == bytes.fromhex(
        "10000000" "00000000" "31000000" "00000000")
    assert encode(tpi.ErrorPacket(49, 10009)) == bytes.fromhex("10000000" "01000000" "31000000" "19270000")
    assert encode(tpi.SystemStatusChange(25)) == bytes.fromhex("0c000000" "08000000" "19000000")
    res = encode(ANSWERS[12])
    assert len(res) == 156 and struct.unpack_from("<iIIIi3d", res) == (156, 2, 0, 0, 0, 1.5, -2.25, 0.125)
    assert len(encode(ANSWERS[13])) == 204
    sizes = {type(p).__name__: len(encode(p)) for p in COMMANDS + ANSWERS}
    assert sizes["SetUnits"] == 32 and sizes["SystemStatusReply"] == 56 and sizes["UnitsReply"] == 36
    assert sizes["StationaryModeParamsReply"] == 24 and sizes["MeasurementStatusInfoReply"] == 24


@pytest.mark.parametrize("packet", COMMANDS, ids=lambda p: type(p).__name__)
def test_commands_round_trip(packet):
    assert Decoder("commands").decode(encode(packet)) == [packet]


@pytest.mark.parametrize("packet", ANSWERS, ids=lambda p: type(p).__name__)
def test_answers_round_trip(packet):
    assert Decoder("answers").decode(encode(packet)) == [packet]


def test_encode_refuses_what_the_wire_cannot_carry():
    with pytest.raises(ValueError):
        encode(tpi.SetUnits(-1, 0, 0, 0, 0))
    with pytest.raises(ValueError):
        encode(tpi.SimpleCommand(Command.SET_UNITS))  # takes parameters


def test_each_side_reports_what_it_does_not_decode():
    # a device gets an unimplemented command: one error naming its id, so it can refuse it
    go_position = struct.pack("<iIIi3d", 40, 0, 55, 0, 1.0, 2.0, 3.0)  # GoPosition(bUseADM, x, y, z)
    (err,) = Decoder("commands").decode(go_position)
    assert isinstance(err, TpiProtocolError) and err.fault is PacketFault.UNSUPPORTED and err.command == 55
    # a host gets a packet type it does not decode (reflector position): skipped by its size
    refl = struct.pack("<iI", 40, 7) + bytes(32)
    items = Decoder("answers").decode(refl + encode(ANSWERS[0]))
    assert isinstance(items[0], TpiProtocolError) and items[0].fault is PacketFault.UNSUPPORTED
    assert items[1] == ANSWERS[0]
    # a typed answer that says OK but carries no values is wrong
    (err,) = Decoder("answers").decode(encode(tpi.Reply(Command.GET_SYSTEM_STATUS, 0)))
    assert err.fault is PacketFault.BAD_SIZE
    # a result of the wrong size is consumed by its size, and decoding goes on
    bad = struct.pack("<iI", 20, 2) + bytes(12)
    items = Decoder("answers").decode(bad + encode(ANSWERS[-1]))
    assert items[0].fault is PacketFault.BAD_SIZE and items[1] == ANSWERS[-1]


def _stream(packets):
    return b"".join(encode(p) for p in packets)


@given(st.lists(st.sampled_from(ANSWERS), max_size=12), st.data())
def test_any_split_gives_the_same_records(packets, data):
    stream = _stream(packets)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    d = Decoder("answers")
    out = []
    prev = 0
    for c in cuts + [len(stream)]:
        out += d.decode(stream[prev:c])
        prev = c
    assert out == packets and d.buffered == 0


def _framed_in(record, stream: bytes) -> bool:
    return encode(record) in stream


@given(st.binary(max_size=2000), st.sampled_from(["answers", "commands"]))
def test_random_bytes_never_crash_and_never_yield_a_record_from_garbage(data, side):
    d = Decoder(side)
    items = d.decode(data) + d.flush()
    for item in items:
        if not isinstance(item, TpiProtocolError):
            # a record only ever comes from a whole, well-framed packet in the stream
            assert _framed_in(item, data)


@given(st.lists(st.sampled_from(ANSWERS), min_size=1, max_size=10), st.data())
def test_mutated_streams_never_crash_and_yield_only_framed_packets(packets, data):
    stream = bytearray(_stream(packets))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(stream) - 1))
        stream[i] = data.draw(st.integers(0, 255))
    stream = bytes(stream)
    d = Decoder("answers")
    for item in d.decode(stream) + d.flush():
        if not isinstance(item, TpiProtocolError):
            assert _framed_in(item, stream)


# odd bytes can never begin a plausible header (sizes are multiples of 4, and a window that
# mixes them with a packet's first bytes is too large or negative): the decoder must find
# every packet after such a run
_ODD = st.binary(min_size=1, max_size=40).map(lambda b: bytes(x | 1 for x in b))


@given(st.lists(st.tuples(_ODD, st.sampled_from(ANSWERS)), min_size=1, max_size=8))
def test_resynchronises_after_runs_of_garbage(chunks):
    stream = b"".join(g + encode(p) for g, p in chunks)
    out = Decoder("answers").decode(stream)
    records = [x for x in out if not isinstance(x, TpiProtocolError)]
    errors = [x for x in out if isinstance(x, TpiProtocolError)]
    assert records == [p for _, p in chunks]
    assert len(errors) == len(chunks) and all(e.fault is PacketFault.GARBAGE for e in errors)
    assert sum(int(e.args[0].split(": ")[1].split(" ")[0]) for e in errors) == sum(len(g) for g, _ in chunks)


def test_memory_is_bounded_by_the_largest_packet():
    d = Decoder("answers")
    d.feed(struct.pack("<iI", tpi.MAX_PACKET_BYTES, 0) + b"\0" * 100)
    assert d.buffered == 108  # a plausible packet waits for its bytes, no more
    d.feed(b"\0" * (tpi.MAX_PACKET_BYTES - 108))
    assert d.buffered == 0 and len(d.decode()) == 1
    d.feed(b"\xff" * 100_000)  # never plausible: skipped, counted, not stored
    assert d.buffered < 8
    (err,) = d.flush()
    assert err.fault is PacketFault.GARBAGE and len(err.raw) <= 64


def test_status_names_and_ok():
    assert tpi.status_name(10009) == "NO_STATIONARY_RESULT" and tpi.status_name(4242) == "STATUS_4242"
    assert tpi.is_ok(0) and tpi.is_ok(11) and not tpi.is_ok(12) and not tpi.is_ok(39)


def _result(x=1.0, y=2.0, z=0.5, std=(1e-6, 1e-6, 1e-6), total=2e-6):
    return tpi.SingleMeasResult(0, 0, 0, x, y, z, *std, total, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 20.0, 1013.25, 50.0)


def test_result_plausibility_by_hand():
    assert tpi.result_problem(_result()) is None
    assert tpi.result_problem(_result(x=299.0, y=0.0, z=0.0)) is None
    assert tpi.result_problem(_result(x=1e6))[0] == "position"  # the 1e9 mm of an earlier attack
    assert tpi.result_problem(_result(x=0.0, y=0.0, z=0.0))[0] == "position"
    assert tpi.result_problem(_result(x=float("nan")))[0] == "position"
    assert tpi.result_problem(_result(std=(1e-6, 2.0, 1e-6)))[0] == "std_y"
    assert tpi.result_problem(_result(total=float("inf")))[0] == "std_total"


@given(st.tuples(*[st.floats(-400.0, 400.0)] * 3), st.tuples(*[st.floats(-2.0, 2.0)] * 4))
def test_result_plausibility_is_exactly_the_documented_ranges(p, s):
    rec = _result(*p, std=s[:3], total=s[3])
    r = sum(c * c for c in p) ** 0.5
    ok = tpi.MIN_RANGE_M <= r <= tpi.MAX_RANGE_M and all(0.0 <= x <= tpi.MAX_STD_M for x in s)
    assert (tpi.result_problem(rec) is None) == ok
