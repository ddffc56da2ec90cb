"""Loading a configuration: TOML (``tomllib``) into the frozen dataclasses of
:mod:`cellcal.daemon.config.schema`, keys converted to SI, unknown keys rejected, every
error under its dotted path; then the checks of :mod:`cellcal.daemon.config.checks`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, get_type_hints

from cellcal.daemon.config.camera import load_camera_target
from cellcal.daemon.config.checks import _check_zmq, _validate, check_measure_kind
from cellcal.daemon.config.errors import ConfigError
from cellcal.daemon.config.schema import (
    _CHOICES,
    _INT_LISTS,
    _LIST_OF,
    _MAX_CONFIG_BYTES,
    _MAX_LIST,
    _MAX_OPTION_DEPTH,
    _MAX_POINTS,
    _MAX_STRING,
    _MIXED_SCALES,
    _POINT_LISTS,
    _STR_LISTS,
    SUPPORTED_CONFIG_VERSIONS,
    Config,
    _check_bound,
    _depth,
    _finite,
    _near,
    _show,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: A section's class (a dataclass of the schema).
_Section = TypeVar("_Section", bound="DataclassInstance")


def _typename(t: object) -> str:
    names: dict[object, str] = {float: "a number", int: "an integer", str: "a string", bool: "true or false",
                                list: "an array", dict: "a table"}
    return names.get(t, getattr(t, "__name__", str(t)))


def _convert(cls: type, fname: str, ftype: object, value: object, scale: float, path: str) -> object:
    """``value`` from the TOML as the field's type ``ftype`` wants it (SI: times ``scale``),
    checked against its bounds, choices and sizes; ConfigError under ``path``."""
    if typing.get_origin(ftype) in (typing.Union, types.UnionType):
        # ``X | None``: an optional key (TOML has no null, so a value given is an X)
        ftype = next(a for a in typing.get_args(ftype) if a is not type(None))
    # ``list[float]``, ``dict[str, object]``: a list or table (the elements' types and units
    # are the tables' below: _LIST_OF, _INT_LISTS, ...)
    base = typing.get_origin(ftype) or ftype
    if dataclasses.is_dataclass(ftype):
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a table, got {type(value).__name__}")
        # A field's annotation is a class, never an instance: is_dataclass said it is one.
        return _build(typing.cast(type, ftype), value, path)
    if ftype is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {_show(value)}")
        return value
    if ftype is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {_show(value)}")
        if not -(2**63) <= value < 2**63:
            raise ConfigError(path, f"does not fit a 64-bit integer ({len(str(abs(value)))} digits)")
        _check_bound(path, value)
        return value
    if ftype is float:
        x = _finite(value, path)
        _check_bound(path, x)
        return x * scale
    if ftype is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {_show(value)}")
        if len(value) > _MAX_STRING:
            raise ConfigError(path, f"at most {_MAX_STRING} characters, got {len(value)}")
        choices = _CHOICES.get((cls, fname))
        if choices and value not in choices:
            raise ConfigError(path, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return value
    if base is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a table, got {_show(value)}")
        for k, v in value.items():
            if _depth(v, _MAX_OPTION_DEPTH) > _MAX_OPTION_DEPTH:
                raise ConfigError(f"{path}.{k}", f"nested deeper than {_MAX_OPTION_DEPTH} tables/arrays")
        return dict(value)
    if base is list:
        if not isinstance(value, list):
            raise ConfigError(path, f"expected an array, got {_show(value)}")
        if len(value) > _MAX_LIST:
            raise ConfigError(path, f"at most {_MAX_LIST} entries, got {len(value)}")
        elem = _LIST_OF.get((cls, fname))
        if elem is not None:
            return [_convert(cls, fname, elem, v, 1.0, f"{path}[{i}]") for i, v in enumerate(value)]
        if (cls, fname) in _INT_LISTS:
            return [_convert(cls, fname, int, v, 1.0, f"{path}[{i}]") for i, v in enumerate(value)]
        width = _POINT_LISTS.get((cls, fname))
        if width is not None:
            if len(value) > _MAX_POINTS:
                raise ConfigError(path, f"at most {_MAX_POINTS} points, got {len(value)}")
            points = []
            for i, pt in enumerate(value):
                if not isinstance(pt, list) or len(pt) != width:
                    raise ConfigError(f"{path}[{i}]", f"expected an array of {width} numbers, got {_show(pt)}")
                points.append(_numbers(pt, scale, f"{path}[{i}]"))
            return points
        scales = _MIXED_SCALES.get((cls, fname))
        if scales is not None:
            if len(value) != len(scales):
                raise ConfigError(path, f"expected {len(scales)} numbers, got {len(value)}")
            return [x * k for x, k in zip(_numbers(value, 1.0, path), scales, strict=True)]
        if (cls, fname) in _STR_LISTS:
            return [_convert(cls, fname, str, v, 1.0, f"{path}[{i}]") for i, v in enumerate(value)]
        return _numbers(value, scale, path)
    raise ConfigError(path, f"unsupported type {ftype!r}")  # a schema bug, not a user error


def _numbers(value: list[object], scale: float, path: str) -> list[float]:
    """An array of numbers with the unit of ``path`` (each within its bounds) in SI."""
    out = []
    for i, v in enumerate(value):
        x = _finite(v, f"{path}[{i}]")
        _check_bound(f"{path}[{i}]", x)
        out.append(x * scale)
    return out


def _build(cls: type[_Section], table: Mapping[str, object], prefix: str) -> _Section:
    hints = get_type_hints(cls)
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs: dict[str, object] = {}
    for k, v in table.items():
        path = f"{prefix}.{k}" if prefix else k
        f = by_key.get(k)
        if f is None:
            hint = _near(k, by_key)
            raise ConfigError(path, "unknown key" + (f" (did you mean {hint!r}?)" if hint else ""))
        kwargs[f.name] = _convert(cls, f.name, hints[f.name], v, f.metadata.get("scale", 1.0), path)
    return cls(**kwargs)



def load_config_text(text: str, *, source: str = "<string>", overrides: Mapping[str, object] | None = None) -> Config:
    """Parse and validate TOML text into a :class:`Config` (SI units).

    Every check that needs no file, device or socket is made here, the ``[zmq]`` security
    rules included (:func:`cellcal.daemon.config.security.check_security`), and the measurement
    kind against the instrument the tracker URL names (:func:`check_measure_kind`);
    :func:`preflight` adds the rest of what ``cellcal run`` checks before it starts.

    Parameters
    ----------
    overrides : mapping, optional
        TOML keys (nested tables, the file's units) merged over the file's before anything
        is checked, so they are checked exactly as if the file said them (``cellcal demo``
        sets its simulated instrument's ``[tracker]`` keys this way). ``sha256`` then covers
        the text and the overrides.

    Raises
    ------
    ConfigError
        Naming ``source`` and the dotted key (empty for the file as a whole: not TOML, too
        big, nested too deep), never another exception.
    """
    if len(text) > _MAX_CONFIG_BYTES:
        raise ConfigError("", f"larger than {_MAX_CONFIG_BYTES} bytes; this is not a cellcal configuration", file=source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}", file=source) from exc
    except RecursionError:
        raise ConfigError("", "not valid TOML for cellcal: tables or arrays nested too deep", file=source) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (int() refuses it)
        raise ConfigError("", f"not valid TOML: {str(exc)[:200]}", file=source) from None
    if overrides:
        raw = _merged(raw, overrides)
    if "config_version" not in raw:
        raise ConfigError("config_version", f"missing (this build reads {SUPPORTED_CONFIG_VERSIONS})", file=source)
    try:
        cfg = _build(Config, raw, "")
        _validate(cfg)
        check_measure_kind(cfg.tracker)
        _check_zmq(cfg)
        # [camera] target_file: read and checked now, its sha256 kept (ADR 0030)
        cfg = dataclasses.replace(cfg, camera=load_camera_target(cfg.camera, source))
    except ConfigError as exc:
        raise exc.with_file(source) from None
    data = text.encode("utf-8", "surrogatepass")
    if overrides:
        data += b"\n# overrides " + json.dumps(overrides, sort_keys=True, default=str).encode()
    digest = hashlib.sha256(data).hexdigest()
    return dataclasses.replace(cfg, sha256=digest, source=source)


def _merged(base: dict[str, object], over: Mapping[str, object]) -> dict[str, object]:
    """``base`` with ``over`` merged in, table by table (a scalar or array replaces)."""
    out = dict(base)
    for k, v in over.items():
        cur = out.get(k)
        out[k] = _merged(cur, v) if isinstance(v, Mapping) and isinstance(cur, dict) else v
    return out


def load_config(path: str | Path, *, overrides: Mapping[str, object] | None = None) -> Config:
    """Read a TOML file; errors name the file and the dotted key path (``overrides``: as
    :func:`load_config_text`)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read: {exc}", file=str(path)) from exc
    return load_config_text(text, source=str(path), overrides=overrides)


#: Where ``cellcal run`` (and ``ctl``, ``watch``) look for the configuration when neither
#: ``--config`` nor ``$CELLCAL_CONFIG`` names one (the systemd unit's path).
DEFAULT_CONFIG_PATH = "/etc/cellcal/cellcal.toml"


#: The environment variable naming the configuration file.
CONFIG_ENV = "CELLCAL_CONFIG"


def find_config(explicit: str | None, *, environ: Mapping[str, str] | None = None,
                default: str = DEFAULT_CONFIG_PATH) -> tuple[str | None, list[str]]:
    """The configuration file a command uses, the way ``cellcal run`` finds it.

    In order: ``explicit`` (``--config``), then ``$CELLCAL_CONFIG``, then ``default`` if
    that file exists. A path given explicitly or by the environment is returned whether or
    not it exists (loading it then says why it cannot be read).

    Returns
    -------
    (path or None, tried)
        ``tried``: what was looked at, in order, for people ("--config not given", ...);
        ``path`` None when nothing named a file and ``default`` does not exist.
    """
    env = os.environ if environ is None else environ
    if explicit:
        return explicit, [f"--config {explicit}"]
    tried = ["--config not given"]
    named = env.get(CONFIG_ENV, "")
    if named:
        return named, [*tried, f"${CONFIG_ENV}={named}"]
    tried.append(f"${CONFIG_ENV} not set")
    if Path(default).is_file():
        return default, [*tried, default]
    tried.append(f"{default} (no such file)")
    return None, tried


def as_toml_dict(obj: DataclassInstance) -> dict[str, object]:
    """The dataclass as a plain dict of SI values (for ``check-config`` to print)."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(obj):
        if f.metadata.get("internal"):
            continue
        v = getattr(obj, f.name)
        # (a field's value is an instance, never a class: is_dataclass of it is of an instance)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = as_toml_dict(v)
        elif isinstance(v, list):
            v = [as_toml_dict(x) if dataclasses.is_dataclass(x) and not isinstance(x, type) else x for x in v]
        out[f.name] = v
    return out
