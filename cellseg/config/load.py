"""YAML → frozen dataclasses, strictly: `include:` deep-merge, dotted `key=value` overrides, round-trip dumps.

A config file is a mapping whose sections match `RunConfig`'s fields. `include: [a.yaml, b.yaml]` merges
the listed files (paths relative to the including file) left to right, then the file's own keys on top.
Overrides such as `train.lr=3e-4` or `data.classes=[mito,er]` are parsed as YAML values and may only set
keys that exist. Unknown keys and wrong types raise `ValueError` naming the dotted key and the valid
choices — there are no expressions, class paths or `$` references.

Example:
    >>> cfg = load_config("configs/smoke/unet_3d.yaml", ["data.root=/tmp/synth", "train.max_steps=2"])
    >>> print(dump_config(cfg))
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

T = TypeVar("T")


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge `top` into a copy of `base` (mappings merge, everything else is replaced)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config with its `include:` chain resolved (no dataclasses yet)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ValueError(f"{path}: include cycle through {' -> '.join(map(str, _seen))}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: invalid YAML ({err})") from None
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: a config file must be a mapping of sections, got {type(raw).__name__}")
    merged: dict[str, Any] = {}
    includes = raw.pop("include", []) or []
    for inc in [includes] if isinstance(includes, str) else includes:
        merged = deep_merge(merged, read_yaml(path.parent / inc, (*_seen, path)))
    return deep_merge(merged, raw)


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` strings (values parsed as YAML) to a nested mapping."""
    out = dict(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form key=value (e.g. train.lr=3e-4)")
        value = yaml.safe_load(text) if text else ""
        patch: dict[str, Any] = value
        for part in reversed(key.strip().split(".")):
            patch = {part: patch}
        out = deep_merge(out, patch)
    return out


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _form(tp: Any) -> str:
    """How a type reads in an error message: "an int", "'auto'", "a list", ..."""
    if get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    names = {int: "an int", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}
    if tp in names:
        return names[tp]
    if get_origin(tp) in (list, tuple):
        return "a list"
    if get_origin(tp) in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "a mapping"
    return _type_name(tp)


def convert_value(value: Any, tp: Any, key: str) -> Any:
    """Check and convert one value to the annotated type (YAML lists become tuples where declared)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for arg in options:
            try:
                return convert_value(value, arg, key)
            except ValueError as err:
                errors.append(str(err))
        if len(errors) == 1:
            raise ValueError(errors[0])
        forms = [_form(a) for a in options] + (["null"] if type(None) in args else [])
        accepted = f"neither {forms[0]} nor {forms[1]}" if len(forms) == 2 else f"none of {', '.join(forms)}"
        raise ValueError(f"{key}: {value!r} is {accepted}")
    if origin is Literal:
        if isinstance(value, bool) and ("on" if value else "off") in args:  # YAML 1.1 reads on/off as booleans
            value = "on" if value else "off"
        if value not in args:
            raise ValueError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, prefix=key)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError(f"{key}: expected {len(args)} values, got {len(value)} ({value!r})")
            return tuple(convert_value(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
        items = [convert_value(v, args[0] if args else Any, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp in (dict,):
        if not isinstance(value, Mapping):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): convert_value(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # PyYAML (YAML 1.1) reads `3e-4` as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp in (int, str, bool) and type(value) is tp:
        return value
    raise ValueError(f"{key}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def from_dict(cls: type[T], data: Any, *, prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{prefix or cls.__name__}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ValueError(f"unknown config key {where}{unknown[0]}; valid keys{' in ' + prefix if prefix else ''}: "
                         f"{', '.join(sorted(fields))}")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = convert_value(value, hints[name], f"{prefix}.{name}" if prefix else name)
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"missing required config key {prefix + '.' if prefix else ''}{missing[0]}")
    return cls(**kwargs)


def to_dict(obj: Any) -> Any:
    """Dataclasses → plain dicts/lists (tuples become lists) for YAML/JSON."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def load(cls: type[T], path: str | Path, overrides: Sequence[str] = ()) -> T:
    """Read `path` (with includes), apply overrides, build `cls` strictly."""
    return from_dict(cls, apply_overrides(read_yaml(path), overrides))


def dump(obj: Any) -> str:
    """The fully resolved config as YAML (loads back to an equal object)."""
    return yaml.safe_dump(to_dict(obj), sort_keys=False, default_flow_style=None)
