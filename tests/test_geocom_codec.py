"""The GeoCOM codec: line grammar, checksums, incremental decoding, resync; the polar convention."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.drivers import geocom_codec as gc
from cellcal.drivers.geocom_codec import Decoder, GeocomProtocolError, LineFault, Reply, Request, encode


def test_crc16_arc_check_value_and_bitwise_reference():
    assert gc.crc16_arc(b"123456789") == 0xBB3D  # the CRC-16/ARC check value
    assert gc.crc16_arc(b"") == 0

    def ref(data: bytes) -> int:  # MSB-first CRC-16 (poly 0x8005) of bit-reversed bytes, reversed
        def rev(x: int, n: int) -> int:
            return int(f"{x:0{n}b}"[::-1], 2)

        crc = 0
        for b in data:
            crc ^= rev(b, 8) << 8
            for _ in range(8):
                crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
        return rev(crc, 16)

    rng = np.random.default_rng(0)
    for n in (1, 5, 33, 200):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert gc.crc16_arc(data) == ref(data) == gc._crc(data)


def test_lines_by_hand():
    assert encode(Request.of(0, trid=0)) == b"%R1Q,0,0:\r\n"
    assert encode(Request.of(2108, 5000, gc.Inclination.AUTO, trid=7)) == b"%R1Q,2108,7:5000,1\r\n"
    assert encode(Request.of(9037, 0.0175, 0.0175, 0)) == b"%R1Q,9037:0.0175,0.0175,0\r\n"
    assert encode(Request.of(18005, True, trid=1)) == b"%R1Q,18005,1:1\r\n"
    assert encode(Reply.of(0, 1.5, 0.25, 12.0, trid=7)) == b"%R1P,0,7:0,1.5,0.25,12.0\r\n"
    assert encode(Reply.of(0, "TS30", trid=2)) == b'%R1P,0,2:0,"TS30"\r\n'
    # the checksum covers the line without ",<crc>" and without the line end
    line = encode(Request.of(2108, 5000, 1, trid=3, crc=True))
    crc = gc.crc16_arc(b"%R1Q,2108,3:5000,1")
    assert line == f"%R1Q,2108,3,{crc}:5000,1\r\n".encode()


def test_decoding_a_manual_style_reply():
    (rep,) = Decoder("replies").decode(b"%R1P,0,0:0,1996,'07','19','10','13','2f'\r\n")
    assert rep == Reply(0, 0, ("1996", "'07'", "'19'", "'10'", "'13'", "'2f'"), 0)
    (rep,) = Decoder("replies").decode(b'%R1P,0,5:0,"TM30, left"\r\n')  # a comma inside a string
    assert gc.parse_string(rep.values[0]) == "TM30, left"
    (req,) = Decoder("requests").decode(b"%R1Q,5004:\r\n")  # no transaction id
    assert req == Request(5004, (), None)


def test_blank_lines_are_not_messages():
    # geocompy sends "\n" + "\r\n" on connect and "\r\n" from is_open(): never answered
    d = Decoder("requests")
    assert d.decode(b"\n\r\n\r\n\n") == []
    assert d.decode(b"\n\r\n%R1Q,0,1:\r\n") == [Request(0, (), 1)]


@pytest.mark.parametrize("line, fault", [
    (b"%R1Q,0,1:\x01\r\n", LineFault.MALFORMED),
    (b"%R1Q,abc:\r\n", LineFault.MALFORMED),
    (b"%R1Q,0,1:1,,2\r\n", LineFault.MALFORMED),
    (b"%R1Q,0,99999:\r\n", LineFault.MALFORMED),  # transaction id out of range
    (b"%R1Q,0,1,1234:\r\n", LineFault.BAD_CRC),
    (b"hello\r\n", LineFault.MALFORMED),
])
def test_bad_request_lines(line, fault):
    (err,) = Decoder("requests").decode(line)
    assert isinstance(err, GeocomProtocolError) and err.fault is fault
    if fault is LineFault.BAD_CRC:
        assert err.trid == 1  # so the instrument can say which exchange was damaged


def test_value_parsers_are_strict():
    assert gc.parse_double("-1.5e-3") == -1.5e-3 and gc.parse_int("-12") == -12
    for bad in ("nan", "inf", "1_0", " 1", "", "1e999"):
        with pytest.raises(ValueError):
            gc.parse_double(bad)
    with pytest.raises(ValueError):
        gc.parse_int("1.0")
    with pytest.raises(ValueError):
        gc.parse_bool("2")
    with pytest.raises(ValueError):
        gc.format_value(math.nan)
    with pytest.raises(ValueError):
        gc.format_value('say "hi"')
    assert gc.format_value(-0.0) == "0.0" and gc.format_value(1e-7, precision=4) == "0.0"


def test_overlong_lines_are_cut_and_decoding_goes_on():
    d = Decoder("replies")
    out = d.decode(b"%R1P,0,1:0," + b"1" * 3000 + b"\r\n%R1P,0,2:0\r\n")
    assert isinstance(out[0], GeocomProtocolError) and out[0].fault is LineFault.OVERLONG
    assert out[1:] == [Reply(0, 0, (), 2)]


_TOKENS = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: gc.format_value(x)),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, blacklist_characters='"'), max_size=12)
    .map(lambda s: f'"{s}"'),
)
_REQUESTS = st.builds(Request, st.integers(0, 99999), st.lists(_TOKENS, max_size=5).map(tuple),
                      st.one_of(st.none(), st.integers(0, gc.MAX_TRID)), st.just(False))
_REPLIES = st.builds(Reply, st.integers(0, 99999), st.integers(0, 99999), st.lists(_TOKENS, max_size=8).map(tuple),
                     st.integers(0, gc.MAX_TRID), st.booleans())


@given(st.lists(_REPLIES, max_size=8), st.data())
def test_replies_round_trip_through_any_split(replies, data):
    stream = b"".join(encode(r) for r in replies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    d = Decoder("replies")
    out, prev = [], 0
    for c in cuts + [len(stream)]:
        out += d.decode(stream[prev:c])
        prev = c
    assert out == replies


@given(_REQUESTS)
def test_requests_round_trip(req):
    assert Decoder("requests").decode(encode(req)) == [req]


def _lines(stream: bytes) -> set[bytes]:
    return {ln.rstrip(b"\r") for ln in stream.split(b"\n")}


@given(st.binary(max_size=1500), st.sampled_from(["replies", "requests"]))
def test_random_bytes_never_crash_and_never_yield_a_record_from_garbage(data, side):
    for item in Decoder(side).decode(data):
        if not isinstance(item, GeocomProtocolError):
            assert encode(item).rstrip(b"\r\n") in _lines(data)  # a whole line of the stream


@given(st.lists(_REPLIES, min_size=1, max_size=6), st.data())
def test_mutated_streams_lose_only_the_lines_they_touch(replies, data):
    lines = [bytearray(encode(r)) for r in replies]
    hit = set()
    for _ in range(data.draw(st.integers(1, 3))):
        k = data.draw(st.integers(0, len(lines) - 1))
        i = data.draw(st.integers(0, len(lines[k]) - 3))  # keep each line's end
        lines[k][i] = data.draw(st.integers(0x20, 0x7E))
        hit.add(k)
    stream = b"".join(bytes(x) for x in lines)
    out = Decoder("replies").decode(stream)
    records = [x for x in out if not isinstance(x, GeocomProtocolError)]
    for rec in records:
        assert encode(rec).rstrip(b"\r\n") in _lines(stream)
    # every untouched line is decoded, in order
    untouched = [r for k, r in enumerate(replies) if k not in hit]
    it = iter(records)
    assert all(any(r == x for x in it) for r in untouched)


@given(st.lists(st.tuples(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), _REPLIES), min_size=1,
                max_size=6))
def test_resynchronises_at_every_line_end(chunks):
    # garbage without a line end glued in front of a line kills only that line; the rest arrive
    stream = b"".join(g + b"\n" + encode(r) for g, r in chunks)
    records = [x for x in Decoder("replies").decode(stream) if not isinstance(x, GeocomProtocolError)]
    assert records == [r for _, r in chunks]


# -- the polar convention ----------------------------------------------------------------------


def test_polar_convention_by_hand():
    # Hz clockwise from +y (north) towards +x (east), V from +z (zenith)
    np.testing.assert_allclose(gc.cartesian_from_polar(0.0, math.pi / 2, 2.0), [0.0, 2.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(gc.cartesian_from_polar(math.pi / 2, math.pi / 2, 2.0), [2.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(gc.cartesian_from_polar(1.0, 0.0, 3.0), [0.0, 0.0, 3.0], atol=1e-15)
    np.testing.assert_allclose(gc.cartesian_from_polar(math.pi, math.pi * 0.75, 1.0),
                               [0.0, -math.sqrt(0.5), -math.sqrt(0.5)], atol=1e-15)


@given(st.floats(-50, 50), st.floats(-50, 50), st.floats(-50, 50))
def test_polar_round_trip(x, y, z):
    p = np.array([x, y, z])
    if np.linalg.norm(p) < 1e-3:
        return
    hz, v, d = gc.polar_from_cartesian(p)
    assert 0.0 <= hz < 2 * math.pi and 0.0 <= v <= math.pi
    np.testing.assert_allclose(gc.cartesian_from_polar(hz, v, d), p, atol=1e-9)


def test_polar_jacobian_by_finite_differences():
    rng = np.random.default_rng(3)
    for _ in range(20):
        q = np.array([rng.uniform(0, 2 * math.pi), rng.uniform(0.1, 3.0), rng.uniform(0.5, 30)])
        J = gc.polar_jacobian(*q)
        num = np.empty((3, 3))
        for k in range(3):
            dq = np.zeros(3)
            dq[k] = 1e-6
            num[:, k] = (gc.cartesian_from_polar(*(q + dq)) - gc.cartesian_from_polar(*(q - dq))) / 2e-6
        np.testing.assert_allclose(J, num, atol=1e-6)


@given(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.floats(-1e3, 1e3))
def test_every_point_an_instrument_can_see_is_a_plausible_measurement(x, y, z):
    """polar_from_cartesian spans exactly what simple_measurement_problem accepts (face I)."""
    d = math.sqrt(x * x + y * y + z * z)
    if d < 1e-3:
        return
    hz, v, d = gc.polar_from_cartesian((x, y, z))
    # as the instrument prints them (15 decimals): a value just below 2 pi may round to it
    hz, v = (float(gc.format_value(a)) for a in (hz, v))
    assert gc.simple_measurement_problem(hz, v, d) is None


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True),
       st.floats(0.0, 2e4, exclude_min=True))
def test_values_off_the_circles_are_named(hz, v, d):
    problem = gc.simple_measurement_problem(hz, v, d)
    in_range = (math.isfinite(hz) and math.isfinite(v) and 0 <= hz <= 2 * math.pi and 0 <= v <= math.pi
                and d <= gc.MAX_SLOPE_DISTANCE_M)
    assert (problem is None) == in_range
    if problem is not None:
        assert problem[0] in ("hz", "v", "slope_distance") and problem[1]
