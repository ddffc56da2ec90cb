"""The tracker codec: CRC, framing, canonical encoding, incremental decoding, resync."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cellcal.drivers import tracker_codec as codec
from cellcal.drivers.errors import ProtocolError
from cellcal.drivers.tracker_codec import (
    Decoder,
    FrameFault,
    MeasKind,
    MeasurementFlags,
    StatusFlags,
    TrackerProtocolError,
    crc16,
    encode,
)

# -- CRC -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, crc",
    [
        (b"123456789", 0x29B1),  # the CRC-16/CCITT-FALSE check value
        (b"", 0xFFFF),  # init value, nothing shifted in
        (b"A", 0xB915),
        (b"PING,1", 0xF692),
    ],
)
def test_crc16_vectors(data, crc):
    assert crc16(data) == crc


def test_crc16_matches_bitwise_reference():
    # An independent bit-by-bit CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF).
    def ref(data: bytes) -> int:
        crc = 0xFFFF
        for b in data:
            crc ^= b << 8
            for _ in range(8):
                crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
                crc &= 0xFFFF
        return crc

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 64, 255):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert crc16(data) == ref(data)


# -- records --------------------------------------------------------------------------------

SAMPLES = [
    codec.Hello(1, "1.0"),
    codec.Ping(2),
    codec.Meas(3, MeasKind.POSE, 500),
    codec.Meas(4, MeasKind.POINT, 0),
    codec.Stat(5),
    codec.Stop(6),
    codec.Ident(1, 12345678, "1.0", "AT-SIM", "SN 0001", "1.2.3", "MM_DEG"),
    codec.Pong(2, 1000250, 1000000),
    codec.PointReply(4, 99, 98, 1, 1234.5678, -0.0001, 0.0, 0.01, 0.01, 0.02, MeasurementFlags.NONE),
    codec.PoseReply(
        3, 99, 98, 500, 2804.0563, -538.3697, 450.0005, 0.0, 0.382683432, 0.923879533, 0.0,
        0.0005, 0.0005, 0.0007, 0.000089, 0.000089, 0.000089, MeasurementFlags.DROPPED_SAMPLES,
    ),
    codec.Status(5, 7, StatusFlags.WARMED_UP | StatusFlags.TARGET_LOCKED),
    codec.Ack(6, 8),
    codec.Nak(7, 9, "BEAM_BROKEN"),
]


@pytest.mark.parametrize("rec", SAMPLES, ids=lambda r: r.TYPE)
def test_roundtrip_each_type(rec):
    frame = encode(rec)
    assert frame.startswith(b"$" + rec.TYPE.encode() + b",")
    assert frame.endswith(b"\r\n") and len(frame) <= codec.MAX_FRAME_BYTES
    body = frame[1 : frame.index(b"*")]
    assert frame[-6:-2] == b"%04X" % crc16(body)
    (out,) = Decoder().decode(frame)
    assert out == rec
    assert encode(out) == frame  # canonical


def test_known_frames():
    assert encode(codec.Ping(1)) == b"$PING,1*F692\r\n"
    assert encode(codec.Meas(7, MeasKind.POINT, 250)) == b"$MEAS,7,POINT,250*DF44\r\n"


def test_longest_pose_fits_in_a_frame():
    big = codec.PoseReply(
        codec.SEQ_MAX, codec.MAX_TS_US, codec.MAX_TS_US, codec.MAX_SAMPLE_COUNT,
        -99999999.9999, -99999999.9999, -99999999.9999, -1.0, -1.0, -1.0, -1.0,
        99999999.9999, 99999999.9999, 99999999.9999, 999.999999, 999.999999, 999.999999,
        MeasurementFlags(0xFFFF),
    )
    frame = encode(big)
    assert len(frame) <= codec.MAX_FRAME_BYTES
    assert Decoder().decode(frame) == [big]


@pytest.mark.parametrize(
    "bad",
    [
        codec.Ping(-1),
        codec.Ping(codec.SEQ_MAX + 1),
        codec.Meas(1, MeasKind.POSE, codec.MAX_AVERAGE_MS + 1),
        codec.PointReply(1, 0, 0, 1, float("nan"), 0, 0, 0, 0, 0, 0),
        codec.PointReply(1, 0, 0, 1, 0, 0, 0, -0.1, 0, 0, 0),  # negative std
        codec.PointReply(1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),  # zero samples
        codec.Ident(1, 0, "1.0", "bad,model", "s", "f", "MM_DEG"),
        codec.Ident(1, 0, "1.0", "x" * 33, "s", "f", "MM_DEG"),
        codec.Nak(1, 0, "lower"),
    ],
)
def test_encode_rejects_values_that_do_not_fit(bad):
    with pytest.raises(ValueError):
        encode(bad)


def test_negative_zero_is_canonical():
    rec = codec.PointReply(1, 0, 0, 1, -0.00001, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    assert b",0.0000," in encode(rec) and b"-0.0000" not in encode(rec)


# -- error cases ------------------------------------------------------------------------------


def _frame(body: bytes) -> bytes:
    return b"$" + body + b"*%04X\r\n" % crc16(body)


@pytest.mark.parametrize(
    "raw, fault",
    [
        (b"$PING,1*3E5C\r\n", FrameFault.BAD_CRC),
        (b"$PING,1*3E5B\n", FrameFault.MALFORMED),  # no CR
        (b"$PING,1\r\n", FrameFault.MALFORMED),  # no CRC
        (b"$PING,1*3E5\r\n", FrameFault.MALFORMED),
        (b"$PI\xc3\x9fNG,1*3E5B\r\n", FrameFault.MALFORMED),  # non-ASCII
        (b"$PI\tNG,1*3E5B\r\n", FrameFault.MALFORMED),  # control byte
        (_frame(b"PONG,1"), FrameFault.BAD_FIELDS),  # too few fields
        (_frame(b"PING,1,2"), FrameFault.BAD_FIELDS),  # too many
        (_frame(b"PING,x"), FrameFault.BAD_FIELDS),
        (_frame(b"PING,01"), FrameFault.BAD_FIELDS),  # leading zero: not canonical
        (_frame(b"PING,+1"), FrameFault.BAD_FIELDS),
        (_frame(b"PING, 1"), FrameFault.BAD_FIELDS),
        (_frame(b"PING,65536"), FrameFault.BAD_FIELDS),
        (_frame(b"MEAS,1,POSE,1e3"), FrameFault.BAD_FIELDS),
        (_frame(b"MEAS,1,pose,100"), FrameFault.BAD_FIELDS),
        (_frame(b"PT,1,0,0,1,nan,0,0,0,0,0,0000"), FrameFault.BAD_FIELDS),
        (_frame(b"PT,1,0,0,1,1_0.0,0,0,0,0,0,0000"), FrameFault.BAD_FIELDS),
        (_frame(b"PT,1,0,0,1,0,0,0,-1,0,0,0000"), FrameFault.BAD_FIELDS),
        (_frame(b"PT,1,0,0,1,0,0,0,0,0,0,00g0"), FrameFault.BAD_FIELDS),
        (_frame(b"WHAT,1"), FrameFault.UNKNOWN_TYPE),
    ],
)
def test_bad_frames_give_typed_errors(raw, fault):
    d = Decoder()
    d.feed(raw)
    with pytest.raises(TrackerProtocolError) as info:
        d.read()
    assert info.value.fault is fault
    assert isinstance(info.value, ProtocolError)
    assert d.read() is None


def test_valid_crc_errors_carry_the_seq():
    d = Decoder()
    out = d.decode(_frame(b"WHAT,42") + _frame(b"MEAS,43,POSE"))
    assert [(e.fault, e.seq, e.msg_type) for e in out] == [
        (FrameFault.UNKNOWN_TYPE, 42, "WHAT"),
        (FrameFault.BAD_FIELDS, 43, "MEAS"),
    ]


def test_decoder_restricted_to_replies_rejects_requests():
    d = Decoder(accept=codec.REPLY_TYPES)
    (err,) = d.decode(encode(codec.Ping(1)))
    assert err.fault is FrameFault.UNKNOWN_TYPE


def test_errors_then_decoding_carries_on():
    ping = encode(codec.Ping(9))
    stream = b"junk" + b"$PING,1*0000\r\n" + b"$" + b"x" * 300 + ping + b"$PI" + ping
    d = Decoder()
    d.feed(stream)
    seen = []
    while True:
        try:
            rec = d.read()
        except TrackerProtocolError as exc:
            seen.append(exc.fault)
            continue
        if rec is None:
            break
        seen.append(rec)
    assert seen == [
        FrameFault.GARBAGE,
        FrameFault.BAD_CRC,
        FrameFault.OVERLONG,
        codec.Ping(9),
        FrameFault.UNTERMINATED,
        codec.Ping(9),
    ]


def test_overlong_boundary():
    # exactly MAX_FRAME_BYTES is legal, one more is not
    pad = codec.MAX_FRAME_BYTES - len(_frame(b"ID,1,0,1.0,,s,f,MM_DEG"))
    body_ok = b"ID,1,0,1.0,%s,s,f,MM_DEG" % (b"m" * pad)
    ok = _frame(body_ok)
    assert len(ok) == codec.MAX_FRAME_BYTES
    (err,) = Decoder().decode(ok)  # decodes as a frame, but the model text is too long
    assert err.fault is FrameFault.BAD_FIELDS
    (err,) = Decoder().decode(_frame(body_ok + b"m"))
    assert err.fault is FrameFault.OVERLONG


def test_garbage_is_counted_not_stored():
    d = Decoder()
    for _ in range(1000):
        d.feed(b"\x00" * 1000)  # a megabyte of line noise with no '$'
    assert d.pending == 0
    d.feed(encode(codec.Ping(1)))
    err, rec = d.decode()
    assert err.fault is FrameFault.GARBAGE and "1000000 byte" in str(err)
    assert len(err.raw) <= 64
    assert rec == codec.Ping(1)


# -- property tests -------------------------------------------------------------------------------

_seq = st.integers(0, codec.SEQ_MAX)
_ts = st.integers(0, codec.MAX_TS_US)
_mm = st.floats(-1e5, 1e5, allow_nan=False)
_std = st.floats(0, 100, allow_nan=False)
_q = st.floats(-1, 1, allow_nan=False)
_text = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="$*,"),
                min_size=1, max_size=32)

records = st.one_of(
    st.builds(codec.Hello, _seq, st.sampled_from(["1.0", "1.7", "2.0"])),
    st.builds(codec.Ping, _seq),
    st.builds(codec.Meas, _seq, st.sampled_from(MeasKind), st.integers(0, codec.MAX_AVERAGE_MS)),
    st.builds(codec.Stat, _seq),
    st.builds(codec.Stop, _seq),
    st.builds(codec.Ident, _seq, _ts, st.just("1.0"), _text, _text, _text, st.just("MM_DEG")),
    st.builds(codec.Pong, _seq, _ts, _ts),
    st.builds(codec.PointReply, _seq, _ts, _ts, st.integers(1, 10**6), _mm, _mm, _mm,
              _std, _std, _std, st.integers(0, 0xFFFF)),
    st.builds(codec.PoseReply, _seq, _ts, _ts, st.integers(1, 10**6), _mm, _mm, _mm,
              _q, _q, _q, _q, _std, _std, _std, _std, _std, _std, st.integers(0, 0xFFFF)),
    st.builds(codec.Status, _seq, _ts, st.integers(0, 0xFFFF)),
    st.builds(codec.Ack, _seq, _ts),
    st.builds(codec.Nak, _seq, _ts, st.sampled_from([c.value for c in codec.NakCode])),
)


def _key(item):
    if isinstance(item, TrackerProtocolError):
        return ("error", item.fault, item.raw)
    return item


def _decode_in_pieces(stream: bytes, cuts: list[int]) -> list:
    d = Decoder()
    out = []
    prev = 0
    for c in sorted(set(cuts)) + [len(stream)]:
        d.feed(stream[prev:c])
        out.extend(d.decode())
        prev = c
    return [_key(x) for x in out]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(records, st.binary(max_size=40)), max_size=12), st.data())
def test_any_split_decodes_identically(items, data):
    stream = b"".join(encode(x) if not isinstance(x, bytes) else x for x in items)
    whole = _decode_in_pieces(stream, [])
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    assert _decode_in_pieces(stream, cuts) == whole
    # byte at a time, the harshest split
    assert _decode_in_pieces(stream, list(range(len(stream)))) == whole


@settings(max_examples=300, deadline=None)
@given(records)
def test_encode_decode_is_canonical(rec):
    frame = encode(rec)
    (out,) = Decoder().decode(frame)
    assert encode(out) == frame
    (again,) = Decoder().decode(encode(out))
    assert again == out


def _garbage_between(frames: list[bytes], chunks: list[bytes]) -> bytes:
    out = bytearray()
    for i, f in enumerate(frames):
        out += chunks[i]
        out += f
    out += chunks[len(frames)]
    return bytes(out)


@settings(max_examples=300, deadline=None)
@given(st.lists(records, min_size=1, max_size=6), st.data())
def test_garbage_between_frames_never_costs_a_valid_frame(recs, data):
    frames = [encode(r) for r in recs]
    chunks = [data.draw(st.binary(max_size=60)) for _ in range(len(frames) + 1)]
    d = Decoder()
    d.feed(_garbage_between(frames, chunks))
    got = []
    while True:
        try:
            rec = d.read()
        except TrackerProtocolError:
            continue
        if rec is None:
            break
        got.append(rec)
    assert got == [Decoder().decode(f)[0] for f in frames]


# -- the stress test ---------------------------------------------------------------------------------


def _garbage_pool(rng: np.random.Generator, pool: list[bytes]) -> list[bytes]:
    """Cheap, nasty garbage: noise, '$' storms, partial and corrupted frames, long lines."""
    out = []
    for _ in range(400):
        kind = rng.integers(7)
        if kind == 0:
            out.append(rng.integers(0, 256, rng.integers(1, 80), dtype=np.uint8).tobytes())
        elif kind == 1:
            out.append(b"$" * int(rng.integers(1, 5)) + b"\r\n" * int(rng.integers(0, 2)))
        elif kind == 2:  # a frame cut short
            f = pool[rng.integers(len(pool))]
            out.append(f[: rng.integers(1, len(f) - 7)])  # stop before the CRC
        elif kind == 3:  # a frame with one byte changed
            f = bytearray(pool[rng.integers(len(pool))])
            k = int(rng.integers(1, len(f) - 6))  # in the body: the CRC must catch it
            f[k] ^= int(rng.integers(1, 256))
            out.append(bytes(f))
        elif kind == 4:  # an overlong line
            out.append(b"$" + bytes(rng.integers(0x20, 0x7F, 300, dtype=np.uint8)))
        elif kind == 5:  # printable junk with commas and stars
            out.append(bytes(rng.choice(list(b"0123456789,.*-ABCDEFPS\r\n"), rng.integers(1, 40))))
        else:  # a valid-looking frame with a wrong CRC
            f = pool[rng.integers(len(pool))]
            out.append(f[:-6] + b"%04X\r\n" % ((int(f[-6:-2], 16) + 1) % 0x10000))
    return out


def test_stress_10000_garbage_streams():
    rng = np.random.default_rng(20240601)
    recs = [rec for rec in SAMPLES]
    recs += [codec.Ping(s) for s in range(10, 60)]
    recs += [codec.Pong(s, 1000 + s, 900 + s) for s in range(10, 60)]
    pool = [encode(r) for r in recs]
    decoded_pool = [Decoder().decode(f)[0] for f in pool]
    garbage = _garbage_pool(rng, pool)
    n_streams = 10_000
    total_records = total_errors = 0
    for _ in range(n_streams):
        k = int(rng.integers(1, 6))
        picks = rng.integers(len(pool), size=k)
        gpicks = rng.integers(len(garbage), size=(k + 1, 2))
        parts = []
        for i in range(k):
            parts.append(garbage[gpicks[i, 0]] + garbage[gpicks[i, 1]])
            parts.append(pool[picks[i]])
        parts.append(garbage[gpicks[k, 0]])
        stream = b"".join(parts)
        d = Decoder(accept=codec.REQUEST_TYPES + codec.REPLY_TYPES)
        # feed in two uneven pieces: incremental decoding in the loop as well
        cut = int(rng.integers(len(stream) + 1))
        got = []
        for piece in (stream[:cut], stream[cut:]):
            d.feed(piece)
            while True:
                try:
                    rec = d.read()
                except ProtocolError:  # the only exception the codec may raise
                    total_errors += 1
                    continue
                if rec is None:
                    break
                got.append(rec)
        want = [decoded_pool[p] for p in picks]
        # every valid frame is recovered after the garbage, and nothing else comes out
        assert got == want, stream
        total_records += len(got)
    assert total_records > n_streams and total_errors > n_streams
