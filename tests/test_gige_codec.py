"""The GigE Vision codec: GVCP commands and acks, GVSP packets, frame reassembly; fuzzed.

Known bytes are written out by hand from the layouts in docs/protocols/gige.md, so an
encoder and decoder that agree with each other but not with the wire would fail here.
"""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.drivers import gige_codec as gc
from cellcal.drivers.gige_link import FrameAssembler
from cellcal.sim.gige_device import GigeDevice

# -- GVCP -------------------------------------------------------------------------------------


def test_readreg_command_bytes():
    data = gc.encode_cmd(gc.ReadRegCmd(1, (gc.Reg.CCP,)))
    assert data == bytes.fromhex("42 01 0080 0004 0001 00000A00")
    assert gc.decode_cmd(data) == gc.ReadRegCmd(1, (0xA00,))


def test_writereg_readmem_writemem_command_bytes():
    assert gc.encode_cmd(gc.WriteRegCmd(0x1234, ((0x944, 2),))) == bytes.fromhex("42 01 0082 0008 1234 00000944 00000002")
    assert gc.encode_cmd(gc.ReadMemCmd(7, 0x200, 512)) == bytes.fromhex("42 01 0084 0008 0007 00000200 0000 0200")
    assert gc.encode_cmd(gc.WriteMemCmd(8, 0x10, b"abcd")) == bytes.fromhex("42 01 0086 0008 0008 00000010 61626364")


def test_ack_bytes_and_decoding():
    ack = bytes.fromhex("0000 0081 0004 0001 00000002")
    assert gc.decode_ack(ack) == gc.ReadRegAck(1, 0, (2,))
    assert gc.encode_ack(gc.ReadRegAck(1, 0, (2,))) == ack
    # an error status: the answer is kept, whatever payload a device appends
    denied = bytes.fromhex("8006 0083 0004 0009 0000 0000")
    assert gc.decode_ack(denied) == gc.StatusAck(9, gc.Status.ACCESS_DENIED, gc.Command.WRITEREG_ACK)
    pending = gc.decode_ack(bytes.fromhex("0000 0089 0004 0003 0000 01F4"))
    assert pending == gc.PendingAck(3, 0, 500)
    mem = gc.decode_ack(bytes.fromhex("0000 0085 0008 0002 00000200 4c6f6361"))
    assert mem == gc.ReadMemAck(2, 0, 0x200, b"Loca")
    # a device may pad the datagram beyond its length field
    assert gc.decode_ack(ack + b"\0" * 8) == gc.ReadRegAck(1, 0, (2,))


CMDS = [
    gc.ReadRegCmd(1, (0, 4, 0x938)),
    gc.WriteRegCmd(65535, ((0xA00, 2), (0x938, 3000))),
    gc.ReadMemCmd(2, 0x100000, 4),
    gc.WriteMemCmd(3, 0xD18, bytes(range(8))),
    gc.DiscoveryCmd(4),
]


@pytest.mark.parametrize("cmd", CMDS, ids=lambda c: type(c).__name__)
def test_command_roundtrip(cmd):
    assert gc.decode_cmd(gc.encode_cmd(cmd)) == cmd


ACKS = [
    gc.ReadRegAck(1, 0, (1, 2, 0xFFFFFFFF)),
    gc.WriteRegAck(2, 0, 1),
    gc.ReadMemAck(3, 0, 0x48, b"cellcal\0"),
    gc.WriteMemAck(4, 0, 8),
    gc.PendingAck(5, 0, 100),
    gc.StatusAck(6, gc.Status.INVALID_ADDRESS, gc.Command.READMEM_ACK),
]


@pytest.mark.parametrize("ack", ACKS, ids=lambda a: type(a).__name__)
def test_ack_roundtrip(ack):
    assert gc.decode_ack(gc.encode_ack(ack)) == ack


@pytest.mark.parametrize("bad", [
    gc.ReadRegCmd(0, (0,)),  # req_id 0 is reserved
    gc.ReadRegCmd(1, ()),
    gc.ReadRegCmd(1, (2,)),  # not aligned
    gc.ReadMemCmd(1, 0, 513),
    gc.ReadMemCmd(1, 0, 6),
    gc.WriteMemCmd(1, 0, b"abc"),
    gc.WriteRegCmd(1, ((0, 2**32),)),
])
def test_encoder_refuses_bad_fields(bad):
    with pytest.raises(ValueError):
        gc.encode_cmd(bad)


@pytest.mark.parametrize("data, where", [
    (b"\x42\x01\x00\x80", "shorter"),
    (bytes.fromhex("41 01 0080 0004 0001 00000A00"), "key"),
    (bytes.fromhex("42 01 0080 0008 0001 00000A00"), "length"),
    (bytes.fromhex("42 01 0080 0004 0000 00000A00"), "req_id"),
    (bytes.fromhex("42 01 0080 0003 0001 000000"), "multiple of 4"),
    (bytes.fromhex("42 01 0099 0000 0001"), "0x0099"),
])
def test_decoder_names_what_is_wrong(data, where):
    with pytest.raises(gc.GigeProtocolError, match=where):
        gc.decode_cmd(data)


@given(st.binary(max_size=600))
def test_garbage_commands_and_acks_raise_only_protocol_errors(data):
    for decode in (gc.decode_cmd, gc.decode_ack, gc.decode_gvsp):
        try:
            decode(data)
        except gc.GigeProtocolError:
            pass


@given(st.sampled_from(CMDS + ACKS), st.integers(0, 63), st.integers(0, 255))
def test_damaged_packets_decode_or_raise_protocol_errors(rec, pos, byte):
    is_cmd = not hasattr(rec, "ack_id")
    data = bytearray(gc.encode_cmd(rec) if is_cmd else gc.encode_ack(rec))
    data[pos % len(data)] = byte
    try:
        out = (gc.decode_cmd if is_cmd else gc.decode_ack)(bytes(data))
    except gc.GigeProtocolError:
        return
    assert type(out).__name__ in {
        "ReadRegCmd", "WriteRegCmd", "ReadMemCmd", "WriteMemCmd", "DiscoveryCmd", "ReadRegAck", "WriteRegAck",
        "ReadMemAck", "WriteMemAck", "PendingAck", "StatusAck",
    }


# -- the simulated device's answers ---------------------------------------------------------------

_ADDR = st.one_of(st.sampled_from([int(r) for r in gc.Reg] + [0x10000 + 4 * i for i in range(24)] + [0x100000]),
                  st.integers(0, 2**32 - 1))
_CMD = st.one_of(
    st.builds(gc.ReadRegCmd, st.integers(1, 65535), st.lists(_ADDR.map(lambda a: a & ~3), min_size=1, max_size=8)
              .map(tuple)),
    st.builds(gc.WriteRegCmd, st.integers(1, 65535),
              st.lists(st.tuples(_ADDR.map(lambda a: a & ~3), st.integers(0, 2**32 - 1)), min_size=1, max_size=4)
              .map(tuple)),
    st.builds(gc.ReadMemCmd, st.integers(1, 65535), _ADDR.map(lambda a: a & ~3), st.integers(1, 128).map(lambda n: 4 * n)),
    st.builds(gc.WriteMemCmd, st.integers(1, 65535), _ADDR.map(lambda a: a & ~3),
              st.binary(min_size=1, max_size=16).map(lambda b: b.ljust(-(-len(b) // 4) * 4, b"\0"))),
)


@given(st.lists(st.one_of(_CMD.map(gc.encode_cmd), st.binary(max_size=64)), max_size=20),
       st.sampled_from([("127.0.0.1", 5000), ("127.0.0.1", 5001)]))
def test_the_simulated_device_answers_anything_without_failing(datagrams, sender):
    dev = GigeDevice("127.0.0.2")  # no sockets: answer() is the device's whole GVCP logic
    for data in datagrams:
        reply = dev.answer(data, sender)
        if reply is not None:
            ack = gc.decode_ack(reply)  # whatever it says, it says it in GVCP
            assert ack.ack_id == (struct.unpack_from(">H", data, 6)[0] or 1)


def test_the_simulated_device_refuses_writes_from_a_second_application():
    dev = GigeDevice("127.0.0.2")
    a, b = ("127.0.0.1", 5000), ("127.0.0.1", 5001)
    take = gc.encode_cmd(gc.WriteRegCmd(1, ((gc.Reg.CCP, gc.CCP_CONTROL),)))
    assert gc.decode_ack(dev.answer(take, a)) == gc.WriteRegAck(1, 0, 1)
    assert gc.decode_ack(dev.answer(take, b)).status == gc.Status.ACCESS_DENIED
    read = gc.encode_cmd(gc.ReadRegCmd(2, (gc.Reg.CCP,)))
    assert gc.decode_ack(dev.answer(read, b)) == gc.ReadRegAck(2, 0, (gc.CCP_CONTROL,))  # reads are answered
    unknown = bytes.fromhex("42 01 FFFF 0000 0003")
    assert gc.decode_ack(dev.answer(unknown, a)) == gc.StatusAck(3, gc.Status.NOT_IMPLEMENTED, 0)


# -- GVSP -------------------------------------------------------------------------------------


def test_leader_payload_trailer_bytes():
    leader = gc.GvspLeader(7, 0, gc.PAYLOAD_TYPE_IMAGE, 0x0000000100000002, gc.PIXEL_FORMATS["Mono8"], 640, 480)
    data = gc.encode_leader(leader)
    assert data == bytes.fromhex(
        "0000 0007 01000000"  # status, block 7, format leader, packet 0
        "0000 0001 00000001 00000002"  # field flags, payload type image, timestamp high/low
        "01080001 00000280 000001E0 00000000 00000000 0000 0000"  # Mono8, 640 x 480, offsets, padding
    )
    assert gc.decode_gvsp(data) == leader
    assert gc.encode_payload(gc.GvspPayload(7, 1, b"\x01\x02")) == bytes.fromhex("0000 0007 03000001 0102")
    assert gc.encode_trailer(gc.GvspTrailer(7, 2, 1, 480)) == bytes.fromhex("0000 0007 02000002 0000 0001 000001E0")
    assert gc.decode_gvsp(bytes.fromhex("0000 0007 02000002 0000 0001 000001E0")) == gc.GvspTrailer(7, 2, 1, 480)


def test_extended_ids_roundtrip():
    leader = gc.GvspLeader(2**40 + 5, 0, gc.PAYLOAD_TYPE_IMAGE, 123, gc.PIXEL_FORMATS["Mono16"], 4, 2, extended=True)
    data = gc.encode_leader(leader)
    assert data[4] == 0x81 and len(data) == gc.GVSP_EXT_HEADER_BYTES + 36
    assert gc.decode_gvsp(data) == leader
    pay = gc.GvspPayload(2**40 + 5, 70000, b"xy", extended=True)
    assert gc.decode_gvsp(gc.encode_payload(pay)) == pay


def test_other_payload_types_and_formats_are_not_images():
    chunk_leader = bytes.fromhex("0000 0001 01000000 0000 4001 00000000 00000001") + bytes(24)
    out = gc.decode_gvsp(chunk_leader)
    assert isinstance(out, gc.GvspLeader) and out.payload_type == 0x4001 and out.width == 0
    with pytest.raises(gc.GigeProtocolError, match="MULTIPART"):
        gc.decode_gvsp(bytes.fromhex("0000 0001 07000001 00"))
    with pytest.raises(gc.GigeProtocolError, match="error status"):
        gc.decode_gvsp(bytes.fromhex("800C 0001 03000001 00"))


def _frame_packets(block: int, w: int, h: int, chunk: int, index: int = 0) -> tuple[list[bytes], bytes]:
    data = bytes((x + y + index) % 256 for y in range(h) for x in range(w))
    pkts = [gc.encode_leader(gc.GvspLeader(block, 0, 1, 1000 + block, gc.PIXEL_FORMATS["Mono8"], w, h))]
    pid = 1
    for off in range(0, len(data), chunk):
        pkts.append(gc.encode_payload(gc.GvspPayload(block, pid, data[off:off + chunk])))
        pid += 1
    pkts.append(gc.encode_trailer(gc.GvspTrailer(block, pid, 1, h)))
    return pkts, data


def _assemble(datagrams: list[bytes]) -> tuple[list, FrameAssembler]:
    out: list = []
    asm = FrameAssembler(out.append)
    for i, d in enumerate(datagrams):
        try:
            asm.feed(gc.decode_gvsp(d), i)
        except gc.GigeProtocolError:
            pass
    return out, asm


def test_assembler_joins_frames_in_any_packet_order():
    pkts, data = _frame_packets(3, 20, 10, 64)
    body = pkts[1:-1]
    random.Random(0).shuffle(body)
    out, asm = _assemble([pkts[0], *body, pkts[-1]])
    assert len(out) == 1 and out[0].data == data and out[0].leader.block_id == 3
    assert asm.incomplete == 0


@given(st.data())
def test_a_frame_missing_any_packet_is_dropped_never_returned(data):
    pkts, _ = _frame_packets(9, 16, 8, 20)
    drop = data.draw(st.integers(0, len(pkts) - 1))
    kept = [p for i, p in enumerate(pkts) if i != drop]
    nxt, nxt_data = _frame_packets(10, 16, 8, 20, index=1)
    out, asm = _assemble(kept + nxt)
    # the damaged frame never comes out; the next, intact one does
    assert [f.leader.block_id for f in out] == [10]
    assert out[0].data == nxt_data
    if drop != len(pkts) - 1:  # without its trailer a block stays open until it goes stale
        assert asm.incomplete == 1


@given(st.lists(st.binary(min_size=0, max_size=80), max_size=40))
def test_garbage_streams_never_yield_a_frame(datagrams):
    out, _ = _assemble(datagrams)
    assert out == []


def test_a_leader_whose_size_disagrees_with_the_payload_is_dropped():
    pkts, _ = _frame_packets(4, 16, 8, 32)
    liar = gc.encode_leader(gc.GvspLeader(4, 0, 1, 0, gc.PIXEL_FORMATS["Mono8"], 16, 9))
    out, asm = _assemble([liar, *pkts[1:]])
    assert out == [] and asm.incomplete == 1


def test_chunk_payloads_roundtrip_and_torn_ones_are_refused():
    image = bytes(range(48))
    chunks = [(0x0A000001, struct.pack(">d", 1234.5)), (0x0A000002, struct.pack(">d", 3.0))]
    payload = gc.encode_chunks(image, chunks)
    assert payload[48:56] == bytes.fromhex("00000001 00000030")  # the image's own id and length
    assert payload[-8:] == bytes.fromhex("0A000002 00000008")
    img, found = gc.parse_chunks(payload, 48)
    assert img == image and found == dict(chunks)
    with pytest.raises(gc.GigeProtocolError, match="first chunk"):
        gc.parse_chunks(payload, 47)
    with pytest.raises(gc.GigeProtocolError):
        gc.parse_chunks(payload[:-1], 48)
    with pytest.raises(gc.GigeProtocolError):
        gc.parse_chunks(payload[8:], 48)


@given(st.binary(max_size=200), st.integers(0, 64))
def test_garbage_chunk_payloads_raise_only_protocol_errors(data, image_bytes):
    try:
        img, found = gc.parse_chunks(data, image_bytes)
    except gc.GigeProtocolError:
        return
    assert len(img) == image_bytes and sum(len(v) + 8 for v in found.values()) <= len(data)


def test_a_chunked_frame_comes_out_with_its_chunks():
    image = bytes(range(64))
    payload = gc.encode_chunks(image, [(7, b"abcd")])
    pkts = [gc.encode_leader(gc.GvspLeader(5, 0, gc.PAYLOAD_TYPE_IMAGE_CHUNKS, 9, gc.PIXEL_FORMATS["Mono8"], 8, 8)),
            gc.encode_payload(gc.GvspPayload(5, 1, payload[:40])), gc.encode_payload(gc.GvspPayload(5, 2, payload[40:])),
            gc.encode_trailer(gc.GvspTrailer(5, 3, gc.PAYLOAD_TYPE_IMAGE_CHUNKS, 8))]
    out, asm = _assemble(pkts)
    assert len(out) == 1 and out[0].data == image and out[0].chunks == {7: b"abcd"}
    liar = gc.encode_chunks(image[:60], [(7, b"abcd")])  # an image chunk of the wrong size
    pkts[1:3] = [gc.encode_payload(gc.GvspPayload(5, 1, liar[:40])), gc.encode_payload(gc.GvspPayload(5, 2, liar[40:]))]
    out, asm = _assemble(pkts)
    assert out == [] and asm.incomplete == 1


def test_pixel_formats():
    assert gc.bits_per_pixel(gc.PIXEL_FORMATS["Mono16"]) == 16
    assert gc.bits_per_pixel(gc.PIXEL_FORMATS["RGB8"]) == 24
    assert gc.pixel_format_name(0x01080001) == "Mono8"
    assert gc.pixel_format_name(0x0108000C) is None
    with pytest.raises(ValueError, match="Mono7"):
        gc.pixel_format_code("Mono7")


def test_string_registers():
    assert gc.decode_string(b"Aravis\0\0junk") == "Aravis"
    assert struct.calcsize(">HHIIIIIIIHH") == 36  # the image leader's body
