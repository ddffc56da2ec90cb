"""The protocol spec's example frames are real: each parses, has the right CRC and direction,
and re-encodes to the same bytes; its CRC check value and worked example hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cellcal.drivers import tracker_codec as codec

SPEC = Path(__file__).resolve().parents[1] / "docs" / "protocols" / "tracker.md"
LINE = re.compile(r"^(H>|D<|X>) (\$\S+)$", re.M)


def _examples():
    return LINE.findall(SPEC.read_text())


def test_spec_has_examples_of_every_message():
    types = set()
    for _, frame in _examples():
        types.add(frame[1:].split(",")[0])
    want = {cls.TYPE for cls in codec.REQUEST_TYPES + codec.REPLY_TYPES}
    assert want <= types, f"no example of {sorted(want - types)}"


@pytest.mark.parametrize("direction, frame", _examples())
def test_spec_example_frame(direction, frame):
    raw = frame.encode("ascii") + b"\r\n"
    if direction == "X>":  # shown damaged on purpose
        (err,) = codec.Decoder().decode(raw)
        assert err.fault is codec.FrameFault.BAD_CRC
        return
    accept = codec.REQUEST_TYPES if direction == "H>" else codec.REPLY_TYPES
    (rec,) = codec.Decoder(accept=accept).decode(raw)
    assert not isinstance(rec, codec.TrackerProtocolError), rec
    assert codec.encode(rec) == raw  # the spec shows canonical frames
    assert len(raw) <= codec.MAX_FRAME_BYTES
    if direction == "D<" and isinstance(rec, (codec.PointReply, codec.PoseReply)):
        assert rec.t_us <= rec.ts_us


def test_spec_crc_statements():
    text = SPEC.read_text()
    assert "**0x29B1**" in text and codec.crc16(b"123456789") == 0x29B1
    assert "`PING,2` has CRC 0xC6F1" in text and codec.crc16(b"PING,2") == 0xC6F1
    assert "`$PING,2*C6F1\\r\\n`" in text


def test_spec_names_every_nak_code_and_flag():
    text = SPEC.read_text()
    for code in codec.NakCode:
        assert f"`{code.value}`" in text
    for flag in list(codec.MeasurementFlags) + list(codec.StatusFlags):
        if flag.name != "NONE":
            assert f"`{flag.name}`" in text and f"0x{flag.value:04X}" in text
