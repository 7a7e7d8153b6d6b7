"""Turn a composed config (DictConfig or plain mapping) into a schema dataclass, strictly.

A pure function: every unknown key is reported with its full path, the allowed keys and the
closest match; every value is checked against the field's type.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config key or value does not fit the schema; the message names the key."""


def structure(cls: type[T], data: Any, path: str = "") -> T:
    data = _to_container(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"'{path or '<root>'}' must be a mapping for {cls.__name__}, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"; did you mean '{_join(path, close[0])}'?" if close else ""
            raise ConfigError(
                f"unknown config key '{_join(path, key)}'; allowed keys of {cls.__name__}: {sorted(fields)}{hint}"
            )
    hints = typing.get_type_hints(cls)
    values = {name: _check(hints[name], data[name], _join(path, name)) for name in fields if name in data}
    missing = [
        n for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required config key(s) {[_join(path, m) for m in missing]}")
    return cls(**values)


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
        if value not in args:
            raise ConfigError(f"'{path}' must be one of {list(args)}, got {value!r}")
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
    (hydra's own error names only the key). Keys under dict-typed fields are free."""
    for override in overrides:
        if "=" not in override and not override.startswith("~"):
            continue
        key = override.lstrip("+~").split("=", 1)[0]
        if key.startswith("hydra.") or key == "hydra" or key.startswith("--"):
            continue
        tp: Any = cls
        for depth, part in enumerate(key.split(".")):
            tp = _dataclass_of(tp)
            if tp is None:
                break  # inside a dict or a plain value: no schema below here
            names = [f.name for f in dataclasses.fields(tp)]
            if part not in names:
                path = ".".join(key.split(".")[:depth])
                close = difflib.get_close_matches(part, names, n=1)
                hint = f"; did you mean '{_join(path, close[0])}'?" if close else ""
                raise ConfigError(
                    f"unknown config key '{_join(path, part)}'; allowed keys of {tp.__name__}: {sorted(names)}{hint}"
                )
            tp = typing.get_type_hints(tp)[part]


def _dataclass_of(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)), None)
    return None
