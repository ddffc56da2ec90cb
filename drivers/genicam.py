"""A small GenICam (GenApi) node-map reader: the features a calibration camera needs.

A GigE Vision device describes its features in an XML file it serves from its own memory;
the first URL register names where (``Local:name.xml;address;length``, or a ``.zip``
holding that file). :func:`parse_xml_url` reads the URL, :func:`xml_from_bytes` unzips, and
:class:`NodeMap` reads the nodes and gives feature access over a :class:`Port` (the
device's register space; the driver's is GVCP READMEM/WRITEMEM).

What is interpreted (``docs/protocols/gige.md`` lists it with what is refused):

* value nodes ``Integer``, ``Float``, ``Enumeration`` (with ``EnumEntry``), ``Command``,
  ``Boolean``, ``String`` (a constant);
* register nodes ``IntReg``, ``MaskedIntReg`` (``LSB``/``MSB`` or ``Bit``), ``FloatReg``
  (4 or 8 bytes), ``StringReg``, ``StructReg`` (each ``StructEntry`` becomes a masked
  register of its own name), with ``Address``, ``pAddress``, ``pIndex`` (``Offset`` or
  ``pOffset``), ``Length``, ``AccessMode``, ``Sign`` and ``Endianess`` (the schema's
  default, little-endian, where absent);
* ``pValue`` / ``pMin`` / ``pMax`` / ``pInc`` indirection wherever a value may be a
  literal or a node;
* ``Converter`` / ``IntConverter`` (``FormulaTo`` / ``FormulaFrom`` with ``pVariable``) and
  ``SwissKnife`` / ``IntSwissKnife`` (``Formula``), through our own evaluator of the GenApi
  formula grammar (arithmetic, bit, comparison and logical operators, ``?:``, ``**`` and the
  functions ``SIN`` ... ``ROUND``).

No caching: every read goes to the device, so what is returned is what the device holds.
A feature that depends on anything else (a chunk port, a URL other than ``Local:``, a node
kind not listed) raises :class:`FeatureUnsupportedError` naming the feature and the node.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import re
import struct
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from cellcal.drivers.errors import DriverError

__all__ = [
    "GenicamError",
    "FeatureNotFoundError",
    "FeatureUnsupportedError",
    "FeatureAccessError",
    "Port",
    "XmlUrl",
    "parse_xml_url",
    "xml_from_bytes",
    "NodeMap",
    "evaluate_formula",
]

log = logging.getLogger(__name__)

#: Largest XML we accept from a device (zipped or not): a few MB in practice.
MAX_XML_BYTES = 16 * 1024 * 1024


class GenicamError(DriverError):
    """The node map could not be read or a feature could not be interpreted."""


class FeatureNotFoundError(GenicamError, KeyError):
    """The device has no feature of that name (also a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FeatureUnsupportedError(GenicamError):
    """A feature depends on something this reader does not interpret; the message names
    the feature and the node."""


class FeatureAccessError(GenicamError):
    """Writing a read-only feature or reading a write-only one."""


class Port(Protocol):
    """A device's register space (big or little-endian is the nodes' business)."""

    def read(self, address: int, length: int) -> bytes: ...

    def write(self, address: int, data: bytes) -> None: ...


# -- the XML's URL ---------------------------------------------------------------------------


@dataclass(frozen=True)
class XmlUrl:
    """A parsed GenICam XML URL: only ``Local:`` (the device's own memory) is fetched."""

    scheme: str
    filename: str
    address: int = 0
    length: int = 0

    @property
    def zipped(self) -> bool:
        return self.filename.lower().endswith(".zip")


def parse_xml_url(url: str) -> XmlUrl:
    """Parse ``Local:[///]name.xml;address;length[?SchemaVersion=...]`` (address and length
    in hex, with or without ``0x``).

    Raises
    ------
    GenicamError
        An empty or malformed URL; a ``File:`` or ``http:`` URL is parsed but has no address.
    """
    text = url.strip()
    scheme, sep, rest = text.partition(":")
    if not sep or not scheme:
        raise GenicamError(f"GenICam XML URL {url!r}: no scheme")
    if scheme.lower() != "local":
        return XmlUrl(scheme.lower(), rest)
    rest = rest.lstrip("/").split("?", 1)[0]
    parts = rest.split(";")
    if len(parts) != 3:
        raise GenicamError(f"GenICam XML URL {url!r}: expected Local:name;address;length")
    try:
        address, length = int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        raise GenicamError(f"GenICam XML URL {url!r}: address or length is not hexadecimal") from None
    if not 0 < length <= MAX_XML_BYTES:
        raise GenicamError(f"GenICam XML URL {url!r}: length {length} outside (0, {MAX_XML_BYTES}]")
    return XmlUrl("local", parts[0], address, length)


def xml_from_bytes(raw: bytes, *, zipped: bool) -> bytes:
    """The XML document in ``raw`` (the first ``.xml`` member of a zip if ``zipped``)."""
    raw = bytes(raw)
    if not zipped:
        return raw.rstrip(b"\0")  # a device may pad the file to its register width
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            names = [n for n in zf.namelist() if n.lower().endswith(".xml")]
            if not names:
                raise GenicamError("GenICam zip holds no .xml file")
            info = zf.getinfo(names[0])
            if info.file_size > MAX_XML_BYTES:
                raise GenicamError(f"GenICam XML of {info.file_size} bytes is larger than {MAX_XML_BYTES}")
            return zf.read(info)
    except zipfile.BadZipFile as exc:
        raise GenicamError(f"GenICam zip does not open: {exc}") from exc


# -- formulas --------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9a-fA-F]+|\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)"
    r"|(?P<op>\*\*|<<|>>|<=|>=|<>|&&|\|\||[-+*/%&|^~!=<>?:(),]))"
)
# binary operators: precedence (higher binds tighter), right-associative?
_BINARY: dict[str, tuple[int, bool]] = {
    "||": (1, False), "&&": (2, False), "|": (3, False), "^": (4, False), "&": (5, False),
    "=": (6, False), "<>": (6, False), "<": (7, False), ">": (7, False), "<=": (7, False), ">=": (7, False),
    "<<": (8, False), ">>": (8, False), "+": (9, False), "-": (9, False),
    "*": (10, False), "/": (10, False), "%": (10, False), "**": (12, True),
}
_FUNCS: dict[str, Callable[[float], float]] = {
    "SIN": math.sin, "COS": math.cos, "TAN": math.tan, "ASIN": math.asin, "ACOS": math.acos,
    "ATAN": math.atan, "ABS": abs, "EXP": math.exp, "LN": math.log, "LG": math.log10,
    "SQRT": math.sqrt, "TRUNC": math.trunc, "FLOOR": math.floor, "CEIL": math.ceil,
    "ROUND": lambda x: math.floor(x + 0.5), "SGN": lambda x: (x > 0) - (x < 0), "NEG": lambda x: -x,
}
_CONSTS = {"PI": math.pi, "E": math.e}


def _tokens(formula: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = formula.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise FeatureUnsupportedError(f"formula {formula!r}: cannot read {text[pos:pos + 10]!r} at {pos}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _arith(op: str, a: Any, b: Any, integer: bool) -> Any:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise ZeroDivisionError("division by zero")
        if integer and isinstance(a, int) and isinstance(b, int):
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        return a / b
    if op == "%":
        if b == 0:
            raise ZeroDivisionError("modulo by zero")
        return math.fmod(a, b) if not (isinstance(a, int) and isinstance(b, int)) else int(math.fmod(a, b))
    if op == "**":
        return a**b
    if op in ("&", "|", "^", "<<", ">>"):
        a, b = int(a), int(b)
        return {"&": a & b, "|": a | b, "^": a ^ b, "<<": a << b, ">>": a >> b}[op]
    if op == "=":
        return int(a == b)
    if op == "<>":
        return int(a != b)
    if op == "<":
        return int(a < b)
    if op == ">":
        return int(a > b)
    if op == "<=":
        return int(a <= b)
    if op == ">=":
        return int(a >= b)
    if op == "&&":
        return int(bool(a) and bool(b))
    if op == "||":
        return int(bool(a) or bool(b))
    raise FeatureUnsupportedError(f"operator {op!r}")


class _Parser:
    """Pratt parser evaluating as it goes (a formula is small and evaluated once per read)."""

    def __init__(self, formula: str, variables: Mapping[str, Any], integer: bool) -> None:
        self.formula = formula
        self.toks = _tokens(formula)
        self.i = 0
        self.vars = variables
        self.integer = integer

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise FeatureUnsupportedError(f"formula {self.formula!r} ends too early")
        self.i += 1
        return tok

    def expect(self, op: str) -> None:
        kind, text = self.take()
        if kind != "op" or text != op:
            raise FeatureUnsupportedError(f"formula {self.formula!r}: expected {op!r}, got {text!r}")

    def parse(self) -> Any:
        value = self.ternary()
        if self.peek() is not None:
            raise FeatureUnsupportedError(f"formula {self.formula!r}: unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return value

    def ternary(self) -> Any:
        cond = self.binary(0)
        tok = self.peek()
        if tok == ("op", "?"):
            self.take()
            a = self.ternary()
            self.expect(":")
            b = self.ternary()
            return a if cond else b
        return cond

    def binary(self, min_prec: int) -> Any:
        left = self.unary()
        while True:
            tok = self.peek()
            if tok is None or tok[0] != "op" or tok[1] not in _BINARY:
                return left
            prec, right_assoc = _BINARY[tok[1]]
            if prec < min_prec:
                return left
            self.take()
            right = self.binary(prec if right_assoc else prec + 1)
            left = _arith(tok[1], left, right, self.integer)

    def unary(self) -> Any:
        kind, text = self.take()
        if kind == "op" and text == "-":
            return -self.binary(11)
        if kind == "op" and text == "+":
            return self.binary(11)
        if kind == "op" and text == "~":
            return ~int(self.binary(11))
        if kind == "op" and text == "!":
            return int(not self.binary(11))
        if kind == "op" and text == "(":
            value = self.ternary()
            self.expect(")")
            return value
        if kind == "num":
            if text[:2].lower() == "0x":
                return int(text, 16)
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "name":
            up = text.upper()
            if up in _FUNCS and self.peek() == ("op", "("):
                self.take()
                arg = self.ternary()
                self.expect(")")
                return _FUNCS[up](arg)
            if text in self.vars:
                return self.vars[text]
            if up in _CONSTS:
                return _CONSTS[up]
            raise FeatureUnsupportedError(f"formula {self.formula!r}: unknown name {text!r}")
        raise FeatureUnsupportedError(f"formula {self.formula!r}: unexpected {text!r}")


def evaluate_formula(formula: str, variables: Mapping[str, Any] | None = None, *, integer: bool = False) -> Any:
    """Evaluate a GenApi formula with ``variables`` (name -> number).

    ``integer`` gives integer division truncating toward zero (``IntSwissKnife``,
    ``IntConverter``). Raises :class:`FeatureUnsupportedError` for what it cannot read, and
    ``ZeroDivisionError`` / ``ValueError`` / ``OverflowError`` from the arithmetic.
    """
    return _Parser(formula, variables or {}, integer).parse()


# -- nodes -----------------------------------------------------------------------------------

_VALUE_KINDS = {"Integer", "Float", "Enumeration", "Command", "Boolean", "String"}
_REG_KINDS = {"IntReg", "MaskedIntReg", "FloatReg", "StringReg"}
_MATH_KINDS = {"Converter", "IntConverter", "SwissKnife", "IntSwissKnife"}
_KNOWN_KINDS = _VALUE_KINDS | _REG_KINDS | _MATH_KINDS | {"Category", "Port", "Register"}


@dataclass
class _Node:
    kind: str
    name: str
    el: ET.Element
    props: dict[str, list[ET.Element]] = field(default_factory=dict)

    def text(self, tag: str) -> str | None:
        els = self.props.get(tag)
        if not els:
            return None
        return (els[0].text or "").strip()

    def all(self, tag: str) -> list[ET.Element]:
        return self.props.get(tag, [])


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _int_literal(text: str, where: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise FeatureUnsupportedError(f"{where}: {text!r} is not a number") from None
        if not value.is_integer():
            raise FeatureUnsupportedError(f"{where}: {text!r} is not an integer") from None
        return int(value)


class NodeMap:
    """The features of one device, read from its GenICam XML.

    Parameters
    ----------
    xml : bytes or str
        The XML document (already unzipped).
    port : Port, optional
        The device's register space; without one, only constant nodes can be read.

    Raises
    ------
    GenicamError
        The XML does not parse or is not a GenICam ``RegisterDescription``.
    """

    def __init__(self, xml: bytes | str, port: Port | None = None) -> None:
        try:
            root = ET.fromstring(xml)
        except (ET.ParseError, LookupError, ValueError) as exc:  # LookupError: an unknown encoding
            raise GenicamError(f"GenICam XML does not parse: {exc}") from exc
        if _local(root.tag) != "RegisterDescription":
            raise GenicamError(f"GenICam XML root is <{_local(root.tag)}>, not <RegisterDescription>")
        self.port = port
        self.vendor = root.get("VendorName", "")
        self.model = root.get("ModelName", "")
        self.schema = f"{root.get('SchemaMajorVersion', '?')}.{root.get('SchemaMinorVersion', '?')}"
        self._nodes: dict[str, _Node] = {}
        self._chunks: Mapping[int, bytes] | None = None
        self._read(root)

    # -- building -------------------------------------------------------------------------
    def _read(self, parent: ET.Element) -> None:
        for el in parent:
            kind = _local(el.tag)
            if kind == "Group":  # a grouping of nodes for editors, nothing more
                self._read(el)
                continue
            if kind == "StructReg":
                self._struct(el)
                continue
            name = el.get("Name")
            if not name:
                continue
            node = _Node(kind, name, el)
            for child in el:
                node.props.setdefault(_local(child.tag), []).append(child)
            self._nodes[name] = node

    def _struct(self, el: ET.Element) -> None:
        shared = [c for c in el if _local(c.tag) != "StructEntry"]
        for entry in el:
            if _local(entry.tag) != "StructEntry" or not entry.get("Name"):
                continue
            node = _Node("MaskedIntReg", entry.get("Name", ""), entry)
            for child in [*shared, *entry]:
                node.props.setdefault(_local(child.tag), []).append(child)
            self._nodes[node.name] = node

    @contextlib.contextmanager
    def chunk_data(self, chunks: Mapping[int, bytes]) -> Iterator[None]:
        """Within the block, features on a chunk port (a ``Port`` with a ``ChunkID``) read
        from ``chunks`` (chunk id -> that chunk's bytes, one frame's)."""
        previous, self._chunks = self._chunks, chunks
        try:
            yield
        finally:
            self._chunks = previous

    # -- introspection --------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def names(self) -> Iterator[str]:
        return iter(self._nodes)

    def kind(self, name: str) -> str:
        """The node's element name (``"Float"``, ``"Enumeration"``, ...)."""
        return self._node(name).kind

    def enum_entries(self, name: str) -> dict[str, int]:
        """An ``Enumeration``'s entries, name -> value."""
        node = self._node(name, "Enumeration")
        out: dict[str, int] = {}
        for e in node.all("EnumEntry"):
            vals = [c for c in e if _local(c.tag) == "Value"]
            if e.get("Name") and vals:
                out[e.get("Name", "")] = _int_literal((vals[0].text or "").strip(), f"{name}.{e.get('Name')}")
        return out

    def unit(self, name: str) -> str:
        return self._node(name).text("Unit") or ""

    def range(self, name: str) -> tuple[float | int | None, float | int | None]:
        """``(min, max)`` of an ``Integer`` or ``Float`` (None where the node gives none)."""
        node = self._node(name)
        return self._bound(node, "Min"), self._bound(node, "Max")

    # -- feature access -------------------------------------------------------------------
    def get(self, name: str) -> Any:
        """The feature's current value: int, float, str (enumeration entry, string), bool."""
        try:
            return self._get(self._node(name))
        except (ZeroDivisionError, ValueError, OverflowError) as exc:
            raise FeatureUnsupportedError(f"feature {name!r}: its formula fails: {exc}") from exc

    def set(self, name: str, value: Any) -> None:
        """Write ``value`` (checked against the node's range and increment, an enumeration's
        entries, a command's or register's access mode).

        Raises
        ------
        ValueError
            The value is outside the feature's range, not an entry, or of the wrong type.
        FeatureAccessError
            The feature is read-only.
        """
        self._set(self._node(name), value)

    def execute(self, name: str) -> None:
        """Run a ``Command`` (write its ``CommandValue``)."""
        node = self._node(name, "Command")
        value = self._value(node, "CommandValue", default=None)
        if value is None:
            raise FeatureUnsupportedError(f"command {name!r} has no CommandValue")
        self._write_int(self._ref(node, "pValue"), int(value))

    # -- internals: nodes -----------------------------------------------------------------
    def _node(self, name: str, kind: str | None = None) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            raise FeatureNotFoundError(f"the device has no feature {name!r}")
        if kind is not None and node.kind != kind:
            raise GenicamError(f"feature {name!r} is a {node.kind}, not a {kind}")
        if node.kind not in _KNOWN_KINDS:
            raise FeatureUnsupportedError(f"feature {name!r}: node kind {node.kind} is not interpreted")
        return node

    def _ref(self, node: _Node, tag: str) -> _Node:
        target = node.text(tag)
        if not target:
            raise FeatureUnsupportedError(f"feature {node.name!r} ({node.kind}) has no {tag}")
        if target not in self._nodes:
            raise FeatureUnsupportedError(f"feature {node.name!r}: {tag} names {target!r}, which the XML lacks")
        return self._node(target)

    def _value(self, node: _Node, tag: str, default: Any = None) -> Any:
        """A property given as a literal ``<tag>`` or as a node ``<p{tag}>``."""
        ref = node.text("p" + tag)
        if ref:
            return self._get(self._ref(node, "p" + tag))
        text = node.text(tag)
        if text is None or text == "":
            return default
        if node.kind in ("Float", "SwissKnife", "Converter", "FloatReg"):
            try:
                return float(text)
            except ValueError:
                raise FeatureUnsupportedError(f"feature {node.name!r}: {tag} {text!r} is not a number") from None
        if tag == "Value" and node.kind == "String":
            return text
        try:
            return _int_literal(text, f"feature {node.name!r} {tag}")
        except FeatureUnsupportedError:
            return float(text)

    def _bound(self, node: _Node, tag: str) -> Any:
        if node.kind in ("Integer", "Float"):
            value = self._value(node, tag)
            if value is None and node.text("pValue"):
                # Registers have their own bounds only by their length; a converter or
                # swiss knife gives none.
                return None
            return value
        return None

    def _vars(self, node: _Node) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for el in node.all("pVariable"):
            var, target = el.get("Name", ""), (el.text or "").strip()
            if not var or target not in self._nodes:
                raise FeatureUnsupportedError(f"feature {node.name!r}: pVariable {var!r} names {target!r}")
            tnode = self._node(target)
            if tnode.kind == "Enumeration":  # in a formula an enumeration is its integer value
                out[var] = int(self._get(self._ref(tnode, "pValue")))
            else:
                out[var] = self._numeric(self._get(tnode), target)
        for el in node.all("Constant"):
            if el.get("Name"):
                out[el.get("Name", "")] = float((el.text or "0").strip())
        return out

    @staticmethod
    def _numeric(value: Any, name: str) -> Any:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, int | float):
            return value
        raise FeatureUnsupportedError(f"{name!r} is used in a formula but is not a number ({value!r})")

    def _get(self, node: _Node) -> Any:
        kind = node.kind
        if kind == "Integer":
            return int(self._value(node, "Value", default=0) or 0)
        if kind == "Float":
            return float(self._value(node, "Value", default=0.0) or 0.0)
        if kind == "String":
            return self._value(node, "Value", default="")
        if kind == "Enumeration":
            raw = int(self._get(self._ref(node, "pValue")))
            for entry, value in self.enum_entries(node.name).items():
                if value == raw:
                    return entry
            raise GenicamError(f"enumeration {node.name!r} holds {raw}, which is none of its entries")
        if kind == "Boolean":
            raw = int(self._get(self._ref(node, "pValue")))
            on = int(self._value(node, "OnValue", default=1))
            return raw == on
        if kind == "Command":
            raise FeatureAccessError(f"command {node.name!r} has no value: execute it")
        if kind in _REG_KINDS:
            return self._read_reg(node)
        if kind in ("SwissKnife", "IntSwissKnife"):
            formula = node.text("Formula")
            if formula is None:
                raise FeatureUnsupportedError(f"feature {node.name!r} has no Formula")
            out = evaluate_formula(formula, self._vars(node), integer=kind == "IntSwissKnife")
            return int(out) if kind == "IntSwissKnife" else float(out)
        if kind in ("Converter", "IntConverter"):
            formula = node.text("FormulaFrom")
            if formula is None:
                raise FeatureUnsupportedError(f"feature {node.name!r} has no FormulaFrom")
            variables = self._vars(node)
            variables["TO"] = self._numeric(self._get(self._ref(node, "pValue")), node.name)
            out = evaluate_formula(formula, variables, integer=kind == "IntConverter")
            return int(out) if kind == "IntConverter" else float(out)
        raise FeatureUnsupportedError(f"feature {node.name!r}: a {kind} has no value")

    def _set(self, node: _Node, value: Any) -> None:
        kind = node.kind
        if kind == "Integer":
            v = _as_int(value, node.name)
            lo, hi, inc = self._value(node, "Min"), self._value(node, "Max"), self._value(node, "Inc", default=1)
            if lo is not None and v < lo or hi is not None and v > hi:
                raise ValueError(f"feature {node.name!r}: {v} outside [{lo}, {hi}]")
            if inc and lo is not None and (v - int(lo)) % int(inc):
                raise ValueError(f"feature {node.name!r}: {v} is not {lo} + a multiple of {inc}")
            if not node.text("pValue"):
                raise FeatureAccessError(f"feature {node.name!r} is a constant")
            self._set(self._ref(node, "pValue"), v)
            return
        if kind == "Float":
            fv = _as_float(value, node.name)
            lo, hi = self._value(node, "Min"), self._value(node, "Max")
            if lo is not None and fv < lo or hi is not None and fv > hi:
                raise ValueError(f"feature {node.name!r}: {fv} outside [{lo}, {hi}]")
            if not node.text("pValue"):
                raise FeatureAccessError(f"feature {node.name!r} is a constant")
            target = self._ref(node, "pValue")
            self._set(target, fv if target.kind in ("Float", "FloatReg", "Converter") else round(fv))
            return
        if kind == "Enumeration":
            entries = self.enum_entries(node.name)
            if not isinstance(value, str) or value not in entries:
                raise ValueError(f"feature {node.name!r}: {value!r} is not one of {', '.join(entries)}")
            self._write_int(self._ref(node, "pValue"), entries[value])
            return
        if kind == "Boolean":
            if not isinstance(value, bool):
                raise ValueError(f"feature {node.name!r}: expected True or False, got {value!r}")
            raw = self._value(node, "OnValue" if value else "OffValue", default=int(value))
            self._write_int(self._ref(node, "pValue"), int(raw))
            return
        if kind in ("IntReg", "MaskedIntReg"):
            self._write_int(node, _as_int(value, node.name))
            return
        if kind == "FloatReg":
            self._write_float(node, _as_float(value, node.name))
            return
        if kind == "StringReg":
            if not isinstance(value, str):
                raise ValueError(f"feature {node.name!r}: expected a string")
            length = self._length(node)
            raw = value.encode("ascii", errors="strict")
            if len(raw) >= length:
                raise ValueError(f"feature {node.name!r}: {len(raw)} bytes do not fit its {length}")
            self._port_write(node, self._address(node), raw.ljust(length, b"\0"))
            return
        if kind in ("Converter", "IntConverter"):
            formula = node.text("FormulaTo")
            if formula is None:
                raise FeatureUnsupportedError(f"feature {node.name!r} has no FormulaTo")
            variables = self._vars(node)
            variables["FROM"] = _as_float(value, node.name)
            try:
                raw = evaluate_formula(formula, variables, integer=kind == "IntConverter")
            except (ZeroDivisionError, ValueError, OverflowError) as exc:
                raise ValueError(f"feature {node.name!r}: {value!r} does not convert: {exc}") from exc
            target = self._ref(node, "pValue")
            self._set(target, float(raw) if target.kind in ("Float", "FloatReg") else round(raw))
            return
        raise FeatureAccessError(f"feature {node.name!r} ({kind}) cannot be written")

    # -- internals: registers --------------------------------------------------------------
    def _port_of(self, node: _Node) -> Port:
        port_name = node.text("pPort")
        port_node = self._nodes.get(port_name or "")
        if port_node is None or port_node.kind != "Port":
            raise FeatureUnsupportedError(f"feature {node.name!r}: pPort {port_name!r} is not a Port of the XML")
        if port_node.text("pChunkID") is not None:
            raise FeatureUnsupportedError(f"feature {node.name!r}: a chunk port with pChunkID ({port_name})")
        chunk_id = port_node.text("ChunkID")
        if chunk_id is not None:
            if self._chunks is None:
                raise FeatureUnsupportedError(
                    f"feature {node.name!r} lives in chunk data ({port_name}): read it inside chunk_data()")
            try:
                cid = int(chunk_id, 16)
            except ValueError:
                raise FeatureUnsupportedError(f"feature {node.name!r}: ChunkID {chunk_id!r} is not hexadecimal") from None
            if cid not in self._chunks:
                raise GenicamError(f"feature {node.name!r}: chunk 0x{cid:X} is not in this frame")
            return _BytesPort(self._chunks[cid])
        if self.port is None:
            raise GenicamError(f"feature {node.name!r} needs the device: this node map has no port")
        return self.port

    def _address(self, node: _Node) -> int:
        total = 0
        found = False
        for el in node.all("Address"):
            total += _int_literal((el.text or "").strip(), f"feature {node.name!r} Address")
            found = True
        for el in node.all("pAddress"):
            target = (el.text or "").strip()
            total += int(self._get(self._node(target)))
            found = True
        for el in node.all("pIndex"):
            index = int(self._get(self._node((el.text or "").strip())))
            if el.get("Offset") is not None:
                offset = _int_literal(el.get("Offset", ""), f"feature {node.name!r} pIndex Offset")
            elif el.get("pOffset") is not None:
                offset = int(self._get(self._node(el.get("pOffset", ""))))
            else:
                raise FeatureUnsupportedError(f"feature {node.name!r}: pIndex without Offset")
            total += index * offset
        if node.all("IntSwissKnife"):
            raise FeatureUnsupportedError(f"feature {node.name!r}: an address by inline IntSwissKnife")
        if not found:
            raise FeatureUnsupportedError(f"feature {node.name!r} ({node.kind}) has no Address")
        return total

    def _length(self, node: _Node) -> int:
        value = self._value(node, "Length")
        if value is None:
            raise FeatureUnsupportedError(f"feature {node.name!r} has no Length")
        return int(value)

    def _little(self, node: _Node) -> bool:
        return (node.text("Endianess") or "LittleEndian") != "BigEndian"

    def _port_read(self, node: _Node, address: int, length: int) -> bytes:
        if (node.text("AccessMode") or "RO") == "WO":
            raise FeatureAccessError(f"feature {node.name!r} is write-only")
        data = self._port_of(node).read(address, length)
        if len(data) != length:
            raise GenicamError(f"feature {node.name!r}: read {len(data)} bytes of {length}")
        return data

    def _port_write(self, node: _Node, address: int, data: bytes) -> None:
        if (node.text("AccessMode") or "RO") == "RO":
            raise FeatureAccessError(f"feature {node.name!r} is read-only")
        self._port_of(node).write(address, data)

    def _mask(self, node: _Node, length: int) -> tuple[int, int]:
        """``(shift, width)`` of a masked register's field, from ``LSB``/``MSB`` or ``Bit``."""
        nbits = 8 * length
        bit = node.text("Bit")
        lsb_t, msb_t = node.text("LSB"), node.text("MSB")
        if bit is not None:
            lsb = msb = _int_literal(bit, f"feature {node.name!r} Bit")
        elif lsb_t is not None and msb_t is not None:
            lsb, msb = _int_literal(lsb_t, "LSB"), _int_literal(msb_t, "MSB")
        else:
            raise FeatureUnsupportedError(f"feature {node.name!r}: a MaskedIntReg needs Bit or LSB and MSB")
        if self._little(node):
            shift, width = lsb, msb - lsb + 1
        else:  # big-endian registers number bit 0 as the most significant
            shift, width = nbits - 1 - lsb, lsb - msb + 1
        if width < 1 or shift < 0 or shift + width > nbits:
            raise FeatureUnsupportedError(f"feature {node.name!r}: bits LSB={lsb} MSB={msb} do not fit {nbits}")
        return shift, width

    def _read_reg(self, node: _Node) -> Any:
        address, length = self._address(node), self._length(node)
        if node.kind == "StringReg":
            return self._port_read(node, address, length).split(b"\0", 1)[0].decode("utf-8", errors="replace")
        if node.kind == "FloatReg":
            if length not in (4, 8):
                raise FeatureUnsupportedError(f"feature {node.name!r}: a FloatReg of {length} bytes")
            raw = self._port_read(node, address, length)
            fmt = ("<" if self._little(node) else ">") + ("f" if length == 4 else "d")
            return float(struct.unpack(fmt, raw)[0])
        if length not in (1, 2, 4, 8):
            raise FeatureUnsupportedError(f"feature {node.name!r}: an integer register of {length} bytes")
        raw = self._port_read(node, address, length)
        value = int.from_bytes(raw, "little" if self._little(node) else "big")
        signed = (node.text("Sign") or "Unsigned") == "Signed"
        width = 8 * length
        if node.kind == "MaskedIntReg":
            shift, width = self._mask(node, length)
            value = (value >> shift) & ((1 << width) - 1)
        if signed and value >> (width - 1):
            value -= 1 << width
        return value

    def _write_int(self, node: _Node, value: int) -> None:
        if node.kind in ("Integer", "Converter", "IntConverter", "Float"):
            self._set(node, value)
            return
        if node.kind not in ("IntReg", "MaskedIntReg"):
            raise FeatureUnsupportedError(f"feature {node.name!r}: cannot write an integer into a {node.kind}")
        address, length = self._address(node), self._length(node)
        if length not in (1, 2, 4, 8):
            raise FeatureUnsupportedError(f"feature {node.name!r}: an integer register of {length} bytes")
        order: Literal["little", "big"] = "little" if self._little(node) else "big"
        signed = (node.text("Sign") or "Unsigned") == "Signed"
        if node.kind == "MaskedIntReg":
            shift, width = self._mask(node, length)
            lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if signed else (0, (1 << width) - 1)
            if not lo <= value <= hi:
                raise ValueError(f"feature {node.name!r}: {value} does not fit {width} bits")
            # Read-modify-write: the other fields of the register keep their values.
            current = int.from_bytes(self._port_of(node).read(address, length), order)
            mask = ((1 << width) - 1) << shift
            raw = (current & ~mask) | ((value << shift) & mask)
            self._port_write(node, address, raw.to_bytes(length, order))
            return
        nbits = 8 * length
        lo, hi = (-(1 << (nbits - 1)), (1 << (nbits - 1)) - 1) if signed else (0, (1 << nbits) - 1)
        if not lo <= value <= hi:
            raise ValueError(f"feature {node.name!r}: {value} does not fit {length} bytes")
        self._port_write(node, address, (value % (1 << nbits)).to_bytes(length, order))

    def _write_float(self, node: _Node, value: float) -> None:
        address, length = self._address(node), self._length(node)
        if length not in (4, 8):
            raise FeatureUnsupportedError(f"feature {node.name!r}: a FloatReg of {length} bytes")
        fmt = ("<" if self._little(node) else ">") + ("f" if length == 4 else "d")
        self._port_write(node, address, struct.pack(fmt, value))


class _BytesPort:
    """One chunk's bytes as a read-only port (its addresses count from the chunk's start)."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)

    def read(self, address: int, length: int) -> bytes:
        if address < 0 or address + length > len(self.data):
            raise GenicamError(f"chunk of {len(self.data)} bytes has no bytes {address}..{address + length}")
        return self.data[address:address + length]

    def write(self, address: int, data: bytes) -> None:
        raise FeatureAccessError("chunk data is read-only")


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or isinstance(value, float) and not value.is_integer():
        raise ValueError(f"feature {name!r}: expected an integer, got {value!r}")
    return int(value)


def _as_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"feature {name!r}: expected a finite number, got {value!r}")
    return float(value)
