"""The GenICam node-map reader: formulas, registers, indirection, refusals; no device.

A byte array stands in for the device's register space, so every read and write the node
map makes is checked at the byte level.
"""

from __future__ import annotations

import io
import math
import struct
import zipfile
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.drivers.genicam import (
    FeatureAccessError,
    FeatureNotFoundError,
    FeatureUnsupportedError,
    GenicamError,
    NodeMap,
    evaluate_formula,
    parse_xml_url,
    xml_from_bytes,
)
from cellcal.sim.gige_device import DEVICE_REGS


class MemPort:
    def __init__(self, size: int = 0x20000) -> None:
        self.mem = bytearray(size)
        self.writes: list[tuple[int, bytes]] = []

    def read(self, address: int, length: int) -> bytes:
        return bytes(self.mem[address:address + length])

    def write(self, address: int, data: bytes) -> None:
        self.writes.append((address, bytes(data)))
        self.mem[address:address + len(data)] = data


def wrap(body: str) -> str:
    return ('<RegisterDescription xmlns="http://www.genicam.org/GenApi/Version_1_1" ModelName="T" '
            f'VendorName="V">{body}<Port Name="Device"/></RegisterDescription>')


def reg(kind: str, name: str, addr: int, extra: str = "", length: int = 4, access: str = "RW",
        endian: str = "BigEndian") -> str:
    return (f'<{kind} Name="{name}"><Address>{addr:#x}</Address><Length>{length}</Length>'
            f'<AccessMode>{access}</AccessMode><pPort>Device</pPort>{extra}'
            f'<Endianess>{endian}</Endianess></{kind}>')


# -- formulas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("formula, value", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("2 ** 3 ** 2", 512),  # right-associative
    ("-2 ** 2", -4),
    ("0x10 >> 2 & 0x3", 0),  # shift binds tighter than &
    ("(0x01080001 >> 16) & 0xFF", 8),
    ("7 / 2", 3.5),
    ("1 = 1 ? 10 : 20", 10),
    ("3 <> 3 || 2 >= 2 && 1 < 0 ? 1 : 2", 2),
    ("SQRT(16) + ABS(-1.5)", 5.5),
    ("ROUND(2.5) + TRUNC(-2.7) + FLOOR(-0.5) + CEIL(0.2)", 1.0),
    ("~0 & 0xF", 15),
    ("PI > 3.14", 1),
])
def test_formulas(formula, value):
    assert evaluate_formula(formula) == pytest.approx(value)


def test_integer_formulas_truncate_toward_zero():
    assert evaluate_formula("7 / 2", integer=True) == 3
    assert evaluate_formula("-7 / 2", integer=True) == -3
    assert evaluate_formula("W * H * 16 / 8", {"W": 640, "H": 480}, integer=True) == 614400


@pytest.mark.parametrize("formula", ["1 +", "FOO * 2", "1 $ 2", "(1", "1 ? 2"])
def test_formulas_that_do_not_read_are_refused(formula):
    with pytest.raises(FeatureUnsupportedError):
        evaluate_formula(formula)


# -- the simulated camera's XML ---------------------------------------------------------------


@pytest.fixture
def simcam():
    port = MemPort()
    xml = resources.files("cellcal.sim").joinpath("gige_camera.xml").read_bytes()
    struct.pack_into(">II", port.mem, DEVICE_REGS["Width"], 640, 480)
    struct.pack_into(">II", port.mem, DEVICE_REGS["SensorWidth"], 640, 480)
    struct.pack_into(">I", port.mem, DEVICE_REGS["PixelFormat"], 0x01080001)
    port.mem[0x48:0x50] = b"cellcal\0"
    return NodeMap(xml, port), port


def test_sim_xml_features_read_and_write_bytes(simcam):
    nm, port = simcam
    assert nm.vendor == "cellcal" and nm.get("DeviceVendorName") == "cellcal"
    assert nm.get("Width") == 640 and nm.range("Width") == (16, 640)
    assert nm.get("PixelFormat") == "Mono8" and nm.get("PayloadSize") == 640 * 480
    nm.set("PixelFormat", "Mono16")
    assert port.writes[-1] == (DEVICE_REGS["PixelFormat"], struct.pack(">I", 0x01100007))
    assert nm.get("PayloadSize") == 640 * 480 * 2  # IntSwissKnife over an enumeration's value
    nm.set("ExposureTime", 1234.5)  # FloatReg, 8 bytes big-endian
    assert port.writes[-1] == (DEVICE_REGS["ExposureTime"], struct.pack(">d", 1234.5))
    assert nm.get("ExposureTime") == 1234.5 and nm.unit("ExposureTime") == "us"
    nm.set("Gain", 3.33)  # Converter FROM * 10 into an Integer: quantised to 0.1 dB
    assert port.writes[-1] == (DEVICE_REGS["GainRaw"], struct.pack(">I", 33))
    assert nm.get("Gain") == pytest.approx(3.3)
    nm.execute("AcquisitionStart")
    assert port.writes[-1] == (DEVICE_REGS["AcquisitionStart"], struct.pack(">I", 1))


def test_masked_and_boolean_registers_keep_the_other_bits(simcam):
    nm, port = simcam
    struct.pack_into(">I", port.mem, DEVICE_REGS["ReverseX"], 0xABCD0000)
    assert nm.get("ReverseX") is False
    nm.set("ReverseX", True)  # Bit 31 of a big-endian register is its least significant bit
    assert port.read(DEVICE_REGS["ReverseX"], 4) == struct.pack(">I", 0xABCD0001)
    struct.pack_into(">I", port.mem, 0xD04, 0x4000_05DC)  # do-not-fragment bit and 1500 bytes
    assert nm.get("GevSCPSPacketSize") == 1500
    nm.set("GevSCPSPacketSize", 9000)
    assert port.read(0xD04, 4) == struct.pack(">I", 0x4000_2328)


def test_range_enumeration_and_access_are_checked(simcam):
    nm, port = simcam
    n = len(port.writes)
    with pytest.raises(ValueError, match="Width"):
        nm.set("Width", 641)
    with pytest.raises(ValueError, match="Mono12"):
        nm.set("PixelFormat", "Mono12")
    with pytest.raises(ValueError, match="Gain"):
        nm.set("Gain", 30.0)
    with pytest.raises(FeatureAccessError, match="read-only"):
        nm.set("SensorWidth", 100)
    with pytest.raises(FeatureAccessError, match="write-only"):
        nm.get("TriggerSoftwareReg")
    with pytest.raises(FeatureNotFoundError, match="NoSuchFeature"):
        nm.get("NoSuchFeature")
    assert len(port.writes) == n  # nothing refused reached the device


# -- node kinds and indirection ---------------------------------------------------------------


def test_little_endian_masked_fields_signed_values_and_pindex():
    xml = wrap(
        reg("MaskedIntReg", "Low4", 0x10, "<LSB>0</LSB><MSB>3</MSB>", endian="LittleEndian")
        + reg("MaskedIntReg", "High4", 0x10, "<LSB>4</LSB><MSB>7</MSB><Sign>Signed</Sign>", length=1,
              endian="LittleEndian")
        + reg("IntReg", "Signed16", 0x20, "<Sign>Signed</Sign>", length=2)
        + '<Integer Name="Sel"><pValue>SelReg</pValue></Integer>' + reg("IntReg", "SelReg", 0x30)
        + reg("IntReg", "Indexed", 0x100, '<pIndex Offset="0x8">Sel</pIndex>')
        + '<Integer Name="Base"><Value>0x40</Value></Integer>'
        + '<IntReg Name="ByPAddress"><pAddress>Base</pAddress><Address>4</Address><Length>4</Length>'
          '<AccessMode>RW</AccessMode><pPort>Device</pPort><Endianess>BigEndian</Endianess></IntReg>'
    )
    port = MemPort()
    nm = NodeMap(xml, port)
    port.mem[0x10] = 0xF5
    assert nm.get("Low4") == 5 and nm.get("High4") == -1
    struct.pack_into(">h", port.mem, 0x20, -300)
    assert nm.get("Signed16") == -300
    nm.set("Sel", 2)
    nm.set("Indexed", 77)
    assert port.writes[-1] == (0x110, struct.pack(">I", 77))
    nm.set("ByPAddress", 5)
    assert port.writes[-1] == (0x44, struct.pack(">I", 5))


def test_struct_reg_entries_become_features():
    xml = wrap('<StructReg Comment="S"><Address>0x50</Address><Length>4</Length><AccessMode>RW</AccessMode>'
               '<pPort>Device</pPort><Endianess>BigEndian</Endianess>'
               '<StructEntry Name="Top"><LSB>15</LSB><MSB>0</MSB></StructEntry>'
               '<StructEntry Name="Flag"><Bit>31</Bit></StructEntry></StructReg>')
    port = MemPort()
    nm = NodeMap(xml, port)
    struct.pack_into(">I", port.mem, 0x50, 0x12340001)
    assert nm.get("Top") == 0x1234 and nm.get("Flag") == 1


def test_converter_with_variables_and_pmax():
    xml = wrap(
        '<Float Name="Rate"><pValue>RateConv</pValue></Float>'
        '<Converter Name="RateConv"><pVariable Name="K">Scale</pVariable>'
        '<FormulaTo>(K / FROM)</FormulaTo><FormulaFrom>(K / TO)</FormulaFrom><pValue>Period</pValue></Converter>'
        '<Integer Name="Scale"><Value>1000000</Value></Integer>'
        '<Integer Name="Period"><pValue>PeriodReg</pValue><Min>1000</Min><pMax>PeriodMax</pMax></Integer>'
        '<Integer Name="PeriodMax"><Value>100000</Value></Integer>'
        + reg("IntReg", "PeriodReg", 0x60)
    )
    port = MemPort()
    nm = NodeMap(xml, port)
    nm.set("Rate", 25.0)
    assert port.read(0x60, 4) == struct.pack(">I", 40000) and nm.get("Rate") == 25.0
    with pytest.raises(ValueError, match="Period"):
        nm.set("Rate", 5.0)  # 200000 us > pMax


def test_what_is_not_interpreted_is_refused_by_name():
    xml = wrap(
        '<Integer Name="ChunkExposure"><pValue>ChunkReg</pValue></Integer>'
        '<IntReg Name="ChunkReg"><Address>0</Address><Length>4</Length><AccessMode>RO</AccessMode>'
        '<pPort>ChunkPort</pPort></IntReg><Port Name="ChunkPort"><ChunkID>1234</ChunkID></Port>'
        '<Integer Name="Dangling"><pValue>Nowhere</pValue></Integer>'
        '<ConfRom Name="Odd"/>'
        '<IntSwissKnife Name="Bad"><Formula>1 $ 2</Formula></IntSwissKnife>'
        '<IntSwissKnife Name="Div"><Formula>1 / 0</Formula></IntSwissKnife>'
    )
    nm = NodeMap(xml, MemPort())
    for name, what in (("ChunkExposure", "chunk"), ("Dangling", "Nowhere"), ("Odd", "ConfRom"), ("Bad", "formula"),
                       ("Div", "Div")):
        with pytest.raises(FeatureUnsupportedError, match=what):
            nm.get(name)


def test_chunk_features_read_inside_chunk_data(simcam):
    nm, _ = simcam
    with pytest.raises(FeatureUnsupportedError, match="chunk"):
        nm.get("ChunkExposureTime")
    with nm.chunk_data({0x0A000001: struct.pack(">d", 2500.0)}):
        assert nm.get("ChunkExposureTime") == 2500.0 and nm.unit("ChunkExposureTime") == "us"
        with pytest.raises(GenicamError, match="0xA000002"):
            nm.get("ChunkGain")  # not in this frame
    nm.set("ChunkModeActive", True)
    nm.set("ChunkSelector", "Gain")
    nm.set("ChunkEnable", True)  # pIndex by the selector: the second enable register
    assert struct.unpack_from(">I", simcam[1].mem, 0x10050)[0] == 1
    assert nm.get("PayloadSize") == 640 * 480 + 8 + 16  # the image's chunk tail and the gain chunk


def test_no_port_no_register_reads():
    nm = NodeMap(wrap(reg("IntReg", "R", 0)), None)
    with pytest.raises(GenicamError, match="no port"):
        nm.get("R")


@given(st.binary(max_size=300))
def test_garbage_xml_raises_genicam_errors_only(data):
    try:
        NodeMap(data, MemPort())
    except GenicamError:
        pass


def test_an_unknown_encoding_is_a_genicam_error():
    with pytest.raises(GenicamError, match="foo"):
        NodeMap(b'<?xml version="1.0" encoding="foo"?><RegisterDescription/>')


# -- the XML's URL and zip ----------------------------------------------------------------------


@pytest.mark.parametrize("url, out", [
    ("Local:arv-fake-camera.xml;10000;3e68", ("local", "arv-fake-camera.xml", 0x10000, 0x3E68)),
    ("Local:///cam.zip;0x100000;1A2b?SchemaVersion=1.1.0", ("local", "cam.zip", 0x100000, 0x1A2B)),
    ("File:///opt/cam.xml", ("file", "///opt/cam.xml", 0, 0)),
])
def test_xml_urls(url, out):
    u = parse_xml_url(url)
    assert (u.scheme, u.filename, u.address, u.length) == out


@pytest.mark.parametrize("url", ["", "cam.xml", "Local:cam.xml;10000", "Local:cam.xml;zz;10", "Local:c.xml;0;0"])
def test_bad_xml_urls(url):
    with pytest.raises(GenicamError):
        parse_xml_url(url)


def test_zipped_xml_is_unzipped_and_plain_padding_stripped():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("cam.xml", b"<RegisterDescription/>")
    assert xml_from_bytes(buf.getvalue(), zipped=True) == b"<RegisterDescription/>"
    assert xml_from_bytes(b"<x/>\0\0\0", zipped=False) == b"<x/>"
    with pytest.raises(GenicamError, match="zip"):
        xml_from_bytes(b"PK not really", zipped=True)


def test_enum_float_constant_reads():
    nm = NodeMap(wrap('<Float Name="F"><Value>2.5</Value></Float><String Name="S"><Value>abc</Value></String>'))
    assert nm.get("F") == 2.5 and nm.get("S") == "abc"
    assert math.isclose(evaluate_formula("F * 2", {"F": nm.get("F")}), 5.0)
