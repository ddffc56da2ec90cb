"""What an SLCAN adapter sends, decoded strictly (``cellcal.drivers.slcan_codec``): frames by
hand and round trip, and garbage fuzzed: no input raises, and no damaged line ever becomes a
frame."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cellcal.drivers.slcan_codec import (
    BEL,
    MAX_LINE,
    AdapterLineSplitter,
    SlcanFrame,
    decode_adapter_line,
    encode_frame,
)

FRAME_HEADS = (b"t", b"T", b"r", b"R")


def _decode(data: bytes) -> list:
    return [decode_adapter_line(line) for line in AdapterLineSplitter().feed(data)]


def test_adapter_lines_by_hand():
    got = _decode(b"t18160102030405AA\rz\r\x07\r" + b"t1816010203040506EA5F\rV0101\rF00\rNCC01\rR01ABCDEF3\r")
    assert [g.kind for g in got] == ["frame", "ack", "error", "ok", "frame", "reply", "reply", "reply", "frame"]
    assert got[0].frame == SlcanFrame(0x181, bytes.fromhex("0102030405AA"))
    assert got[4].frame == SlcanFrame(0x181, bytes.fromhex("010203040506"))  # a receive timestamp: dropped
    assert got[8].frame == SlcanFrame(0x1ABCDEF, b"", extended=True, remote=True, dlc=3)
    # each way a serial line damages a frame line, and lines no adapter sends
    for line, kind in ((b"t1G30", "garbled"), (b"t18\xff\xfe01", "garbled"), (b"t1819AA", "garbled"),
                       (b"t18140011", "garbled"), (b"t70", "garbled"), (b"t1811AAFFFFF", "garbled"),
                       (b"t18110AF0000", "garbled"), (b"V01", "garbled"), (b"Q?", "unknown"),
                       (b"d1810", "unknown"), (b"ab\x07", "garbled")):
        got = decode_adapter_line(line)
        assert got.kind == kind and got.frame is None and got.reason, line
    assert decode_adapter_line(None).kind == "garbled"  # an overlong line


def test_overlong_lines_are_dropped_to_their_end_and_bel_ends_a_line():
    s = AdapterLineSplitter()
    assert s.feed(b"t" + b"0" * 200) == [] and s.pending == 0
    assert s.feed(b"\rz\r") == [None, b"z"]
    assert s.feed(b"\x07x\x07") == [BEL, b"x" + BEL]


@given(st.integers(0, 0x7FF), st.binary(max_size=8), st.booleans(), st.booleans(),
       st.none() | st.integers(0, 59_999))
def test_frames_round_trip_with_and_without_timestamp(can_id, data, extended, remote, stamp):
    f = SlcanFrame(can_id, b"" if remote else data, extended, remote, len(data))
    got = _decode(encode_frame(f, stamp))
    assert len(got) == 1 and got[0].kind == "frame" and got[0].frame == f


@given(st.binary(max_size=400), st.integers(1, 50))
def test_garbage_never_raises_never_grows_and_any_split_decodes_the_same(data, step):
    whole = _decode(data)
    s = AdapterLineSplitter()
    parts = [decode_adapter_line(x) for i in range(0, len(data), step) for x in s.feed(data[i : i + step])]
    assert parts == whole and s.pending <= MAX_LINE
    for g in whole:
        assert g.kind in ("frame", "ok", "error", "ack", "reply", "unknown", "garbled")


@given(st.lists(st.tuples(st.integers(0, 0x7FF), st.binary(max_size=8)), min_size=1, max_size=8),
       st.data())
def test_a_damaged_byte_costs_at_most_its_own_line_and_never_forges_a_frame_from_noise(frames, data):
    """Damage one byte of a stream of frame lines: every frame decoded is a grammatical line
    of the damaged stream (nothing else becomes a frame), and every line the damage did not
    reach still decodes to its frame (a damaged line end also takes the next line with it)."""
    lines = [encode_frame(SlcanFrame(i, d)) for i, d in frames]
    stream = bytearray(b"".join(lines))
    k = data.draw(st.integers(0, len(stream) - 1))
    stream[k] = data.draw(st.integers(0, 255))
    got = [g for g in _decode(bytes(stream)) if g.kind == "frame"]
    start = 0
    untouched = []
    reached = set()
    for n, line in enumerate(lines):
        if start <= k < start + len(line):
            reached |= {n, n + 1} if k == start + len(line) - 1 else {n}
        start += len(line)
    for n, (i, d) in enumerate(frames):
        if n not in reached:
            untouched.append(SlcanFrame(i, d))
    got_frames = [g.frame for g in got]
    for f in untouched:
        assert f in got_frames
    for f in got_frames:  # anything decoded re-encodes to a line that is really in the stream
        assert encode_frame(f)[:-1].upper() in bytes(stream).upper()
