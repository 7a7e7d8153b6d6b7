"""Turn a composed config (DictConfig or plain mapping) into a schema dataclass, strictly.

A pure function: every unknown key is reported with its full path, the allowed keys and the
closest match; every value is checked against the field's type (a `Literal` names the allowed
values) and against the bounds a field declares with `bounded(...)`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config key or value does not fit the schema; the message names the key."""


_BOUNDS = {"gt": (">", lambda v, b: v > b), "ge": (">=", lambda v, b: v >= b),
           "lt": ("<", lambda v, b: v < b), "le": ("<=", lambda v, b: v <= b)}


def bounded(default: Any, **bounds: float) -> Any:
    """A numeric field whose value `structure` checks against `gt`, `ge`, `lt`, `le`
    (`lr: float = bounded(5e-4, gt=0)`); None (an optional field left off) is not checked."""
    unknown = set(bounds) - set(_BOUNDS)
    if unknown:
        raise TypeError(f"bounded() takes {sorted(_BOUNDS)}, not {sorted(unknown)}")
    return dataclasses.field(default=default, metadata={"bounds": bounds})


def bounds_text(f: dataclasses.Field) -> str:
    """"> 0 and <= 1" for a field made with `bounded(..., gt=0, le=1)`; "" without bounds."""
    return " and ".join(f"{_BOUNDS[k][0]} {b}" for k, b in f.metadata.get("bounds", {}).items())


def _check_bounds(f: dataclasses.Field, value: Any, path: str) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    for kind, bound in f.metadata.get("bounds", {}).items():
        op, holds = _BOUNDS[kind]
        if not holds(value, bound):
            raise ConfigError(f"{path} must be {op} {bound}, got {value!r}")


def check_instance(instance: Any) -> None:
    """A config built in Python gets the checks a composed one gets from `structure`: types, `Literal`
    choices and bounds, naming the key."""
    structure(type(instance), dataclasses.asdict(instance))


def structure(cls: type[T], data: Any, path: str = "") -> T:
    data = _to_container(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"'{path or '<root>'}' must be a mapping for {cls.__name__}, got {type(data).__name__}")
    if not path:
        for key in _dotted_keys(data):
            _refuse_moved(cls, key)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean '{_join(path, close[0])}'?" if close else ""
            raise ConfigError(
                f"unknown config key '{_join(path, key)}'; allowed keys of {cls.__name__}: {sorted(fields)}{hint}"
            )
    hints = typing.get_type_hints(cls)
    values = {name: _check_field(fields[name], hints[name], data[name], _join(path, name))
              for name in fields if name in data}
    missing = [
        n for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required config key(s) {[_join(path, m) for m in missing]}")
    return cls(**values)


def _check_field(f: dataclasses.Field, tp: Any, value: Any, path: str) -> Any:
    value = _check(tp, value, path)
    _check_bounds(f, value, path)
    return value


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _to_container(data: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:
        return data
    if isinstance(data, (DictConfig, ListConfig)):
        return OmegaConf.to_container(data, resolve=True)
    return data


def _check(tp: Any, value: Any, path: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _check(arg, value, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"'{path}': {value!r} fits none of {args}")
    if origin is typing.Literal:
        if value not in args and str(value).lower() in args and str(value).lower() in ("true", "false"):
            value = str(value).lower()  # hydra reads `key=true` as a bool, which a str field stores as 'True'
        if value not in args:
            raise ConfigError(f"{path}={value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        return structure(tp, value, path)
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"'{path}' must be a mapping, got {value!r}")
        key_t, val_t = args or (Any, Any)
        return {_check(key_t, k, f"{path}.<key>"): _check(val_t, v, f"{path}.{k}") for k, v in value.items()}
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{path}' must be a list, got {value!r}")
        item_t = args[0] if args else Any
        return (origin or tp)(_check(item_t, v, f"{path}[{i}]") for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if (tp in (int, float) and isinstance(value, bool)) or not isinstance(value, tp):
        raise ConfigError(f"'{path}' must be {tp.__name__}, got {value!r} ({type(value).__name__})")
    return value


def check_overrides(cls: type, overrides: list[str]) -> None:
    """Check hydra command-line overrides (`a.b=1`, `+a.c=2`, `~a.d`) against the schema before
    hydra composes anything, so a typo fails with the allowed keys and the closest match
    (hydra's own error names only the key), and a value outside a `Literal` or a field's bounds
    fails naming the key. Keys under dict-typed fields are free."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in overrides:
        if "=" not in override and not override.startswith("~"):
            continue
        key = override.lstrip("+~").split("=", 1)[0]
        if key.startswith("hydra.") or key == "hydra" or key.startswith("--"):
            continue
        _refuse_moved(cls, key)
        leaf = _leaf_field(cls, key)
        if leaf is not None and "=" in override and not override.startswith("~"):
            parsed = OverridesParser.create().parse_override(override)
            if not parsed.is_sweep_override():
                _check_override_value(*leaf, parsed.value(), key)


def _refuse_moved(cls: type, key: str) -> None:
    """A key the schema's `MOVED_KEYS` (old dotted name -> new name) lists, or one under a moved section,
    fails with its new name."""
    moved: dict[str, str] = getattr(cls, "MOVED_KEYS", {})
    parts = key.split(".")
    for depth in range(len(parts), 0, -1):
        old = ".".join(parts[:depth])
        if old in moved:
            new = moved[old] if depth == len(parts) else f"{moved[old]}.{'.'.join(parts[depth:])}"
            raise ConfigError(f"config key '{key}' has moved: use {new}")


def _dotted_keys(data: Mapping, prefix: str = "") -> Iterator[str]:
    for k, v in data.items():
        key = _join(prefix, k)
        if isinstance(v, Mapping):
            yield from _dotted_keys(v, key)  # the leaves first: their message is the most precise
        yield key


def _leaf_field(cls: type, key: str) -> tuple[dataclasses.Field, Any] | None:
    """The field (and its type) `key` names, raising on an unknown key; None below a dict."""
    tp: Any = cls
    found = None
    for depth, part in enumerate(key.split(".")):
        tp = _dataclass_of(tp)
        if tp is None:
            return None  # inside a dict or a plain value: no schema below here
        fields = {f.name: f for f in dataclasses.fields(tp)}
        if part not in fields:
            path = ".".join(key.split(".")[:depth])
            close = difflib.get_close_matches(part, fields, n=1)
            hint = f"; did you mean '{_join(path, close[0])}'?" if close else ""
            raise ConfigError(
                f"unknown config key '{_join(path, part)}'; allowed keys of {tp.__name__}: {sorted(fields)}{hint}"
            )
        found, tp = fields[part], typing.get_type_hints(tp)[part]
    return found, tp


def _check_override_value(f: dataclasses.Field, tp: Any, value: Any, key: str) -> None:
    """Only choices and bounds: other values hydra converts (`output_dir=123` becomes "123")."""
    if isinstance(value, str) and "${" in value:
        return  # an interpolation: resolved, and checked, by `structure`
    if _has_literal(tp) or f.metadata.get("bounds"):
        _check_field(f, tp, value, key)


def _has_literal(tp: Any) -> bool:
    return typing.get_origin(tp) is typing.Literal or any(_has_literal(a) for a in typing.get_args(tp))


def _dataclass_of(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)
    return None
